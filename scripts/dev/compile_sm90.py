"""Compile the triton backend's attention kernel for sm_90 on a machine without a GPU and
print its resources (registers, spills, shared memory) and whether the dots became wgmma.

  python3 scripts/dev/compile_sm90.py [KEY=VALUE ...]   e.g. BLOCK_M=64 BLOCK_N=64 num_warps=4 PAGE=16 HAS_TREE=1
  variants: FP8=1 (e4m3 cache) or 2 (e5m2), FP16=1, SINK=1, SOFTCAP=1, ALIBI=1, WINDOW=1, BIDIR=1, HEAD_DIM=96;
  FP8 options: FP8_F16=1 (float16 dots), V_PAIRS=1 (V converted before its transpose), V_WORDS=1,
  KV_A=1/2/3 (K / V / both the dots' A operand from registers: S^T = K Q^T, O^T = V^T P^T)
  --sass: also a histogram of the SASS opcodes (LDS.U8: byte-wise shared loads, F2F: scalar conversions)

Needs triton's bundled ptxas; no device, no torch (run it with the device's triton version:
`python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0`). Used to read a variant's costs before spending
device time on it (docs/triton_notes.md).
"""
from __future__ import annotations

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

PTRS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "PO": "*fp32", "PL": "*fp32",
        "BT": "*i32", "UNITS": "*i32", "ANC": "*i64", "SEM": "*i32", "QPOS": "*i32", "SINKS": "*fp32",
        "SLOPES": "*fp32", "KSC": "*fp32", "VSC": "*fp32"}
BACKENDS = __import__("pathlib").Path(__file__).resolve().parents[2] / "attnbench" / "backends"


def plan_constant(name: str):
    """A literal module constant of triton_plan.py, read without importing it (it needs torch)."""
    import ast

    tree = ast.parse((BACKENDS / "triton_plan.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def load_kernels(name: str = "triton_kernels"):
    """attnbench/backends/``name``.py as ``sm90pkg.<name>``, its ``from .triton_plan import`` served
    by a stub holding the plan's literal constants (this runs in a venv with triton alone; the
    prefill and Gluon compile scripts load their kernel modules through it too)."""
    import importlib.util
    import types

    if "sm90pkg" not in sys.modules:
        pkg = types.ModuleType("sm90pkg")
        pkg.__path__ = [str(BACKENDS)]
        stub = types.ModuleType("sm90pkg.triton_plan")
        stub.UNIT_COLUMNS, stub.UNIT_COLS = plan_constant("UNIT_COLUMNS"), plan_constant("UNIT_COLS")
        sys.modules.update({"sm90pkg": pkg, "sm90pkg.triton_plan": stub})
    spec = importlib.util.spec_from_file_location(f"sm90pkg.{name}", BACKENDS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, spill store bytes) read by cuobjdump from the cubin."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else -1


def sass_histogram(cubin: bytes) -> str:
    """Counts of the memory, conversion and MMA opcodes in the cubin's SASS (static, whole kernel)."""
    import collections
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ops = collections.Counter(m.group(2) for m in (
        re.match(r"\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line) for line in out.splitlines()) if m)
    shown = [o for o in sorted(ops) if re.match(r"(LDS|LDSM|LDG|F2F|PRMT|HMMA|STS|SHF|LOP3)", o)]
    return " ".join(f"{o}:{ops[o]}" for o in shown) + f" total:{sum(ops.values())}"


def main(argv: list[str]) -> None:
    kw = dict(G=4, HEAD_DIM=128, PAGE=16, BLOCK_M=64, BLOCK_Q=16, BLOCK_N=64, BLOCK_NF=0,
              UNIT_COLS=plan_constant("UNIT_COLS"),
              HAS_TREE=1, IEEE=0, TILE_IN_PAGE=0, FUSED_MERGE=0, KV_MAJOR=0, NUM_KV=8, num_warps=4, num_stages=3,
              BLOCK_D=0, PAD_D=0, FP8=0, SINK=0, SOFTCAP=0, ALIBI=0, WINDOW=0, BIDIR=0, POSITIONS=0,
              FP8_F16=0, V_PAIRS=0, V_WORDS=0, KV_A=0, K_WORDS=0)
    for a in argv:
        k, v = a.split("=")
        kw[k] = int(v)
    kw["BLOCK_NF"] = kw["BLOCK_NF"] or kw["BLOCK_N"]
    kw["TILE_IN_PAGE"] = int(kw["PAGE"] % kw["BLOCK_NF"] == 0)
    kw["BLOCK_D"] = kw["BLOCK_D"] or 1 << (kw["HEAD_DIM"] - 1).bit_length()  # 96 -> 128, padded lanes masked
    kw["PAD_D"] = int(kw["BLOCK_D"] != kw["HEAD_DIM"])
    kw["POSITIONS"] = int(bool(kw["WINDOW"] or kw["ALIBI"]))
    ptrs = dict(PTRS)
    if kw["FP8"]:  # FP8=1: e4m3 cache, FP8=2: e5m2
        ptrs["K"] = ptrs["V"] = {1: "*fp8e4nv", 2: "*fp8e5"}[kw["FP8"]]
        kw["FP8"] = 1
    if kw.pop("FP16", 0):  # q and the output in float16 instead of bfloat16
        ptrs["Q"] = ptrs["Out"] = "*fp16"
    fn = load_kernels().paged_attention_kernel
    sig, consts = {}, {}
    for name in fn.arg_names:
        if name in ptrs:
            sig[name] = ptrs[name]
        elif name in kw:
            sig[name] = "constexpr"
            consts[name] = kw[name]
        elif name in ("qk_scale", "cap"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    # the JIT marks pointers and integer arguments divisible by 16 (tt.divisibility): the loads'
    # vector width and whether they can become cp.async depend on it. These are the
    # arguments that are multiples of 16 in the benchmark shapes (d=128, 8 KV heads).
    div16 = [n for n in fn.arg_names if n in ptrs or n.startswith("stride_")
             and n not in ("stride_anc", "stride_bt", "stride_sem", "stride_pls", "stride_scale")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    opts = {"num_warps": kw["num_warps"], "num_stages": kw["num_stages"]}
    if kw.get("maxnreg"):
        opts["maxnreg"] = kw["maxnreg"]
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    ptx = k.asm["ptx"]
    regs, spills = resources(k.asm["cubin"])
    shown = ("BLOCK_M", "BLOCK_N", "BLOCK_NF", "PAGE", "HAS_TREE", "num_warps", "num_stages", "HEAD_DIM", "FP8", "SINK",
             "SOFTCAP", "ALIBI", "WINDOW", "BIDIR", "FP8_F16", "V_PAIRS", "V_WORDS", "KV_A", "K_WORDS")
    print({k2: kw[k2] for k2 in shown if kw[k2] or k2 in ("HAS_TREE", "PAGE")},
          "regs", regs, "spill bytes", spills, "smem", k.metadata.shared,
          "wgmma", len(re.findall(r"wgmma.mma_async", ptx)), "mma.sync", len(re.findall(r"mma.sync", ptx)),
          "cp.async", len(re.findall(r"cp.async.cg|cp.async.ca", ptx)), "bulk", len(re.findall(r"cp.async.bulk", ptx)))
    if "--sass" in sys.argv:
        print(sass_histogram(k.asm["cubin"]))
    if "--ttgir" in sys.argv:
        print(k.asm["ttgir"])
    if "--ptx" in sys.argv:
        print(k.asm["ptx"])


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
