"""compile_sm90_gluon.py for the Gluon MLA kernel (attnbench/kernels/mla/gluon_kernels.py, the MLA path's
``gluon`` option): compile it for sm_90 without a GPU and print registers, spills, shared memory, warps and
the TMA / mbarrier / wgmma counts, e.g.

  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_mla.py [PAGE=64 BLOCK_N=64 STAGES=2 COMPUTE_REGS=232]
  /tmp/venv36/bin/python scripts/dev/compile_sm90_gluon_mla.py PAGE=16 PO=fp32

DeepSeek-V3's latent row (D_NOPE 512 + ROPE 64); PO=fp32 compiles float32 split partials (default: bf16,
triton_mla_gluon.HALF_PARTIALS). The head count is a runtime argument (one build for 16 and 128 heads).
Run it with the device's triton (3.6): docs/triton_notes.md, "the thirteenth session".
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_sm90 as base  # noqa: E402
import compile_sm90_gluon as gluon_pf  # noqa: E402


def main(argv: list[str]) -> None:
    po = next((a.split("=")[1] for a in argv if a.startswith("PO=")), "bf16")
    defaults = dict(D_NOPE=512, ROPE=64, PAGE=64, BLOCK_N=64, STAGES=2, COMPUTE_REGS=232, EARLY_PV=0, PIPE_S=0,
                    ROW_LIMITS=0, num_warps=4,
                    UNIT_COLS=8)
    kw = gluon_pf.settings([a for a in argv if not a.startswith("PO=")], defaults)
    nope, rope, box = kw.pop("D_NOPE"), kw.pop("ROPE"), min(kw["PAGE"], kw["BLOCK_N"])
    descs = {"q_desc": gluon_pf.desc([64, nope]), "qr_desc": gluon_pf.desc([64, rope]),
             "kv_desc": gluon_pf.desc([box, nope]), "kr_desc": gluon_pf.desc([box, rope])}
    ptrs = {"Out": "*bf16", "PO": f"*{po}", "PL": "*fp32", "BT": "*i32", "UNITS": "*i32", "QSTART": "*i32", "CTX": "*i32"}
    print("PO", po, end=" ")
    gluon_pf.compile_and_report(base.load_kernels("gluon_mla_kernels").mla_gluon_kernel, kw, descs, ptrs,
                                ("PAGE", "BLOCK_N", "STAGES", "COMPUTE_REGS", "EARLY_PV", "PIPE_S",
                                                                          "ROW_LIMITS"))


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if "=" in a])
