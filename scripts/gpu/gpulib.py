"""What the GPU scripts share (scripts/gpu/verify_all.py, flashinfer_warmup.py, validate.py's
summary): the shipped scenarios, the backend specs of every route option, batch specs as JSON,
the shrinking of a batch for a JIT warm-up, and the status table of run folders.

Imported by path (``sys.path.insert(0, <this folder>)``): scripts/gpu is no package."""
from __future__ import annotations

import collections
import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Iterable, Optional

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIRS = (ROOT / "attnbench" / "scenarios", ROOT / "attnbench" / "scenarios" / "gpu")

#: options of a backend that pick the kernel family ("route"): each value is a row of its own
#: in the verification (attnbench backends --probe lists every option; the others are build or
#: mode flags set from the environment: flash-attn's hdim128_only, xformers' triton_only)
ROUTE_OPTIONS = {"flashinfer": ("route", "cascade"), "flex": ("mask", "kernel"), "flash-attn4": ("trees",),
                 "triton": ("route",)}


def shipped_scenarios() -> list[Path]:
    """attnbench/scenarios/*.yaml and attnbench/scenarios/gpu/*.yaml, sorted."""
    return [p for d in SCENARIO_DIRS for p in sorted(d.glob("*.yaml"))]


def pinned_to_cpu(path: Path) -> bool:
    """The scenario names ``device: cpu`` (a CPU scenario, not one for the GPU)."""
    from attnbench.workload.scenario import load

    return load(path).scenario.device == "cpu"


def route_specs(name: str) -> list[str]:
    """``name`` and one spec per non-default value of each of its route options, from the
    backend's declared ``options`` (BackendOption): flashinfer, flashinfer:cascade=off,
    flashinfer:route=decode, ...; flex, flex:mask=dense, flex:kernel=flash. Canonical strings (the rows' backend)."""
    from attnbench.backend import canonical_spec, get_backend_class

    cls = get_backend_class(name)
    specs = [canonical_spec(name)]
    for key in ROUTE_OPTIONS.get(name, ()):
        if key not in cls.options:  # a backend that does not declare this option (yet)
            continue
        opt = cls.options[key]
        default = opt.declared_default()
        values = opt.choices if opt.choices else (("on", "off") if opt.type is bool else ())
        for v in values:
            if v != default:
                s = canonical_spec(f"{name}:{key}={v}")
                if s not in specs:
                    specs.append(s)
    return specs


# -- batch specs as JSON (worker processes take them on stdin) --------------------------------
def spec_to_json(spec) -> dict:
    return dataclasses.asdict(spec)


def spec_from_json(d: dict):
    from attnbench.workload.spec import BatchSpec, Request

    reqs = tuple(Request(**{**r, "tree_parents": None if r["tree_parents"] is None else tuple(r["tree_parents"])})
                 for r in d["requests"])
    return BatchSpec(**{**d, "requests": reqs})


def shrink(spec, max_pages: int = 2, max_query: int = 24, max_alike: int = 4):
    """The same batch with contexts of at most ``max_pages`` pages, prefills of at most
    ``max_query`` tokens and at most ``max_alike`` requests of one shape: kinds, order, causality,
    tree shapes, shared prefixes (cut to every member's context), page size, heads, dtypes and
    variants kept: what a library's kernel choice and its JIT modules depend on, at a fraction of
    the memory and time."""
    cap = max_pages * spec.page_size
    seen: collections.Counter = collections.Counter()
    kept = []
    for r in spec.requests:
        key = (r.kind, r.query, r.tree_parents, r.causal, r.prefix_group)
        seen[key] += 1
        if seen[key] <= max_alike:
            kept.append(r)
    # a request with more queries than keys (context < 0: docs/semantics.md) keeps its lengths
    cut = [(r, r.context, r.query) if r.context < 0 else
           (r, min(r.context, cap), r.query if (r.tree_parents is not None or r.query == 1) else min(r.query, max_query))
           for r in kept]
    group: dict = {}
    for r, ctx, _ in cut:
        if r.prefix_group is not None:
            group[r.prefix_group] = min(group.get(r.prefix_group, ctx), ctx)
    reqs = tuple(dataclasses.replace(r, context=ctx, query=q,
                                     shared_prefix=min(r.shared_prefix, group[r.prefix_group]) if r.prefix_group is not None
                                     else r.shared_prefix)
                 for r, ctx, q in cut)
    return dataclasses.replace(spec, requests=reqs)


def kernel_signature(backend: str, spec) -> tuple:
    """What decides a FlashInfer route and its JIT modules for ``spec`` (lengths left out): two
    items with one signature build the same kernels."""
    from attnbench.workload.trees import is_chain

    reqs = spec.requests
    trees = [r for r in reqs if r.tree_parents is not None]
    multi = [r.query > 1 for r in reqs]
    mixed = None
    if any(multi) and not all(multi) and not trees:
        mixed = not any(multi[multi.index(False):])
    return (backend, spec.dtype, spec.kv_dtype, spec.kv_scale, spec.kv_order, spec.head_dim,
            spec.num_q_heads // max(1, spec.num_kv_heads), spec.page_size, spec.window is not None, spec.sinks,
            spec.softcap is not None, spec.alibi, spec.attention, spec.kv_lora_rank, spec.rope_dim,
            not trees and not any(multi), bool(trees), all(is_chain(r.tree_parents) for r in trees),
            tuple(sorted({r.causal for r in reqs})), mixed,
            any(r.prefix_group is not None and r.shared_prefix >= spec.page_size for r in reqs))


# -- the status table of run folders ----------------------------------------------------------
STATUSES = ("ok", "mismatch", "error", "skipped")
MEMORY_SKIP = re.compile(r"available on cuda")


@dataclasses.dataclass
class Cell:
    """The rows of one (backend, scenario): counts by status, distinct skip reasons, the modes
    (routes) the ok rows ran, the saved-output check, and whether rows are missing."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    modes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    saved_ok: int = 0
    saved_off: int = 0
    cases: int = 0  # cases the scenario has (0: unknown)
    note: str = ""  # cut short / not run


def read_rows(run_dirs: Iterable[Path]) -> tuple[list, list[str]]:
    """Every row of these run folders, and one line per folder cut short or without rows."""
    from attnbench.store.runfolder import RunFolder

    rows, cut = [], []
    for p in run_dirs:
        if not (p / "rows.jsonl").is_file():
            cut.append(f"{p.name}: no rows")
            continue
        rf = RunFolder.load(p)
        if not rf.manifest.complete:
            cut.append(f"{p.name}: incomplete ({len(rf.rows)} rows)")
        rows += rf.rows
    return rows, cut


def cells_of(rows: Iterable[Any], saved: Iterable[dict] = ()) -> dict[tuple[str, str], Cell]:
    """(backend, scenario) -> Cell, from rows and from check_saved.py --jsonl records
    (``{"scenario", "backend", "ok"}``)."""
    cells: dict[tuple[str, str], Cell] = collections.defaultdict(Cell)
    for r in rows:
        c = cells[(r.id.backend, r.id.scenario)]
        st = getattr(r.status, "value", r.status)
        c.counts[st] += 1
        if st == "skipped":
            c.reasons[r.reason] += 1
        elif st == "ok" and r.id.mode:
            c.modes[str(r.id.mode)] += 1
    for s in saved:
        c = cells[(s["backend"], s["scenario"])]
        if s["ok"]:
            c.saved_ok += 1
        else:
            c.saved_off += 1
    return cells


def status_table(cells: dict[tuple[str, str], Cell], reason_ids: Optional[dict[str, str]] = None) -> tuple[list[str], dict[str, str]]:
    """Markdown lines of the table (one line per backend and scenario) and the reasons legend
    (reason -> id, R1, R2, ...: the skip reasons in the table are these ids)."""
    ids = dict(reason_ids or {})
    lines = ["| backend (route) | scenario | cases | ok | mismatch | error | skipped (reasons) | saved outputs check | ran as |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (backend, scen), c in sorted(cells.items()):
        for reason in c.reasons:
            ids.setdefault(reason, f"R{len(ids) + 1}")
        skipped = str(c.counts["skipped"])
        if c.reasons:
            skipped += " (" + ", ".join(f"{ids[r]}×{n}" for r, n in sorted(c.reasons.items(), key=lambda x: ids[x[0]])) + ")"
        saved = ("-" if not (c.saved_ok or c.saved_off) else f"{c.saved_ok} ok" + (f", **{c.saved_off} off**" if c.saved_off else ""))
        modes = ", ".join(f"{m}×{n}" if n > 1 else m for m, n in c.modes.most_common(3)) + (" …" if len(c.modes) > 3 else "")
        total = sum(c.counts.values())
        cases = f"{total}/{c.cases}" if c.cases and total != c.cases else str(total)
        bad = lambda k: f"**{c.counts[k]}**" if c.counts[k] else "0"
        lines.append(f"| {backend} | {scen}{' — ' + c.note if c.note else ''} | {cases} | {c.counts['ok']} | {bad('mismatch')} | "
                     f"{bad('error')} | {skipped} | {saved} | {modes.replace('|', '/')} |")
    return lines, ids


def legend(ids: dict[str, str]) -> list[str]:
    out = []
    for reason, rid in sorted(ids.items(), key=lambda x: int(x[1][1:])):
        tag = " (memory: other workers held the GPU; rerun alone)" if MEMORY_SKIP.search(reason) else ""
        out.append(f"- {rid}: {reason}{tag}")
    return out


def failed_rows(rows: Iterable[Any]) -> list[str]:
    return [f"{r.id.scenario} | {r.id.case_id} | {r.id.backend}: {getattr(r.status, 'value', r.status)}: {r.reason}"
            for r in rows if getattr(r.status, "value", r.status) in ("error", "mismatch")]


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def junit_summary(path: Path) -> list[str]:
    """A pytest junit xml as lines: the counts, every failure's test, and every skip reason with
    how many tests it skipped (the tests lane of scripts/gpu/validate.py)."""
    import xml.etree.ElementTree as ET

    counts, skips, failed = collections.Counter(), collections.Counter(), []
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = f"{tc.get('classname', '')}::{tc.get('name', '')}"
        kinds = [c.tag for c in tc if c.tag in ("failure", "error", "skipped")]
        # a run cut at its budget (SIGINT) leaves a nameless <testcase/> per test still running in an
        # xdist worker: that test never ended, it did not pass
        kind = kinds[0] if kinds else "passed" if tc.get("name") else "unfinished"
        counts[kind] += 1
        if kind == "skipped":
            el = next(c for c in tc if c.tag == "skipped")
            msg = el.get("message", "")
            if msg == "collection skipped":  # a module skipped whole: its reason is in the text
                why = re.search(r"Skipped: (.*?)['\"]?\)?$", (el.text or "").strip())
                msg = f"{name.strip(':')} (the whole module): {why.group(1) if why else el.text}"
            skips[re.sub(r"^Skipped: ", "", msg)] += 1
        elif kind in ("failure", "error"):
            msg = next(c for c in tc if c.tag == kind).get("message", "")
            failed.append(f"{kind}: {name}: {msg[:300]}")
    out = ["pytest -m gpu: " + ", ".join(f"{k} {counts[k]}" for k in ("passed", "failure", "error", "skipped"))
           + (f", unfinished {counts['unfinished']} (the run was cut while they ran)" if counts["unfinished"] else "")]
    out += failed
    out += [f"skipped {n}x: {msg}" for msg, n in skips.most_common()]
    return out
