"""Inputs refused by their size before they are read (issue 37 item 16): a scenario file is
checked against its 4 MiB cap while reading at most one byte past it."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.scenario import MAX_TEXT_BYTES

ROOT = Path(__file__).resolve().parents[1]
cli = CliRunner()


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.mark.slow
def test_a_huge_scenario_file_is_refused_before_it_is_read(tmp_path):
    """A 16 GiB (sparse) file under a 3 GiB address-space limit: read whole, it was a MemoryError
    traceback (a 20 GB file on a real machine; 100 MB took 36-53 s and 337 MB to refuse)."""
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(16 << 30)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (["validate", str(big)], ["run", str(big), "--list"]):
        r = subprocess.run([sys.executable, "-m", "attnbench", *cmd], capture_output=True, text=True, env=env,
                           preexec_fn=_limit_address_space)
        out = r.stdout + r.stderr
        assert r.returncode == 2, out[-2000:]
        assert f"{big}: {16 << 30} bytes; a scenario file is at most {MAX_TEXT_BYTES} bytes" in out.replace("\n", "")
        assert "Traceback" not in out


def test_a_scenario_file_one_byte_over_the_cap_is_refused(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("# " + "x" * MAX_TEXT_BYTES + "\n")
    r = cli.invoke(app, ["validate", str(p)])
    assert r.exit_code == 2 and "a scenario file is at most" in r.output, r.output[-500:]


@pytest.mark.slow
def test_a_huge_trace_line_is_refused_before_it_is_read(tmp_path):
    """Issue 60 item 10: `import` read a trace line of any size whole (a 1 GB line took 3.2 GB;
    under a 3 GB limit a MemoryError traceback). A 16 GiB sparse line under a 3 GiB limit: refused
    after reading 4 MiB of it."""
    from attnbench.workload.traces import MAX_LINE_BYTES

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.write(b'{"requests": [{"query_len": 1, "context_len": 3}]}\n')
        f.truncate(16 << 30)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "attnbench", "import", str(big), "-o", str(tmp_path / "s.yaml")],
                       capture_output=True, text=True, env=env, preexec_fn=_limit_address_space)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-2000:]
    assert f"{big}:2: a line longer than {MAX_LINE_BYTES} bytes" in out.replace("\n", "") and "Traceback" not in out
    assert not (tmp_path / "s.yaml").exists()


def test_a_trace_line_at_the_cap_is_read_and_one_byte_over_is_refused(tmp_path):
    from attnbench.workload.traces import MAX_LINE_BYTES

    step = '{"requests": [{"query_len": 1, "context_len": 3}]}'
    for pad, code in ((MAX_LINE_BYTES - len(step), 0), (MAX_LINE_BYTES - len(step) + 1, 2)):
        (tmp_path / "t.jsonl").write_text(step + " " * pad + "\n")
        r = cli.invoke(app, ["import", str(tmp_path / "t.jsonl"), "-o", str(tmp_path / f"s{code}.yaml")])
        assert r.exit_code == code and ("a line longer than" in r.output) == bool(code), r.output[-500:]
