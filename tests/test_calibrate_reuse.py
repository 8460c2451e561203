"""`calibrate --out DIR` reuses only runs made the same way (issue 60 item 14): runs of other
backends or another --device are refused by name (`calibrate -b flex` reported sdpa's numbers)."""
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row, Status
from attnbench.store.runfolder import RunFolder
from attnbench.workload.scenario import load_text

cli = CliRunner()
TEXT = textwrap.dedent("""\
    name: cal
    device: cpu
    model: {num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float32}
    batch: [{kind: decode, count: 1, context: 16}]
    timing: {rounds: 10}
    """)


def _runs(tmp_path: Path, backend: str, device) -> Path:
    """Two complete runs of sdpa rows in ``cal/run-00K``, recorded as made with ``-b backend``."""
    (tmp_path / "cal.yaml").write_text(TEXT)
    sf = load_text(TEXT)
    for k in (1, 2):
        rf = RunFolder.create(tmp_path, "cal", tmp_path / "cal" / f"run-{k:03d}")
        rf.start({"scenario": "cal", "scenario_path": "cal.yaml", "scenario_text": TEXT, "scenario_sha256": sf.sha256,
                  "overrides": [], "environment": {"device": "cpu test"},
                  "options": {"backends": [backend], "device": device}})
        for case in sf.cases:
            rounds = [1.0 + 0.01 * i for i in range(10)]
            rf.add(Row(RowIdentity(scenario="cal", case_id=case.case_id, backend=backend), status=Status.OK,
                       workload=RowWorkload(params=dict(case.params), batch="1 decode@16"),
                       timing=RowTiming(round_medians_ms=rounds, samples_ms=rounds, median_ms=rounds[5], n=10,
                                        timing_method="cpu")))
        rf.finish(True)
    return tmp_path / "cal"


def test_runs_of_other_backends_or_device_are_not_reused(tmp_path):
    out = _runs(tmp_path, "sdpa", None)
    base = ["calibrate", str(tmp_path / "cal.yaml"), "--runs", "2", "--out", str(out), "--format", "json"]
    for other, says in ((["-b", "flex"], "(-b sdpa, device cpu)"), (["-b", "sdpa", "--device", "cuda"], "(-b sdpa, device cpu)"), ([], "(-b sdpa, device cpu)")):
        r = cli.invoke(app, base + other)
        assert r.exit_code == 2 and "a run made with other backends or device " + says in r.output, r.output
        assert "calibrate into another --out" in r.output
    for same in (["-b", "sdpa"], ["-b", "sdpa", "--device", "cpu"]):  # made the same way: reused, nothing run
        r = cli.invoke(app, base + same)
        assert r.exit_code == 0, r.output
    assert "run 1/2" not in r.output and sorted(p.name for p in out.iterdir()) == ["run-001", "run-002"]
