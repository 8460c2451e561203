"""A key tile's pages by TMA, shared by the Gluon kernels that read a paged cache (tree/gluon_kernels.py,
mla/gluon_kernels.py, decode/gluon_kernels.py): a key tile (64 keys; the decode kernel's are 128 at head dim 64)
lies in one page (pages of at least its keys) or spans tile / PAGE pages, one TMA box each. The block table is
read once a box, never once a key (issue 33: the shipped Triton kernel's per-key lookup costs its FP8 decodes ~7 us
at page 16).

``row_pages`` / ``copy_tile``: the same tile by cp.async instead (the decode kernel's ``COPY``), each thread copying
16-byte pieces of whole key rows in the ``COPY`` layout, each row's page looked up by the threads holding it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
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


@gluon.jit
def row_pages(bt_row, start, last, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, COPY: gl.constexpr):
    """The block-table entry of each key row of the tile from ``start`` (clamped to ``last``), in the rows of the
    copy layout ``COPY``: each thread loads those of its own rows."""
    rows = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, COPY))
    return gl.load(bt_row + gl.minimum(rows // PAGE, last))


@gluon.jit
def copy_tile(K, V, k_dst, v_dst, start, pages, kvh, stride_row, row_head, col_head, PAGE: gl.constexpr,
              ROW_PAGE: gl.constexpr, COPY: gl.constexpr):
    """The key tile from ``start`` (its ``row_pages``) into ``k_dst`` / ``v_dst`` by cp.async, K and V the caches'
    2-D rows views (kv_view) with row stride ``stride_row``; the caller commits the group."""
    BLOCK_N: gl.constexpr = k_dst.shape[0]
    HEAD_DIM: gl.constexpr = k_dst.shape[1]
    rows = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, COPY))
    row = pages.to(gl.int64) * ROW_PAGE + kvh * row_head + rows % PAGE
    # (16-byte pieces: a row starts on a multiple of 16 elements, stride_row and col_head being multiples of the
    # head dim, 64 or 128)
    cols = gl.multiple_of(kvh * col_head, 16) + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, COPY))
    off = gl.expand_dims(gl.multiple_of(row * stride_row, 16), 1) + gl.expand_dims(cols, 0)
    async_copy.async_copy_global_to_shared(k_dst, K + off)
    async_copy.async_copy_global_to_shared(v_dst, V + off)
