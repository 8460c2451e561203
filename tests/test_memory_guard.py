"""Issue 25: the memory guard reads what the kernel can hand out (MemAvailable, the cgroup
limit) and counts each backend's declared working set: a backend that does not fit is a
skipped row that says why, before anything is allocated; a case whose own inputs and
reference do not fit skips every row (never an OOM kill, never error rows)."""
from pathlib import Path

import pytest
import torch

from attnbench.backend import registry
from attnbench.execute import runner as runner_mod
from attnbench.execute.memory import available_bytes, backend_bytes, reference_bytes
from attnbench.execute.runner import RunOptions, Runner
from attnbench.workload.scenario import load_text

from .test_cli import TINY


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def test_available_memory_is_memavailable_not_memfree():
    if not Path("/proc/meminfo").is_file():
        return
    got = available_bytes(torch.device("cpu"))
    assert got is not None and got <= _meminfo("MemAvailable") * 1.2
    # MemFree leaves out the page cache the kernel would reclaim: the guard must not read it
    assert got >= min(_meminfo("MemAvailable") * 0.8, got)


def test_a_backend_whose_working_set_does_not_fit_is_skipped_alone(monkeypatch):
    sf = load_text(TINY, "tiny.yaml", ["sweep={}"])
    spec = sf.cases[0].scenario.batch_spec()
    base = spec.memory_bytes() + reference_bytes(spec)
    ref_share = backend_bytes(registry.get_backend_class("reference"), spec, "cpu")
    sdpa_share = backend_bytes(registry.get_backend_class("sdpa"), spec, "cpu")
    assert sdpa_share > ref_share  # its padded K/V, scores and mask are declared
    monkeypatch.setattr(runner_mod, "_memory_available", lambda device: base + (ref_share + sdpa_share) // 2)
    rows = {r.id.backend: r for r in Runner(sf,
                                            RunOptions(backends=["reference", "sdpa"], measure_ceilings=False)).rows()}
    assert rows["reference"].status == "ok"
    assert rows["sdpa"].status == "skipped" and "working set" in rows["sdpa"].reason and "available" in rows["sdpa"].reason


class _Same(registry.Backend):
    """The reference's output, no working set of its own: the same share as the reference."""

    name = "same_share"

    def plan(self, batch):
        from attnbench.workload.reference import reference_attention

        self.out = reference_attention(batch)[0].to(batch.dtype)
        return batch

    def run(self, batch):
        return self.out.clone()


def test_rounds_add_the_shares_up(monkeypatch):
    monkeypatch.setitem(registry._EXTRA, "same_share", _Same)
    for rounds, statuses in ((1, ["ok", "ok"]), (2, ["ok", "skipped"])):
        sf = load_text(TINY.replace("min_runs: 3}", f"min_runs: 3, rounds: {rounds}}}"), "tiny.yaml", ["sweep={}"])
        spec = sf.cases[0].scenario.batch_spec()
        base = spec.memory_bytes() + reference_bytes(spec)
        share = backend_bytes(_Same, spec, "cpu")
        assert share == backend_bytes(registry.get_backend_class("reference"), spec, "cpu")
        monkeypatch.setattr(runner_mod, "_memory_available", lambda device: base + share + share // 2)
        rows = {r.id.backend: r for r in Runner(sf, RunOptions(backends=["reference", "same_share"],
                                                            measure_ceilings=False)).rows()}
        assert [rows["reference"].status, rows["same_share"].status] == statuses, (rounds, rows["same_share"].reason)


def test_a_batch_whose_masks_and_reference_need_terabytes_is_skipped_not_run():
    text = """
    name: huge
    device: cpu
    model: {num_q_heads: 1, num_kv_heads: 1, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 256}
    batch:
      - {kind: prefill, count: 60, query: 65536, context: 0}
    timing: {warmup_ms: 1, measure_ms: 1, min_runs: 1}
    """
    sf = load_text(text.replace("\n    ", "\n"), "huge.yaml")
    rows = list(Runner(sf, RunOptions(backends=["reference", "sdpa", "flex"], measure_ceilings=False)).rows())
    assert [r.status for r in rows] == ["skipped"] * 3, [r.reason for r in rows]
    assert all("needs about" in r.reason and ("TiB" in r.reason or "GiB" in r.reason) for r in rows)


@pytest.mark.slow
def test_the_guard_honours_ulimit_v(tmp_path):
    """Issue 37 item 23: the pre-check ignored RLIMIT_AS (`ulimit -v`): a 4.3 GiB case under a
    3 GiB limit was let through and became `error: DefaultCPUAllocator: can't allocate memory`
    after 11 s; now it is a skipped row saying what it needs and what is available."""
    import json
    import os
    import resource
    import subprocess
    import sys

    scen = tmp_path / "big.yaml"
    scen.write_text("name: big\nmodel: {num_q_heads: 8, num_kv_heads: 8, head_dim: 128, dtype: float32}\n"
                    "batch: [{kind: decode, count: 8, context: 16384}]\ntiming: {warmup_ms: 0.2, measure_ms: 1}\n")
    out = tmp_path / "run"
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "attnbench", "run", str(scen), "-b", "sdpa", "--out", str(out), "-q"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)},
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)))
    assert r.returncode == 0, r.stdout[-1000:] + r.stderr[-1000:]
    row = json.loads((out / "rows.jsonl").read_text().splitlines()[0])
    assert row["status"] == "skipped" and "needs about 4.3 GiB" in row["reason"] and "available on cpu" in row["reason"]
