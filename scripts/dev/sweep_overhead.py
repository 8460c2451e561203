"""Wall time of a sweep through ``attnbench run`` and where it goes, per case.

    python3 scripts/dev/sweep_overhead.py [SCENARIO] [--set key=value ...] [-b BACKEND ...]

Runs the command in this process (the real CLI path: runner, run folder, table) with the
runner's steps wrapped in clocks, then prints the wall time and its split:

- timing: ``time_run`` (warm-up and measurement budgets, the estimate and the checked final call)
- plan timing: the backends' plans and converts timed on the host (``execute.host_samples.HostTimes``: its
  first calls in prepare, the rest after each round's kernel timing)
- reference: the float64 oracle of each case
- prepare: the rest of each row's preparation (first plan, first run, output check)
- batch: building each case's tensors; release: freeing memory between rows
- record: writing rows to the run folder; the rest: startup, table, Python between steps

harness overhead = wall - (timing + plan timing + reference), per case and as a share of
those. Default scenario: attnbench/scenarios/cpu-sweep.yaml (100 cases; reference, sdpa, flex;
budgets 2 + 10 ms). Not a test: the numbers depend on the machine and its load, so the
script prints the load average before and after.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CLOCKS: dict[str, float] = defaultdict(float)


def _clocked(name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCKS[name] += time.perf_counter() - t0

    return wrapper


def _instrument() -> None:
    """Wrap the runner's steps (names as the runner module sees them) in clocks."""
    from attnbench.execute import host_samples as hs
    from attnbench.execute import runner as rn
    from attnbench.store import runfolder

    for name in ("time_run", "materialize", "_release"):
        setattr(rn, name, _clocked(name, getattr(rn, name)))
    hs.HostTimes.first = _clocked("host_first", hs.HostTimes.first)  # inside _prepare
    hs.HostTimes.round = _clocked("host_rounds", hs.HostTimes.round)  # after each round's time_run
    rn.Runner._reference = _clocked("reference", rn.Runner._reference)
    rn.Runner._prepare = _clocked("_prepare", rn.Runner._prepare)
    runfolder.RunFolder.add = _clocked("record", runfolder.RunFolder.add)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", nargs="?", default=str(ROOT / "attnbench" / "scenarios" / "cpu-sweep.yaml"))
    ap.add_argument("--set", action="append", default=[], help="override a scenario key")
    ap.add_argument("-b", "--backend", action="append", default=[])
    ap.add_argument("-k", dest="select", help="only the rows this -k expression picks")
    ap.add_argument("--show-table", action="store_true", help="print the results table too")
    a = ap.parse_args()

    _instrument()
    from attnbench.cli import app
    from attnbench.workload.scenario import load

    sf = load(Path(a.scenario), a.set)
    if a.select:
        from attnbench.workload.select import parse_selector

        picks = parse_selector(a.select)
        cases = sum(1 for c in sf.cases if any(picks(c.case_id, b) for b in (a.backend or sf.scenario.backends or [""])))
    else:
        cases = len(sf.cases)
    out = Path(tempfile.mkdtemp(prefix="sweep-overhead-")) / "run"
    args = ["run", a.scenario, "--out", str(out), "-q"]
    for s in a.set:
        args += ["--set", s]
    for b in a.backend:
        args += ["-b", b]
    if a.select:
        args += ["-k", a.select]
    load_before = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    stdout = sys.stdout
    if not a.show_table:
        sys.stdout = open(os.devnull, "w")
    try:
        app(args, standalone_mode=False)
    finally:
        sys.stdout = stdout
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    load_after = os.getloadavg()

    c = CLOCKS
    host = c["host_first"] + c["host_rounds"]
    prepare = c["_prepare"] - c["host_first"]  # _prepare includes the first plan timing
    useful = c["time_run"] + host + c["reference"]
    parts = [
        ("timing (budgets)", c["time_run"]),
        ("plan timing", host),
        ("reference", c["reference"]),
        ("prepare (first plan/run, check)", prepare),
        ("batch", c["materialize"]),
        ("release", c["_release"]),
        ("record (run folder)", c["record"]),
    ]
    rest = wall - sum(v for _, v in parts)
    print(f"{a.scenario}: {cases} cases, wall {wall:.1f} s "
          f"(load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; {time.strftime('%Y-%m-%d %H:%M:%S')})")
    for name, v in parts + [("the rest (startup, table, between steps)", rest)]:
        print(f"  {name:42s} {v:7.2f} s  {1e3 * v / cases:8.1f} ms/case  {v / wall:6.1%}")
    over = wall - useful
    print(f"harness overhead = wall - (timing + plan timing + reference) = {over:.2f} s, "
          f"{1e3 * over / cases:.1f} ms/case, {over / useful:.1%} of timing + plan + reference")
    print(f"process CPU time {cpu:.1f} s (user + system; with one intra-op thread, about what the wall "
          f"time would be on an otherwise idle machine)")
    print(f"run folder: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
