"""What the Gluon kernels' GPU tests share (tests/test_gluon_*_gpu.py): the Hopper skip and a route's run
against the reference."""
import pytest
import torch

from attnbench.workload.reference import compare, reference_attention


def on_hopper(kernel: str) -> None:
    """Skip off Hopper (the Gluon ``kernel`` is written for sm_90)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the Gluon {kernel} kernel is written for Hopper (sm_90)")


def check_route(route: str, batch, *, tuning=None, runs: int = 1, auto: bool = False, **options):
    """``batch`` planned by the triton backend with ``route`` forced (``auto``: selected by auto) and ``options``,
    the plan's route asserted, then launched ``runs`` times (with the route module's ``tuning``, None: its
    defaults), the output NaN-filled first (every element must be written), each against the reference within
    1e-2; returns the plan."""
    from attnbench.backends.triton import TritonBackend

    be = TritonBackend(**options) if auto else TritonBackend(route=route, **options)
    assert be.unsupported(batch) == [], be.unsupported(batch)
    plan = be.plan(batch)
    assert plan.route.name == route, plan.mode
    launch = plan.route.launch if tuning is None else (lambda p: plan.route.launch(p, tuning))
    ref = reference_attention(batch)[0]
    for _ in range(runs):
        plan.out.fill_(float("nan"))
        out = launch(plan)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        rel = compare(out, ref)[0]
        assert rel < 1e-2, (route, rel)
    return plan
