"""The scenario's ``model:``, ``kv_cache:`` and ``batch:`` groups as validated models (the
rest of the file and the loading: ``workload/scenario.py``). docs/scenarios.md, docs/semantics.md."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from attnbench.workload import mla
from attnbench.workload.spec import (FP8_DTYPES, KINDS, KV_DTYPES, KV_ORDERS, KV_SCALES, LAYOUTS, MODEL_DTYPES,
                                     OUT_DTYPES, SCORE_ORDERS, Request, softcap_problem)
from attnbench.workload.trees import TreeError, parse_tree, tree_is_dynamic
from attnbench.workload.units import parse_int

SizeInt = Annotated[int, BeforeValidator(parse_int)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelShape(Strict):
    num_q_heads: SizeInt = Field(ge=1, le=1024)
    num_kv_heads: Optional[SizeInt] = Field(default=None, ge=1, le=1024, description="required for attention: mha")
    head_dim: Optional[SizeInt] = Field(default=None, ge=1, le=1024, description="required for attention: mha")
    dtype: Literal[MODEL_DTYPES] = "bfloat16"
    scale: Optional[float] = Field(default=None, gt=0, description="softmax scale; default head_dim ** -0.5; mla: (qk_nope_head_dim + rope_dim) ** -0.5")
    attention: Literal["mha", "mla"] = Field(default="mha", description="mla: multi-head latent attention, absorbed")
    kv_lora_rank: Optional[SizeInt] = Field(default=None, ge=1, le=4096, description="mla: latent = value dims (512)")
    rope_dim: Optional[SizeInt] = Field(default=None, ge=0, le=1024, description="mla: rotary key dims (64)")
    qk_nope_head_dim: Optional[SizeInt] = Field(default=None, ge=1, le=4096, description="mla: for the scale (128)")
    window: Optional[SizeInt] = Field(
        default=None, description="sliding window W >= 1: a query at position p sees keys at positions > p - W"
    )
    sinks: bool = Field(default=False, description="one seeded sink logit per query head in every softmax denominator")
    softcap: Optional[float] = Field(default=None, description="logit soft-cap c > 0: scores -> c * tanh(scores / c)")
    alibi: bool = Field(default=False, description="ALiBi: scores += slope_h * (key position - query position)")
    score_order: Literal[SCORE_ORDERS] = Field(
        default="softcap-alibi",
        description="with both softcap and alibi: softcap-alibi caps q.k then adds ALiBi; alibi-softcap adds"
        " ALiBi then caps the sum (FlashInfer's order)",
    )
    rope: bool = Field(
        default=False, description="fused Llama-style rotary embedding on q and k at their positions (the cache"
        " holds keys before rotation); mha only, even head_dim",
    )
    rope_theta: float = Field(default=1e4, gt=0, description="rope: base of the rotary frequencies")
    rope_scale: float = Field(default=1.0, gt=0, description="rope: positions are divided by this")
    out_dtype: Optional[Literal[OUT_DTYPES]] = Field(
        default=None, description="FP8 output: the attention output O is written as round_fp8(O / out_scale) (a 16-bit"
        " mha model); the check reads it back times out_scale",
    )
    out_scale: float = Field(default=1.0, gt=0, description="out_dtype: the output's scale")
    q_dtype: Optional[Literal[tuple(FP8_DTYPES)]] = Field(
        default=None, description="FP8 attention: q quantized to this FP8 dtype with a per-tensor scale from the"
        " data (a 16-bit model); the reference reads the quantized q",
    )

    @model_validator(mode="after")
    def _gqa(self):
        mla.check_model(self)  # the heads and dims of attention: mha (GQA) or mla
        if self.window is not None and self.window < 1:
            raise ValueError(
                f"window must be >= 1 (got {self.window}): a window of W keys lets a query at position p see keys"
                " at positions > p - W; leave `window` out for full attention"
            )
        if self.softcap is not None and softcap_problem(self.softcap):
            raise ValueError(f"{softcap_problem(self.softcap)}; leave it out for no soft-capping")
        if self.rope and (self.attention == "mla" or (self.head_dim or 0) % 2):
            raise ValueError("rope: true needs attention: mha and an even head_dim (MLA keeps its rotary part in"
                             " rope_dim, already applied)")
        if self.out_dtype is not None and (self.dtype == "float32" or self.attention == "mla"):
            raise ValueError(f"out_dtype {self.out_dtype} needs a 16-bit model (bfloat16 or float16) and attention: mha")
        if self.q_dtype is not None and self.dtype == "float32":
            raise ValueError(f"q_dtype {self.q_dtype} needs a 16-bit model: set model.dtype to bfloat16 or float16")
        return self


class KVCache(Strict):
    page_size: SizeInt = Field(default=16, ge=1, le=4096)
    layout: Literal[LAYOUTS] = "shuffled"
    dtype: Optional[Literal[KV_DTYPES]] = Field(
        default=None, description="cache dtype: fp8_e4m3 or fp8_e5m2 (scales from the data), else the model dtype"
    )
    scale: Literal[KV_SCALES] = Field(
        default="per-tensor",
        description="FP8 scales: one per K/V cache (per-tensor) or one per KV head (per-head); unused by a cache in the model dtype",
    )
    order: Literal[KV_ORDERS] = Field(
        default="NHD", description="page storage order: NHD [page, head, dim] or HND [head, page, dim]"
    )
    k_scale: Optional[float] = Field(
        default=None, gt=0, description="a cache in the model dtype: K = k_cache * k_scale (with v_scale)"
    )
    v_scale: Optional[float] = Field(
        default=None, gt=0, description="a cache in the model dtype: V = v_cache * v_scale (with k_scale)"
    )

    @model_validator(mode="after")
    def _scales(self):
        if (self.k_scale is None) != (self.v_scale is None):
            raise ValueError("give both k_scale and v_scale (1 for the one you do not want), or neither")
        if self.k_scale is not None and self.dtype is not None and self.dtype.startswith("fp8"):
            raise ValueError(f"k_scale/v_scale are for a cache in the model dtype; an {self.dtype} cache's scales"
                             " come from its data: leave them out, or leave out dtype")
        return self


class Group(Strict):
    """A group of ``count`` identical requests."""

    kind: Literal[KINDS]
    count: SizeInt = Field(default=1, ge=1, le=65536)
    context: SizeInt = Field(default=0, ge=0, le=1 << 24)
    kv_len: Optional[SizeInt] = Field(
        default=None, ge=1, le=1 << 24,
        description="kind: prefill, instead of context: the request's key count L; L < query only with causal:"
        " false (the cache holds the last L new tokens' keys)",
    )
    query: Optional[SizeInt] = Field(default=None, ge=1, le=1 << 20)
    tree: Optional[dict[str, Any]] = Field(
        default=None,
        description="one of: choices, chain, full {depth, branching}, branching [..], random {nodes, max_depth, max_children, seed}, parents [..], preset NAME (`attnbench trees`); add dynamic: true for a tree that changes every step",
    )
    shared_prefix: SizeInt = Field(
        default=0, ge=0, le=1 << 24,
        description="the group's requests share their first N context tokens: whole pages are the same pages",
    )
    causal: bool = Field(
        default=True, description="kind: prefill only: false makes it bidirectional (every query sees every key of its request)"
    )
    compare_with: list[Literal["chain", "decode"]] = Field(
        default=[], max_length=2,
        description="kind: tree only: also run each case with this group as chains of equal node count"
        " (prefill of the tree's node count) and/or as plain decodes (`attnbench tree-costs` reads them)",
    )

    @model_validator(mode="after")
    def _shape(self):
        if self.kind == "decode":
            if self.query not in (None, 1):
                raise ValueError(f"a decode has query 1, got {self.query}; use kind: prefill for more tokens")
            self.query = 1
        if self.kind == "prefill" and self.query is None:
            raise ValueError("a prefill needs `query` (new tokens), e.g. query: 512")
        if self.kind != "tree" and self.tree is not None:
            raise ValueError("`tree` is only for kind: tree")
        if self.kind == "tree":
            if self.tree is None:
                raise ValueError("kind: tree needs `tree`, e.g. tree: {chain: 4} or tree: {choices: [[0], [1]]}")
            try:
                parents = parse_tree(self.tree)
            except TreeError as e:
                raise ValueError(str(e)) from None
            if self.query is not None and self.query != len(parents):
                raise ValueError(f"query ({self.query}) must equal the tree's node count ({len(parents)}) or be left out")
            self.query = len(parents)
        self._kv_len()
        if self.shared_prefix and self.shared_prefix > self.context:
            raise ValueError(
                f"shared_prefix ({self.shared_prefix}) is larger than the context ({self.context}): the shared"
                f" prompt is part of the cached context; lower shared_prefix or raise context"
            )
        if not self.causal and self.kind != "prefill":
            raise ValueError(
                f"causal: false is for kind: prefill only (a {self.kind} attends causally to its cache); remove it here"
            )
        if self.compare_with and self.kind != "tree":
            raise ValueError(f"compare_with is only for kind: tree (this group is kind: {self.kind}); remove it here")
        return self

    def _kv_len(self) -> None:
        if self.kv_len is None:
            return
        if self.kind != "prefill":
            raise ValueError(f"kv_len is for kind: prefill (this group is kind: {self.kind}); give context instead")
        if "context" in self.model_fields_set:
            raise ValueError("give context or kv_len, not both (kv_len = context + query)")
        if self.kv_len < self.query and self.causal:
            raise ValueError(
                f"kv_len {self.kv_len} < query {self.query} needs causal: false: causal queries aligned bottom-right"
                f" would leave the first {self.query - self.kv_len} of them no key to see"
            )
        self.context = self.kv_len - self.query  # < 0: more queries than keys (docs/semantics.md)

    def requests(self, group_id: Optional[int] = None) -> list[Request]:
        """The group's requests; ``group_id`` names its prefix group when it shares a prefix."""
        parents, dyn = (tuple(parse_tree(self.tree)), tree_is_dynamic(self.tree)) if self.kind == "tree" else (None, False)
        share = dict(shared_prefix=self.shared_prefix, prefix_group=group_id) if self.shared_prefix else {}
        return [Request(self.kind, self.query, self.context, parents, dyn, causal=self.causal, **share)
                for _ in range(self.count)]
