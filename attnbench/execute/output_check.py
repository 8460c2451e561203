"""A backend's output against the reference: the checks every output passes, in order
(a tensor, its shape, dtype and device, never-written values, NaN/Inf, all zeros, the tolerance)."""
from __future__ import annotations

import torch

from attnbench.measure.mismatch import mismatch_where
from attnbench.measure.poison import count_poison
from attnbench.store.rows import Status
from attnbench.workload.batch import Batch
from attnbench.workload.reference import compare


def check_output(out, ref: torch.Tensor, batch: Batch, tol: float) -> tuple[Status, str, float, float]:
    """-> (status, reason, rel_err, max_abs_err) of a backend output against the reference."""
    if not isinstance(out, torch.Tensor):
        return Status.MISMATCH, f"run() returned {type(out).__name__}, not a tensor", float("nan"), float("nan")
    if tuple(out.shape) != tuple(batch.out_shape):
        return Status.MISMATCH, f"wrong shape {list(out.shape)}, expected {list(batch.out_shape)}", float("nan"), float("nan")
    if out.dtype != batch.out_dtype:
        return Status.MISMATCH, f"wrong dtype {out.dtype}, expected {batch.out_dtype}", float("nan"), float("nan")
    if not same_device(out.device, batch.device):  # a meta tensor's values cannot even be read
        return Status.MISMATCH, f"output on the wrong device: {out.device}, expected {batch.device}", float("nan"), float("nan")
    unwritten = count_poison(out)
    if unwritten:
        return (
            Status.MISMATCH,
            f"output never written: {unwritten} of {out.numel()} values still hold the NaN poison (or malloc's fill of "
            "fresh memory) put there before the call",
            float("inf"), float("inf"),
        )
    out = batch.output_values(out)  # an FP8 output (model.out_dtype) times its scale
    bad = (~torch.isfinite(out)).sum().item()
    if bad:
        return Status.MISMATCH, f"output has {bad} NaN/Inf values of {out.numel()}", float("inf"), float("inf")
    if out.numel() and not out.any() and ref.any():
        return Status.MISMATCH, "output never written: every value is 0 (fresh memory?)", float("inf"), float("inf")
    rel, mx = compare(out, ref)
    if not rel <= tol:
        where = mismatch_where(out, ref, batch.query_start_loc, [q.kind for q in batch.spec.requests], tol)
        return Status.MISMATCH, f"relative error {rel:.3g} exceeds tolerance {tol:.3g}" + (f"; {where}" if where else ""), rel, mx
    return Status.OK, "", rel, mx


def same_device(a: torch.device, b: torch.device) -> bool:
    """One device (an index left out is the current one: ``cuda`` and ``cuda:0`` match)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
