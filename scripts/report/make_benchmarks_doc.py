"""Write docs/benchmarks.md (and its plots) from attnbench run folders.

    python3 scripts/report/make_benchmarks_doc.py RUN_DIR [RUN_DIR ...] --command "what produced them" \
        [--out docs/benchmarks.md] [--plots docs/img]

Runs of the same scenario (e.g. the library backends and flash-attn measured in two passes)
are merged into one table per scenario; "vs best" is recomputed over the merged rows.
Decode and tree-verification scenarios get a plot of kernel time vs context per backend.
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
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--command", required=True, help="the command line that produced the runs")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    ap.add_argument("--plots", type=Path, default=Path("docs/img"))
    ap.add_argument("--commit", default=None, help="attnbench commit the runs came from (when the GPU copy had no .git)")
    ap.add_argument("--note", action="append", default=[], help="a line about how the runs were made (repeatable)")
    args = ap.parse_args()

    by_scenario: dict[str, list] = {}
    manifests = []
    for run in args.runs:
        rf = RunFolder.load(run)
        manifests.append(rf.manifest)
        for r in rf.rows:
            by_scenario.setdefault(r.id.scenario, []).append(r)
    env = manifests[0].environment
    versions: dict[str, str] = {}
    for m in manifests:
        for k, v in (m.environment.get("backends") or {}).items():
            if v and v != "unavailable":
                versions[k] = v
    lines = [
        "# Benchmarks",
        "",
        "Made by attnbench from one GPU session with:",
        "",
        "```bash",
        args.command,
        "```",
        "",
        f"- device: **{env.get('device')}**; torch {env.get('torch')}, CUDA {env.get('cuda')}, triton {env.get('triton')}, python {env.get('python')}",
        "- backends: " + ", ".join(f"{k} ({v})" for k, v in sorted(versions.items())),
        f"- attnbench commit: {args.commit or env.get('git_commit') or 'n/a'}",
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
        lines += [f"## {scen}", "", about, "", f"Batch of the first case: {rows[0].workload.batch}", ""]
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
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


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
