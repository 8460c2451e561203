"""Checksums of timed calls' outputs: a backend that is wrong on a few calls is caught.

Only the first call of a row and the last timed call are compared with the reference in
full. In between, each timed call's output gets four numbers (in float32 on the device,
queued right after the call's end event, so outside the timed region), and every one must
agree with the checked first output's:

* the sum of the values and the sum of their magnitudes, within ``RTOL`` of the magnitude
  sum: a call that leaves part of the output stale, zeroed, NaN or garbage;
* a projection on fixed pseudo-random weights, one per output position (``sum(w * x)``),
  within ``PROJ_RTOL`` of the output's L2 norm (the norm itself is the fourth number). Sums
  cannot see a permutation; the projection can: swapping two heads of an output with ``H``
  heads moves it by about ``sqrt(4 / H)`` of the norm (0.35 at 32 heads), reversing the token
  rows by about ``sqrt(2)``, while rounding noise between calls (a 16-bit output off by one
  unit in the last place everywhere) moves it by under 0.004 of the norm.

What this does not catch: an error too small to move a sum by 1e-3 of the output's
magnitude, or the projection by 1e-2 of its norm (e.g. two token rows swapped among more
than ~40k); the full reference check covers the first and the last call only.
"""
from __future__ import annotations

from typing import Optional

import torch

RTOL = 1e-3
PROJ_RTOL = 1e-2
_SEED = 0x5EED
_weights: dict = {}  # (numel, device) -> float32 weights; the last few outputs' shapes


def _weights_for(x: torch.Tensor) -> torch.Tensor:
    key = (x.numel(), str(x.device))
    w = _weights.get(key)
    if w is None:
        if len(_weights) >= 2:  # one row's output shape at a time, in practice
            _weights.pop(next(iter(_weights)))
        gen = torch.Generator(device=x.device).manual_seed(_SEED)
        w = _weights[key] = torch.randn(x.numel(), generator=gen, device=x.device, dtype=torch.float32)
    return w


def checksum(out) -> Optional[torch.Tensor]:
    """``[sum, sum of |x|, sum of w*x, ||x||_2]`` of a tensor output (on its device), or None
    for anything else."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    x = out.detach().float().reshape(-1)
    return torch.stack([x.sum(), x.abs().sum(), torch.dot(x, _weights_for(x)), torch.linalg.vector_norm(x)])


def count_differing(sums: Optional[torch.Tensor], good: Optional[torch.Tensor]) -> tuple[int, int]:
    """``(calls whose sums differ from ``good``, calls checked)``; NaN sums differ."""
    if sums is None or good is None or not len(sums):
        return 0, 0
    sums, good = sums.double().cpu(), good.double().cpu()
    tol = torch.tensor([RTOL * float(good[1].abs()), RTOL * float(good[1].abs()),
                        PROJ_RTOL * float(good[3].abs()), PROJ_RTOL * float(good[3].abs())], dtype=torch.float64)
    same = ((sums - good).abs() <= tol + 1e-30).all(dim=1)
    return int((~same).sum()), len(sums)
