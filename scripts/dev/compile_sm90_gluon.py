"""compile_sm90_prefill.py for the Gluon prefill kernel (attnbench/kernels/prefill/gluon_kernels.py,
the prefill path's ``gluon`` option): compile it for sm_90 without a GPU and print registers,
spills, shared memory, the partitions' warps and the TMA / mbarrier / wgmma counts, e.g.

  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon.py [BLOCK_M=128 BLOCK_N=128 STAGES=2 PAGE=256 num_warps=8]

Run it with the device's triton (3.6): docs/triton_notes.md, "Prefill round 3".
"""
from __future__ import annotations

import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sm90 as base  # noqa: E402
import compile_sm90_prefill as pf  # noqa: E402

PTRS = {"Out": "*bf16", "PO": "*fp32", "PL": "*fp32", "BT": "*i32", "UNITS": "*i32", "SCHED": "*i32"}


def load_kernel():
    """gluon_prefill_kernels.py's kernel (compile_sm90.load_kernels: triton alone)."""
    return base.load_kernels("gluon_prefill_kernels").prefill_gluon_kernel


def desc(shape: list[int], ty: str = "bf16") -> str:
    """A tensor descriptor's signature: ``ty`` bf16, fp16, fp8e4nv or fp8e5 blocks of ``shape``."""
    gty = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp8e4nv": gl.float8e4nv, "fp8e5": gl.float8e5}[ty]
    layout = gl.NVMMASharedLayout.get_default_for(shape, gty)
    return f"tensordesc<{ty}[{', '.join(map(str, shape))}],{layout!r}>"


def settings(argv: list[str], kw: dict) -> dict:
    """``kw`` with the command line's NAME=int settings applied (an NHD cache: ROW_PAGE = PAGE)."""
    for a in argv:
        k, v = a.split("=")
        kw[k] = int(v)
    kw["ROW_PAGE"] = kw["PAGE"]
    return kw


def compile_and_report(fn, kw: dict, descs: dict, ptrs: dict, shown: tuple, aligned: tuple = (), **options) -> None:
    """Compile the Gluon kernel ``fn`` for sm_90 (arguments: ``descs`` tensor descriptors, ``ptrs`` pointers,
    ``kw``'s names constexprs, the rest i32 but qk_scale and cap) and print the ``shown`` settings, registers,
    spills, shared memory, warps, the wgmma / TMA / mbarrier / setmaxnreg counts (with setmaxnreg's values)
    and each loop's instructions; DUMP=PREFIX writes the TTGIR and PTX. ``aligned``: arguments given divisibility 16,
    as a launch specializes aligned pointers and integers."""
    sig, consts = {}, {}
    for name in fn.arg_names:
        if name in descs:
            sig[name] = descs[name]
        elif name in ptrs:
            sig[name] = ptrs[name]
        elif name in kw:
            sig[name], consts[name] = "constexpr", kw[name]
        else:
            sig[name] = "fp32" if name in ("qk_scale", "cap") else "i32"
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                         attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in aligned})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": kw["num_warps"], **options})
    regs, spills = base.resources(k.asm["cubin"])
    ptx = k.asm["ptx"]
    print({s: kw[s] for s in shown}, "regs", regs, "spill bytes", spills, "smem", k.metadata.shared,
          "warps launched", k.metadata.num_warps, "wgmma", len(re.findall(r"wgmma.mma_async", ptx)),
          "TMA loads", ptx.count("cp.async.bulk.tensor"), "mbarrier", ptx.count("mbarrier."),
          "setmaxnreg", ptx.count("setmaxnreg"), re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))
    for row in pf.loops(k.asm["cubin"]):
        print("  " + row)
    if os.environ.get("DUMP"):
        for ext in ("ttgir", "ptx"):
            with open(f"{os.environ['DUMP']}.{ext}", "w") as f:
                f.write(k.asm[ext])


def main(argv: list[str]) -> None:
    kw = settings(argv, dict(G=4, HEAD_DIM=128, PAGE=256, BLOCK_M=128, BLOCK_N=128, STAGES=2, HEAVY_FIRST=1, num_warps=4,
                             Q_PARTS=2, EARLY_PAGE=0, DYNAMIC=0, COMPUTE_REGS=200, maxnreg=0,
                             UNIT_COLS=base.plan_constant("UNIT_COLS")))
    d = kw["HEAD_DIM"]
    descs = {"q_desc": desc([kw["BLOCK_M"] // kw["Q_PARTS"], d]), "k_desc": desc([kw["BLOCK_N"], d]), "v_desc": desc([kw["BLOCK_N"], d])}
    compile_and_report(load_kernel(), kw, descs, PTRS,
                       ("BLOCK_M", "BLOCK_N", "STAGES", "PAGE", "Q_PARTS", "EARLY_PAGE", "COMPUTE_REGS", "maxnreg"),
                       **({"maxnreg": kw["maxnreg"]} if kw["maxnreg"] else {}))


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
