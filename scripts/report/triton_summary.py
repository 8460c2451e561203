"""Compact table of attnbench run folders for the triton notes (docs/triton_notes.md):

  python3 scripts/report/triton_summary.py CEILINGS_JSON RUN_DIR...

Per row: kernel median (us), rel err, % of the memory floor at the measured COPY bandwidth
(issue 16's measure: bytes / copy TB/s over the time), useful TF/s and % of the bf16 matmul
ceiling, and the ratio to the fastest non-triton backend of the case.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from attnbench.store.runfolder import RunFolder


def main(ceil_path: str, dirs: list[str]) -> None:
    ceil = next(iter(json.loads(Path(ceil_path).read_text()).values()))
    copy = ceil["copy_tbps"]
    mm = ceil["matmul_tflops"].get("bfloat16") or next(iter(ceil["matmul_tflops"].values()))
    print(f"ceilings: copy {copy:.3f} TB/s, read {ceil.get('read_tbps', 0):.3f} TB/s, bf16 matmul {mm:.0f} TF/s")
    for d in dirs:
        by_case: dict[str, list] = {}
        for r in RunFolder.load(Path(d)).rows:
            by_case.setdefault(r.id.case_id, []).append(r)
        print(f"== {Path(d).name}")
        for case, rs in by_case.items():
            ok = [r for r in rs if r.status == "ok"]
            others = [r.timing.median_ms for r in ok if not r.id.backend.startswith("triton")]
            best_other = min(others) if others else math.nan
            for r in rs:
                if r.status != "ok":
                    print(f"{case:28s} {r.id.backend:16s} {r.status}: {r.reason[:80]}")
                    continue
                t = r.timing.median_ms * 1e3
                floor = r.roofline.bytes / copy / 1e6  # us
                tf = r.roofline.flops / t / 1e6
                print(f"{case:28s} {r.id.backend:16s} {t:8.1f} us  err {r.correctness.rel_err:.1e}  "
                      f"floor {floor:6.1f} us = {100 * floor / t:5.1f}%  {tf:5.0f} TF/s = {100 * tf / mm:4.1f}% mm  "
                      f"other/this {best_other * 1e3 / t:5.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
