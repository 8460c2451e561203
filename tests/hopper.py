"""What the Gluon kernels' GPU tests share (tests/test_gluon_tree_gpu.py, tests/test_gluon_mla_gpu.py,
tests/test_gluon_decode_gpu.py): the Hopper skip, the launch counter, the run against the reference."""
import pytest
import torch

from attnbench.workload.reference import compare, reference_attention


def on_hopper(kernel: str, module=None, monkeypatch=None, **consts):
    """Skip off Hopper (the Gluon ``kernel`` is written for sm_90), then set ``module``'s constants ``consts``."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the Gluon {kernel} kernel is written for Hopper (sm_90)")
    for name, value in consts.items():
        monkeypatch.setattr(module, name, value)


def count_launches(monkeypatch, module, what) -> list:
    """``module.run`` (a Gluon kernel's launch) wrapped so each launch appends ``what(plan)`` to the list returned."""
    seen = []
    real = module.run

    def counting(p):
        seen.append(what(p))
        return real(p)

    monkeypatch.setattr(module, "run", counting)
    return seen


def matches_reference(be, plan, batch, launches, runs: int):
    """``runs`` runs of ``plan`` by backend ``be``, the output NaN-filled first (every element must be written), each
    against the reference within 1e-2, the Gluon kernel launched (``launches`` not empty); returns the plan."""
    ref = reference_attention(batch)[0]
    for _ in range(runs):
        plan.out.fill_(float("nan"))
        out = be.run(plan)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        rel = compare(out, ref)[0]
        assert launches and rel < 1e-2, (launches, rel)
    return plan
