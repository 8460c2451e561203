"""Print the run-time kernel tables of a run folder's ``--profile`` pass (``*.kernels.json``), one line a
kernel: case, backend, kernel name (cut), calls and us per run. Usage: python3 scripts/gpu/kernel_tables.py RUN_DIR"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> None:
    for f in sorted(Path(folder).rglob("*.kernels.json")):
        t = json.loads(f.read_text())
        print(f"{t['case_id']:<28} {t['backend']:<18} {t['kernels_per_call']} kernels, "
              f"{1e3 * t['kernel_ms_per_call']:.1f} us a call")
        for k in t["run_kernels"]:
            print(f"    {k['name'][:60]:<60} x{k['calls_per_run']:<4} {k['us_per_run']:8.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
