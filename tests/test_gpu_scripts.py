"""What the GPU validation runs, exercised on the CPU: every shipped scenario (attnbench/scenarios/gpu/
included) loads, the GPU ones run through a real backend at small head counts with every row
ok, and each check of scripts/gpu/gpu_checks.py runs to its verdicts (their thresholds are for a GPU)."""
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.scenario import load

from .scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "attnbench" / "scenarios").rglob("*.yaml"))
GPU_SCENARIOS = sorted((ROOT / "attnbench" / "scenarios" / "gpu").glob("*.yaml"))
SMALL = ["model.num_q_heads=4", "model.num_kv_heads=2", "model.head_dim=16"]


def test_every_shipped_scenario_loads():
    assert len(GPU_SCENARIOS) >= 5
    for f in SHIPPED:
        assert load(f).cases, f


@pytest.mark.slow
@pytest.mark.parametrize("path", GPU_SCENARIOS, ids=lambda p: p.stem)
def test_gpu_scenarios_run_on_the_cpu_at_small_shapes(path, tmp_path):
    out = tmp_path / "run"
    args = ["run", str(path), "--device", "cpu", "-b", "reference", "-b", "sdpa", "--out", str(out), "-q",
            "--warmup-ms", "0", "--measure-ms", "1"]
    for s in SMALL:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    cases = load(path).cases
    assert len(df) == 2 * len(cases) and set(df[df.backend == "reference"].status) == {"ok"}, df[["case_id", "status"]]
    # sdpa runs every case but FP8 attention's (model.q_dtype), which it refuses by name
    sdpa = df[df.backend == "sdpa"]
    fp8q = sdpa.case_id.str.contains("q_dtype=fp8")
    assert set(sdpa[~fp8q].status) == {"ok"}, sdpa[["case_id", "status", "reason"]]
    assert all(r.status == "skipped" and "FP8 attention" in r.reason for r in sdpa[fp8q].itertuples()), sdpa


@pytest.mark.slow
def test_gpu_checks_run_on_the_cpu(tmp_path):
    mod = load_script("scripts/gpu/gpu_checks.py", register=True)  # dataclasses look their module up there
    mod.FLUSH_REPEATS = 1
    small = [*SMALL, "timing.warmup_ms=0", "timing.measure_ms=1", "batch.0.context=64", "batch.0.count=2"]
    c = mod.Checks(tmp_path, device="cpu", overrides=small)
    for name, check in mod.CHECKS.items():
        verdicts = check(c)
        assert verdicts, name
        for v in verdicts:
            assert v.check and v.case and v.measured and v.ok in (True, False, None), (name, v)
            assert not v.measured.startswith(("error", "mismatch")), (name, v)
    # every row measured, but triton's where it cannot run (no TRITON_INTERPRET here)
    assert c.rows and all(r.status == "ok" or (r.id.backend == "triton" and r.status == "skipped") for r in c.rows)
    assert any(r.profile.kernels_per_call for r in c.rows)  # the profiler pass ran
