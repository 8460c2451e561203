"""What the Gluon kernels' GPU tests share (tests/test_gluon_tree_gpu.py, tests/test_gluon_mla_gpu.py)."""
import pytest
import torch


def on_hopper(kernel: str, module=None, monkeypatch=None, **consts):
    """Skip off Hopper (the Gluon ``kernel`` is written for sm_90), then set ``module``'s constants ``consts``."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the Gluon {kernel} kernel is written for Hopper (sm_90)")
    for name, value in consts.items():
        monkeypatch.setattr(module, name, value)
