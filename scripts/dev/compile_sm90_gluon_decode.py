"""compile_sm90_gluon.py for the Gluon decode kernel (attnbench/kernels/decode/gluon_kernels.py, the decode path's
``gluon`` option): compile it for sm_90 without a GPU and print registers, spills, shared memory, the TMA / mbarrier
counts and each loop's instructions, e.g.

  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_decode.py [PAGE=16 FP8=1 STAGES=2 HEAD_DIM=128 G=4 \
      BLOCK_N=64 WINDOW=0 SINK=0 SOFTCAP=0 COPY=0 maxnreg=128]

(COPY=1: pages by cp.async in the launch's layout for the head dim; BLOCK_N=128: TILES' 128-key tiles.)

Run it with the device's triton (3.6): docs/triton_notes.md, "Decode round 1".
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sm90 as base  # noqa: E402
import compile_sm90_gluon as gluon_pf  # noqa: E402

PTRS = {"Q": "*bf16", "Out": "*bf16", "PO": "*fp32", "PL": "*fp32", "BT": "*i32", "UNITS": "*i32", "KSC": "*fp32",
        "VSC": "*fp32", "SINKS": "*fp32"}


def main(argv: list[str]) -> None:
    from triton.experimental.gluon import language as gl

    kw = gluon_pf.settings(argv, dict(G=4, HEAD_DIM=128, PAGE=16, BLOCK_N=64, STAGES=2, FP8=1, WINDOW=0, SINK=0,
                                      SOFTCAP=0, COPY=0, num_warps=4, UNIT_COLS=base.plan_constant("UNIT_COLS"),
                                      maxnreg=0))
    regs = kw.pop("maxnreg")
    for flag in ("FP8", "WINDOW", "SINK", "SOFTCAP"):
        kw[flag] = bool(kw[flag])
    if kw["COPY"]:  # cp.async in 16-byte pieces of whole rows (triton_decode_gluon.copy_layout's)
        vec = 16 if kw["FP8"] else 8
        tpr = kw["HEAD_DIM"] // vec
        kw["COPY"] = gl.BlockedLayout([1, vec], [32 // tpr, tpr], [4, 1], [1, 0])
    else:
        kw["COPY"] = None
    kw["E5M2"] = bool(kw.get("E5M2", 0))
    kw["WORD_LAYOUT"] = gl.NVMMASharedLayout.get_default_for([kw["BLOCK_N"], kw["HEAD_DIM"] // 2], gl.int16)
    ty = ("fp8e5" if kw["E5M2"] else "fp8e4nv") if kw["FP8"] else "bf16"
    box = gluon_pf.desc([min(kw["PAGE"], kw["BLOCK_N"]), kw["HEAD_DIM"]], ty)
    shown = ("PAGE", "STAGES", "BLOCK_N", "FP8", "HEAD_DIM", "G", "WINDOW", "SINK", "SOFTCAP")
    gluon_pf.compile_and_report(base.load_kernels("gluon_decode_kernels").decode_gluon_kernel, kw,
                                {"k_desc": box, "v_desc": box}, dict(PTRS, K2="*" + ty, V2="*" + ty), shown,
                                aligned=("K2", "V2", "stride_row"), **({"maxnreg": regs} if regs else {}))

if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
