"""CPU time of ``attnbench validate`` on a big sweep file (issue 59: loading copied the whole
scenario once per case, so a 2,592-case, 949 KB sweep took 3 minutes of CPU).

    python3 scripts/dev/validate_time.py [--cases 2500] [--keep FILE]

Writes a scenario whose ``sweep.batch`` holds ``--cases`` distinct batches (each a list of
three request groups, as ``attnbench import`` writes one per engine step shape) to a
temporary file, runs ``python3 -m attnbench validate FILE`` in a child process from this
checkout, and prints the file's size, the child's CPU time (user + system) and its wall time.
Not a test: the numbers depend on the machine and its load, so the load average is printed
with them.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def sweep_document(cases: int) -> dict:
    """A scenario of ``cases`` cases: one swept ``batch`` value per case, all different."""
    batches = []
    for i in range(cases):
        batches.append([
            {"kind": "decode", "count": 1 + i % 32, "context": 64 * (1 + i % 50)},
            {"kind": "prefill", "count": 1 + i % 3, "query": 16 + i % 100, "context": 32 * (i % 40)},
            {"kind": "tree", "count": 1 + i % 4, "context": 128 + i, "tree": {"chain": 1 + i % 5}},
        ])
    return {
        "name": "validate-time",
        "model": {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "dtype": "bfloat16"},
        "kv_cache": {"page_size": 16, "layout": "shuffled"},
        "batch": batches[0],
        "sweep": {"batch": batches},
        "backends": ["reference"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2500)
    ap.add_argument("--keep", type=Path, default=None, help="write the scenario here (and keep it)")
    args = ap.parse_args()
    text = yaml.safe_dump(sweep_document(args.cases), sort_keys=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "validate-time.yaml"
        path.write_text(text)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "attnbench", "validate", str(path)], cwd=ROOT,
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print((proc.stdout + proc.stderr).strip())
    print(f"cases {args.cases}, file {len(text.encode()) / 1024:.0f} KiB: validate took {cpu:.2f} s CPU, "
          f"{wall:.2f} s wall (exit {proc.returncode}); load average {os.getloadavg()[0]:.2f}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
