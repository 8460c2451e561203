"""In-kernel timestamps for the Gluon kernels' timelines (issue 33: where a program's time goes between its
start, its key tiles and its end; their reader, tree_timeline.py, is in git history).

``stamp(row, slot, ON)`` writes the SM's ``%globaltimer`` (ns, one clock for every SM) at ``row[slot]`` and its
``%clock64`` (the SM's cycles) at ``row[SLOTS + slot]``; with ``ON`` false it compiles to nothing, so the
kernels' shipped builds do not change. A row is ``2 * SLOTS`` int64 words a program.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

SLOTS = 8


@gluon.jit
def stamp(row, slot: gl.constexpr, ON: gl.constexpr):
    """The time now into ``row[slot]`` (globaltimer) and ``row[SLOTS + slot]`` (clock64), when ON."""
    if ON:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                        pack=1)
        cyc = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(row + slot, now)
        gl.store(row + 8 + slot, cyc)  # (8: SLOTS)
