"""Checksums of timed calls' outputs: a backend that is wrong on a few calls is caught.

Only the first call of a row and the last timed call are compared with the reference in
full. In between, each timed call's output gets two sums (of the values and of their
magnitudes, in float32 on the device, queued right after the call's end event, so outside the
timed region) and every one must agree with the checked first output's within ``RTOL`` of its
magnitude sum. What this catches: a call that leaves part of the output stale, zeroed,
NaN or garbage. What it does not: an error too small to move a sum by 1e-3 of the output's
magnitude (the full reference check covers the first and the last call only).
"""
from __future__ import annotations

from typing import Optional

import torch

RTOL = 1e-3


def checksum(out) -> Optional[torch.Tensor]:
    """``[sum, sum of |x|]`` of a tensor output (on its device), or None for anything else."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    x = out.detach().float()
    return torch.stack([x.sum(), x.abs().sum()])


def count_differing(sums: Optional[torch.Tensor], good: Optional[torch.Tensor]) -> tuple[int, int]:
    """``(calls whose sums differ from ``good``, calls checked)``; NaN sums differ."""
    if sums is None or good is None or not len(sums):
        return 0, 0
    sums, good = sums.double().cpu(), good.double().cpu()
    tol = RTOL * (float(good[1].abs()) + 1e-30)
    same = ((sums - good).abs() <= tol).all(dim=1)
    return int((~same).sum()), len(sums)
