"""FlexAttention on K/V gathered out of the pages, padded per request.

Layout: queries ``[B, Hq, Qmax, D]`` and keys/values ``[B, Hkv, Lmax, D]`` (one batch row per
request, so the kernel's grid has B x heads x query blocks programs). ``convert`` pads the
queries and gathers K/V (an FP8 cache dequantized with its scales, either storage order): what
Flex needs because it cannot read the pages (convert_ms).

``plan`` (plan_ms) builds, by array ops on the host lengths, per-row tables (causal limit,
window start, tree region, positions) and from them the ``BlockMask`` by per-block KV indices
(``BlockMask.from_kv_blocks``, ``_flex_blocks.py``): which KV blocks each query block reads and
which are fully visible, as an engine with paged attention computes them. The ``mask_mod``
decides inside partial blocks: keys past the request's length hidden; causal (bottom-right)
for prefill/decode, every key for a non-causal prefill, prefix + ancestors for tree nodes (an
ancestor table); the window on positions (a tree node at C + its depth). Option
``mask=dense`` builds the block mask the old way instead (``create_block_mask`` evaluating the
``mask_mod`` over the padded grid), to measure the difference. Option ``kernel=flash`` runs Flex's
FLASH backend (``kernel_options={"BACKEND": "FLASH"}``: FlashAttention-4's CuTe kernel under the
same masks and score_mod, flash-attn-4 installed; what it refuses: ``_flex_flash.py``).

Variants: soft-cap and ALiBi in a ``score_mod`` (``c * tanh(s / c)``, then
``slope_h * (key position - query position)``); sinks exactly from Flex's LSE (natural log):
``out * sigmoid(lse - sink_h)`` = ``sum exp(s) v / (exp(sink) + sum exp(s))``.

On the GPU ``flex_attention`` is compiled (``torch.compile(dynamic=False)``); batches with more
than one query per request force the flex (not the decoding) kernel
(``kernel_options={"FORCE_USE_FLEX_ATTENTION": True}``), because the decoding kernel failed for
GQA tree masks on an H100 (docs/backends.md). The row's mode names the mask build and the
kernel options. On the CPU it runs unfused.

Head dims past 256 (MLA's 576-wide latent keys, 512-wide values): torch's default tiles for
them (``BLOCK_M=64, BLOCK_N=32``, 3 stages, in ``template_heuristics``) need 428032 bytes of
shared memory per program on an H100, which allows 232448 (227 KB): the kernel failed to
build (InductorError, issue 32). Its Triton template pads both head dims to powers of two
(``QK_HEAD_DIM_ROUNDED``: 576 -> 1024) and keeps the query tile and ``num_stages`` K and V
tiles in shared memory; ``flex_smem_bytes`` estimates that and reproduces the 428032.
``wide_tiles`` takes the largest tiles of ``WIDE_TILES`` that fit under the limit with a
margin (576/512, 16-bit: 32 x 32, one stage, 8 warps: about 166 KB) and passes them as
kernel options; head dims up to 256 keep torch's own choice (no tile options).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch

from attnbench.backend import Backend, BackendOption
from attnbench.workload.batch import Batch

from ._dense import Dense, dense_working_set, gather_padded_kv, padded_queries, rope_dense, unpad_output
from ._flex_blocks import block_mask_from_kv_blocks, make_mask_mod, row_tables
from ._flex_flash import flash_reasons, flash_unavailable, flash_version, lse_scale

BLOCK = 128  # Flex's default block size (query and key), as create_block_mask uses
SMEM_LIMIT = 232448  # bytes of shared memory one program may use on an H100/H200 (227 KB)
SMEM_MARGIN = 8192  # kept free under the limit: what the estimate does not count (barriers, layouts)
#: (BLOCK_M, BLOCK_N, num_stages, num_warps) for head dims past 256, preferred first; 8 warps keep
#: the [BLOCK_M, 512] float32 accumulator and the query tile within registers at BLOCK_M 32-64
WIDE_TILES = ((64, 32, 2, 8), (32, 32, 2, 8), (64, 32, 1, 8), (32, 32, 1, 8), (64, 16, 1, 8),
              (32, 16, 1, 8), (16, 32, 1, 4), (16, 16, 1, 4))


def _pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def flex_smem_bytes(d_qk: int, d_v: int, elsize: int, block_m: int, block_n: int, stages: int) -> int:
    """Shared memory of one program of Flex's Triton kernel: head dims padded to powers of two,
    the query tile and ``stages`` K and V tiles, 2 KB besides (the H100's figure for torch's
    default at 576/512 bf16, 64/32/3 stages: 428032 bytes)."""
    dq, dv = _pow2(d_qk), _pow2(d_v)
    return elsize * (block_m * dq + stages * block_n * (dq + dv)) + 2048


def wide_tiles(d_qk: int, d_v: int, elsize: int, max_block_m: int = 128) -> Optional[dict]:
    """Kernel options for head dims past 256 ({} up to 256: torch's own tiles fit and stay), the
    first of ``WIDE_TILES`` with ``BLOCK_M <= max_block_m`` that fits in shared memory, or None
    when none does."""
    if _pow2(d_qk) <= 256 and _pow2(d_v) <= 256:
        return {}
    for bm, bn, stages, warps in WIDE_TILES:
        if bm <= max_block_m and flex_smem_bytes(d_qk, d_v, elsize, bm, bn, stages) <= SMEM_LIMIT - SMEM_MARGIN:
            return {"BLOCK_M": bm, "BLOCK_N": bn, "num_stages": stages, "num_warps": warps}
    return None


@dataclass
class FlexPlan:
    mode: str
    q: torch.Tensor  # [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, Hkv, Lmax, D]
    v: torch.Tensor
    block_mask: Any
    score_mod: Any
    scale: float
    fn: Any
    kernel_options: dict
    index: torch.Tensor  # real tokens in [B * Qmax], packed order
    sinks: Optional[torch.Tensor]  # [1, Hq, 1] float32 sink logits, or None
    finish: Any = None  # Batch.finish_output: the output in the model dtype or in FP8 (model.out_dtype)
    lse_scale: float = 1.0  # what the returned LSE is multiplied by to be natural-log (_flex_flash.lse_scale)


# On the CPU the unfused path is what runs (and is fine); its warning only adds noise.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    import torch._dynamo

    from torch.nn.attention.flex_attention import flex_attention

    # Every case of a sweep is a new static shape: allow more recompiles than the default 8,
    # or torch.compile would silently fall back to the unfused path after the eighth.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    return torch.compile(flex_attention, dynamic=False)


def _lse_kwargs() -> dict:
    """Ask Flex for its LSE (``return_aux`` where this torch has it, else ``return_lse``)."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest

        return {"return_aux": AuxRequest(lse=True)}
    except ImportError:
        return {"return_lse": True}


class FlexBackend(Backend):
    name = "flex"
    supports_window = True
    supports_sinks = True
    supports_softcap = True
    supports_alibi = True
    supports_noncausal = True
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")  # dequantized in convert
    kv_scales = ("per-tensor", "per-head")
    kv_orders = ("NHD", "HND")
    options = {
        "mask": BackendOption(
            "mask", "blocks", choices=("blocks", "dense"),
            help="blocks: BlockMask.from_kv_blocks from row intervals; dense: create_block_mask over the padded grid"),
        "kernel": BackendOption(
            "kernel", "triton", choices=("triton", "flash"),
            help="triton: Flex's Triton kernels; flash: kernel_options BACKEND=FLASH, FlashAttention-4's CuTe "
                 "kernel under Flex's masks (needs flash-attn-4)"),
    }
    supports_mla = True  # the latent as one KV head (gathered in convert), values its first dims
    # K/V scales applied in convert; more queries than keys: row tables; RoPE rotated in convert;
    # ALiBi before the soft-cap in the score_mod
    supports_16bit_kv_scales = supports_short_kv = supports_rope = supports_alibi_before_softcap = True
    out_dtypes = ("fp8_e4m3",)  # the output written in FP8 after the kernel (an elementwise op in run)

    @classmethod
    def unavailable(cls):
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no FlexAttention (needs torch >= 2.5)"
        return None

    def why_unavailable(self):
        if self.option("kernel") == "flash":
            return flash_unavailable()
        return super().why_unavailable()

    def unsupported(self, batch: Batch) -> list[str]:
        if self.option("kernel") == "flash":
            return flash_reasons(batch)
        if batch.device.type == "cuda" and batch.dtype == torch.float32 and batch.head_dim > 128:
            return ["flex kernel: float32 with head_dim > 128 exceeds shared memory"]
        if batch.device.type == "cuda" and wide_tiles(batch.head_dim, batch.v_head_dim, batch.q.element_size()) is None:
            return [f"flex kernel: head dims {batch.head_dim}/{batch.v_head_dim} (padded to "
                    f"{_pow2(batch.head_dim)}/{_pow2(batch.v_head_dim)}) need more than {SMEM_LIMIT} bytes of "
                    "shared memory even at its smallest tiles"]
        return []

    @classmethod
    def working_set_bytes(cls, spec, device_type: str) -> int:
        return dense_working_set(spec, device_type, mask=False)

    def convert(self, batch: Batch) -> Dense:
        k, v = gather_padded_kv(batch)
        q, index = padded_queries(batch)
        if batch.spec.rope:
            q, k = rope_dense(batch, q, k)
        return Dense(batch, q, k, v, index)

    def plan(self, dense: Dense) -> FlexPlan:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        d = dense if isinstance(dense, Dense) else self.convert(dense)  # plan(batch) converts first
        batch = d.batch
        dev = batch.device
        b, qmax, lmax = d.q.shape[0], d.q.shape[2], d.k.shape[2]
        tables = row_tables(batch, qmax, lmax)
        mask_mod = make_mask_mod(tables, batch.window)
        if self.option("mask") == "dense":
            block_mask = create_block_mask(mask_mod, B=b, H=None, Q_LEN=qmax, KV_LEN=lmax, device=dev, BLOCK_SIZE=BLOCK)
        else:
            block_mask = block_mask_from_kv_blocks(tables, qmax, lmax, mask_mod, BLOCK)
        on_gpu = dev.type == "cuda"
        kernel_options = {"FORCE_USE_FLEX_ATTENTION": True} if on_gpu and qmax > 1 else {}
        how = "torch.compile(dynamic=False)" if on_gpu else "eager"
        kernel = "flex kernel forced" if kernel_options else "default kernel"
        scale_lse = 1.0
        if self.option("kernel") == "flash":  # Flex's FLASH backend: FlashAttention-4's kernel, its own tiles
            kernel_options, kernel = {"BACKEND": "FLASH"}, f"BACKEND=FLASH ({flash_version()})"
            if batch.sinks is not None and lse_scale() != 1.0:
                scale_lse = lse_scale()
                kernel += ", its LSE divided by ln 2 (torch#181645)"
        elif on_gpu:  # head dims past 256: tiles that fit in shared memory (the decoding kernel's
            # rows are the G query heads of a KV head: no taller tile than they fill, and its
            # BLOCK_M must be a multiple of G (tl.device_assert(BLOCK_M % G == 0): 128 MLA heads
            # failed to build at BLOCK_M=32 on an H100); where no such tile fits, the flex kernel)
            g = batch.num_q_heads // batch.num_kv_heads
            tiles = wide_tiles(batch.head_dim, batch.v_head_dim, batch.q.element_size(),
                               128 if qmax > 1 else max(16, _pow2(g)))
            if tiles and qmax == 1 and tiles["BLOCK_M"] % g:
                tiles = wide_tiles(batch.head_dim, batch.v_head_dim, batch.q.element_size())
                kernel_options["FORCE_USE_FLEX_ATTENTION"] = True
                kernel = "flex kernel forced (no decoding tile holds a multiple of the group size)"
            if tiles:
                kernel_options.update(tiles)
                kernel += ", tiles " + " ".join(f"{k}={v}" for k, v in tiles.items())
        sinks = _sink_logits(batch, tables)
        return FlexPlan(
            mode=f"{self.option('mask')} block mask, {how}, {kernel}" + (", rope in convert" if batch.spec.rope else "")
            + (", fp8 output after the kernel" if batch.spec.out_dtype else ""),
            q=d.q,
            k=d.k,
            v=d.v,
            block_mask=block_mask,
            score_mod=_score_mod(batch, tables),
            scale=batch.scale,
            fn=_compiled_flex() if on_gpu else flex_attention,
            kernel_options=kernel_options,
            index=d.index,
            sinks=sinks,
            finish=batch.finish_output,
            lse_scale=scale_lse,
        )

    def run(self, p: FlexPlan) -> torch.Tensor:
        kw: dict = {"kernel_options": p.kernel_options} if p.kernel_options else {}
        if p.score_mod is not None:
            kw["score_mod"] = p.score_mod
        if p.sinks is None:
            o = p.fn(p.q, p.k, p.v, block_mask=p.block_mask, scale=p.scale, enable_gqa=True, **kw)
            return p.finish(unpad_output(o, p.index))
        o, aux = p.fn(p.q, p.k, p.v, block_mask=p.block_mask, scale=p.scale, enable_gqa=True, **_lse_kwargs(), **kw)
        lse = getattr(aux, "lse", aux).float()  # [B, Hq, Qmax], natural log (once scaled, below)
        if p.lse_scale != 1.0:  # torch#181645 on the FLASH backend; no extra launch elsewhere
            lse = lse * p.lse_scale
        o = (o.float() * torch.sigmoid(lse - p.sinks)[..., None]).to(o.dtype)
        return p.finish(unpad_output(o, p.index))


def alibi_top(t) -> torch.Tensor:
    """``[B, Qmax]``: the position of each row's last allowed key, where its ALiBi term is largest:
    the row's own position (causal rows, tree nodes: their keys are at or before them), the
    request's last key (bidirectional prefill rows, ``hi``)."""
    return torch.maximum(t.hi, t.qpos)


def _score_mod(batch: Batch, t) -> Any:
    """Soft-cap then ALiBi on Flex's scaled scores (docs/semantics.md), or None. ALiBi enters
    as ``slope_h * (key position - alibi_top)``: the semantic term less a constant per row
    (``slope_h * (alibi_top - query position)``, 0 but on bidirectional rows), which leaves the
    softmax as it is and keeps the terms of the keys that carry a row's weight near 0. Added
    unshifted, a 346-token bidirectional prefill put them near 172 and eager bfloat16 scores (a
    CPU) step by 1 there: rel. err 0.098. The LSE is shifted by the same constant (the sinks
    in ``plan`` take it back). With ``score_order: alibi-softcap`` ALiBi goes in first, unshifted
    (a shift before the tanh would change the scores; the tanh bounds them anyway)."""
    cap, slopes = batch.softcap, batch.alibi_slopes
    if cap is None and slopes is None:
        return None
    kpos = t.kpos
    first = batch.spec.alibi_first
    top = (t.qpos if first else alibi_top(t)) if slopes is not None else None

    def score_mod(score, b, h, q_idx, kv_idx):
        if slopes is not None and first:
            score = score + (slopes[h] * (kpos[b, kv_idx] - top[b, q_idx]).float()).to(score.dtype)
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None and not first:
            score = score + (slopes[h] * (kpos[b, kv_idx] - top[b, q_idx]).float()).to(score.dtype)
        return score

    return score_mod


def _sink_logits(batch: Batch, t) -> Optional[torch.Tensor]:
    """The sink logit each row's LSE is weighed against (``run``): ``[1, Hq, 1]``, or with ALiBi
    ``[B, Hq, Qmax]`` less the row's ALiBi shift (``_score_mod``: the LSE Flex returns is the
    semantic one less that shift)."""
    if batch.sinks is None:
        return None
    sinks = batch.sinks.float().view(1, -1, 1)
    if batch.alibi_slopes is None or batch.spec.alibi_first:  # no shift in the score_mod
        return sinks
    shift = (alibi_top(t) - t.qpos).float()  # [B, Qmax], 0 but on bidirectional rows
    return sinks - batch.alibi_slopes.float().view(1, -1, 1) * shift[:, None, :]
