"""Inputs nobody else touched: each backend gets its own copy of a case's tensors, and a
backend that writes into its inputs, or returns an output that aliases one, is caught.

The runner keeps one *pristine* batch per case (the reference reads it; no backend ever
sees it) and hands every backend a fresh clone. After the backend's last call (its checked
run, its timing rounds, its profile) the clone is compared with the pristine batch tensor by
tensor (``torch.equal``: exact, one read of each, outside every timed region). A difference
makes that backend's row an ``error`` naming the tensors it modified; the backends after it
read their own clones, so they are unaffected, and so is a thread the culprit left writing.
An output whose storage overlaps an input's is an error too: the next call (or the next
backend) would change it behind the check.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.mla import is_mla

#: the tensor fields of a Batch that backends read (the metadata a backend must not change too)
INPUT_FIELDS = (
    "q", "k_cache", "v_cache", "block_table", "query_start_loc", "query_lens", "context_lens", "kv_lens",
    "k_scale", "v_scale", "sinks", "alibi_slopes",  # None unless the batch uses FP8 / sinks / ALiBi
    "q_fp8", "q_scale",  # None without FP8 attention (model.q_dtype)
)


def clone_batch(batch: Batch) -> Batch:
    """A deep copy of the batch's tensors on the same device; host metadata is shared
    (it is immutable: the spec and its requests are frozen dataclasses)."""
    fields = {f: getattr(batch, f).clone() for f in INPUT_FIELDS if getattr(batch, f) is not None}
    if is_mla(batch):  # the values stay a view of the latent cache
        fields["v_cache"] = fields["k_cache"][..., : batch.v_head_dim]
    return dataclasses.replace(batch, **fields, _masks={})


def modified_inputs(pristine: Batch, used: Batch) -> list[str]:
    """Names of the input tensors ``used`` no longer holds bit-for-bit as ``pristine`` does."""
    out = []
    for f in INPUT_FIELDS:
        a, b = getattr(pristine, f), getattr(used, f)
        if a is None or b is None:
            if a is not b:
                out.append(f)
            continue
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or not torch.equal(_bits(a), _bits(b)):
            out.append(f)
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so that a NaN written over a value compares unequal to itself)."""
    if not t.is_floating_point() or not t.numel():
        return t
    return t.contiguous().view(-1).view(torch.uint8)


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def aliased_inputs(out, batch: Batch) -> list[str]:
    """Input tensors whose memory the output shares (a view of q, a slice of the cache...)."""
    if not isinstance(out, torch.Tensor) or out.device != batch.device or not out.untyped_storage().nbytes():
        return []
    o0, o1 = _span(out)
    names = []
    for f in INPUT_FIELDS:
        t = getattr(batch, f)
        if t is None or not t.untyped_storage().nbytes():
            continue
        i0, i1 = _span(t)
        if o0 < i1 and i0 < o1:
            names.append(f)
    return names


def input_problem(pristine: Batch, used: Optional[Batch], when: str = "") -> Optional[str]:
    """The ``error`` reason for a backend that modified its inputs, or None."""
    if used is None:
        return None
    if used.device.type == "cuda":
        torch.cuda.synchronize(used.device)
    changed = modified_inputs(pristine, used)
    if not changed:
        return None
    return f"modified its inputs ({', '.join(changed)}){' ' + when if when else ''}"
