"""Compile the MLA Triton kernel (triton_mla_kernels.py) for sm_90 without a GPU and print its
registers, spills, shared memory and whether the dots became wgmma (as scripts/dev/compile_sm90.py
does for the MHA kernel; run it with the device's triton, e.g. triton 3.6.0 in a venv):

  python3 scripts/dev/compile_sm90_mla.py "H=16" "H=128,BLOCK_M=64,num_warps=8" "H=16,BLOCK_M=64,HAS_TREE=1,BIDIR=1"
"""
import re, sys, importlib.util
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from compile_sm90 import resources
spec = importlib.util.spec_from_file_location("mk", str(__import__("pathlib").Path(__file__).resolve().parents[2] / "attnbench" / "backends" / "triton_mla_kernels.py"))
mk = importlib.util.module_from_spec(spec); spec.loader.exec_module(mk)
PTRS = {"Q": "*bf16", "KV": "*bf16", "OUT": "*bf16", "PO": "*fp32", "PL": "*fp32", "BT": "*i32", "UNITS": "*i32",
        "CTX": "*i32", "QSTART": "*i32", "ANC": "*i64"}
def comp(**kw):
    base = dict(H=16, D_NOPE=512, D_ROPE=64, PAGE=64, BLOCK_M=16, BLOCK_N=32, HAS_TREE=0, UNIT_COLS=8, num_warps=4, num_stages=2, BIDIR=0, IEEE=0, NCH=1, TAIL_STAGES=0)
    base.update(kw); kw = base
    kw["TAIL_STAGES"] = kw["TAIL_STAGES"] or None  # 0: the launch's num_stages
    fn = mk.mla_attention_kernel
    sig, consts = {}, {}
    for n in fn.arg_names:
        if n in PTRS: sig[n] = PTRS[n]
        elif n in kw: sig[n] = "constexpr"; consts[n] = kw[n]
        elif n == "qk_scale": sig[n] = "fp32"
        else: sig[n] = "i32"
    div16 = [n for n in fn.arg_names if n in PTRS or n in ("stride_q", "stride_kv_page", "stride_kv_tok", "stride_o", "stride_po_s", "stride_po_r")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": kw["num_warps"], "num_stages": kw["num_stages"]})
    except Exception as e:
        print(kw, "FAIL", str(e)[:200]); return
    ptx = k.asm["ptx"]
    regs, spills = resources(k.asm["cubin"])
    print({x: kw[x] for x in ("H","BLOCK_M","BLOCK_N","NCH","TAIL_STAGES","HAS_TREE","BIDIR","num_warps","num_stages")}, "regs", regs, "spill", spills, "smem", k.metadata.shared,
          "wgmma", len(re.findall(r"wgmma.mma_async", ptx)), "mma.sync", len(re.findall(r"mma.sync", ptx)), "cp.async", len(re.findall(r"cp.async.cg|cp.async.ca", ptx)), flush=True)
for a in sys.argv[1:]:
    comp(**{k: int(v) for k, v in (x.split("=") for x in a.split(","))})
