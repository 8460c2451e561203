"""Statistics, the CPU timer and its fallbacks, and FLOP/byte counts against hand-computed batches."""
import math
import time

import pytest
import torch

from attnbench.workload.batch import BatchSpec, Request
from attnbench.measure.metrics import Ceilings, allowed_pairs, roofline, work_of
from attnbench.measure.stats import Summary, quantile
from attnbench.measure.timing import TimingConfig, _counts, time_host, time_run


def test_summary():
    s = Summary.of([5.0, 1.0, 2.0, 4.0, 3.0])
    assert s.n == 5 and s.median == 3.0 and s.min == 1.0 and s.mean == 3.0
    assert s.p20 == pytest.approx(1.8) and s.p80 == pytest.approx(4.2)
    assert s.iqr_rel == pytest.approx((4.0 - 2.0) / 3.0)
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert math.isnan(Summary.of([]).median)


def test_budgets_become_counts():
    cfg = TimingConfig(warmup_ms=10, measure_ms=100, min_runs=5, max_runs=1000)
    assert _counts(1.0, cfg) == (10, 100)
    assert _counts(50.0, cfg) == (1, 5)  # min_runs wins
    assert _counts(1e-6, cfg)[1] == 1000  # max_runs wins


def test_unset_min_runs_is_bounded_by_the_budget():
    """Without min_runs, 5 calls at least, but never more than fit in twice the budget: a
    40 ms row under a 10 ms budget is timed once (the estimate call was its warm-up)."""
    cfg = TimingConfig(warmup_ms=2, measure_ms=10)
    assert _counts(40.0, cfg) == (1, 1)
    assert _counts(3.0, cfg) == (1, 5)  # 5 calls = 15 ms fit in 20
    assert _counts(6.0, cfg) == (1, 3)  # 3 calls fit in 20 ms, 5 would not
    assert _counts(0.5, cfg) == (4, 20)  # the budget decides
    assert _counts(40.0, TimingConfig(warmup_ms=2, measure_ms=10, min_runs=5)) == (1, 5)  # set: a hard floor


def test_cpu_timer_keeps_raw_samples_and_poisons_before_the_final_call():
    calls = []
    buf = torch.ones(4)

    def run():
        calls.append(1)
        return buf  # never rewritten: the poisoned final output shows it

    res = time_run(run, torch.device("cpu"), TimingConfig(warmup_ms=0, measure_ms=1, min_runs=7, max_runs=7))
    assert res.method == "cpu" and res.cold_l2 is False
    assert len(res.samples_ms) == 7 and all(x >= 0 for x in res.samples_ms)
    assert torch.isnan(res.output).all()
    assert len(calls) == 1 + 7  # the estimate, the samples (the last one poisoned first); no warm-up budget
    calls.clear()
    buf.fill_(1.0)
    # a warm-up budget the estimate call alone covers buys no more calls
    time_run(lambda: (calls.append(1), time.sleep(0.002), buf)[-1], torch.device("cpu"),
             TimingConfig(warmup_ms=1, measure_ms=1, min_runs=3, max_runs=3))
    assert len(calls) == 1 + 3


def test_cpu_timer_output_of_an_honest_run():
    x = torch.randn(8)
    res = time_run(lambda: x * 2, torch.device("cpu"), TimingConfig(warmup_ms=1, measure_ms=2))
    assert torch.equal(res.output, x * 2)


def test_time_host_samples():
    s = time_host(lambda: sum(range(1000)), torch.device("cpu"), budget_ms=1, max_runs=5)
    assert 1 <= len(s) <= 5
    slow = time_host(lambda: time.sleep(0.02), torch.device("cpu"), budget_ms=10, max_runs=20)
    assert len(slow) == 1  # one sample spends the budget: no more
    fast = time_host(lambda: None, torch.device("cpu"), budget_ms=1000, max_runs=7)
    assert len(fast) == 7


def test_gpu_timing_falls_back_to_cpu_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    res = time_run(lambda: torch.ones(2), torch.device("cpu"), TimingConfig(measure_ms=1))
    assert res.method == "cpu"


def spec(reqs, hq=4, hkv=2, d=8, dtype="bfloat16", ps=4):
    return BatchSpec(tuple(reqs), hq, hkv, d, dtype, ps, "contiguous")


def test_flops_by_hand():
    # decode over 10 cached tokens: 1 query sees 11 keys
    assert allowed_pairs(spec([Request("decode", 1, 10)])) == 11
    # prefill of 3 with context 2: 3 + 4 + 5 keys
    assert allowed_pairs(spec([Request("prefill", 3, 2)])) == 12
    # tree [-1, 0, 0, 1] with context 5: every node sees 5 + its depth + 1
    assert allowed_pairs(spec([Request("tree", 4, 5, (-1, 0, 0, 1))])) == 4 * 5 + (1 + 2 + 2 + 3)
    w = work_of(spec([Request("prefill", 3, 2)], hq=4, d=8))
    assert w.flops == 12 * 4 * 4 * 8


def test_bytes_by_hand():
    s = spec([Request("decode", 1, 10), Request("tree", 4, 5, (-1, 0, 0, 1))], hq=4, hkv=2, d=8, dtype="bfloat16", ps=4)
    kv = 2 * (11 + 9) * 2 * 8 * 2  # K and V, kv_len slots, Hkv, D, 2 bytes
    qo = 2 * 5 * 4 * 8 * 2
    table = 4 * (3 + 3)  # ceil(11/4) + ceil(9/4) int32 entries
    lens = 4 * 3 * 2
    tree = 4 * 4
    w = work_of(s)
    assert w.bytes == kv + qo + table + lens + tree


def test_roofline():
    from attnbench.measure.metrics import Work

    w = Work(flops=int(1e12), bytes=int(1e9))
    c = Ceilings("x", copy_tbps=2.0, matmul_tflops={"bfloat16": 500.0})
    r = roofline(w, 4.0, c, "bfloat16")  # mem floor 0.5 ms, compute floor 2 ms
    assert r.bound == "compute" and r.floor_ms == pytest.approx(2.0)
    assert r.pct_of_ceiling == pytest.approx(50.0)
    assert r.tflops == pytest.approx(250.0) and r.tbps == pytest.approx(0.25)
    r2 = roofline(w, 4.0, None, "bfloat16")
    assert math.isnan(r2.pct_of_ceiling) and r2.tbps == pytest.approx(0.25)


def test_runner_timing_config_keeps_each_field():
    """The scenario's timing settings reach TimingConfig by name (a positional call once put
    cuda_graphs into the new ``flush`` field, and every GPU row failed in the L2 flusher)."""
    from attnbench.execute.options import RunOptions
    from attnbench.execute.runner import Runner
    from attnbench.workload.scenario import load_text

    text = (
        "name: t\nseed: 0\ndevice: cpu\nmodel: {num_q_heads: 2, num_kv_heads: 1, head_dim: 8, dtype: float32}\n"
        "batch:\n  - {kind: decode, count: 1, context: 4}\n"
        "timing: {warmup_ms: 3, measure_ms: 7, min_runs: 2, max_runs: 9, cold_l2: false, cuda_graphs: false, rounds: 2}\n"
    )
    sf = load_text(text)
    cfg = Runner(sf, RunOptions(measure_ceilings=False, backends=["sdpa"])).timing_config(sf.cases[0])
    assert (cfg.warmup_ms, cfg.measure_ms, cfg.min_runs, cfg.max_runs) == (3, 7, 2, 9)
    assert (cfg.cold_l2, cfg.cuda_graphs, cfg.rounds, cfg.flush) == (False, False, 2, "read")


def test_one_timing_model_scenario_cli_manifest_rows(tmp_path):
    """timing.flush is settable in the scenario and with --flush; the override is recorded in
    the manifest and each row's re-run command and read back by --resume's checks; the
    scenario's defaults are the timer's (written once, in workload.timing_spec)."""
    import json

    from typer.testing import CliRunner

    from attnbench.cli.app import app
    from attnbench.execute.options import RunOptions
    from attnbench.execute.runner import Runner
    from attnbench.store.options import options_from_json
    from attnbench.workload.scenario import Timing, load_text
    from attnbench.workload.timing_spec import DEFAULTS

    assert Timing().config() == DEFAULTS
    text = (
        "name: t\nseed: 0\ndevice: cpu\nmodel: {num_q_heads: 2, num_kv_heads: 1, head_dim: 8, dtype: float32}\n"
        "batch:\n  - {kind: decode, count: 1, context: 4}\ntiming: {flush: write, measure_ms: 2}\n"
    )
    sf = load_text(text)
    assert Runner(sf, RunOptions(measure_ceilings=False, backends=["sdpa"])).timing_config(sf.cases[0]).flush == "write"
    opts = RunOptions(measure_ceilings=False, backends=["sdpa"], timing_overrides={"flush": "write+read"})
    assert Runner(sf, opts).timing_config(sf.cases[0]).flush == "write+read"
    (tmp_path / "t.yaml").write_text(text)
    cli = CliRunner()
    r = cli.invoke(app, ["run", str(tmp_path / "t.yaml"), "-b", "sdpa", "--flush", "read", "--out", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert man["options"]["timing_overrides"] == {"flush": "read"}
    row = json.loads((tmp_path / "o" / "rows.jsonl").read_text().splitlines()[0])
    assert "--flush read" in row["repro"] and row["flush"] == ""  # a CPU row: no L2 was flushed
    r = cli.invoke(app, ["run", str(tmp_path / "t.yaml"), "--flush", "zero", "--out", str(tmp_path / "p"), "-q"])
    assert r.exit_code == 2 and "--flush zero" in r.output and "read, write, write+read" in r.output, r.output
    with pytest.raises(ValueError, match="timing_overrides"):
        options_from_json({"timing_overrides": {"flush": 3}})
