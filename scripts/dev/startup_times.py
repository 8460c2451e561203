"""Wall time of the commands that run no batch, hyperfine-style: N runs each after one
warm-up, mean ± sd, min and max, and the mean CPU time (user + system: less sensitive than
wall time to other processes on a shared machine). ``python3 scripts/dev/startup_times.py [--runs 10]``.
Run it with the Python that has attnbench installed (it calls ``python -m attnbench``)."""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    [],  # bare interpreter start, for scale
    ["--help"],
    ["--version"],
    ["schema"],
    ["validate", str(ROOT / "attnbench" / "scenarios" / "quickstart.yaml")],
    ["backends"],
    ["backends", "--probe"],
]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_once(args: list[str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run."""
    c0 = _cpu()
    cmd = [sys.executable, "-c", "pass"] if not args else [sys.executable, "-m", "attnbench", *args]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-500:]}")
    return dt, _cpu() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    print(f"{'command':40s} {'mean':>7s} {'± sd':>7s} {'min':>7s} {'max':>7s} {'cpu':>7s}  (s, {a.runs} runs)")
    for args in COMMANDS:
        time_once(args)  # warm-up: file cache
        both = [time_once(args) for _ in range(a.runs)]
        ts, cpu = [w for w, _ in both], [c for _, c in both]
        name = "python -c pass" if not args else "attnbench " + " ".join(Path(x).name if "/" in x else x for x in args)
        print(f"{name:40s} {statistics.mean(ts):7.3f} {statistics.stdev(ts):7.3f} {min(ts):7.3f} {max(ts):7.3f} {statistics.mean(cpu):7.3f}")


if __name__ == "__main__":
    main()
