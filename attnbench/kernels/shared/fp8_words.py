"""The FP8 words of the triton backend's kernel (``V_WORDS``): V read as int16 words of two FP8 dims (the low
byte an even dim, the high byte the next odd one), split into the two dims' tiles in the dots' dtype."""
from __future__ import annotations

import triton
import triton.language as tl

# one PTX cvt a word of two FP8 values: both as float16 (the low byte first); the Gluon decode kernel's too
CVT_E4M3 = tl.constexpr("{ .reg .b32 t; cvt.rn.f16x2.e4m3x2 t, $2; mov.b32 {$0, $1}, t; }")
CVT_E5M2 = tl.constexpr("{ .reg .b32 t; cvt.rn.f16x2.e5m2x2 t, $2; mov.b32 {$0, $1}, t; }")


@triton.jit
def split_words(w, F8: tl.constexpr, q, CVT: tl.constexpr):
    """(the low bytes, the high bytes) of the int16 words ``w`` as ``q``'s dtype, the bytes of FP8 dtype ``F8``.
    ``CVT`` (compiled builds, float16 ``q``): one PTX cvt.rn.f16x2 a word, both bytes at once, no shift or mask
    (offline sm_90, the 8 x 16k decode config: 2128 -> 1888 SASS instructions); else a shift, a mask and a
    conversion each (the interpreter runs no PTX)."""
    if CVT:
        tl.static_assert(q.dtype == tl.float16)
        if F8 == tl.float8e5:
            lo, hi = tl.inline_asm_elementwise(CVT_E5M2, "=h,=h,h", [w], dtype=(tl.float16, tl.float16), is_pure=True,
                                               pack=1)
        else:
            lo, hi = tl.inline_asm_elementwise(CVT_E4M3, "=h,=h,h", [w], dtype=(tl.float16, tl.float16), is_pure=True,
                                               pack=1)
    else:
        hi = (w >> 8).to(tl.uint8).to(F8, bitcast=True).to(q.dtype)
        lo = w.to(tl.uint8).to(F8, bitcast=True).to(q.dtype)
    return lo, hi
