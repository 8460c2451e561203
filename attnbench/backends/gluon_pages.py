"""A key tile's pages by TMA, shared by the Gluon kernels that read a paged cache (gluon_tree_kernels.py,
gluon_mla_kernels.py, gluon_decode_kernels.py): a 64-key tile lies in one page (pages of 64 keys or more) or
spans 64 / PAGE pages, one TMA box each (pages of 8-32 keys). The block table is read once a box, never once
a key (issue 33: the shipped Triton kernel's per-key lookup costs its FP8 decodes ~7 us at page 16).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def tile_pages(bt_row, start, last, PAGE: gl.constexpr, BOX: gl.constexpr, NB: gl.constexpr):
    """The block-table entries of the NB boxes of the key tile from ``start`` (clamped to ``last``, the unit's last
    page: a box past it reads that page again, its keys masked), in one load; every thread of the partition holds
    all NB (callers ask a tile ahead, so the load's latency is not on the TMA's path)."""
    offs = gl.arange(0, NB, layout=gl.BlockedLayout([NB], [32], [gl.num_warps()], [0]))
    return gl.load(bt_row + gl.minimum((start + offs * BOX) // PAGE, last))


@gluon.jit
def issue_tile(k_desc, v_desc, k_dst, v_dst, bar, start, pages, kvh, row_head, col_head, PAGE: gl.constexpr,
               ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr):
    """The TMA boxes of the key tile from ``start`` (its ``tile_pages``) into ``k_dst`` / ``v_dst``, arriving on
    ``bar`` (the cache seen as 2-D rows: triton_prefill_gluon.kv_view's ``ROW_PAGE``, ``row_head``, ``col_head``)."""
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    offs = gl.arange(0, BLOCK_N // BOX, layout=pages.type.layout)
    mbarrier.expect(bar, 2 * (BLOCK_N // BOX) * k_desc.block_type.nbytes)
    for b in gl.static_range(BLOCK_N // BOX):
        page = gl.sum(gl.where(offs == b, pages, 0), axis=0)  # (in-thread: each thread holds every entry)
        slot = start + b * BOX
        row = page * ROW_PAGE + kvh * row_head + slot % PAGE
        tma.async_copy_global_to_shared(k_desc, [row, kvh * col_head], bar, k_dst.slice(b * BOX, BOX))
        tma.async_copy_global_to_shared(v_desc, [row, kvh * col_head], bar, v_dst.slice(b * BOX, BOX))
