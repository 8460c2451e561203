"""What a batch is, without its tensors: requests and shapes (no torch import here, so that
reading and validating scenarios stays fast). ``batch.materialize`` turns a spec into tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from attnbench.workload.mla import is_mla, spec_problems
from attnbench.workload.units import format_int

if TYPE_CHECKING:
    import torch

# The facts of a batch, defined here once: the scenario's schema (workload.scenario), the
# tensors (workload.batch) and the backend contract (backend.KINDS) take them from here.
#: request kinds (docs/semantics.md)
KINDS = ("prefill", "decode", "tree")
#: how a request's pages are placed in the cache (workload.pages)
LAYOUTS = ("contiguous", "shuffled", "shuffled-within", "reversed", "interleaved")
#: dtype name -> bytes per element (``BatchSpec.torch_dtype`` is the torch dtype)
DTYPE_NAMES = {"float32": 4, "float16": 2, "bfloat16": 2}
MODEL_DTYPES = tuple(DTYPE_NAMES)
#: FP8 KV-cache dtype name -> (torch dtype name, largest finite value); 1 byte per element
FP8_DTYPES = {"fp8_e4m3": ("float8_e4m3fn", 448.0), "fp8_e5m2": ("float8_e5m2", 57344.0)}
#: what kv_cache.dtype may name: an FP8 dtype, or the model's dtype spelled out
KV_DTYPES = (*FP8_DTYPES, *MODEL_DTYPES)
KV_SCALES = ("per-tensor", "per-head")
KV_ORDERS = ("NHD", "HND")
#: FP8 output dtypes (model.out_dtype): e4m3, as FlashInfer's and TensorRT-LLM's FP8 outputs
OUT_DTYPES = ("fp8_e4m3",)
#: the order of soft-cap and ALiBi on a score (docs/semantics.md "Scores, in this order")
SCORE_ORDERS = ("softcap-alibi", "alibi-softcap")


def check_kv_dtype(model_dtype: str, d: Optional[str]) -> None:
    """ValueError when the cache dtype ``d`` (None: the model's) cannot serve the model's dtype."""
    if d is not None and d.startswith("fp8") and model_dtype == "float32":
        raise ValueError(
            f"kv_cache.dtype {d} needs a 16-bit model: set model.dtype to bfloat16 or float16 (FP8 caches"
            " serve 16-bit models), or leave kv_cache.dtype out"
        )
    if d is not None and not d.startswith("fp8") and d != model_dtype:
        raise ValueError(
            f"kv_cache.dtype {d} differs from model.dtype {model_dtype}: a cache that is not FP8 has the model's"
            " dtype; leave kv_cache.dtype out, or use fp8_e4m3 / fp8_e5m2"
        )


#: the range of a soft-cap: float32's normal numbers. Kernels compute ``c * tanh(s / c)`` in float32
#: (the scores are float32 in every library, and in SDPA's eager path and Flex here), so a cap
#: float32 cannot hold turns every score into NaN (``s / inf * inf``), whatever the model dtype.
SOFTCAP_RANGE = (1.1754943508222875e-38, 3.4028234663852886e38)


def softcap_problem(c: float) -> Optional[str]:
    """Why ``c`` cannot be a soft-cap, or None (docs/semantics.md, "Scores, in this order")."""
    lo, hi = SOFTCAP_RANGE
    if not c > 0:
        return f"softcap must be > 0 (got {c}), e.g. softcap: 50"
    if not lo <= c <= hi:
        return (f"softcap {c:g} is outside float32's range ({lo:.3g} to {hi:.3g}), in which kernels compute the cap "
                f"c * tanh(s / c): every score would be NaN; give a cap in that range, e.g. softcap: 50")
    return None


@dataclass(frozen=True)
class Request:
    """One request of a batch. ``query`` new tokens attend to ``context`` cached ones.

    Requests with the same ``prefix_group`` share their first ``shared_prefix`` context tokens:
    the whole pages of it are the same physical pages (docs/semantics.md, "Shared prefixes")."""

    kind: str
    query: int
    context: int
    tree_parents: Optional[tuple[int, ...]] = None
    tree_dynamic: bool = False  # the tree changes every step (trees.tree_is_dynamic)
    shared_prefix: int = 0
    prefix_group: Optional[int] = None
    causal: bool = True  # False: a bidirectional prefill (every query sees every key of its request)

    @property
    def kv_len(self) -> int:
        return self.context + self.query


@dataclass(frozen=True)
class BatchSpec:
    """Everything needed to materialize a batch: shapes, layout and the requests."""

    requests: tuple[Request, ...]
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    page_size: int = 16
    layout: str = "shuffled"
    scale: Optional[float] = None
    # Attention variants (docs/semantics.md); the defaults are plain causal attention.
    window: Optional[int] = None  # W >= 1: a query at position p sees keys at positions > p - W
    sinks: bool = False  # one seeded sink logit per query head in every softmax denominator
    softcap: Optional[float] = None  # c > 0: scores -> c * tanh(scores / c)
    alibi: bool = False  # scores += slope_h * (key position - query position)
    kv_dtype: Optional[str] = None  # None: the model dtype; "fp8_e4m3" | "fp8_e5m2"
    kv_scale: str = "per-tensor"  # FP8 scales: "per-tensor" | "per-head"
    kv_order: str = "NHD"  # storage order of the cache pages: "NHD" | "HND"
    # Given K/V scales of a cache in the model dtype (docs/semantics.md "K/V scales"): K is
    # k_cache * k_scale, V is v_cache * v_scale, as FlashInfer's k_scale/v_scale for any dtype.
    k_scale: Optional[float] = None
    v_scale: Optional[float] = None
    # Rotary embedding applied inside attention (docs/semantics.md "Fused RoPE"), Llama style
    rope: bool = False
    rope_theta: float = 1e4
    rope_scale: float = 1.0
    score_order: str = "softcap-alibi"  # or "alibi-softcap": ALiBi added before the soft-cap
    q_dtype: Optional[str] = None  # FP8 queries (docs/semantics.md "FP8 attention"): "fp8_e4m3" | "fp8_e5m2"
    out_dtype: Optional[str] = None  # FP8 output (docs/semantics.md "FP8 output"): "fp8_e4m3"
    out_scale: float = 1.0  # the FP8 output holds O / out_scale

    # Multi-head latent attention (workload/mla.py): "mla" caches one latent head of
    # head_dim = kv_lora_rank + rope_dim; its values are the first kv_lora_rank dims.
    attention: str = "mha"
    kv_lora_rank: int = 0
    rope_dim: int = 0

    def __post_init__(self):
        problems = spec_problems(self.attention, self.num_kv_heads, self.head_dim, self.kv_lora_rank, self.rope_dim)
        if problems:
            raise ValueError("; ".join(problems))
        self._check_variants()
        size: dict = {}
        for r in self.requests:
            if r.prefix_group is None:
                continue
            if not 0 <= r.shared_prefix <= r.context:
                raise ValueError(f"shared_prefix {r.shared_prefix} must be in 0..context ({r.context})")
            if size.setdefault(r.prefix_group, r.shared_prefix) != r.shared_prefix:
                raise ValueError(f"prefix group {r.prefix_group}: its requests give different shared_prefix lengths")

    def _check_variants(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 (got {self.window}); None means no window")
        if self.softcap is not None and softcap_problem(self.softcap):
            raise ValueError(f"{softcap_problem(self.softcap)}; None means no soft-capping")
        if self.kv_dtype is not None and self.kv_dtype not in FP8_DTYPES:
            raise ValueError(f"kv_dtype must be None (the model dtype) or one of {', '.join(FP8_DTYPES)}, got {self.kv_dtype!r}")
        if self.kv_dtype is not None and self.dtype == "float32":
            raise ValueError(f"an {self.kv_dtype} KV cache needs a 16-bit model dtype (float16 or bfloat16), not float32")
        if self.kv_scale not in KV_SCALES:
            raise ValueError(f"kv_scale must be one of {', '.join(KV_SCALES)}, got {self.kv_scale!r}")
        if self.kv_order not in KV_ORDERS:
            raise ValueError(f"kv_order must be one of {', '.join(KV_ORDERS)}, got {self.kv_order!r}")
        self._check_scales()
        for r in self.requests:
            if not r.causal and r.kind != "prefill":
                raise ValueError(f"causal=False is for prefill requests only, not {r.kind}")
            if r.context < 0 and (r.causal or r.kind != "prefill" or r.kv_len < 1):
                raise ValueError(f"a request with more queries ({r.query}) than keys ({r.kv_len}) must be a non-causal"
                                 " prefill with at least one key")

    def _check_scales(self) -> None:
        if (self.k_scale is None) != (self.v_scale is None):
            raise ValueError("give both k_scale and v_scale, or neither")
        if self.k_scale is not None and is_mla(self):
            raise ValueError("k_scale/v_scale are for attention: mha (an MLA latent cache is K and V at once)")
        if self.k_scale is not None and (self.fp8 or not (self.k_scale > 0 and self.v_scale > 0)):
            raise ValueError("k_scale/v_scale are positive scales of a cache in the model dtype (an FP8 cache's"
                             " scales come from its data)")
        if self.rope and (is_mla(self) or self.head_dim % 2 or not (self.rope_theta > 0 and self.rope_scale > 0)):
            raise ValueError("rope needs attention mha, an even head_dim, rope_theta > 0 and rope_scale > 0")
        if self.score_order not in SCORE_ORDERS:
            raise ValueError(f"score_order must be one of {', '.join(SCORE_ORDERS)}, got {self.score_order!r}")
        if self.out_dtype is not None and (self.out_dtype not in OUT_DTYPES or self.dtype == "float32"
                                           or is_mla(self) or not self.out_scale > 0):
            raise ValueError(f"out_dtype must be one of {', '.join(OUT_DTYPES)} on a 16-bit mha model with out_scale > 0")
        if self.q_dtype is not None and (self.q_dtype not in FP8_DTYPES or self.dtype == "float32"):
            raise ValueError(f"q_dtype must be one of {', '.join(FP8_DTYPES)} on a 16-bit model, got {self.q_dtype!r}")

    @property
    def fp8(self) -> bool:
        return self.kv_dtype is not None

    @property
    def short_kv(self) -> bool:
        """Some request has more queries than keys (a non-causal prefill, context < 0)."""
        return any(r.context < 0 for r in self.requests)

    @property
    def alibi_first(self) -> bool:
        """ALiBi is added before the soft-cap (only matters when the batch has both)."""
        return self.alibi and self.softcap is not None and self.score_order == "alibi-softcap"

    @property
    def kv_element_bytes(self) -> int:
        """Bytes per K or V element in the cache (1 for FP8)."""
        return 1 if self.fp8 else DTYPE_NAMES[self.dtype]

    @property
    def kv_scale_count(self) -> int:
        """float32 scales per K (and per V) cache: 0 without FP8, 1 per tensor, Hkv per head."""
        if not self.fp8:
            return 0
        return 1 if self.kv_scale == "per-tensor" else self.num_kv_heads

    @property
    def v_head_dim(self) -> int:
        """Width of a value (and of the output): ``kv_lora_rank`` for MLA, ``head_dim`` otherwise."""
        return self.kv_lora_rank if is_mla(self) else self.head_dim

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)

    def shared_pages(self, r: Request) -> int:
        """Whole pages of ``r``'s shared prefix (a partial last page is ``r``'s own copy)."""
        return r.shared_prefix // self.page_size if r.prefix_group is not None else 0

    def prefix_groups(self) -> dict[int, list[int]]:
        """Prefix group -> indices of its requests, for groups that share at least one page."""
        out: dict[int, list[int]] = {}
        for i, r in enumerate(self.requests):
            if self.shared_pages(r):
                out.setdefault(r.prefix_group, []).append(i)
        return out

    def page_runs(self) -> list[tuple[Optional[int], Optional[int], int]]:
        """The cache's pages as runs in allocation order: ``(prefix group, None, n)`` for a
        group's shared pages (just before its first request's own pages) and ``(None, i, n)``
        for request i's own pages."""
        runs: list[tuple[Optional[int], Optional[int], int]] = []
        seen = set()
        for i, r in enumerate(self.requests):
            shared = self.shared_pages(r)
            if shared and r.prefix_group not in seen:
                seen.add(r.prefix_group)
                runs.append((r.prefix_group, None, shared))
            runs.append((None, i, self.pages_of(r) - shared))
        return runs

    @property
    def num_tokens(self) -> int:
        return sum(r.query for r in self.requests)

    def pages_of(self, r: Request) -> int:
        return math.ceil(r.kv_len / self.page_size)

    @property
    def num_pages(self) -> int:
        """Pages in the cache: every request's own pages, each shared page once, and page 0
        kept as the null page."""
        return 1 + sum(n for _, _, n in self.page_runs())

    def memory_bytes(self) -> int:
        """Bytes the materialized batch takes on its device (q, out, caches, tables); an FP8
        cache adds the float32 copy of one cache it is quantized from while it is built."""
        el = DTYPE_NAMES[self.dtype]
        caches = 1 if is_mla(self) else 2  # MLA's values are a view of its latent cache
        slots = self.num_pages * self.page_size * self.num_kv_heads * self.head_dim
        kv = caches * slots * self.kv_element_bytes + (4 * slots if self.fp8 else 0)
        qo = self.num_tokens * self.num_q_heads * (self.head_dim + self.v_head_dim) * el
        return kv + qo


def describe(spec: BatchSpec) -> str:
    """``32 decode@4.5k sharing 4k + 2 prefill 512 + 8 tree(5)@2k + 1 chain3@2k``: runs of requests that read
    the same (``sharing N``: their first N context tokens are a shared prefix). Requests are
    counted by what the text shows: 16 dynamic trees of 60 nodes with different shapes are
    ``16 dynamic tree(60)@4k``, not the same words 16 times."""
    parts: list[list] = []  # [count, text]
    for r in spec.requests:
        text = _request_text(r)
        if parts and parts[-1][1] == text:
            parts[-1][0] += 1
        else:
            parts.append([1, text])
    return " + ".join(f"{count} {text}" for count, text in parts) + "".join(f"; {v}" for v in variant_words(spec))


def _request_text(r: Request) -> str:
    if r.kind == "decode":
        s = f"decode@{format_int(r.context)}"
    elif r.kind == "tree":
        s = f"{'dynamic ' if r.tree_dynamic else ''}{tree_word(None if r.tree_dynamic else r.tree_parents, r.query)}@{format_int(r.context)}"
    elif r.context < 0:
        s = f"non-causal prefill {format_int(r.query)} over {format_int(r.kv_len)} keys"
    else:
        s = f"{'' if r.causal else 'non-causal '}prefill {format_int(r.query)}"
        s += f"@{format_int(r.context)}" if r.context else ""
    return s + (f" sharing {format_int(r.shared_prefix)}" if r.prefix_group is not None else "")


def tree_word(parents, nodes: int) -> str:
    """A verified tree in words, one spelling everywhere (tables, batch lines, imported
    scenarios' comments): a chain of k drafts (``tree: {chain: k}``, k + 1 nodes) is ``chaink``,
    as its case id spells it (``1chain3-at192``); any other tree ``tree(N)``, N nodes with the root."""
    if parents is not None and nodes > 1 and all(p == i - 1 for i, p in enumerate(parents)):
        return f"chain{nodes - 1}"
    return f"tree({nodes})"


def variant_words(spec: BatchSpec) -> list[str]:
    """The attention variants of ``spec`` in words (``fp8_e4m3 KV per-head``, ``window 128``,
    ...); [] for plain attention in the model dtype, NHD."""
    words = [f"MLA {spec.kv_lora_rank}+{spec.rope_dim}"] if is_mla(spec) else []
    if spec.fp8:
        words.append(f"{spec.kv_dtype} KV {spec.kv_scale}")
    if spec.k_scale is not None:
        words.append(f"k_scale {spec.k_scale:g} v_scale {spec.v_scale:g}")
    if spec.q_dtype is not None:
        words.append(f"{spec.q_dtype} q")
    if spec.out_dtype is not None:
        words.append(f"{spec.out_dtype} out scale {spec.out_scale:g}")
    if spec.kv_order != "NHD":
        words.append(f"{spec.kv_order} cache")
    if spec.window is not None:
        words.append(f"window {format_int(spec.window)}")
    if spec.sinks:
        words.append("sinks")
    if spec.softcap is not None:
        words.append(f"softcap {spec.softcap:g}")
    if spec.alibi:
        words.append("alibi before softcap" if spec.alibi_first else "alibi")
    if spec.rope:
        words.append(f"rope theta {spec.rope_theta:g}" + (f" scale {spec.rope_scale:g}" if spec.rope_scale != 1 else ""))
    return words
