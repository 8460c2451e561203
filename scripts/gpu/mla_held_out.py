"""Held-out batches for the Gluon MLA kernel (issue 33, the thirteenth session), on the GPU machine from the repo root:
random MLA decode batches nobody wrote by hand (head counts 1-128, 1-12 requests of 1-20000 keys, half the
batches with MTP chains of 1-4 drafts beside the decodes, pages of 8 to 256 keys in every layout,
bf16 or fp16, DeepSeek-V3's latent row), each run through the default triton backend and
checked against the exact reference at attnbench's default tolerance; one line a batch: what it was, the error,
what ran. The random scenarios of random_scenarios.py draw few MLA decodes (5 MLA cases in 120 scenarios, 1 the
kernel takes: seeds 940-942), hence this draw of its own.

    python3 scripts/gpu/mla_held_out.py --seed 950 --n 60 --budget-s 200
    python3 scripts/gpu/mla_held_out.py --seed 950 --n 60 --list      # the draws only (any machine)

Exit 1 when a batch is wrong, errs or does not run the Gluon kernel on Hopper."""
from __future__ import annotations

import argparse
import random
import sys
import time

HEADS = (1, 2, 4, 8, 16, 24, 32, 64, 96, 128)
PAGES = (8, 16, 32, 64, 128, 256)
LAYOUTS = ("contiguous", "shuffled", "shuffled-within", "reversed", "interleaved")


def draw(seed: int, n: int) -> list:
    """``n`` random MLA decode batch specs from ``seed``."""
    from attnbench.workload.batch import BatchSpec, Request
    from attnbench.workload.trees import chain

    rng = random.Random(seed)
    specs = []
    for _ in range(n):
        lens = [rng.choice((1, 2, 63, 64, 65, 127, 129, 1000, 4095, 4097, 16384, 20000)) if rng.random() < 0.3
                else rng.randint(1, 20000) for _ in range(rng.randint(1, 12))]
        hq = rng.choice(HEADS)
        drafts = rng.choice((1, 2, 3, 4)) if rng.random() < 0.5 else 0  # MTP chains beside decodes
        reqs = tuple(Request("tree", drafts + 1, c - 1, tuple(chain(drafts))) if drafts and rng.random() < 0.7
                     else Request("decode", 1, c - 1) for c in lens)
        specs.append(BatchSpec(reqs, hq, 1, 576, rng.choice(("bfloat16", "float16")), rng.choice(PAGES),
                               rng.choice(LAYOUTS), attention="mla", kv_lora_rank=512, rope_dim=64))
    return specs


def describe(spec) -> str:
    lens = [r.context + 1 for r in spec.requests]
    chains = [r.query - 1 for r in spec.requests if r.tree_parents is not None]
    what = f"{len(lens) - len(chains)} decodes" + (f", {len(chains)} chains of {max(chains)} drafts at most" if chains else "")
    return (f"{spec.num_q_heads} heads, {what}, contexts {min(lens)}-{max(lens)}, page {spec.page_size} "
            f"{spec.layout}, {spec.dtype}")


def check(spec, seed: int, device: str = "cuda") -> tuple[bool, str]:
    """(right and on the Gluon kernel where it should be, the line to print)."""
    import torch

    from attnbench.kernels.mla import gluon as mg
    from attnbench.backends.triton import TritonBackend
    from attnbench.workload.batch import materialize
    from attnbench.workload.reference import compare, default_tolerance, reference_attention

    batch = materialize(spec, seed, device)
    be = TritonBackend()
    plan = be.plan(batch)
    plan.out.fill_(float("nan"))  # every element must be written
    rel = compare(be.run(plan), reference_attention(batch)[0])[0]
    if batch.device.type == "cuda":
        torch.cuda.synchronize()
    tol = default_tolerance(batch.dtype)
    gluon_expected = mg.hopper(batch.device)
    ok = rel < tol and plan.gluon == gluon_expected
    return ok, f"rel err {rel:.1e} (tolerance {tol:g}), ran as '{plan.mode}'"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=950)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--list", action="store_true", help="print the draws only")
    a = ap.parse_args()
    t0, bad, ran = time.time(), 0, 0
    for i, spec in enumerate(draw(a.seed, a.n)):
        name = f"mla-{a.seed}-{i:03d}: {describe(spec)}"
        if a.list:
            print(name)
            continue
        if time.time() - t0 > a.budget_s:
            print(f"{name}: not run (budget)")
            continue
        try:
            ok, line = check(spec, a.seed * 1000 + i)
        except Exception as e:  # one batch's failure is reported, the others still run
            ok, line = False, f"error {type(e).__name__}: {str(e)[:300]}"
        ran += 1
        bad += not ok
        print(f"{name}: {'ok' if ok else 'NOT OK'} {line}", flush=True)
    if not a.list:
        print(f"{ran} batches, {bad} not ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
