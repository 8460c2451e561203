"""Helpers of scripts/gpu/gpu_mla.sh (MLA on the GPU, issue 23). Subcommands:

    python3 scripts/gpu/gpu_mla.py jit                 FlashInfer's MLA modules (fa2, fa3) built once
    python3 scripts/gpu/gpu_mla.py sweep               triton MLA configs on the target cases, timed by
                                                   attnbench's own timer (time_run), checked vs the reference
    python3 scripts/gpu/gpu_mla.py summary DIR...      every row of the run folders: time, % of the byte
                                                   floor, % of the roofline, status; then the targets

The targets (issue 23): triton MLA decode >= 80% of the latent byte floor at 8 requests x 16k
with 16 and 128 heads; MLA trees >= 2x the fastest other backend that runs them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

DECODE = [("decode 8x16k h16", 16), ("decode 8x16k h128", 128)]


def _spec(hq: int, reqs):
    from attnbench.workload.batch import BatchSpec

    return BatchSpec(tuple(reqs), hq, 1, 576, "bfloat16", 64, "shuffled", attention="mla", kv_lora_rank=512, rope_dim=64)


def jit() -> None:
    """Plan and run a tiny MLA batch through FlashInfer's wrapper on each route (JIT-compiles)."""
    from attnbench.backends import flashinfer_mla
    from attnbench.backends.flashinfer_plans import workspace_for
    from attnbench.workload.batch import Request, materialize

    batch = materialize(_spec(16, [Request("decode", 1, 100)] * 2), 0, "cuda")
    for route in ("fa2", "fa3"):
        try:
            p = flashinfer_mla.plan(batch, route, workspace_for({}, batch.device), {})
            flashinfer_mla.run(p)
            torch.cuda.synchronize()
            print(f"jit {route}: ok ({p.mode})", flush=True)
        except Exception as e:  # reported, the rows of that route then say what failed
            print(f"jit {route}: {type(e).__name__}: {str(e)[:300]}", flush=True)


def sweep() -> None:
    """Triton MLA configs on the decode targets and an EAGLE tree, timed by attnbench's timer."""
    from attnbench.kernels.mla import plan as triton_mla
    from attnbench.kernels.shared.plan import num_sms
    from attnbench.measure.ceilings import ceilings_for
    from attnbench.measure.metrics import work_of
    from attnbench.measure.stats import Summary
    from attnbench.measure.timing import time_run
    from attnbench.workload.batch import Request, materialize
    from attnbench.workload.reference import compare, reference_attention
    from attnbench.workload.timing_spec import TimingConfig
    from attnbench.workload.trees import parse_tree

    dev = torch.device("cuda")
    ceil = ceilings_for(dev, "bfloat16")
    cfg_t = TimingConfig(warmup_ms=10, measure_ms=40)
    eagle = tuple(parse_tree({"preset": "eagle-mc_sim_7b_63"}))
    cases = [(n, _spec(h, [Request("decode", 1, 16384)] * 8)) for n, h in DECODE]
    cases.append(("eagle26 8x4k h16", _spec(16, [Request("tree", len(eagle), 4096, eagle)] * 8)))
    configs = [dict(), dict(block_n=16), dict(num_stages=3)]
    for name, spec in cases:
        batch = materialize(spec, 0, dev)
        ref = reference_attention(batch)[0]
        work = work_of(spec)
        floor_ms = work.bytes / (ceil.memory_tbps * 1e12) * 1e3
        extra = [dict(block_m=32, num_warps=4)] if spec.num_q_heads == 128 else [dict(num_warps=8)]
        for cfg in configs + extra + [dict(splits=s) for s in (8, 64)]:
            kw = dict(cfg)
            splits = kw.pop("splits", None)
            try:
                p = triton_mla.plan(batch, num_sms(dev), False, splits, **kw)
                rel = compare(triton_mla.run(p), ref)[0]
                med = Summary.of(time_run(lambda: triton_mla.run(p), dev, cfg_t).samples_ms).median
                print(f"sweep {name:18} {str(cfg):34} {p.cfg} units {p.units.shape[0]:4d}: {med * 1e3:8.1f} us,"
                      f" {100 * floor_ms / med:5.1f}% of byte floor ({floor_ms * 1e3:.1f} us), rel err {rel:.1e}", flush=True)
            except Exception as e:
                print(f"sweep {name:18} {str(cfg):34}: {type(e).__name__}: {str(e)[:200]}", flush=True)


def summary(dirs: list[str]) -> None:
    from attnbench.store.runfolder import RunFolder

    best_other: dict = {}
    tri: dict = {}
    print(f"{'scenario':28} {'case':44} {'backend':22} {'status':8} {'us':>9} {'%bytes':>7} {'%roof':>6} {'rel err':>8}  mode/reason")
    for d in dirs:
        for r in RunFolder.load(Path(d)).rows:
            st = r.status.value
            us = r.timing.median_ms * 1e3
            pct_bytes = 100 * r.roofline.tbps / _mem_tbps(r) if st == "ok" else float("nan")
            why = (r.id.mode if st == "ok" else r.reason)[:90]
            print(f"{r.id.scenario[:28]:28} {r.id.case_id[:44]:44} {r.id.backend[:22]:22} {st:8} {us:9.1f} {pct_bytes:7.1f}"
                  f" {r.roofline.pct_of_ceiling:6.1f} {r.correctness.rel_err:8.1e}  {why}")
            if st != "ok" or r.id.backend == "reference":
                continue
            key = (r.id.scenario, r.id.case_id)
            if r.id.backend == "triton":
                tri[key] = r
            else:
                if key not in best_other or us < best_other[key][0]:
                    best_other[key] = (us, r.id.backend)
    print("\ntargets: triton vs the fastest other backend that ran (ok) the same case")
    for key, r in sorted(tri.items()):
        other = best_other.get(key)
        ratio = f"{other[0] / (r.timing.median_ms * 1e3):.2f}x faster than {other[1]}" if other else "no other backend ran it"
        print(f"  {key[0][:28]:28} {key[1][:44]:44} triton {r.timing.median_ms * 1e3:8.1f} us, "
              f"{100 * r.roofline.tbps / _mem_tbps(r):5.1f}% of byte floor; {ratio}")


_CEIL: dict = {}


def _mem_tbps(r) -> float:
    """The memory ceiling the row's roofline used (cached ceilings of its device)."""
    from attnbench.measure.ceilings import ceilings_for

    if "c" not in _CEIL:
        _CEIL["c"] = ceilings_for(torch.device("cuda"), "bfloat16", measure=False) if torch.cuda.is_available() else None
    c = _CEIL["c"]
    return c.memory_tbps if c else float("nan")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "jit":
        jit()
    elif cmd == "sweep":
        sweep()
    elif cmd == "summary":
        summary(sys.argv[2:])
    else:
        sys.exit(__doc__)
