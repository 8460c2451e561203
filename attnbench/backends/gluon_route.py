"""What a Gluon kernel's route note says (the triton backend's ``mode`` column): one rule for the Gluon prefill
and tree kernels, which differ only in the names they give and in what they fit."""
from __future__ import annotations

from typing import Callable


def note(p, fit: Callable[[object], str], unwanted: Callable[[object], str], hopper: Callable[[object], bool],
         ran: str, instead: str) -> str:
    """``ran`` when the Gluon kernel runs plan ``p`` (``fit(p)`` empty), else '<instead>: <why>'. Off Hopper
    (``hopper``: the caller's, which tests patch) the kernel is never a candidate: '' (the row runs what it
    always ran). Where the default plan did not shape the
    batch for the kernel, ``unwanted(p.batch)`` is the reason given, else ``fit``'s."""
    why = fit(p)
    if why and not hopper(p.batch.device):
        return ""
    if why:
        why = unwanted(p.batch) or why
    return f"{instead}: {why}" if why else ran


def refusal(batch, kernel: str, unwanted: Callable[[object], str], hopper: Callable[[object], bool]) -> str:
    """The first reason the Gluon ``kernel`` cannot run ``batch`` ('' for none yet): not a Hopper GPU, else
    ``unwanted``'s (the caller's module functions, which tests patch)."""
    if not hopper(batch.q.device):
        return f"the Gluon {kernel} kernel needs a Hopper GPU (sm_90)"
    return unwanted(batch)
