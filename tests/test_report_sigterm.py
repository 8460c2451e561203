"""`report` stopped by SIGTERM (a CI cancel) removes its partial page, as on Ctrl-C (issue 60
item 27: 69-117 MB of `.report.html.XXXX.tmp` were left beside the output for 100,000 rows).

The signal is sent by the report process itself while it writes the page (from inside the
fsync of its temporary file): the moment a cancel could land, reached every time."""
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


@pytest.mark.slow
def test_sigterm_while_the_page_is_written_leaves_no_partial_page(tmp_path):
    from attnbench.workload.scenario import load_text

    rf = RunFolder.create(tmp_path, "r", tmp_path / "run")
    rf.start({"scenario": "r", "scenario_path": "r.yaml", "scenario_text": TEXT, "overrides": [],
              "environment": {"device": "cpu test"}})
    for case in load_text(TEXT).cases:
        rounds = [1.0, 1.1, 0.9]
        rf.add(Row(RowIdentity(scenario="r", case_id=case.case_id, backend="sdpa"), status=Status.OK,
                   workload=RowWorkload(params=dict(case.params), batch="1 decode@16"),
                   timing=RowTiming(round_medians_ms=rounds, samples_ms=rounds, median_ms=1.0, n=3,
                                    timing_method="cpu")))
    rf.finish(True)
    out = tmp_path / "pages"
    out.mkdir()
    (tmp_path / "driver.py").write_text(DRIVER)
    r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), "report", str(tmp_path / "run"), "-o",
                        str(out / "report.html")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 143, r.stdout + r.stderr
    assert "terminated (SIGTERM)" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert list(out.iterdir()) == []  # neither the page nor its temporary file
