"""The exact reference: per request, gather K/V through the block table and compute masked
softmax attention in float64 (float32 for very large cases). The oracle for every check."""
from __future__ import annotations

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.masks import key_positions, query_positions
from attnbench.workload.rope import apply_rope, rope_angles

# The backend that runs this oracle: never a competitor (kept out of ranks, bests and summaries,
# refused as a check's normalizer), since it is written to be right, not fast.
ORACLE_BACKEND = "reference"

# Above this many score elements per chunk the reference computes in float32 (docs/semantics.md
# allows it on large cases); float64 stays for everything a test or a CPU run uses.
FLOAT64_LIMIT = 1 << 26
CHUNK_ELEMENTS = 1 << 25


def reference_attention(batch: Batch, compute_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(out [N, Hq, Dv] float32, lse [N, Hq] float32, natural log)``; ``Dv`` is
    ``batch.v_head_dim`` (``D`` except for MLA, whose values are the latent's first dims).

    The output stays in float32 (not rounded to the batch's dtype), so that the error of a
    16-bit backend is measured against the exact value. Follows docs/semantics.md: scores
    ``(q . k) * scale``, then soft-cap, then ALiBi (or ALiBi, then soft-cap: ``score_order``),
    then the mask (causal / tree / non-causal and the window), then softmax with the sink logit
    in the denominator (and in the LSE). An FP8 or scaled cache is read dequantized
    (``batch.gather_kv``), FP8 queries too (``batch.query_values``); with ``rope`` q and k are
    rotated at their positions first."""
    hq = batch.num_q_heads
    out = torch.empty(batch.out_shape, dtype=torch.float32, device=batch.device)
    lse = torch.empty(batch.num_tokens, hq, dtype=torch.float32, device=batch.device)
    starts = batch.query_start
    for i, r in enumerate(batch.requests):
        cdt = compute_dtype
        if cdt is None:
            big = r.query * r.kv_len * hq > FLOAT64_LIMIT
            cdt = torch.float32 if big else torch.float64
        o, l = _request(batch, i, cdt)
        out[starts[i] : starts[i + 1]] = o
        lse[starts[i] : starts[i + 1]] = l
    return out, lse


def _request(batch: Batch, i: int, cdt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Request i's ``(out [Q, Hq, Dv], lse [Q, Hq])`` in float32, computed in ``cdt``."""
    r = batch.requests[i]
    hq, hkv, d, dv = batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.v_head_dim
    g = hq // hkv
    dev = batch.device
    k, v = batch.gather_kv(i)
    k = k.to(cdt).permute(1, 0, 2)  # [Hkv, L, D]
    v = v.to(cdt).permute(1, 0, 2)
    mask = batch.mask(i).to(dev)  # [Q, L]
    qpos = query_positions(r).to(dev, cdt)
    kpos = key_positions(r).to(dev, cdt)
    spec = batch.spec
    q = batch.query_values()[batch.query_start[i] : batch.query_start[i + 1]].to(cdt)  # [Q, Hq, D]
    if spec.rope:  # exact rotary at the positions, in the compute dtype
        q = apply_rope(q, rope_angles(qpos, d, spec.rope_theta, spec.rope_scale, cdt)[:, None, :])
        k = apply_rope(k, rope_angles(kpos, d, spec.rope_theta, spec.rope_scale, cdt)[None, :, :])
    heads = lambda t: None if t is None else t.to(dev, cdt).reshape(hkv, g, 1, 1)  # noqa: E731
    slopes, sinks = heads(batch.alibi_slopes), heads(batch.sinks)
    out = torch.empty(r.query, hq, dv, dtype=torch.float32, device=dev)
    lse = torch.empty(r.query, hq, dtype=torch.float32, device=dev)
    # Chunk over query rows so a long prefill never builds a huge score matrix.
    rows = max(1, CHUNK_ELEMENTS // max(1, r.kv_len * hq))
    for s in range(0, r.query, rows):
        e = min(r.query, s + rows)
        qc = q[s:e].reshape(e - s, hkv, g, d).permute(1, 2, 0, 3)  # [Hkv, G, q, D]
        scores = torch.einsum("hgqd,hld->hgql", qc, k) * batch.scale
        alibi = None if slopes is None else slopes * (kpos[None, :] - qpos[s:e, None])
        if alibi is not None and spec.alibi_first:
            scores = scores + alibi
        if batch.softcap is not None:
            scores = batch.softcap * torch.tanh(scores / batch.softcap)
        if alibi is not None and not spec.alibi_first:
            scores = scores + alibi
        scores = scores.masked_fill(~mask[s:e], float("-inf"))
        m = scores.amax(-1, keepdim=True)
        if sinks is not None:
            m = torch.maximum(m, sinks)
        p = torch.exp(scores - m)
        denom = p.sum(-1, keepdim=True)
        if sinks is not None:
            denom = denom + torch.exp(sinks - m)  # the sink has a logit but no value
        o = torch.einsum("hgql,hld->hgqd", p / denom, v)
        out[s:e] = o.permute(2, 0, 1, 3).reshape(e - s, hq, dv).float()
        lse[s:e] = (m + torch.log(denom)).squeeze(-1).permute(2, 0, 1).reshape(e - s, hq).float()
    return out, lse


def merge_attention_states(
    o_a: torch.Tensor, s_a: torch.Tensor, o_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions over disjoint key sets by their natural-log LSEs.

    ``o_*``: ``[N, H, D]``; ``s_*``: ``[N, H]`` float32. A side with LSE = -inf saw no keys,
    and the other side is then the answer. Returns ``(o [N, H, D] in o_a.dtype, s [N, H])``.
    """
    s_a = s_a.float()
    s_b = s_b.float()
    m = torch.maximum(s_a, s_b)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a = torch.exp(s_a - m_safe)
    w_b = torch.exp(s_b - m_safe)
    total = w_a + w_b
    o = (w_a.unsqueeze(-1) * o_a.float() + w_b.unsqueeze(-1) * o_b.float()) / total.clamp_min(1e-30).unsqueeze(-1)
    return o.to(o_a.dtype), m_safe + torch.log(total)


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """``(relative error ‖out − ref‖ / ‖ref‖, max abs error)`` in float64; NaN/Inf give inf."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if not torch.isfinite(o).all():
        return float("inf"), float("inf")
    diff = o - r
    rel = (diff.norm() / r.norm().clamp_min(1e-300)).item()
    return rel, diff.abs().max().item() if diff.numel() else 0.0


DEFAULT_TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1.5e-2}


def default_tolerance(dtype: torch.dtype) -> float:
    """Relative-error tolerance by dtype (docs/semantics.md: fp32 << 1e-4, 16-bit 1e-3..1e-2)."""
    return DEFAULT_TOLERANCE[dtype]


#: the default tolerance of FP8-attention rows (``model.q_dtype``): the reference reads the same
#: quantized q, K and V, so what is left is the kernel's own rounding, P in FP8 above all (e4m3
#: keeps 3 mantissa bits: up to 2^-4 relative per probability; tests/test_batch_features.py
#: measures 2-3% on random inputs), docs/semantics.md "FP8 attention"
FP8_ATTENTION_RTOL = 0.05


def batch_tolerance(batch) -> float:
    """The default tolerance of a row on ``batch``: its dtype's, or ``FP8_ATTENTION_RTOL`` with FP8
    queries or an FP8 output."""
    fp8 = batch.spec.q_dtype is not None or batch.spec.out_dtype is not None
    return FP8_ATTENTION_RTOL if fp8 else default_tolerance(batch.dtype)


def route_tolerance(plan, tol: float, dtype: torch.dtype, explicit: bool = False) -> tuple[float, str]:
    """``(tolerance, why)`` for a backend's plan. A route that computes below the batch's
    precision (e.g. q quantized to FP8 over an FP8 cache) declares ``plan.rtol`` and
    ``plan.rtol_reason``: when ``tol`` is the dtype's default (not ``explicit`` from --rtol, no
    other check.rtol) the larger one applies, and ``why`` says so for the row's mode
    (``rtol 0.05: q quantized to fp8_e4m3``); else ``(tol, "")``."""
    extra = getattr(plan, "rtol", None)
    if not extra or explicit or tol != default_tolerance(dtype) or extra <= tol:
        return tol, ""
    return float(extra), f"rtol {extra:g}: {getattr(plan, 'rtol_reason', '') or 'a lower-precision route'}"
