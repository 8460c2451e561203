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

* on a CPU with glibc, while the correctness call runs, ``malloc`` fills every block it hands
  out with the byte ``0xFE`` (``mallopt(M_PERTURB)``; ``fresh_memory_marked``): whichever free
  chunk the allocator picks (best fit can pick one that held an earlier, correct output), an
  unwritten output holds that pattern: ``-1.69e38`` in float32 and bfloat16, a NaN with a
  payload in float16, values an attention output (a mix of V's rows) never takes.

The poison is a quiet NaN with a payload (``0x7FC0DEAD`` for float32, ``0x7FEA`` for 16-bit
types): arithmetic never produces that payload from random inputs, so an output value with
exactly these bits was never written by the backend.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Iterator, Optional

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


_M_PERTURB = -6  # glibc's mallopt parameter: fill allocated blocks with ~byte, freed ones with byte
_PERTURB_BYTE = 0x01
_FRESH = {torch.int32: -0x01010102, torch.int16: -0x0102}  # 0xFEFEFEFE and 0xFEFE, as signed ints


def count_poison(t: torch.Tensor) -> int:
    """How many values of ``t`` still hold the poison bit pattern (or, written by nobody,
    the bytes ``malloc`` filled a fresh block with under ``fresh_memory_marked``)."""
    pat = _PATTERN.get(t.dtype)
    if pat is None:
        return 0
    bits = t.contiguous().view(pat[0])
    return int(((bits == pat[1]) | (bits == _FRESH[pat[0]])).sum().item())


def _mallopt(value: int) -> bool:
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_PERTURB, value))
    except (OSError, AttributeError):  # no glibc (musl, macOS, Windows): the poisoned blocks remain
        return False


@contextlib.contextmanager
def fresh_memory_marked(device: torch.device) -> Iterator[None]:
    """On a CPU, every block ``malloc`` hands out inside the block is filled with ``0xFE``
    bytes first (and freed ones with ``0x01``): an output nobody wrote shows that pattern
    whatever memory it got. Off a CPU, or without glibc's ``mallopt``, nothing changes."""
    on = torch.device(device).type == "cpu" and _mallopt(_PERTURB_BYTE)
    try:
        yield
    finally:
        if on:
            _mallopt(0)


def poison_allocator(shape, dtype: torch.dtype, device: torch.device) -> None:
    """Fill and free blocks of ``shape``: the next allocation of that size likely gets one."""
    blocks = 1 if torch.device(device).type == "cuda" else 8
    ts = [torch.empty(shape, dtype=dtype, device=device) for _ in range(blocks)]
    for t in ts:
        poison_fill(t)
    del ts
