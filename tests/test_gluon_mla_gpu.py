"""The Gluon MLA kernel (issue 33, MLA round 2; attnbench/kernels/mla/gluon_kernels.py) on a Hopper GPU against
the reference: DeepSeek-V3's latent row (512 + 64), 128 and 16 heads (and 1, 96: a unit's rows short of 64 or
a request's last unit partial), decodes over contexts of odd lengths (key counts 1, 63, 65, 1000, 16384) in
shuffled pages of 8 to 256 keys, bf16 and fp16, split by the plan's rule, forced to 1 split or to 3 and 7
(partials and the merge), MTP chains as causal chunks; random (never zero) inputs, the output NaN-filled first.
Each case forces the route (or asserts auto selected it)."""
from __future__ import annotations

import pytest
import torch

from attnbench.workload.batch import BatchSpec, Request, materialize

from .hopper import check_route, on_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ODD = tuple(Request("decode", 1, c) for c in (999, 62, 0, 64, 16383))  # 1000, 63, 1, 65, 16384 keys
LONG = tuple(Request("decode", 1, 16383) for _ in range(8))  # the target's shape: 8 x 16k
CASES = [  # requests, q heads, page, dtype, splits
    (ODD, 128, 64, "bfloat16", None),
    (ODD, 128, 64, "bfloat16", 1),  # no split: the output stored by the kernel
    (ODD, 128, 16, "bfloat16", 7),
    (ODD, 16, 64, "bfloat16", None),
    (ODD, 16, 8, "float16", 3),
    (ODD, 16, 256, "bfloat16", 1),
    (ODD, 96, 32, "bfloat16", None),  # 64 + 32 rows a request
    (ODD, 1, 128, "float16", 3),  # one head: 63 rows of q past the batch's own (zero-filled by the TMA)
    (LONG, 128, 64, "bfloat16", None),
    (LONG, 16, 64, "bfloat16", None),
]


def _check(batch, runs: int = 2, **options):
    on_hopper("MLA")
    return check_route("gluon-mla", batch, runs=runs, **options)


@pytest.mark.parametrize("reqs,hq,page,dtype,splits", CASES)
def test_gluon_mla_matches_the_reference(reqs, hq, page, dtype, splits):
    spec = BatchSpec(reqs, hq, 1, 576, dtype, page, "shuffled", attention="mla", kv_lora_rank=512, rope_dim=64)
    batch = materialize(spec, seed=page + hq + len(reqs), device="cuda")
    plan = _check(batch, splits=splits)
    if splits and splits > 1:
        assert plan.num_merge > 0
    if splits == 1:
        assert plan.num_merge == 0


def test_refused_batches_keep_the_triton_kernel():
    """A branching tree takes the mla route under auto (and matches the reference)."""
    on_hopper("MLA")
    spec = BatchSpec((Request("tree", 3, 1000, (-1, 0, 0)),) * 2, 128, 1, 576, "bfloat16", 64, "shuffled",
                     attention="mla", kv_lora_rank=512, rope_dim=64)
    check_route("mla", materialize(spec, seed=1, device="cuda"), auto=True)


def _chains(n, ctxs):
    from attnbench.workload.trees import chain

    return tuple(Request("tree", n + 1, c, tuple(chain(n))) for c in ctxs)


@pytest.mark.parametrize("reqs,hq,page,dtype,splits", [
    (_chains(2, (16383,) * 8), 128, 64, "bfloat16", None),  # the target's MTP row: 8 x 16k, chain of 2 drafts
    (_chains(2, (999, 62, 0, 64)) + ODD[:2], 128, 16, "bfloat16", 3),  # chains beside decodes, odd lengths
    (_chains(4, (1000, 63)), 64, 8, "float16", None),  # 64 heads: a unit is a token's every head
    (_chains(1, (5000, 130)), 128, 256, "float16", 1),
    (_chains(3, (16383, 7)), 192, 32, "bfloat16", 7),
    (_chains(2, (16383,) * 8), 16, 64, "bfloat16", None),  # 16 heads: units of 4 tokens' heads (ROW_LIMITS)
    (_chains(4, (999, 62, 0, 64)) + ODD[:2], 16, 16, "float16", 7),  # splits ending inside a unit's tokens
    (_chains(3, (1000, 130, 5)), 96, 8, "bfloat16", 3),  # 96 heads: a unit across two tokens
    (_chains(1, (4000, 63)), 1, 256, "bfloat16", None),
])
def test_gluon_mla_takes_mtp_chains_as_causal_chunks(reqs, hq, page, dtype, splits):
    """MTP chains (a static chain of drafts: node i sees nodes below it) run the Gluon kernel as causal chunks: a
    unit's key end is its last token's; at a multiple of 64 heads a unit is one token's heads, else each row is
    masked at its own token's end (ROW_LIMITS); against the reference."""
    spec = BatchSpec(reqs, hq, 1, 576, dtype, page, "shuffled", attention="mla", kv_lora_rank=512, rope_dim=64)
    batch = materialize(spec, seed=page + hq, device="cuda")
    plan = _check(batch, splits=splits)
    assert (plan.units[:, 7] == 0).all()
