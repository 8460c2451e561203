"""Which FlashInfer route computes a batch: what each route can express, and the route an
engine would pick on this GPU (``route=auto``). Pure logic over the batch's facts: no
FlashInfer import, so the choice and its skip reasons are tested on the CPU.

Routes (FlashInfer 0.5.3 and 0.7.2.post1, which take the same arguments here; ``docs/backends.md``):
- ``decode``: ``BatchDecodeWithPagedKVCacheWrapper`` on CUDA cores; decode-only batches.
- ``decode-tc``: the same wrapper with ``use_tensor_cores=True`` (its prefill kernels);
  measured faster than ``decode`` on an H100 at GQA group 4 (shared/device/NOTES.md), and
  vLLM's FlashInfer backend turns tensor cores on for decode.
- ``fa2`` / ``fa3``: ``BatchPrefillWithPagedKVCacheWrapper(backend=...)``: every kind; trees,
  mixed causal/non-causal batches and windows on trees take a custom mask (fa2 only: fa3 has
  none); with sinks, FlashInfer's ``BatchAttentionWithAttentionSinkWrapper`` on that backend.
- ``xqa``: ``trtllm_batch_decode_with_kv_cache(backend="xqa")`` (TensorRT-LLM's XQA decode,
  sm90+): decode-only, page sizes 16/32/64/128, sinks and windows, no soft-cap.
- ``persistent``: ``BatchAttention`` (one persistent kernel for prefill and decode): causal or
  wholly non-causal batches without windows or sinks; soft-cap and FP8 caches (``k_scale`` /
  ``v_scale`` at run, as FlashInfer's ``run`` takes them).
- ``pod``: ``BatchPODWithPagedKVCacheWrapper`` (prefill and decode fused in one launch): batches
  with both prefill (all causal or all non-causal: one ``causal_p``) and decode requests in two
  groups (prefills first, or decodes first as vLLM orders its batch), windows on causal
  prefills and FP8 caches; no soft-cap (its ``plan`` fixes 0), no trees, no interleaving.
- ``auto``: shared prefix pages -> the cascade (option ``cascade``); decode-only -> ``xqa``
  with sinks (the decode wrapper has none), else ``decode-tc``; a batch that needs a custom
  mask -> ``fa2``; prefills mixed with decodes -> ``persistent`` where it can (measured on an
  H100 with the GPU script gpu_library_routes.py (since removed): 172 us against fa2's 291 and fa3's 365 on 2 chunked
  prefills of 512 + 16 decodes @4k; not with an FP8 cache, which persistent runs but was not
  timed against fa2); otherwise ``fa3`` on Hopper (FlashInfer's own "auto"
  choice there: 107 us against persistent's 152 on 4x1k) unless the cache is FP8 (fa3 wants FP8
  queries too), else ``fa2``. Decodes: decode-tc 60.2 us, fa2 60.3, decode 62.3, xqa 67.3,
  persistent 70.3 (8x4k page 16); 193.4 / 193.1 / 206.9 / 208.2 / 201.9 at 8x16k.
  A batch too finely scaled for the fa2 kernel's mask (an amax-scaled ``fp8_e5m2`` cache: below)
  takes ``decode`` for decodes and no route otherwise.

Masks on FlashInfer's fa2 kernel (``include/flashinfer/attention/prefill.cuh`` in the 0.5.3
wheel; ``fa2`` runs it, and ``decode-tc`` plans it too: ``decode.py`` builds
``get_batch_prefill_module("fa2", ...)`` when ``use_tensor_cores``): a masked key (custom mask,
causal, or past the request's length in its last tile) gets the logit ``MaskFillValue =
-math::inf``, and ``math::inf`` is the finite ``5e4`` (``math.cuh``), set on the raw ``q.k``
before the softmax scale is applied (``update_mdo_states`` multiplies by ``sm_scale_log2``
after masking). The scale there is ``sm_scale * k_scale`` (``run`` folds the FP8 ``k_scale``
in), so a masked key keeps the weight ``2^-((5e4 + m) * sm_scale * k_scale * log2 e)`` against
the row's largest raw logit ``m``. With an ``fp8_e5m2`` cache scaled to its amax (``k_scale =
amax / 57344``: ~1e-4) that is ~``2^-0.5``: wrong outputs with no error (issue 32: rel. err
0.58-0.77 on an H100, head dims 64/128/256), where ``fp8_e4m3`` (``amax / 448``) keeps 2^-50 or
less. The CUDA-core ``decode`` kernel scales before it masks (``decode.cuh``) and is not
affected. ``mask_bits`` is that exponent (with ``m`` = 0); below ``MIN_MASK_BITS`` the two
routes refuse the batch, naming it. ``persistent`` (``persistent.cuh``) and ``pod``
(``batch_pod.cuh``) run the same ``prefill.cuh`` device code (``logits_mask`` then
``update_mdo_states``) and are refused the same way.

ALiBi (``flashinfer_alibi.py``): ``decode``, ``decode-tc`` and ``fa2`` hand FlashInfer
``pos_encoding_mode="ALIBI"`` (exact up to a constant per row on prefills, decodes and chains);
``fa3``, ``persistent``, ``pod`` (its kernel drops the mode) and ``xqa`` have none, so ``auto`` takes ``fa2`` for ALiBi batches of
prefills (``decode-tc`` for decodes); branching trees, soft-cap and sinks are refused with it.

Skip reasons name FlashInfer's own limits, the releases whose source was read for them ("0.5.3
and 0.7.2.post1" where both show the limit) and the file that shows it; docs/backends.md lists
each one (its footnotes) with a link to that source. The fa2 kernel's mask limit follows the
installed ``math.cuh`` (``fa2_mask_fill``): 0.7.2.post1 masks with IEEE -inf, and nothing is
refused for it there.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attnbench.workload.trees import is_chain

from .flashinfer_alibi import alibi_reasons
from .flashinfer_rope import rope_reasons

ROUTES = ("auto", "decode", "decode-tc", "fa2", "fa3", "xqa", "persistent", "pod")
#: routes on FlashInfer's fa2 kernel code, whose masked keys keep a weight 2^-mask_bits (above)
FA2_KERNEL = ("fa2", "decode-tc", "persistent", "pod")
#: which kernel each of those runs, as the skip reason names it
MASK_KERNEL = {"persistent": "persistent kernel (persistent.cuh: prefill.cuh's masking)",
               "pod": "POD kernel (batch_pod.cuh: the fa2 prefill code)"}
#: how the prefill and decode requests of a batch with both lie (None: not such a batch)
PREFILLS_FIRST, DECODES_FIRST, INTERLEAVED = "prefills first", "decodes first", "interleaved"
FA2_MASK_FILL = 5e4  # FlashInfer 0.5.3's math::inf, the magnitude of its mask logit
MIN_MASK_BITS = 40.0  # a masked key's weight at most 2^-40 of the largest (~1e-12)
LOG2E = 1.4426950408889634
XQA_PAGE_SIZES = (16, 32, 64, 128)
#: where BatchAttention's plan shows its limits, in the releases read
BATCH_ATTENTION = "0.5.3 attention.py, 0.7.2.post1 attention/_core.py"


@dataclass(frozen=True)
class Facts:
    """What the route choice reads off a batch."""

    decode_only: bool  # every request has one query token and no tree
    trees: bool
    causal: tuple[bool, ...]  # per request
    mixed_order: Optional[str]  # both kinds present, no trees: PREFILLS_FIRST, DECODES_FIRST or INTERLEAVED
    prefill_causal: tuple[bool, ...]  # the causality of each request of more than one query token
    window: Optional[int]
    softcap: Optional[float]
    sinks: bool
    alibi: bool
    kv_dtype: Optional[str]  # None or "fp8_e4m3"/"fp8_e5m2"
    kv_scale: str
    page_size: int
    head_dim: int
    logit_scale: float = 1.0  # what FlashInfer multiplies raw q.k by: the softmax scale times the FP8 k_scale
    mask_fill: float = FA2_MASK_FILL  # the installed FlashInfer's math::inf (fa2_mask_fill)
    branching_trees: bool = False  # a tree request that is not a chain (its nodes' positions are not their rows)
    q_dtype: Optional[str] = None  # FP8 attention (model.q_dtype): fa3 only
    rope: bool = False  # fused RoPE (flashinfer_rope.py)
    short_kv: bool = False  # a non-causal request with more queries than keys
    scales16: bool = False  # K/V scales on a 16-bit cache (kv_cache.k_scale/v_scale)

    @property
    def mask_bits(self) -> float:
        """-log2 of the weight a masked key keeps on FlashInfer's fa2 kernel (row max 0). With
        ALiBi the kernel applies the scale in its logits transform, before the mask, and then
        multiplies by log2 e alone (flashinfer_alibi.py): the scale does not shrink the mask."""
        return self.mask_fill * (1.0 if self.alibi else self.logit_scale) * LOG2E

    @property
    def needs_mask(self) -> bool:
        """A custom mask is the only way: trees, causal and non-causal requests mixed, or a
        window over non-causal requests (FlashInfer's window_left is for causal rows)."""
        return self.trees or len(set(self.causal)) > 1 or (self.window is not None and not all(self.causal))


def facts_of(batch) -> Facts:
    h, spec = batch.host, batch.spec
    q = h.query_lens
    trees = bool(h.is_tree.any())
    multi = q > 1
    mixed = None
    if bool(multi.any()) and bool((~multi).any()) and not trees:
        changes = int((multi[1:] != multi[:-1]).sum())  # 1: two groups
        mixed = INTERLEAVED if changes > 1 else PREFILLS_FIRST if bool(multi[0]) else DECODES_FIRST
    return Facts(
        decode_only=not trees and bool((q == 1).all()),
        trees=trees,
        causal=tuple(bool(c) for c in h.causal),
        mixed_order=mixed,
        prefill_causal=tuple(bool(c) for c, m in zip(h.causal, multi) if m),
        window=spec.window,
        softcap=spec.softcap,
        sinks=bool(spec.sinks),
        alibi=bool(spec.alibi),
        kv_dtype=spec.kv_dtype,
        kv_scale=spec.kv_scale,
        page_size=spec.page_size,
        head_dim=spec.head_dim,
        # one host read of the scale tensor (as _scales does in plan): an engine holds it as a float
        logit_scale=float(batch.scale) * (float(batch.k_scale.max()) if batch.k_scale is not None else 1.0),
        branching_trees=any(r.tree_parents is not None and not is_chain(r.tree_parents) for r in batch.requests),
        q_dtype=spec.q_dtype,
        rope=spec.rope,
        short_kv=spec.short_kv,
        scales16=spec.k_scale is not None and spec.kv_dtype is None,
        mask_fill=fa2_mask_fill(),
    )


def mask_fill_of(header: str) -> Optional[float]:
    """The magnitude of ``math::inf`` in the text of FlashInfer's ``math.cuh``: 5e4 in 0.5.3
    (``constexpr float inf = 5e4;``), infinity from the release that made it IEEE -inf (0.7.2.post1:
    ``cuda::std::numeric_limits<float>::infinity()``); None when the text has no such line."""
    m = re.search(r"constexpr\s+float\s+inf\s*=\s*([^;]+);", header)
    if m is None:
        return None
    value = m.group(1).strip()
    if "infinity" in value:
        return math.inf
    try:
        return float(value.rstrip("fF"))
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def fa2_mask_fill() -> float:
    """The installed FlashInfer's mask logit magnitude, read from its ``math.cuh`` (found without
    importing FlashInfer); 0.5.3's 5e4 when it cannot be read (no FlashInfer, another layout)."""
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "data" / "include" / "flashinfer" / "math.cuh"
        if path.is_file():
            found = mask_fill_of(path.read_text(errors="replace"))
            if found is not None:
                return found
    return FA2_MASK_FILL


def route_reasons(route: str, f: Facts, sm_major: Optional[int] = 9) -> list[str]:
    """Why ``route`` cannot compute a batch with facts ``f`` ([] = it can). ``sm_major``: the
    GPU's compute capability major (None: unknown, e.g. on a CPU). Each reason names FlashInfer's
    limit, the releases read for it and the file that shows it (docs/backends.md, footnotes)."""
    out = []
    name = f"route {route}"
    # per-head FP8 scales are declined by the backend's capabilities; ALiBi: flashinfer_alibi.py
    if route in ("decode", "decode-tc", "xqa") and not f.decode_only:
        out.append(f"{name} computes decode-only batches (one query token per request, no trees)")
    if route == "fa3" and f.needs_mask:
        out.append(f"{name}: FlashInfer's fa3 prefill kernels take no custom mask (trees or mixed causal/non-causal requests)")
    if route == "fa3" and f.kv_dtype is not None and f.q_dtype is None:
        out.append(f"{name}: fa3 reads an FP8 cache only with FP8 queries (model.q_dtype)")
    out += _fp8_query_reasons(route, f) + rope_reasons(route, f)
    if f.short_kv and (route != "fa2" or f.alibi):
        out.append(f"{name}: more queries than keys (kv_len < query) run on route fa2 without ALiBi only (its "
                   "prefill kernel takes any qo_len/kv_len pair non-causally; the others are not checked)")
    if route == "fa3" and sm_major is not None and sm_major != 9:
        out.append(f"{name}: fa3 kernels need a Hopper GPU (sm_90), this one is sm_{sm_major}x")
    if f.sinks and route in SINKLESS:
        out.append(f"{name}: {SINKLESS[route]} (use route xqa, fa2 or fa3)")
    if route in FA2_KERNEL and f.mask_bits < MIN_MASK_BITS:
        kv = f" (an {f.kv_dtype} cache's k_scale folded in)" if f.kv_dtype else ""
        fill = f"{f.mask_fill:.0e}".replace("e+0", "e")
        out.append(f"{name}: FlashInfer's {MASK_KERNEL.get(route, 'fa2 kernel')} masks keys with the finite "
                   f"logit -{fill} before it applies the softmax scale, here {f.logit_scale:.3g}{kv}: a "
                   f"masked key keeps weight 2^-{f.mask_bits:.2g} (wrong outputs, no error; math.cuh inf = "
                   f"{fill} as in 0.5.3, prefill.cuh; 0.7.2.post1 masks with IEEE -inf); "
                   "not run (route decode scales before masking)")
    if route in ("fa2", "fa3") and f.sinks and f.softcap is not None:
        out.append(f"{name}: FlashInfer's attention-sink variant (0.5.3 and 0.7.2.post1: AttentionSink in "
                   "jit/attention/variants.py, which has no logits transform) has no soft-cap")
    if route in ("fa2", "fa3") and f.sinks and f.needs_mask:
        # seen on an H100 (gpu_library_routes.py, since removed; gpt-oss tree 8x40 @4k, W128 + sinks):
        # the sink wrapper with a custom mask returned rel. err 0.99 and raised nothing
        out.append(f"{name}: FlashInfer's attention-sink variant (0.5.3 and 0.7.2.post1: AttentionSink in "
                   "jit/attention/variants.py, whose logits mask applies only the window) ignores a custom mask "
                   "(trees, mixed causal): wrong outputs on an H100 (0.5.3), not run")
    out += _special_reasons(route, f, sm_major)
    return out + alibi_reasons(route, f)


#: the routes whose FlashInfer entry point takes no attention sinks (0.5.3 and 0.7.2.post1), and where
SINKLESS = {
    "decode": "FlashInfer's decode wrapper hands run(sinks=) to its trtllm-gen backend only (sm_100; 0.7.2.post1 "
              "also to cuDNN and cute-dsl), never to the CUDA-core kernel run here (0.5.3 and 0.7.2.post1: "
              "decode.py run, prefill.py paged_run)",
    "decode-tc": "FlashInfer's decode wrapper hands run(sinks=) to its trtllm-gen backend only (sm_100; 0.7.2.post1 "
                 "also to cuDNN and cute-dsl), never to the fa2 kernel run here (0.5.3 and 0.7.2.post1: "
                 "decode.py run, prefill.py paged_run)",
    "persistent": "FlashInfer's BatchAttention takes no sinks (0.5.3 attention.py, 0.7.2.post1 attention/_core.py: "
                  "plan/run)",
    "pod": "FlashInfer's BatchPODWithPagedKVCacheWrapper takes no sinks (0.5.3 and 0.7.2.post1: pod.py plan/run)",
}


def _fp8_query_reasons(route: str, f: Facts) -> list[str]:
    """FP8 attention (``model.q_dtype``): FlashInfer's fa3 kernels take FP8 queries with an FP8
    cache of the same dtype (``plan(q_data_type=, kv_data_type=, o_data_type=)``, ``run``'s
    ``q_scale``/``k_scale``/``v_scale``); its other kernels take 16-bit queries."""
    if f.q_dtype is None:
        return []
    name = f"route {route}"
    if route != "fa3":
        return [f"{name}: FlashInfer runs FP8 queries (model.q_dtype) on its fa3 kernels only (route fa3)"]
    out = []
    if f.kv_dtype != f.q_dtype:
        out.append(f"{name}: fa3's FP8 attention reads the queries and the cache in one FP8 dtype (q {f.q_dtype}, "
                   f"cache {f.kv_dtype or 'in the model dtype'})")
    if f.sinks:
        out.append(f"{name}: the attention-sink wrapper is not run with FP8 queries")
    return out


def _special_reasons(route: str, f: Facts, sm_major: Optional[int]) -> list[str]:
    name, out = f"route {route}", []
    if route == "xqa":
        if f.page_size not in XQA_PAGE_SIZES:
            out.append(f"{name}: XQA takes page sizes {'/'.join(map(str, XQA_PAGE_SIZES))}, got {f.page_size}")
        if f.softcap is not None:
            out.append(f"{name}: XQA has no logit soft-cap")
        if f.kv_dtype is not None:
            out.append(f"{name}: XQA on an FP8 cache ended in 'unspecified launch failure' on an H100 (lost CUDA "
                       "context; FlashInfer 0.5.3, not yet run on 0.7.2.post1); not run")
        if f.scales16:
            out.append(f"{name}: XQA's bmm1_scale/bmm2_scale over a 16-bit cache gave outputs off the reference "
                       "(rel. err 0.69, FlashInfer 0.7.2.post1 on an H200): K/V scales on a 16-bit cache run on "
                       "routes decode, decode-tc, fa2, fa3 and pod")
        if f.head_dim % 16 or f.head_dim > 256:
            out.append(f"{name}: XQA needs head_dim a multiple of 16 up to 256 (FlashInfer 0.5.3's jit/xqa.py; "
                       "0.7.2.post1's takes up to 512, refused here until a GPU run checks it), got "
                       f"{f.head_dim}")
        if sm_major is not None and sm_major < 9:
            out.append(f"{name}: XQA needs sm_90 or newer, this GPU is sm_{sm_major}x")
    if route == "persistent":
        if f.needs_mask:
            out.append(f"{name}: FlashInfer's BatchAttention.plan takes one causal flag for the whole batch and "
                       f"no custom mask ({BATCH_ATTENTION}): no trees or mixed causal/non-causal requests")
        if f.window is not None:
            out.append(f"{name}: FlashInfer's BatchAttention.plan takes no window_left ({BATCH_ATTENTION})")
    if route == "pod":
        out += _pod_reasons(name, f)
    return out


def _pod_reasons(name: str, f: Facts) -> list[str]:
    """``BatchPODWithPagedKVCacheWrapper`` (pod.py): one prefill group (queries ``q_p``, one
    ``causal_p``) and one decode group (``q_d``), as two tensors, in one launch."""
    pod, src, out = "FlashInfer's BatchPODWithPagedKVCacheWrapper", "0.5.3 and 0.7.2.post1: pod.py", []
    if f.trees:
        out.append(f"{name}: {pod}.run takes its prefill custom mask without a per-request mask_indptr "
                   f"({src} passes None): no trees")
    elif f.mixed_order is None:
        out.append(f"{name}: {pod} fuses a prefill group with a decode group ({src} plan/run take both): "
                   "the batch needs both")
    elif f.mixed_order == INTERLEAVED:
        out.append(f"{name}: {pod}.run takes the prefill and the decode queries as two tensors (q_p, q_d; {src}) and "
                   "returns two outputs: each group must be one run of the batch's packed queries, and here prefill "
                   "and decode requests interleave (an engine orders its batch into the two groups; attnbench does "
                   "not time copies it would not make)")
    if len(set(f.prefill_causal)) > 1:
        out.append(f"{name}: {pod}.run takes one causal_p for all prefill requests ({src}): no mix of causal and "
                   "non-causal prefills")
    elif f.window is not None and not all(f.prefill_causal):
        out.append(f"{name}: {pod} applies window_left to causal rows only and takes no per-request custom mask "
                   f"({src}): no window on non-causal prefills")
    if f.softcap is not None:
        out.append(f"{name}: {pod} has no logit soft-cap ({src} plan fixes logits_soft_cap = 0.0, "
                   "'not supported currently')")
    return out


def auto_route(f: Facts, sm_major: Optional[int] = 9) -> str:
    """The route an engine would take for a batch without shared prefix pages (see the module
    docstring); the cascade is decided before, from the batch's prefix groups."""
    if f.q_dtype is not None:
        return "fa3"  # FP8 attention: the only route with FP8 queries (its reasons say when it cannot)
    if f.decode_only:
        if f.sinks and not route_reasons("xqa", f, sm_major):
            return "xqa"
        if f.sinks:
            return "fa2"
        return "decode" if route_reasons("decode-tc", f, sm_major) else "decode-tc"
    if f.mixed_order is not None and f.kv_dtype is None and not route_reasons("persistent", f, sm_major):
        return "persistent"  # prefills and decodes together (H100, 2x512 + 16 decodes: 172 us vs fa2 291, fa3 365)
    if not route_reasons("fa3", f, sm_major):
        return "fa3"
    return "fa2"
