"""Whole-process CPU time (user + system of the command and every child it waited for) of
the commands people run most, min and median of N runs each:

    python3 scripts/dev/cpu_times.py [--runs 5] [--sweep-runs 2] [--only help,version,...]

CPU seconds, not wall time: on a machine shared with other work they move far less than
the wall clock (a process that waits for the CPU is not charged for it). Each command runs
once first, unmeasured (the file cache). The run commands write into fresh temporary
folders. Run it with the Python that has attnbench installed (``python -m attnbench``).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCEN = ROOT / "attnbench" / "scenarios"
COMMANDS = {  # name -> arguments of `attnbench` ({out}: a fresh run folder)
    "python": None,  # `python -c pass`, for scale
    "help": ["--help"],
    "version": ["--version"],
    "validate": ["validate", str(SCEN / "quickstart.yaml")],
    "list": ["run", str(SCEN / "cpu-sweep.yaml"), "--list"],
    "quickstart": ["run", str(SCEN / "quickstart.yaml"), "--device", "cpu", "--out", "{out}", "-q"],
    "sweep": ["run", str(SCEN / "cpu-sweep.yaml"), "--out", "{out}", "-q"],
}


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_once(args) -> tuple[float, float]:
    """(cpu, wall) seconds of one run of the command."""
    if args is None:
        cmd = [sys.executable, "-c", "pass"]
    else:
        out = Path(tempfile.mkdtemp(prefix="cpu-times-")) / "run"
        cmd = [sys.executable, "-m", "attnbench", *(a.replace("{out}", str(out)) for a in args)]
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-800:]}")
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sweep-runs", type=int, default=2)
    ap.add_argument("--only", default=",".join(COMMANDS), help=f"comma-separated, of: {', '.join(COMMANDS)}")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    unknown = set(names) - set(COMMANDS)
    if unknown:
        sys.exit(f"unknown: {', '.join(sorted(unknown))}; choose from {', '.join(COMMANDS)}")
    print(f"load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M:%S')}; {os.cpu_count()} CPUs")
    print(f"{'command':12s} {'runs':>4s} {'cpu min':>8s} {'cpu med':>8s} {'wall min':>9s} {'wall med':>9s}  (s)")
    for name in names:
        runs = a.sweep_runs if name == "sweep" else a.runs
        if name != "sweep":
            time_once(COMMANDS[name])  # warm-up: the file cache
        got = [time_once(COMMANDS[name]) for _ in range(runs)]
        cpu, wall = [c for c, _ in got], [w for _, w in got]
        print(f"{name:12s} {runs:4d} {min(cpu):8.2f} {statistics.median(cpu):8.2f} "
              f"{min(wall):9.2f} {statistics.median(wall):9.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
