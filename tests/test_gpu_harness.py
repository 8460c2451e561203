"""GPU-only checks of the timer and the harness (run on the GPU machine: pytest -m gpu)."""
import pytest
import torch

from attnbench.workload.batch import Request
from attnbench.workload.reference import compare, reference_attention
from attnbench.measure.timing import TimingConfig, time_run

from .conftest import make_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_graph_timing_and_poisoned_output_check():
    from attnbench.backends.sdpa import SdpaBackend

    b = make_batch([Request("decode", 1, 1000)] * 4, hq=8, hkv=2, d=64, dtype="bfloat16", page_size=16, device="cuda")
    be = SdpaBackend()
    plan = be.plan(b)
    res = time_run(lambda: be.run(plan), b.device, TimingConfig(warmup_ms=2, measure_ms=10))
    assert res.method == "cuda-graph" and res.cold_l2
    ref, _ = reference_attention(b)
    assert compare(res.output, ref)[0] < 2e-2


def test_uncapturable_falls_back_to_events():
    calls = []

    def run():
        calls.append(1)
        x = torch.ones(4, device="cuda")
        x.sum().item()  # a host sync cannot be captured
        return x

    res = time_run(run, torch.device("cuda"), TimingConfig(warmup_ms=1, measure_ms=2))
    assert res.method == "cuda-events" and "capture failed" in res.note


def test_stale_graph_output_is_caught():
    buf = torch.ones(8, device="cuda")

    def run():
        return buf  # nothing is ever written: the poisoned replay shows it

    res = time_run(run, torch.device("cuda"), TimingConfig(warmup_ms=1, measure_ms=2))
    assert torch.isnan(res.output).all()


def test_isolate_in_rounds_blames_the_kernel_that_faulted(tmp_path):
    """--isolate, timing.rounds 2: an illegal memory access of the second backend is its own
    error row, and the backends around it are measured in a fresh process (the faulted CUDA
    context is not reused)."""
    from pathlib import Path

    import pandas as pd
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    from .test_cli import TINY

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY.replace("device: cpu", "device: cuda"))
    out = tmp_path / "run"
    wild = str(Path(__file__).with_name("gpu_misbehaving_backends.py"))
    r = CliRunner().invoke(app, [
        "run", str(scenario), "--out", str(out), "--set", "sweep={}", "--set", "timing.rounds=2", "--isolate",
        "--backend-file", wild, "-b", "sdpa", "-b", "wild", "-b", "reference", "-q",
    ])
    assert r.exit_code == 1, r.output
    by = {row.backend: row for row in pd.read_csv(out / "results.csv", keep_default_na=False).itertuples()}
    assert set(by) == {"sdpa", "wild", "reference"}
    assert by["wild"].status == "error", by["wild"].reason
    for good in ("sdpa", "reference"):
        assert by[good].status == "ok", (good, by[good].reason)
