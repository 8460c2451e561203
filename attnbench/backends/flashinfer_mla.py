"""FlashInfer's MLA kernels (``flashinfer.mla.BatchMLAPagedAttentionWrapper``, 0.5.3; 0.7.2.post1
keeps the positional ``plan``, deprecated) for the ``flashinfer`` backend's MLA batches
(``attention: mla``). The limits below are in both releases' sources (0.5.3 ``mla.py``, 0.7.2.post1
``mla/_batch_mla/_wrapper.py``).

The wrapper reads two paged caches, ``ckv [P, page, 512]`` and ``kpe [P, page, 64]``, and
queries split as ``q_nope [N, H, 512]`` and ``q_pe [N, H, 64]``, each by its strides (read
from its run code: ``ckv_stride_page``, ``ckv_stride_n``, ...). attnbench's latent cache
``[P, page, 1, 576]`` is both at once: the two caches are views of it (``[..., :512]`` and
``[..., 512:]``), and so are the two query parts, so nothing is copied or converted.

Its masks are ``causal`` (bottom-right, as docs/semantics.md's prefill and decode) or none:
no custom mask. Chains (each node the only child of the one before) are exactly the causal
mask and run as such; any other tree is a skipped row saying so. Routes: the wrapper's
``backend`` argument, ``fa2`` or ``fa3`` (``auto``: FlashInfer's own choice, fa3 on sm90), from
the ``flashinfer`` backend's ``route`` option (``-b flashinfer:route=fa3``); its other routes
are skipped rows for MLA batches. head_dim_ckv / head_dim_kpe: FlashInfer
JIT-compiles the pair asked for; only 512 / 64 (DeepSeek-V2/V3/R1, Kimi K2) is validated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.trees import is_chain

from ._metadata import flashinfer_page_layout

VALIDATED_DIMS = ((512, 64),)


@dataclass
class FlashInferMlaPlan:
    mode: str
    wrapper: Any
    q_nope: torch.Tensor  # [N, H, kv_lora_rank] view of q
    q_pe: torch.Tensor  # [N, H, rope_dim] view of q
    ckv: torch.Tensor  # [P, page, kv_lora_rank] view of the latent cache
    kpe: torch.Tensor  # [P, page, rope_dim] view of the latent cache
    out: torch.Tensor  # [N, H, kv_lora_rank]


def mla_reasons(batch: Batch, route: str) -> list[str]:
    """Why BatchMLAPagedAttentionWrapper cannot compute ``batch`` exactly ([] when it can)."""
    out = []
    dims = (batch.spec.kv_lora_rank, batch.spec.rope_dim)
    if dims not in VALIDATED_DIMS:
        out.append(f"FlashInfer MLA: kv_lora_rank/rope_dim {dims[0]}/{dims[1]} not validated (512/64 is)")
    if route not in ("auto", "fa2", "fa3"):
        out.append(f"route {route}: FlashInfer's MLA wrapper is run on routes auto, fa2 and fa3 only (its other "
                   "backends, cutlass in 0.5.3 and 0.7.2.post1, and trtllm-gen, xqa, cute-dsl and cutile in "
                   "0.7.2.post1, need SM10x-SM12x GPUs)")
    if batch.spec.kv_dtype is not None:
        out.append(f"FlashInfer MLA route: a latent cache in the model dtype only, not {batch.spec.kv_dtype}")
    if batch.spec.k_scale is not None:
        out.append("FlashInfer MLA route: no K/V scales (kv_cache.k_scale/v_scale) on the latent cache")
    if batch.spec.alibi:  # scenarios refuse it for MLA; a BatchSpec built by hand may have it
        out.append("FlashInfer's BatchMLAPagedAttentionWrapper has no ALiBi (its plan takes no pos_encoding_mode: "
                   "0.5.3 mla.py, 0.7.2.post1 mla/_batch_mla/_wrapper.py)")
    # a one-token prefill sees every key of its request either way: the causal mask is its mask too
    if any(not r.causal and r.query > 1 for r in batch.requests):
        out.append("FlashInfer MLA route: one mask for the batch (causal); a group of several tokens has causal: false")
    trees = [r for r in batch.requests if r.tree_parents is not None and not is_chain(r.tree_parents)]
    if trees:
        out.append(f"FlashInfer's BatchMLAPagedAttentionWrapper takes no custom mask (causal or none only; 0.5.3 and "
                   f"0.7.2.post1): {len(trees)} tree request(s) that are not chains")
    return out


def plan(batch: Batch, route: str, workspace: torch.Tensor, wrappers: dict) -> FlashInferMlaPlan:
    """The engine's step: FlashInfer's page layout from the block table, then the wrapper's plan."""
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    dev = batch.device
    key = (route, str(dev))
    if key not in wrappers:
        wrappers[key] = BatchMLAPagedAttentionWrapper(workspace, backend=route)
    w = wrappers[key]
    indptr, indices, _ = flashinfer_page_layout(batch)
    h = batch.host
    rank, rope = batch.spec.kv_lora_rank, batch.spec.rope_dim
    # host arrays on the CPU: the wrapper keeps host copies for its scheduler and moves them to
    # the device itself (non-blocking); the page indices are on the device already
    w.plan(
        torch.from_numpy(h.query_start_loc.astype("int32")), indptr.int(), indices,
        torch.from_numpy(h.kv_lens.astype("int32")), batch.num_q_heads, rank, rope,
        batch.page_size, True, batch.scale, batch.dtype, batch.dtype,
    )
    latent = batch.k_cache[:, :, 0]  # [P, page, rank + rope]
    return FlashInferMlaPlan(
        mode=f"BatchMLAPagedAttentionWrapper ({getattr(w, '_backend', route)}, causal)",
        wrapper=w,
        q_nope=batch.q[..., :rank], q_pe=batch.q[..., rank:],
        ckv=latent[..., :rank], kpe=latent[..., rank:],
        out=torch.empty(batch.out_shape, dtype=batch.dtype, device=dev),
    )


def run(p: FlashInferMlaPlan) -> torch.Tensor:
    return p.wrapper.run(p.q_nope, p.q_pe, p.ckv, p.kpe, out=p.out)
