"""compile_sm90.py for the prefill kernel (attnbench/kernels/prefill/kernels.py): compile it
for sm_90 on a machine without a GPU and print registers, spills, shared memory, and the SASS
length and opcode mix of each loop (the unmasked key loop first), e.g.

  python3 scripts/dev/compile_sm90_prefill.py PAGE=16 LEAN=1 FOLD=1 [BLOCK_M=128 num_warps=8 num_stages=3 maxnreg=128]

Defaults: the 4 x 1k causal prefill's shipped config (BLOCK_M 128 = 32 tokens x G 4, 64-key
tiles, 8 warps, 3 stages, d 128, bf16). Run it with the device's triton (3.6) as compile_sm90.py
says; issue 33's prefill round in docs/triton_notes.md reads its numbers.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sm90 as base  # noqa: E402

PTRS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "PO": "*fp32", "PL": "*fp32", "BT": "*i32",
        "UNITS": "*i32"}


def load_kernel(name: str = "prefill_attention_kernel"):
    """triton_prefill_kernels.py's kernel ``name`` (compile_sm90.load_kernels: triton alone)."""
    return getattr(base.load_kernels("triton_prefill_kernels"), name)


def loops(cubin: bytes) -> list[str]:
    """Each backward branch's body in the SASS: its length and most common opcodes."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ins = [(int(m.group(1), 16), m.group(3), line) for line in out.splitlines()
           for m in [re.match(r"\s+/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)] if m]
    rows = []
    for at, op, line in ins:
        target = re.search(r"BRA (0x[0-9a-f]+)", line) if op == "BRA" else None
        if target and int(target.group(1), 16) < at:
            body = collections.Counter(o.split(".")[0] for b, o, _ in ins if int(target.group(1), 16) <= b <= at)
            rows.append(f"loop {sum(body.values())} instr: " + " ".join(f"{k}:{v}" for k, v in body.most_common(14)))
    return rows


def main(argv: list[str]) -> None:
    kw = dict(G=4, HEAD_DIM=128, PAGE=16, BLOCK_M=128, BLOCK_Q=32, BLOCK_N=64, BLOCK_NF=0,
              UNIT_COLS=base.plan_constant("UNIT_COLS"), IEEE=0, TILE_IN_PAGE=0, LEAN=0, FOLD=0, HEAVY_FIRST=0,
              num_warps=8, num_stages=3, maxnreg=0)
    for a in argv:
        k, v = a.split("=")
        kw[k] = int(v)
    kw["BLOCK_NF"] = kw["BLOCK_NF"] or kw["BLOCK_N"]
    kw["BLOCK_Q"] = kw["BLOCK_M"] // kw["G"]
    kw["TILE_IN_PAGE"] = int(kw["PAGE"] % kw["BLOCK_NF"] == 0)
    fn = load_kernel("prefill_attention_kernel")
    ptrs = PTRS
    sig, consts = {}, {}
    for name in fn.arg_names:
        if name in ptrs:
            sig[name] = ptrs[name]
        elif name in kw:
            sig[name], consts[name] = "constexpr", kw[name]
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
    div16 = [n for n in fn.arg_names if n in ptrs
             or n.startswith("stride_") and n not in ("stride_bt", "stride_pls")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    opts = {"num_warps": kw["num_warps"], "num_stages": kw["num_stages"]}
    if kw["maxnreg"]:
        opts["maxnreg"] = kw["maxnreg"]
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    regs, spills = base.resources(k.asm["cubin"])
    shown = ("BLOCK_M", "BLOCK_N", "BLOCK_NF", "PAGE", "num_warps", "num_stages", "maxnreg", "LEAN", "FOLD")
    print({s: kw[s] for s in shown}, "regs", regs, "spill bytes", spills, "smem", k.metadata.shared,
          "wgmma", len(re.findall(r"wgmma.mma_async", k.asm["ptx"])),
          "cp.async", len(re.findall(r"cp.async.cg|cp.async.ca", k.asm["ptx"])))
    for row in loops(k.asm["cubin"]):
        print("  " + row)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
