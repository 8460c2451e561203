"""compile_sm90_gluon.py for the Gluon tree kernel (attnbench/backends/gluon_tree_kernels.py, the tree
path's ``gluon`` option): compile it for sm_90 without a GPU and print registers, spills, shared memory,
warps and the TMA / mbarrier / wgmma counts, e.g.

  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_tree.py [PAGE=16 WGS=3 STAGES=4 COMPUTE_REGS=152]

Run it with the device's triton (3.6): docs/triton_notes.md, "Tree round 1".
"""
from __future__ import annotations

import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sm90 as base  # noqa: E402
import compile_sm90_gluon as gluon_pf  # noqa: E402
import compile_sm90_prefill as pf  # noqa: E402

PTRS = {"Q": "*bf16", "Out": "*bf16", "PO": "*fp32", "PL": "*fp32", "BT": "*i32", "UNITS": "*i32", "ANC": "*i64", "SEM": "*i32"}


def main(argv: list[str]) -> None:
    kw = dict(G=4, HEAD_DIM=128, PAGE=16, BLOCK_N=64, STAGES=4, WGS=3, COMPUTE_REGS=160, FUSED_MERGE=0, num_warps=4,
              UNIT_COLS=base.plan_constant("UNIT_COLS"))
    for a in argv:
        k, v = a.split("=")
        kw[k] = int(v)
    kw["ROW_PAGE"] = kw["PAGE"]  # NHD
    fn = base.load_kernels("gluon_tree_kernels").tree_gluon_kernel
    d = kw["HEAD_DIM"]
    box = min(kw["PAGE"], kw["BLOCK_N"])
    sig, consts = {}, {}
    for name in fn.arg_names:
        if name in ("k_desc", "v_desc"):
            sig[name] = gluon_pf.desc([box, d])
        elif name in PTRS:
            sig[name] = PTRS[name]
        elif name in kw:
            sig[name], consts[name] = "constexpr", kw[name]
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": kw["num_warps"]})
    regs, spills = base.resources(k.asm["cubin"])
    ptx = k.asm["ptx"]
    print({s: kw[s] for s in ("PAGE", "WGS", "STAGES", "BLOCK_N", "COMPUTE_REGS")}, "regs", regs, "spill bytes", spills,
          "smem", k.metadata.shared, "warps launched", k.metadata.num_warps,
          "wgmma", len(re.findall(r"wgmma.mma_async", ptx)), "TMA loads", ptx.count("cp.async.bulk.tensor"),
          "mbarrier", ptx.count("mbarrier."), "setmaxnreg", re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \d+", ptx))
    for row in pf.loops(k.asm["cubin"]):
        print("  " + row)
    if os.environ.get("DUMP"):
        for ext in ("ttgir", "ptx"):
            with open(f"{os.environ['DUMP']}.{ext}", "w") as f:
                f.write(k.asm[ext])


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
