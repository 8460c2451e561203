"""Write docs/benchmarks.md (and its plots) from attnbench run folders.

    python3 scripts/report/make_benchmarks_doc.py RUN_DIR[=COMMIT] [...] --command "what produced them" \
        [--command ...] [--commit SHA] [--out docs/benchmarks.md] [--plots docs/img] [--append FILE]

Runs of the same scenario (e.g. the library backends and flash-attn measured in two passes)
are merged into one table per scenario; "vs best" is recomputed over the merged rows.
Decode and tree-verification scenarios get a plot of kernel time vs context per backend.
Each scenario's section names when its runs were made, at which attnbench commit (``=COMMIT`` after
a run folder, else --commit, else the run's own git metadata when it was clean), the attnbench
command of each run and the host's load when it began. Runs from several GPU calls can therefore
share the page: give each call's command with its own --command. --append adds a markdown file
after the generated sections, verbatim (tables kept from an earlier session, with their command).
"""
from __future__ import annotations

import argparse
import math
import re
import textwrap
from pathlib import Path

from attnbench.analyze.plots import plot_run
from attnbench.analyze.tables import fmt_time
from attnbench.store.runfolder import RunFolder
from attnbench.store.rows import rows_frame


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="run folders, each optionally =COMMIT (the attnbench commit it ran)")
    ap.add_argument("--command", required=True, action="append",
                    help="the command line that produced the runs (repeatable: one per GPU call)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    ap.add_argument("--plots", type=Path, default=Path("docs/img"))
    ap.add_argument("--commit", default=None, help="attnbench commit the runs came from (when the GPU copy had no .git)")
    ap.add_argument("--note", action="append", default=[], help="a line about how the runs were made (repeatable)")
    ap.add_argument("--append", type=Path, default=None, help="a markdown file added after the generated sections")
    args = ap.parse_args()

    by_scenario: dict[str, list] = {}
    provenance: dict[str, list[str]] = {}
    manifests = []
    commits = []
    for spec in args.runs:
        run, _, commit = spec.partition("=")
        rf = RunFolder.load(Path(run))
        m = rf.manifest
        manifests.append(m)
        commit = commit or args.commit or _clean_commit(m.environment)
        commits.append(commit)
        for r in rf.rows:
            by_scenario.setdefault(r.id.scenario, []).append(r)
        provenance.setdefault(m.scenario, []).append(_provenance(m, commit))
    env = manifests[0].environment
    versions: dict[str, str] = {}
    for m in manifests:
        for k, v in (m.environment.get("backends") or {}).items():
            if v and v != "unavailable":
                versions[k] = v
    lines = [
        "# Benchmarks",
        "",
        "Made by attnbench from " + ("one GPU call" if len(args.command) == 1 else f"{len(args.command)} GPU calls")
        + " with:",
        "",
        "```bash",
        *args.command,
        "```",
        "",
        f"- device: **{env.get('device')}**; torch {env.get('torch')}, CUDA {env.get('cuda')}, triton {env.get('triton')}, python {env.get('python')}",
        "- backends: " + ", ".join(f"{k} ({v})" for k, v in sorted(versions.items())),
        "- attnbench commit: " + ", ".join(dict.fromkeys(commits)) + " (each scenario's section says which)",
        "- `sdpa` and `flex` (either kernel) cannot read a paged cache: their convert step gathers K/V into a"
        " dense layout, so their kernel time reads contiguous memory and the gather shows in their convert"
        " time; `triton`, `flash-attn`, `flash-attn4`, `xformers` and `flashinfer` read the pages in place.",
        "- kernel = median of CUDA-graph replays (events where a backend cannot be captured: the row says),"
        " cold L2 (flushed before every call); plan = host time of the engine's per-step metadata work"
        " (the library's plan call included); convert = host time of what attnbench adds because the"
        " library cannot read the paged batch (SDPA/Flex: gathered K/V, dense masks; - for none);"
        " every output checked against the float64 reference (rel err).",
        "- roofline = time at the binding measured ceiling (memory: the faster of copy and read-only"
        " bandwidth; compute: dense bf16 matmul) over the kernel time.",
        *(f"- {n}" for n in args.note),
        "",
    ]
    lines = [w for line in lines for w in _wrap_bullet(line)]
    args.plots.mkdir(parents=True, exist_ok=True)
    for scen, rows in by_scenario.items():
        order = {c: i for i, c in enumerate(dict.fromkeys(r.id.case_id for r in rows))}
        rows = sorted(rows, key=lambda r: order[r.id.case_id])  # each case's rows together (stable)
        df = rows_frame(rows)
        desc = next((m.scenario_text or "" for m in manifests if m.scenario == scen), "")
        about = next((ln.split(":", 1)[1].strip() for ln in desc.splitlines() if ln.startswith("description:")), "")
        lines += [f"## {scen}", "", about, ""]
        lines += [w for p in provenance.get(scen, []) for w in _wrap_bullet(p)] + [""]
        lines += [f"Batch of the first case: {rows[0].workload.batch}", ""]
        lines += [
            "| case | backend | status | plan | convert | kernel | TB/s | roofline | vs best | rel err | notes |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r, xf in zip(rows, df["x_fastest"]):
            notes = "; ".join(x for x in (r.reason, r.id.mode,
                                          r.timing.timing_method if r.timing.timing_method != "cuda-graph" else "") if x)
            roof = f"{r.roofline.pct_of_ceiling:.0f}% {r.roofline.bound[:3]}" if math.isfinite(r.roofline.pct_of_ceiling) else "-"
            vs = "best" if xf == 1.0 else (f"{xf:.2f}x" if math.isfinite(xf) else "-")
            tbps = f"{r.roofline.tbps:.2f}" if math.isfinite(r.roofline.tbps) else "-"
            err = f"{r.correctness.rel_err:.1e}" if math.isfinite(r.correctness.rel_err) else "-"
            lines.append(
                f"| {r.id.case_id} | {r.id.backend} | {r.status} | {fmt_time(r.timing.plan_ms)} | {fmt_time(r.timing.convert_ms) if r.timing.convert_ms else '-'} | {fmt_time(r.timing.median_ms)} | {tbps} | {roof} | {vs} | {err} | {notes.replace('|', '/')} |"
            )
        lines.append("")
        ctx_cols = [c for c in df.columns if c.endswith(".context") and df[c].nunique() > 1]
        if ctx_cols and any(k in scen for k in ("decode", "tree")):
            for path in plot_run(rows, ctx_cols[0], args.plots / scen, title=scen):
                rel = path.relative_to(args.out.parent) if path.is_relative_to(args.out.parent) else path
                lines += [f"![{path.stem}]({rel})", ""]
    if args.append:
        lines += [args.append.read_text().rstrip("\n")]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


def _clean_commit(env: dict) -> str:
    """The run's commit from its own git metadata, where the copy it ran from was clean."""
    sha = env.get("git_commit") or ""
    if not sha:
        return "n/a"
    return sha[:7] if not env.get("git_dirty") else f"{sha[:7]} with uncommitted changes (give RUN=COMMIT)"


def _provenance(m, commit: str) -> str:
    """One list item: when the run was made, at which commit, its command and the host's load then."""
    load = m.load or {}
    start = (load.get("start") or [None])[0]
    busy = f"; host load average at its start {start:.1f} (1 min) on {load.get('cores')} cores" if start is not None else ""
    status = "" if m.status == "complete" else f" ({m.status}: cut before every row ran)"
    return f"- run {(m.start_time or '')[:16].replace('T', ' ')} UTC at attnbench {commit}{status}: `{m.command}`{busy}"


def _wrap_bullet(line: str, width: int = 100) -> list[str]:
    """A "- ..." prose line wrapped at ``width`` (docs/ wraps prose); left whole where a wrapped line
    would start with markdown syntax (a "-", "*", "+", "#", ">", "|" or "1." would begin a new block)."""
    if not line.startswith("- ") or len(line) <= width:
        return [line]
    out = textwrap.wrap(line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    if any(re.match(r"\s*([-*+#>|]|\d+[.)])(\s|$)", w) for w in out[1:]):
        return [line]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
