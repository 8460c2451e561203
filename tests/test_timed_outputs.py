"""A backend wrong on one call in a few hundred (its 10th call zeroes a quarter of its
output) passes both full reference checks (the first call and the last timed one) but not
the checksums of every timed call."""
from __future__ import annotations

import pytest
import torch

from attnbench import backend as registry
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
        rows = {r.backend: r for r in Runner(load_text(text, "w.yaml"), RunOptions(backends=["wrong_once", "sdpa"])).rows()}
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
    off = torch.stack([good, torch.tensor([2.5, 6.0]), torch.tensor([float("nan"), 6.0])])
    assert count_differing(off, good) == (2, 3)
    assert count_differing(None, good) == (0, 0)
    assert checksum(None) is None and checksum(torch.ones(2, dtype=torch.int32)) is None
