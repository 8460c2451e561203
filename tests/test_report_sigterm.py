"""Commands that write files, stopped by SIGTERM (a CI cancel), remove their partial output as
on Ctrl-C (issue 60 item 27: `report` left 69-117 MB of `.report.html.XXXX.tmp` beside the output
for 100,000 rows). `report`, `baseline`, `import` and `decide`'s exports, each killed mid-write.

The signal is sent by the command's process itself while it writes (from inside the fsync of
its temporary file): the moment a cancel could land, reached every time."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row, Status
from attnbench.store.runfolder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
TEXT = textwrap.dedent("""\
    name: r
    device: cpu
    model: {num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float32}
    batch: [{kind: decode, count: 1, context: 16}]
    """)
DRIVER = textwrap.dedent("""\
    import os, signal, sys
    real = os.fsync
    def fsync(fd):  # the page is written: now the cancel comes
        os.kill(os.getpid(), signal.SIGTERM)
        real(fd)
    os.fsync = fsync
    from typer.main import get_command
    from attnbench.cli import app
    get_command(app)(sys.argv[1:], prog_name="attnbench")
    """)


def _run_folder(tmp_path: Path) -> Path:
    from attnbench.workload.scenario import load_text

    rf = RunFolder.create(tmp_path, "r", tmp_path / "run")
    rf.start({"scenario": "r", "scenario_path": "r.yaml", "scenario_text": TEXT, "overrides": [],
              "environment": {"device": "cpu test"}})
    for case in load_text(TEXT).cases:
        rounds = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
        for backend in ("sdpa", "flex"):
            rf.add(Row(RowIdentity(scenario="r", case_id=case.case_id, backend=backend), status=Status.OK,
                       workload=RowWorkload(params=dict(case.params), batch="1 decode@16"),
                       timing=RowTiming(round_medians_ms=rounds, samples_ms=rounds, median_ms=1.0, n=8,
                                        timing_method="cpu")))
    rf.finish(True)
    return tmp_path / "run"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["report", "baseline", "import", "decide"])
def test_sigterm_while_the_output_is_written_leaves_no_partial_file(tmp_path, command):
    run = _run_folder(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"requests": [{"query_len": 1, "context_len": 3}]}\n')
    args = {"report": ["report", str(run), "-o", str(out / "report.html")],
            "baseline": ["baseline", str(run), "--to", str(out / "b.json")],
            "import": ["import", str(trace), "-o", str(out / "s.yaml")],
            "decide": ["decide", str(run), "--export-json", str(out / "d.json")]}[command]
    (tmp_path / "driver.py").write_text(DRIVER)
    r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), *args], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 143, r.stdout + r.stderr
    assert "terminated (SIGTERM)" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert list(out.iterdir()) == []  # neither the output nor its temporary file
