"""What the routes' launches share (no triton import here): the stride arguments every attention kernel takes
in the same order (``paged_attention_kernel``, ``prefill_attention_kernel``), and the split merge's second launch."""
from __future__ import annotations

import torch

from attnbench.kernels.shared import plan as tp


def io_strides(p) -> tuple[int, ...]:
    """q (token, head), K and V caches (page, slot, head), out (token, head), the partial outputs
    (split row, head, dim) and LSEs (split row, head), the block table (request): the kernels'
    stride arguments after their pointers."""
    b, q, k, v, out, po, pl = p.batch, p.batch.q, p.batch.k_cache, p.batch.v_cache, p.out, p.po, p.pl
    return (q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
            b.block_table.stride(0))


MERGE_ELEMENTS = 2048  # partial elements a merge program reads (splits x heads x d): 16 a thread


def merge_heads(heads: int, splits_p2: int, d_pad: int) -> int:
    """The merge's heads a program: as many as keep its partial tile within MERGE_ELEMENTS (a power of two)."""
    return max(1, min(tp.next_pow2(heads), MERGE_ELEMENTS // (splits_p2 * d_pad)))


def merge(p) -> torch.Tensor:
    """``merge_kernel`` (kernels/merge.py) over the plan's split rows into ``p.out`` (none: nothing to launch)."""
    if p.num_merge:
        from attnbench.kernels import merge as mk

        b, out, po, pl = p.batch, p.out, p.po, p.pl
        d_pad = tp.next_pow2(b.head_dim)
        bh = merge_heads(b.num_q_heads, p.splits_p2, d_pad)
        mk.merge_kernel[(p.num_merge, -(-b.num_q_heads // bh))](
            out, po, pl, p.merge,
            out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
            b.num_q_heads,
            HEAD_DIM=b.head_dim, SPLITS=p.splits_p2, BLOCK_D=d_pad, PAD_D=d_pad != b.head_dim, BLOCK_H=bh,
            num_warps=4,
        )
    return p.out
