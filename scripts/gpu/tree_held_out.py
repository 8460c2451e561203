"""Held-out batches for the Gluon tree kernel (issue 33, tree round 1), on the GPU machine from the repo root:
random scenarios nobody wrote by hand (scripts/gpu/random_scenarios.py, FlashInfer's profile: 16-bit, head
dims 64/128), kept where triton_tree_gluon takes every case, each run through the default triton backend
(every row checked against the exact reference); one line a row: status, error, what ran.

    python3 scripts/gpu/tree_held_out.py --seeds 912 913 914 915 916 917 --budget-s 150 --out /tmp/held

``--route fp8``: the FP8 decode kernel's held-out batches instead: ``--profile all`` draws (head dims 64 to 256, the
attention variants) keeping the scenarios with an FP8 cache and no MLA, whatever route each case then takes.
``--route mla``: the Gluon MLA kernel's: ``--profile all`` draws keeping the scenarios with a case it takes.
``--route decode``: the Gluon decode kernel's: ``--profile decode`` draws (FP8 decodes alone, the attention
variants) keeping the scenarios with a case it takes.
``--only STEM ...``: only those scenario files (e.g. the ones a budget left unrun). ``--jobs N`` (4): runs at once,
each its own process (one at a time, the sixteenth session's decode draws took 11-16 s each on the H200 machine: 16
in a 180 s budget, 10 in 160 s; mostly start-up and compiles). Exit 1 when a row is not ok (a mismatch or an
error)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _select(files: list[Path], wanted) -> list[Path]:
    """The files whose cases' batch specs ``wanted`` takes; a draw the tool refuses is said and left out."""
    from attnbench.workload import scenario as sc

    keep = []
    for f in files:
        try:
            if wanted([c.scenario.batch_spec() for c in sc.load(f).cases]):
                keep.append(f)
        except Exception as e:  # a draw the tool refuses is not this check's business
            print(f"{f.name}: not loaded ({type(e).__name__})", file=sys.stderr)
    return keep


def _taken(files: list[Path], route, pick) -> list[Path]:
    """The scenarios whose cases' taken-or-not (``route.unwanted(batch) == ''``, with Hopper assumed) ``pick``
    (all, any) keeps."""
    from attnbench.workload.batch import materialize

    hopper, route.hopper = route.hopper, lambda device: True  # (the CPU too: the gate's other rules)
    try:
        return _select(files, lambda specs: pick(route.unwanted(materialize(s, 0)) == "" for s in specs))
    finally:
        route.hopper = hopper  # the runs after see the real device


def eligible(files: list[Path]) -> list[Path]:
    """The scenarios whose every case the Gluon tree option's plan takes (``unwanted`` == '')."""
    from attnbench.kernels.tree import gluon as triton_tree_gluon

    return _taken(files, triton_tree_gluon, all)


def with_mla_gluon(files: list[Path]) -> list[Path]:
    """The scenarios with a case the Gluon MLA kernel takes (16-bit MLA decodes, thirteenth session)."""
    from attnbench.kernels.mla import gluon as triton_mla_gluon

    return _taken(files, triton_mla_gluon, any)


def with_decode_gluon(files: list[Path]) -> list[Path]:
    """The scenarios with a case the Gluon decode kernel takes (FP8 decodes alone, sixteenth session: with windows,
    sinks and soft-capping)."""
    from attnbench.kernels.decode import gluon as triton_decode_gluon

    return _taken(files, triton_decode_gluon, any)


def with_fp8(files: list[Path]) -> list[Path]:
    """The scenarios with an FP8 cache in some case and no MLA case (the paged kernel's FP8 words)."""
    return _select(files, lambda specs: any(str(s.kv_dtype or "").startswith("fp8") for s in specs)
                   and all(s.attention != "mla" for s in specs))


def run_one(f: Path, out: Path, left: float) -> tuple[list[str], int, int]:
    """``f`` through the default triton backend (every row checked against the reference) with ``left`` seconds:
    (one line a row, rows, rows not ok)."""
    if left < 15:
        return [f"{f.name}: not run (budget)"], 0, 0
    try:
        subprocess.run([sys.executable, "-m", "attnbench", "run", str(f), "-b", "triton", "-q", "--warmup-ms", "1",
                        "--measure-ms", "3", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=left)
    except subprocess.TimeoutExpired:
        pass  # (the rows it wrote are read below; none: "no row")
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()] \
        if (out / "rows.jsonl").exists() else []
    if not rows:
        return [f"{f.name}: no row"], 0, 1
    lines = [f"{f.name} {r.get('case_id')}: {r.get('status')} rel err {r.get('rel_err')} (tolerance "
             f"{r.get('tolerance')}), ran as '{r.get('mode') or ''}'" for r in rows]
    return lines, len(rows), sum(r.get("status") != "ok" for r in rows)


def run_all(files: list[Path], runs: Path, budget_s: float, jobs: int = 1, say=print) -> tuple[int, int]:
    """Every file through ``run_one``, ``jobs`` at a time (each run a process of its own: their start-up and
    compiles overlap; the rows are checks, not timings), within ``budget_s`` seconds from now; each file's lines
    handed to ``say`` in the files' order as soon as they are known: (rows, rows not ok)."""
    from concurrent.futures import ThreadPoolExecutor

    end = time.time() + budget_s
    ran = bad = 0
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for lines, n, b in pool.map(lambda f: run_one(f, runs / f.stem, end - time.time()), files):
            for line in lines:
                say(line)
            ran, bad = ran + n, bad + b
    return ran, bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[912, 913, 914, 915, 916, 917])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--jobs", type=int, default=4, help="scenarios run at once (each its own process)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/held"))
    ap.add_argument("--list", action="store_true", help="only list the eligible scenarios")
    ap.add_argument("--route", choices=("tree", "fp8", "mla", "decode"), default="tree")
    ap.add_argument("--only", nargs="+", default=None, help="scenario file stems to run (default: all eligible)")
    ap.add_argument("--max-nodes", type=int, default=64, help="random_scenarios.py's --max-nodes (trees past 64 nodes)")
    a = ap.parse_args()
    t0 = time.time()
    files = []
    for s in a.seeds:
        d = a.out / "scenarios" / (str(s) if a.max_nodes == 64 else f"{s}-n{a.max_nodes}")
        subprocess.run([sys.executable, "scripts/gpu/random_scenarios.py", "--n", str(a.n), "--seed", str(s), "--out",
                        str(d), "--profile", {"tree": "flashinfer", "decode": "decode"}.get(a.route, "all"),
                        "--max-nodes", str(a.max_nodes)], check=True, stdout=subprocess.DEVNULL)
        files += sorted(d.glob("*.yaml"))
    keep = {"tree": eligible, "fp8": with_fp8, "mla": with_mla_gluon, "decode": with_decode_gluon}[a.route](files)
    print(f"{len(keep)} of {len(files)} scenarios " + {
        "tree": "take the Gluon tree kernel", "fp8": "have an FP8 cache",
        "mla": "have a case the Gluon MLA kernel takes",
        "decode": "have a case the Gluon decode kernel takes"}[a.route])
    if a.only:
        keep = [f for f in keep if f.stem in a.only]
    if a.list:
        print("\n".join(str(f) for f in keep))
        return 0
    ran, bad = run_all(keep, a.out / "runs", a.budget_s - (time.time() - t0), a.jobs,
                       lambda line: print(line, flush=True))
    print(f"{ran} rows, {bad} not ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
