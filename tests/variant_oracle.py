"""An independent oracle for the attention variants: token by token, key by key, in float64,
straight from docs/semantics.md (it shares no code with workload/reference.py or masks.py)."""
import math

import torch


def _ancestors(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def _depth(parents, i):
    return len(_ancestors(parents, i)) - 1


def _rotate(x, pos, spec):
    """docs/semantics.md "Fused RoPE": dims i and i + D/2 turned by pos / scale * theta^(-2i/D)."""
    d = x.shape[0]
    out = x.clone()
    for i in range(d // 2):
        a = pos / spec.rope_scale * spec.rope_theta ** (-2.0 * i / d)
        out[i] = x[i] * math.cos(a) - x[i + d // 2] * math.sin(a)
        out[i + d // 2] = x[i + d // 2] * math.cos(a) + x[i] * math.sin(a)
    return out


def naive_variants(batch):
    """``[N, Hq, D]`` float64. K/V read page by page through the block table and dequantized
    with the saved scales by hand (FP8 queries too); positions, window, soft-cap, ALiBi (in the
    batch's order), RoPE and sinks per formula."""
    spec = batch.spec
    g = batch.num_q_heads // batch.num_kv_heads
    out = torch.zeros(batch.q.shape, dtype=torch.float64)
    kc, vc = batch.k_cache.cpu(), batch.v_cache.cpu()
    for i, r in enumerate(batch.requests):
        par = r.tree_parents
        qpos = [r.context + (_depth(par, t) if par is not None else t) for t in range(r.query)]
        kpos = list(range(r.context)) + qpos if par is not None else list(range(r.kv_len))
        for t in range(r.query):
            row = batch.query_start[i] + t
            keys = []
            for j in range(r.kv_len):
                if par is not None:
                    ok = j < r.context or (j - r.context) in _ancestors(par, t)
                else:
                    ok = (not r.causal) or j <= r.context + t
                if spec.window is not None and not kpos[j] > qpos[t] - spec.window:
                    ok = False
                if ok:
                    keys.append(j)
            for h in range(batch.num_q_heads):
                kvh = h // g
                logits, values = [], []
                for j in keys:
                    page = int(batch.block_table[i, j // batch.page_size])
                    k = kc[page, j % batch.page_size, kvh].double()
                    v = vc[page, j % batch.page_size, kvh].double()
                    if batch.k_scale is not None:
                        k = k * float(batch.k_scale[kvh if batch.k_scale.numel() > 1 else 0])
                        v = v * float(batch.v_scale[kvh if batch.v_scale.numel() > 1 else 0])
                    q = batch.q[row, h].double()
                    if batch.q_fp8 is not None:
                        q = batch.q_fp8[row, h].double() * float(batch.q_scale[0])
                    if spec.rope:
                        q, k = _rotate(q, qpos[t], spec), _rotate(k, kpos[j], spec)
                    s = float(q @ k) * batch.scale
                    bias = float(batch.alibi_slopes[h]) * (kpos[j] - qpos[t]) if spec.alibi else 0.0
                    if spec.softcap is not None and spec.score_order == "alibi-softcap":
                        s, bias = s + bias, 0.0
                    if spec.softcap is not None:
                        s = spec.softcap * math.tanh(s / spec.softcap)
                    s += bias
                    logits.append(s)
                    values.append(v)
                m = max(logits)
                den = sum(math.exp(s - m) for s in logits)
                if spec.sinks:
                    den += math.exp(float(batch.sinks[h]) - m)
                out[row, h] = sum(math.exp(s - m) * v for s, v in zip(logits, values)) / den
    return out
