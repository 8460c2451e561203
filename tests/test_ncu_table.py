"""scripts/gpu/gpu_triton_ncu.sh's cases and scripts/gpu/ncu_table.py's reading of ncu's raw CSV
(the GPU run itself is the device's; here: that each default case picks exactly one attnbench row
of an existing scenario, and that the table reads the counters it names)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts/gpu/gpu_triton_ncu.sh"


def _table():
    return load_script("scripts/gpu/ncu_table.py")


def _default_cases() -> list[list[str]]:
    text = SCRIPT.read_text()
    body = text[text.index("CASES=("):]
    body = body[body.index("CASES=(", 1):body.index("\n)\n")]
    return [line.split("|", 4) for line in re.findall(r'^\s+"([^"]+)"', body, re.M)]


@pytest.mark.slow
@pytest.mark.parametrize("case", _default_cases(), ids=lambda c: c[0])
def test_each_default_case_is_one_row_of_a_shipped_scenario(case):
    label, scen, rows, backend, regex = case
    path = Path(scen) if scen.endswith(".yaml") else Path("attnbench/scenarios") / f"{scen}.yaml"
    assert (ROOT / path).is_file(), path
    assert re.compile(regex)  # a valid regex for --kernel-name
    out = subprocess.run([sys.executable, "-m", "attnbench", "run", str(path), "-b", backend, "-k", rows, "--list"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "1 case(s), 1 row(s)" in out.stdout, out.stdout


def _raw_csv(tmp_path, values: dict[str, str]) -> Path:
    head = ["ID", "Process ID", "Kernel Name"] + list(values)
    units = ["", "", ""] + ["" for _ in values]
    row = ["0", "123", "paged_attention_kernel"] + list(values.values())
    p = tmp_path / "case-a.csv"
    p.write_text("==PROF== noise\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in (head, units, row)) + "\n")
    return p


def test_the_table_reads_the_counters_it_names(tmp_path):
    p = _raw_csv(tmp_path, {
        "gpu__time_duration.sum": "93,200",  # ns, with ncu's thousands separator
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "71.5",
        "dram__bytes.sum.per_second": "3,038,717,360,114.78",
        "launch__registers_per_thread": "168",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "12.5",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "3.0",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "1.0",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "0",
    })
    text = "\n".join(_table().block("case-a", _table().kernels(p)[0]))
    assert "time us 93.2" in text and "DRAM % peak 71.5" in text and "DRAM TB/s 3.04" in text
    assert "registers/thread 168" in text and "tensor pipe % 12.5" in text
    assert "SM % peak -" in text  # absent from the report
    assert "long_scoreboard 3.00 (75%), barrier 1.00 (25%)" in text and "wait" not in text.split("stalls")[1]


def test_a_file_without_a_kernel_says_so(tmp_path, capsys):
    (tmp_path / "empty.csv").write_text("==PROF== No kernels were profiled.\n")
    assert _table().main([str(tmp_path / "empty.csv")]) == 0
    assert "no kernel in empty.csv" in capsys.readouterr().out


def test_an_unexpanded_glob_says_no_page_was_written(tmp_path, capsys):
    # gpu_triton_ncu.sh passes "$RAW"/*.csv; when every profiled run failed the shell hands over the glob itself
    assert _table().main([str(tmp_path / "*.csv")]) == 0
    assert "no raw page" in capsys.readouterr().out
