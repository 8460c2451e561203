"""Host side of the triton backend's attention variants (docs/semantics.md): FP8 K/V scales,
sliding windows, sinks, soft-capping, ALiBi, bidirectional prefill, and the query/key
positions the window and ALiBi need.

The kernel is specialized on each variant (constexpr flags), so a plain batch compiles to
the plain kernel. Positions: a prefill/decode token i of a request with context C sits at
C + i, a tree node at C + its depth; a key slot j < C at j, a tree node's key at its node's
position (the kernel reads it from the same per-token array). The window's first key of a
row block (``window_bounds``) starts the plan's key range, so pages below every row's window
are never read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch, node_depths

from attnbench.workload.tokens import token_ids

LOG2E = math.log2(math.e)
FP8_NAMES = ("fp8_e4m3", "fp8_e5m2")


@dataclass
class Features:
    """The variant inputs of one launch (device tensors are None when the variant is off)."""

    window: int  # W, 0 without a window
    cap: float  # softcap c * log2(e), 0 without soft-capping
    sinks: Optional[torch.Tensor]  # [Hq] float32 sink logits (natural log)
    slopes: Optional[torch.Tensor]  # [Hq] float32 ALiBi slopes
    k_scale: Optional[torch.Tensor]  # [1] or [Hkv] float32 FP8 dequantization scales
    v_scale: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]  # [N] int32 query-token positions (window or ALiBi)
    bidir: bool  # some prefill is bidirectional (causal: false)

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None

    def constexprs(self) -> dict:
        """The kernel's variant flags."""
        return dict(FP8=self.fp8, SINK=self.sinks is not None, SOFTCAP=self.cap > 0,
                    ALIBI=self.slopes is not None, WINDOW=self.window > 0, BIDIR=self.bidir,
                    POSITIONS=self.positions is not None)


def window_of(batch: Batch) -> int:
    return int(getattr(batch, "window", None) or 0)


def causal_flags(batch: Batch) -> np.ndarray:
    """``[B]`` bool: False for bidirectional prefills."""
    return batch.host.causal


def features(batch: Batch, positions: Optional[torch.Tensor], bidir: Optional[bool] = None) -> Features:
    """The launch's variant inputs; ``positions``: the tokens' int32 positions already on the
    batch's device (the plan uploads them with its other tables), or None; ``bidir``: whether
    some prefill is bidirectional, when the caller knows (the plan's shape), else from the batch."""
    softcap = getattr(batch, "softcap", None)
    k_scale = getattr(batch, "k_scale", None)
    dev = batch.device

    def f32(t):
        return None if t is None else t.to(device=dev, dtype=torch.float32).contiguous()

    return Features(
        window=window_of(batch),
        cap=float(softcap) * LOG2E if softcap else 0.0,
        sinks=f32(getattr(batch, "sinks", None)), slopes=f32(getattr(batch, "alibi_slopes", None)),
        k_scale=f32(k_scale), v_scale=f32(getattr(batch, "v_scale", None)) if k_scale is not None else None,
        positions=positions,
        bidir=not causal_flags(batch).all() if bidir is None else bidir,
    )


def variants(batch: Batch) -> list[str]:
    """The attention variants the batch asks for besides an FP8 cache, in words ([] for none): the Gluon routes
    and the Triton prefill route take none of them (the paged kernel takes them all)."""
    out = ["a sliding window"] if window_of(batch) else []
    out += ["soft-capping"] if getattr(batch, "softcap", None) else []
    out += [words for attr, words in (("sinks", "sinks"), ("alibi_slopes", "ALiBi"))
            if getattr(batch, attr, None) is not None]
    return out + (["a bidirectional prefill"] if not causal_flags(batch).all() else [])


def needs_positions(batch: Batch) -> bool:
    return window_of(batch) > 0 or getattr(batch, "alibi_slopes", None) is not None


def token_positions(batch: Batch) -> np.ndarray:
    """``[N]`` int64 position of every packed query token (numpy, host): C + i, or C + depth
    for a tree node (depths by pointer doubling over the padded parents)."""
    h = batch.host
    n = int(h.query_lens.sum())
    req = np.repeat(np.arange(len(h.query_lens)), h.query_lens)
    pos = h.context_lens[req] + np.arange(n) - h.query_start_loc[req]
    t = batch.trees
    if t.tmax:
        depth = node_depths(t.parents_host)  # log2(depth) array steps, no step per node
        real = np.arange(depth.shape[1])[None, :] < t.sizes[:, None]
        ctx = np.repeat(h.context_lens[t.reqs], t.sizes)
        pos[token_ids(batch, t.reqs)] = ctx + depth[real]
    return pos


def window_bounds(positions: np.ndarray, q_start: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row block (``q_start``: its first packed token; the blocks cover the tokens in order):
    ``(win_lo, full_lo)``: the first key slot any of its rows may see and the first slot
    inside every row's window (position > p - W for every row p; a key's slot is never below
    its position, so slot bounds from positions are safe). Zeros without a window."""
    if not window:
        z = np.zeros(len(q_start), dtype=np.int64)
        return z, z
    pmin = np.minimum.reduceat(positions, q_start)
    pmax = np.maximum.reduceat(positions, q_start)
    return np.maximum(0, pmin - window + 1), np.maximum(0, pmax - window + 1)
