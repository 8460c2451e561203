"""One table from Nsight Compute's raw CSV pages (``ncu --import R.ncu-rep --page raw --csv
--print-units base``), one block per file: the counters that say which limit a kernel is at.

    python3 scripts/gpu/ncu_table.py CASE.csv ...      (scripts/gpu/gpu_triton_ncu.sh makes them)

Per kernel: its duration; DRAM throughput (% of peak, TB/s), L2 throughput and hit rate, the SM
and issue-slot throughput, the busy share of the tensor, ALU, FMA, load-store and shared pipes,
achieved vs theoretical occupancy, registers, shared memory, grid and waves, instructions,
shared-memory bank conflicts; then the warp stall reasons
(warps stalled per issued instruction, the largest first: what each warp waits on between two
instructions). A counter the report lacks prints as "-".
"""
from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

#: (label, metric name, scale, format)
SHOWN = (
    ("time us", "gpu__time_duration.sum", 1e-3, "{:.1f}"),
    ("DRAM % peak", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("DRAM TB/s", "dram__bytes.sum.per_second", 1e-12, "{:.2f}"),
    ("L2 % peak", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", 1, "{:.1f}"),
    ("SM % peak", "sm__throughput.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("issue slots % busy", "sm__issue_active.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("tensor pipe %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("ALU pipe %", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("FMA pipe %", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("LSU pipe %", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("shared pipe %", "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("theoretical occupancy %", "sm__maximum_warps_per_active_cycle_pct", 1, "{:.1f}"),
    ("registers/thread", "launch__registers_per_thread", 1, "{:.0f}"),
    ("shared KB/block (dyn)", "launch__shared_mem_per_block_dynamic", 1 / 1024, "{:.1f}"),
    ("grid", "launch__grid_size", 1, "{:.0f}"),
    ("block", "launch__block_size", 1, "{:.0f}"),
    ("waves/SM", "launch__waves_per_multiprocessor", 1, "{:.2f}"),
    ("instructions M", "smsp__inst_executed.sum", 1e-6, "{:.1f}"),
    ("cycles/issued inst (warp)", "smsp__average_warp_latency_per_inst_issued.ratio", 1, "{:.1f}"),
)
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
CONFLICT = re.compile(r"^l1tex__data_bank_conflicts_pipe_lsu_mem_shared\w*\.sum$")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def kernels(path: Path) -> list[dict[str, str]]:
    """The rows of one raw page: header row, units row, one row per profiled kernel."""
    rows = list(csv.reader(path.read_text(errors="replace").splitlines()))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return []
    head = rows[start]
    return [dict(zip(head, r)) for r in rows[start + 2:] if len(r) == len(head)]


def block(label: str, k: dict[str, str]) -> list[str]:
    out = [f"== {label}: {k.get('Kernel Name', '?')[:80]}"]
    cells = []
    for name, metric, scale, fmt in SHOWN:
        v = number(k.get(metric, ""))
        cells.append(f"{name} {'-' if v is None else fmt.format(v * scale)}")
    conflicts = [number(v) for m, v in k.items() if CONFLICT.match(m) and number(v) is not None]
    cells.append(f"shared bank conflicts {sum(conflicts):.0f}" if conflicts else "shared bank conflicts -")
    out += ["   " + "; ".join(cells[i:i + 5]) for i in range(0, len(cells), 5)]
    stalls = sorted(((number(v), STALL.match(m).group(1)) for m, v in k.items()
                     if STALL.match(m) and number(v) is not None), reverse=True)
    total = sum(v for v, _ in stalls)
    if stalls:
        out.append("   stalls (warps per issued inst, share): " + ", ".join(
            f"{r} {v:.2f} ({100 * v / total:.0f}%)" for v, r in stalls[:6] if v > 0))
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    for p in map(Path, paths):
        if not p.is_file():  # the shell passes its glob unexpanded when no case wrote a page
            print(f"== {p.name}: no raw page (the profiled run failed before ncu wrote one: see its .log)")
            continue
        ks = kernels(p)
        if not ks:
            print(f"== {p.stem}: no kernel in {p.name} (see its .log)")
        for i, k in enumerate(ks):
            print("\n".join(block(p.stem + (f" #{i}" if len(ks) > 1 else ""), k)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
