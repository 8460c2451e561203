"""Poison values that tell "never written" apart from "computed NaN".

A backend that returns memory it never wrote (``torch.empty`` and no kernel, or a kernel that
skips some rows) can pass a check by chance: the memory may still hold a previous correct
output. Two defences, both used by the runner and the timer:

* before the correctness call, blocks of the output's size are filled with a *poison* bit
  pattern and freed, so the allocator hands that memory to the backend's ``torch.empty``
  (reliable under the CUDA caching allocator; likely, not certain, under the CPU's malloc,
  where large blocks come back as fresh zero pages instead: an all-zero output is reported
  as never written too);
* the timer poisons the previous output before the final checked call, which catches a
  backend that returns a stale buffer.

The poison is a quiet NaN with a payload (``0x7FC0DEAD`` for float32, ``0x7FEA`` for 16-bit
types): arithmetic never produces that payload from random inputs, so an output value with
exactly these bits was never written by the backend.
"""
from __future__ import annotations

from typing import Optional

import torch

_PATTERN = {
    torch.float32: (torch.int32, 0x7FC0DEAD),
    torch.float16: (torch.int16, 0x7FEA),
    torch.bfloat16: (torch.int16, 0x7FEA),
}


def poison_fill(t: Optional[torch.Tensor]) -> None:
    """Overwrite a floating tensor with the poison (NaN for dtypes without a pattern)."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return
    pat = _PATTERN.get(t.dtype)
    if pat is not None and t.is_contiguous():
        t.view(pat[0]).fill_(pat[1])
    else:
        t.fill_(float("nan"))


def count_poison(t: torch.Tensor) -> int:
    """How many values of ``t`` still hold the poison bit pattern."""
    pat = _PATTERN.get(t.dtype)
    if pat is None:
        return 0
    return int((t.contiguous().view(pat[0]) == pat[1]).sum().item())


def poison_allocator(shape, dtype: torch.dtype, device: torch.device) -> None:
    """Fill and free blocks of ``shape``: the next allocation of that size likely gets one."""
    blocks = 1 if torch.device(device).type == "cuda" else 8
    ts = [torch.empty(shape, dtype=dtype, device=device) for _ in range(blocks)]
    for t in ts:
        poison_fill(t)
    del ts
