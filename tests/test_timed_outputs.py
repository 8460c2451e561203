"""A backend wrong on one call in a few hundred (its 10th call zeroes a quarter of its
output) passes both full reference checks (the first call and the last timed one) but not
the checksums of every timed call."""
from __future__ import annotations

import pytest
import torch

from attnbench.backend import registry
from attnbench.execute.runner import RunOptions, Runner
from attnbench.measure.checksum import checksum, count_differing
from attnbench.workload.scenario import load_text

from . import misbehaving_backends as mb
from .test_inputs_guard import SCENARIO


class WrongOnce(mb.WrongSometimes):
    """With no warm-up, call 1 is the checked one, 2-3 estimate the cost, the timed calls
    follow (>= 200 of them): call 10 is a timed call, never the final checked one."""

    name = "wrong_once"

    def run(self, batch):
        type(self).calls += 1
        o = self.out.clone()
        if type(self).calls == 10:
            o[: max(1, o.shape[0] // 4)] = 0
        return o


@pytest.mark.parametrize("rounds", [1, 3])
def test_one_wrong_timed_call_is_a_mismatch(rounds):
    registry.register(WrongOnce)
    try:
        WrongOnce.calls = 0
        text = SCENARIO.replace("ROUNDS", str(rounds)).replace(
            "warmup_ms: 1, measure_ms: 4, min_runs: 3", "warmup_ms: 0, measure_ms: 1, min_runs: 600"
        )
        rows = {r.id.backend: r for r in Runner(load_text(text, "w.yaml"),
                                                RunOptions(backends=["wrong_once", "sdpa"])).rows()}
    finally:
        registry._EXTRA.pop("wrong_once", None)
    bad = rows["wrong_once"]
    assert bad.status == "mismatch", (bad.status, bad.reason)
    assert "timed calls returned an output whose checksum differs" in bad.reason
    assert rows["sdpa"].status == "ok"


def test_count_differing():
    good = checksum(torch.tensor([1.0, -2.0, 3.0]))
    same = torch.stack([good, good * (1 + 1e-5)])
    assert count_differing(same, good) == (0, 2)
    off = torch.stack([good, checksum(torch.tensor([1.0, -2.0, 3.5])), checksum(torch.tensor([float("nan"), -2.0, 3.0]))])
    assert count_differing(off, good) == (2, 3)
    assert count_differing(None, good) == (0, 0)
    assert checksum(None) is None and checksum(torch.ones(2, dtype=torch.int32)) is None


class Permutes(mb._Good):
    """Right on the checked calls; on its 10th call (a timed one, never the final checked
    one: see WrongOnce) its output comes back with two heads swapped (``mode`` heads) or its
    token rows reversed (``rows``): the sums of the values and of their magnitudes stay the
    same, so only a position-weighted check sees it."""

    name = "permutes"
    mode = "heads"
    calls = 0

    def run(self, batch):
        type(self).calls += 1
        o = self.out.clone()
        if type(self).calls == 10:
            o = o[:, [1, 0, *range(2, o.shape[1])]].contiguous() if self.mode == "heads" else o.flip(0).contiguous()
        return o


@pytest.mark.parametrize("mode", ["heads", "rows"])
def test_a_permuted_output_on_some_timed_calls_is_a_mismatch(mode, monkeypatch):
    registry.register(Permutes)
    monkeypatch.setattr(Permutes, "mode", mode)
    monkeypatch.setattr(Permutes, "calls", 0)
    try:
        text = SCENARIO.replace("ROUNDS", "1").replace(
            "warmup_ms: 1, measure_ms: 4, min_runs: 3", "warmup_ms: 0, measure_ms: 1, min_runs: 600")
        rows = {r.id.backend: r for r in Runner(load_text(text, "p.yaml"),
                                                RunOptions(backends=["permutes", "sdpa"])).rows()}
    finally:
        registry._EXTRA.pop("permutes", None)
    bad = rows["permutes"]
    assert bad.status == "mismatch", (bad.status, bad.reason)
    assert "timed calls returned an output whose checksum differs" in bad.reason
    assert rows["sdpa"].status == "ok"


def test_the_checksum_sees_permutations_and_not_rounding():
    torch.manual_seed(0)
    out = torch.randn(40, 32, 128).to(torch.bfloat16)
    good = checksum(out)
    swapped = out[:, [1, 0, *range(2, 32)]]
    one_ulp = (out.float() * (1 + 2.0 ** -8 * torch.randint(-1, 2, out.shape))).to(torch.bfloat16)
    sums = torch.stack([checksum(swapped), checksum(out.flip(0)), checksum(one_ulp), checksum(out.clone())])
    assert count_differing(sums[:2], good) == (2, 2)
    assert count_differing(sums[2:], good) == (0, 2)
