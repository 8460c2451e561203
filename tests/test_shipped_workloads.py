"""The shipped shared-prefix and tree-cost scenarios run on the CPU through every CPU backend
against the reference (smaller heads, contexts and batch sizes than on the GPU; the same
batches' structure: shared pages, presets, variants)."""
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder
from attnbench.workload.units import parse_int

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


SCALE = 16  # contexts, shared prefixes, page sizes are cut by this (4608 -> 288, 4k -> 256): the CPU is slow


def _cut(value):
    return parse_int(value) // SCALE


def shrink(name: str, tmp_path: Path, **sweep) -> Path:
    doc = yaml.safe_load((ROOT / "attnbench" / "scenarios" / name).read_text())
    for g in doc["batch"]:
        for key in ("context", "shared_prefix"):
            if key in g:
                g[key] = _cut(g[key])
    doc["kv_cache"]["page_size"] = max(1, doc["kv_cache"]["page_size"] // SCALE)
    for key, values in doc["sweep"].items():
        if key.endswith((".context", ".shared_prefix", ".page_size")):
            doc["sweep"][key] = [_cut(v) for v in values]
    doc["model"] = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "dtype": "float32"}
    doc["device"] = "cpu"
    doc["timing"] = {"warmup_ms": 0, "measure_ms": 1, "min_runs": 1, "max_runs": 2}
    doc["sweep"].update(sweep)
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, sweep, cases",
    [
        ("shared-prefix-decode-llama3-8b.yaml", {}, 4),
        ("shared-prefix-trees-llama3-8b.yaml", {}, 4),
        ("tree-costs-llama3-8b.yaml", {"batch.0.count": [1, 3]}, 6),
    ],
)
def test_shipped_scenario_on_cpu(name, sweep, cases, tmp_path):
    p = shrink(name, tmp_path, **sweep)
    r = runner.invoke(app, ["run", str(p), "-q", "-b", "reference", "-b", "sdpa", "-b", "flex", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    rows = RunFolder.load(tmp_path / "run").rows
    assert len(rows) == 3 * cases and all(x.status == "ok" for x in rows), [(x.id.case_id, x.reason) for x in rows]
    assert all(x.correctness.rel_err < x.correctness.tolerance for x in rows)
    if "shared" in name:  # the shared case moves fewer bytes than the same batch unshared
        by = {(x.workload.params["batch.0.shared_prefix"], x.workload.params["kv_cache.page_size"]): x.roofline.bytes for x in rows}
        for page in (16 // SCALE, 256 // SCALE):
            assert by[(4096 // SCALE, page)] < by[(0, page)]
