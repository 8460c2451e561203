"""scripts/gpu/tree_timeline.py's arithmetic on the CPU: stamps written as the Gluon tree kernel would write them
(triton_tree_gluon.CLOCKS, gluon_clocks' rows) for a real plan of 8 x 40-node trees, with known intervals, read back
as the medians it prints; and its refusal without a Hopper GPU."""
import importlib.util
from pathlib import Path

import pytest
import torch

from attnbench.kernels.tree import gluon as tree
from attnbench.backends.triton import TritonBackend
from attnbench.kernels.shared.plan import COL

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("tree_timeline", ROOT / "scripts" / "gpu" / "tree_timeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plan(monkeypatch):
    monkeypatch.setattr(tree, "hopper", lambda device: True)  # the plan shaped for the Gluon kernel on the CPU
    plan = TritonBackend().plan(_script().batch_of(1000, 16, False, device="cpu"))
    assert tree.RAN in plan.mode, plan.mode
    return plan


# ns of each step (the SM at 2000 MHz: 2 cycles a ns)
SETUP, Q, FIRST, TILE, MASKED, END = 500, 1900, 1700, 1250, 2000, 1300


def _stamps(plan, skew_ns: int = 256) -> torch.Tensor:
    units = plan.units
    n_kv = plan.batch.num_kv_heads
    last = tree.warpgroups(plan) - 1
    clk = torch.zeros(units.shape[0] * n_kv, 4, 16, dtype=torch.int64)
    for w in range(clk.shape[0]):
        u = units[w // n_kv]
        lo, hi, full = (int(u[COL[c]]) for c in ("kv_lo", "kv_hi", "full_end"))
        n = -(-(hi - lo) // 64)
        n_full = min(max(full - lo, 0) // 64, n)
        start = 10_000 + (w % 3) * skew_ns
        times = {(3, 2): start}
        t = start + SETUP
        for part in range(last + 1):
            steps = [t, t + Q, t + Q + FIRST]
            steps.append(steps[-1] + (n_full - 1) * TILE)
            steps.append(steps[-1] + (n - n_full) * MASKED)
            steps.append(steps[-1] + END)
            for slot, at in enumerate(steps):
                times[(part, slot)] = at
        for (row, slot), at in times.items():
            clk[w, row, slot] = at
            clk[w, row, 8 + slot] = 2 * at  # cycles
    return clk


def test_intervals_read_back_the_steps_the_stamps_hold(monkeypatch):
    tl = _script()
    plan = _plan(monkeypatch)
    r = tl.intervals(_stamps(plan), plan)
    assert r["programs"] == plan.units.shape[0] * 8
    assert r["mhz"] == pytest.approx(2000)
    for key, ns in (("setup", SETUP), ("q", Q), ("first", FIRST), ("tile", TILE), ("end", END)):
        assert r[key] == pytest.approx(ns / 1e3), key
    assert r["masked"] == pytest.approx(MASKED / 1e3)  # (the split holding the tree's nodes)
    starts = torch.tensor([(w % 3) * 0.256 for w in range(r["programs"])], dtype=torch.float64)
    assert r["start_max"] == pytest.approx(0.512) and r["start_med"] == pytest.approx(float(starts.median()))
    assert r["kernel"] == pytest.approx(float((_stamps(plan)[:, :3, 5].max() - 10_000) / 1e3))


def test_a_program_without_rows_is_left_out_of_the_medians(monkeypatch):
    tl = _script()
    plan = _plan(monkeypatch)
    clk = _stamps(plan)
    clk[0, :3, :] = 0  # its partitions never ran a row (a decode's unit hands the slots back only)
    clk[0, :3, 8:] = 0
    r = tl.intervals(clk, plan)
    assert r["q"] == pytest.approx(Q / 1e3)


def test_it_refuses_without_a_hopper_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert _script().main([]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err
