"""The device a run asks for (``auto | cpu | cuda | cuda:N``), checked against this machine."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICE_NAMES = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")


def resolve_device(name: str) -> torch.device:
    """``auto | cpu | cuda | cuda:N`` -> a torch device visible here; ValueError (a message) if not."""
    import torch  # here: `run --list` checks names with DEVICE_NAMES without torch

    if not isinstance(name, str) or not DEVICE_NAMES.match(name):
        raise ValueError(f"device {name!r}: not a device name; use auto, cpu, cuda or cuda:N (N a number)")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA device is visible here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return dev
