"""Checks of a Flex ``BlockMask`` as the fused GPU kernel reads it (issue 32).

On the CPU Flex's eager path applies the ``mask_mod`` to every query/key pair and ignores the
block lists, so a wrong list cannot show there; the Triton kernel (torch's
``_inductor/kernel/flex/templates/flex_attention.py.jinja``) reads only the listed blocks,
applies the ``mask_mod`` in partial blocks only, and finds a (batch, head)'s lists at

    KV_NUM_BLKS + (z * SPARSE_HQ + h) * stride(KV_NUM_BLKS, 1) + q_block
    KV_IDX + (z * SPARSE_HQ + h) * stride(KV_IDX, 1) + q_block * stride(KV_IDX, 2)

(the comment there: "KV_IDX and KV_NUM_BLKS are always contiguous"): the batch offset comes
from the *head* stride. A tensor whose head axis has size 1 counts as contiguous in PyTorch
whatever that axis's stride is, so a head stride of 0 (what numpy gives an axis added with
``None``) passes every contiguity check and makes every batch row read row 0's lists.

:func:`kernel_block_sets` reads the lists by that formula, :func:`effective_mask` is the mask the
kernel then applies, and :func:`emulate_kernel` runs a Flex plan with it on the CPU (eager Flex
with the effective mask as its ``mask_mod``): what the GPU computes, up to rounding. Used by
tests/test_flex_blocks.py and scripts/gpu/flex_diag.py.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def contiguous_strides(shape) -> tuple[int, ...]:
    """The row-major strides of ``shape``, size-1 axes included (what the kernel assumes)."""
    out, s = [], 1
    for n in reversed(tuple(shape)):
        out.append(s)
        s *= int(n)
    return tuple(reversed(out))


def stride_problems(bm) -> list[str]:
    """The block-mask tensors whose strides are not the row-major ones the Triton kernel's
    offset formula assumes (``is_contiguous()`` does not tell: it ignores size-1 axes)."""
    out = []
    for name in _LISTS:
        t = getattr(bm, name, None)
        if t is not None and tuple(t.stride()) != contiguous_strides(t.shape):
            out.append(f"{name}: shape {tuple(t.shape)} strides {tuple(t.stride())}, "
                       f"kernel assumes {contiguous_strides(t.shape)}")
    return out


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage from its first element on, as a 1-D tensor (a pointer's view)."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return torch.as_strided(t, (n,), (1,), t.storage_offset())


def _sets(num: torch.Tensor, idx: torch.Tensor, nkb: int, kernel: bool) -> torch.Tensor:
    """``[Z, SH, nQB, nKB]`` bool: the blocks listed for each (batch, head, query block)."""
    num, idx = num.cpu(), idx.cpu()
    z, sh, nqb = num.shape
    width = idx.shape[-1]
    zi = torch.arange(z)[:, None, None]
    hi = torch.arange(sh)[None, :, None]
    qi = torch.arange(nqb)[None, None, :]
    if kernel:  # the Triton kernel's pointer arithmetic
        hz = zi * sh + hi
        n = _flat(num)[(hz * num.stride(1) + qi).reshape(-1)].reshape(z, sh, nqb).long()
        base = hz * idx.stride(1) + qi * idx.stride(2)  # [Z, SH, nQB]
        cols = _flat(idx)[(base[..., None] + torch.arange(width)).reshape(-1)].reshape(z, sh, nqb, width)
    else:  # what the tensors say by ordinary indexing
        n = num.long()
        cols = idx
    cols = cols.long()
    valid = torch.arange(width) < n[..., None]
    out = torch.zeros(z, sh, nqb, nkb + 1, dtype=torch.bool)
    out.scatter_(3, torch.where(valid, cols.clamp(0, nkb - 1), nkb), True)
    return out[..., :nkb]


def kernel_block_sets(bm, lmax: int, kernel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partial, full)``, each ``[Z, SH, nQB, nKB]`` bool: the KV blocks each (batch, head,
    query block) reads with and without the ``mask_mod``, found as the Triton kernel finds
    them (``kernel=True``) or by indexing the tensors (``kernel=False``)."""
    nkb = -(-lmax // bm.BLOCK_SIZE[1])
    partial = _sets(bm.kv_num_blocks, bm.kv_indices, nkb, kernel)
    if bm.full_kv_num_blocks is None:
        return partial, torch.zeros_like(partial)
    return partial, _sets(bm.full_kv_num_blocks, bm.full_kv_indices, nkb, kernel)


def mask_grid(mask_mod, b: int, qmax: int, lmax: int, device: Any = "cpu") -> torch.Tensor:
    """``[B, 1, Qmax, Lmax]`` bool: the ``mask_mod`` evaluated on the whole padded grid (head 0;
    attnbench's masks do not depend on the head)."""
    bi = torch.arange(b, device=device)[:, None, None, None]
    hi = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    qi = torch.arange(qmax, device=device)[None, None, :, None]
    ki = torch.arange(lmax, device=device)[None, None, None, :]
    return torch.broadcast_to(mask_mod(bi, hi, qi, ki), (b, 1, qmax, lmax)).cpu()


def _expand(blocks: torch.Tensor, qb: int, kb: int, qmax: int, lmax: int) -> torch.Tensor:
    return blocks.repeat_interleave(qb, 2).repeat_interleave(kb, 3)[:, :, :qmax, :lmax]


def effective_mask(bm, mask_mod, b: int, qmax: int, lmax: int, kernel: bool = True,
                   grid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[B, SH, Qmax, Lmax]`` bool: the pairs the fused kernel scores: every key of a listed
    full block, the ``mask_mod``'s keys of a listed partial block, nothing elsewhere."""
    partial, full = kernel_block_sets(bm, lmax, kernel)
    qb, kb = bm.BLOCK_SIZE
    grid = mask_grid(mask_mod, b, qmax, lmax) if grid is None else grid
    sh = partial.shape[1]
    if partial.shape[0] != b:  # a broadcast batch axis
        partial, full = partial.expand(b, sh, -1, -1), full.expand(b, sh, -1, -1)
    return (_expand(partial, qb, kb, qmax, lmax) & grid) | _expand(full, qb, kb, qmax, lmax)


def mask_errors(bm, mask_mod, b: int, qmax: int, lmax: int, kernel: bool = True,
                rows: Optional[torch.Tensor] = None) -> dict:
    """Where the mask the kernel applies (:func:`effective_mask`) differs from the ``mask_mod``
    on the padded grid, on the query ``rows`` that count (``[B, Qmax]`` bool, the real ones;
    default all): ``{"hidden": [(z, q block, visible keys it never scores)], "exposed": [(z,
    q block, masked keys it scores)]}``; both empty when the lists are right."""
    grid = mask_grid(mask_mod, b, qmax, lmax, device=bm.kv_num_blocks.device)
    eff = effective_mask(bm, mask_mod, b, qmax, lmax, kernel, grid=grid)
    keep = torch.ones(b, qmax, dtype=torch.bool) if rows is None else rows.cpu()
    qb = bm.BLOCK_SIZE[0]
    out: dict = {"hidden": [], "exposed": []}
    for key, m in (("hidden", grid & ~eff), ("exposed", eff & ~grid)):
        per = m.any(1) & keep[:, :, None]  # [B, Qmax, Lmax]
        nqb = -(-qmax // qb)
        padded = torch.zeros(per.shape[0], nqb * qb, lmax, dtype=torch.bool)
        padded[:, :qmax] = per
        counts = padded.view(per.shape[0], nqb, qb, lmax).sum((2, 3))
        for zi, qi in counts.nonzero().tolist():
            out[key].append((zi, qi, int(counts[zi, qi])))
    return out


def compare_lists(a, b, lmax: int, kernel: bool = True) -> dict:
    """Where two block masks (e.g. from_kv_blocks' and create_block_mask's) disagree, per
    (batch row, query block), as the kernel reads them: ``"missing"``: kv blocks ``b`` reads
    and ``a`` does not; ``"full_vs_partial"``: blocks ``a`` reads as full where ``b`` has them
    partial (right when every real row sees all of the block: create_block_mask also counts
    the rows past Q_LEN of a last query block as masked); ``"extra"``: blocks ``a`` reads that
    ``b`` skips (time, not correctness). Lists of ``(z, q block, [kv blocks])``."""
    if tuple(a.BLOCK_SIZE) != tuple(b.BLOCK_SIZE):
        raise ValueError(f"block sizes differ: {a.BLOCK_SIZE} and {b.BLOCK_SIZE}")
    pa, fa = kernel_block_sets(a, lmax, kernel)
    pb, fb = kernel_block_sets(b, lmax, kernel)
    z = max(pa.shape[0], pb.shape[0])
    pa, fa, pb, fb = (x[:, :1].expand(z, 1, -1, -1) for x in (pa, fa, pb, fb))
    la, lb = pa | fa, pb | fb
    out: dict = {"missing": [], "full_vs_partial": [], "extra": []}
    for key, m in (("missing", lb & ~la), ("full_vs_partial", fa & pb), ("extra", la & ~lb)):
        for zi, qi in (m.any(-1)[:, 0]).nonzero().tolist():
            out[key].append((zi, qi, m[zi, 0, qi].nonzero().flatten().tolist()))
    return out


def emulate_kernel(backend, plan, kernel: bool = True) -> torch.Tensor:
    """The output the fused kernel gives for a Flex ``plan`` (from ``FlexBackend.plan`` on the
    CPU): eager Flex with the :func:`effective_mask` as its ``mask_mod`` (eager Flex applies the
    mask_mod everywhere), the plan's score_mod, sinks and unpadding unchanged."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    bm = plan.block_mask
    b, qmax, lmax = plan.q.shape[0], plan.q.shape[2], plan.k.shape[2]
    eff = effective_mask(bm, bm.mask_mod, b, qmax, lmax, kernel).to(plan.q.device)
    sh = eff.shape[1]

    def eff_mod(bi, hi, qi, ki):
        return eff[bi, hi % sh, qi, ki]

    em = create_block_mask(eff_mod, B=b, H=None, Q_LEN=qmax, KV_LEN=lmax, device=plan.q.device,
                           BLOCK_SIZE=max(qmax, lmax))
    p = type(plan)(**{**plan.__dict__, "block_mask": em, "fn": flex_attention, "kernel_options": {}})
    return backend.run(p)
