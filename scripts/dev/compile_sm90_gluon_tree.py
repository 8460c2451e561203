"""compile_sm90_gluon.py for the Gluon tree kernel (attnbench/kernels/tree/gluon_kernels.py, the tree
path's ``gluon`` option): compile it for sm_90 without a GPU and print registers, spills, shared memory,
warps and the TMA / mbarrier / wgmma counts, e.g.

  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_tree.py [PAGE=16 WGS=3 STAGES=4 COMPUTE_REGS=152]
  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_tree.py FP8=1 STAGES=3 STAGES8=3 COMPUTE_REGS=152
  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_tree.py PIPE_S=0

PIPE_S defaults to the shipped build's: 1 for 16-bit slots, 0 with FP8=1 (triton_tree_gluon); so do CLOCKS=0 (the
timestamps), PDL=0, MASK_WORDS=1, MASK_AHEAD=0 and EARLY_META=1 (the fourteenth session's options).

Run it with the device's triton (3.6): docs/triton_notes.md, "Tree round 1".
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sm90 as base  # noqa: E402
import compile_sm90_gluon as gluon_pf  # noqa: E402

PTRS = {"CLK": "*i64", "Q": "*bf16", "Out": "*bf16", "PO": "*bf16", "PL": "*fp32", "BT": "*i32", "UNITS": "*i32",
        "ANC": "*i64", "SEM": "*i32", "KSC": "*fp32", "VSC": "*fp32"}


def main(argv: list[str]) -> None:
    from triton.experimental.gluon import language as gl

    kw = gluon_pf.settings(argv, dict(G=4, HEAD_DIM=128, PAGE=16, BLOCK_N=64, STAGES=4, WGS=3, COMPUTE_REGS=160,
                                      FUSED_MERGE=0, num_warps=4, UNIT_COLS=base.plan_constant("UNIT_COLS"), FP8=0,
                                      STAGES8=3, PIPE_S=-1, CLOCKS=0, PDL=0, MASK_WORDS=1, MASK_AHEAD=0, EARLY_META=1))
    kw["FP8"] = bool(kw["FP8"])
    kw["CLOCKS"] = bool(kw["CLOCKS"])
    kw["PDL"] = bool(kw["PDL"])
    kw["MASK_WORDS"] = bool(kw["MASK_WORDS"])
    kw["MASK_AHEAD"] = bool(kw["MASK_AHEAD"])
    kw["EARLY_META"] = bool(kw["EARLY_META"])
    if kw["PIPE_S"] < 0:
        kw["PIPE_S"] = 0 if kw["FP8"] else 1
    kw["SLOT_TY"] = gl.float16 if kw["FP8"] else gl.bfloat16
    kw["SLOT_LAYOUT"] = gl.NVMMASharedLayout.get_default_for([kw["BLOCK_N"], kw["HEAD_DIM"]], kw["SLOT_TY"])
    # a page's box (pages under 64 keys), of the cache's dtype
    box = gluon_pf.desc([min(kw["PAGE"], kw["BLOCK_N"]), kw["HEAD_DIM"]], "fp8e4nv" if kw["FP8"] else "bf16")
    gluon_pf.compile_and_report(base.load_kernels("gluon_tree_kernels").tree_gluon_kernel, kw,
                                {"k_desc": box, "v_desc": box}, PTRS,
                                ("PAGE", "WGS", "STAGES", "BLOCK_N", "COMPUTE_REGS", "FP8", "STAGES8", "PIPE_S"))


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
