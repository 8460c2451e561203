"""Check the tensors of ``attnbench run --save-tensors DIR`` independently: recompute each
case from the saved file alone (q, caches, block table, lengths, kinds, tree parents, scale,
and the variants: causal, window, softcap, sinks, ALiBi slopes, FP8 scales), in float64,
following docs/semantics.md with its own code (torch only, no attnbench reference), and
compare every saved backend output with it. Sharing shows only in the block table: the script
reports how many block-table entries point at a page another request uses. MLA files
(``attention: mla``) are recomputed by :func:`mla_outputs`, the MLA section of the same page.

    python3 scripts/gpu/check_saved.py DIR [DIR ...] [--jsonl FILE]    (exit 1 if an output is off)

``--jsonl FILE`` appends one JSON line per saved output (dir, file, case_id, backend, rel, ok,
variants): scripts/gpu/verify_all.py counts them per backend and scenario.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

#: relative-error tolerances by output dtype (docs/semantics.md "Tolerances"); FP8 attention
#: (a saved ``q_dtype``) is checked at FP8_TOLERANCE ("FP8 attention")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1.5e-2}
FP8_TOLERANCE = 0.05


def key_positions(query: int, context: int, parents) -> torch.Tensor:
    """Key positions: slot j at j, but a tree's node slots at their nodes' positions (context
    may be < 0: a non-causal request with more queries than keys holds the last C + Q tokens)."""
    if parents is None:
        return torch.arange(context + query)
    return torch.cat([torch.arange(context), torch.tensor(positions("", query, context, parents))])


def rotary(x: torch.Tensor, pos: torch.Tensor, theta: float, scale: float) -> torch.Tensor:
    """Fused RoPE: dims i and i + D/2 of ``x`` ``[T, H, D]`` turned by pos / scale * theta^(-2i/D)."""
    half = x.shape[-1] // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    a = (pos.to(x.device, torch.float64) / scale)[:, None, None] * theta ** (-2.0 * i / x.shape[-1])
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * torch.cos(a) - x2 * torch.sin(a), x2 * torch.cos(a) + x1 * torch.sin(a)], -1)


def positions(kind: str, query: int, context: int, parents) -> list[int]:
    """Query positions: C + i, or C + depth for a tree node."""
    if parents is None:
        return [context + i for i in range(query)]
    depth = [0] * query
    for i in range(1, query):
        depth[i] = depth[parents[i]] + 1
    return [context + d for d in depth]


def visible(query: int, context: int, parents, causal: bool, window) -> torch.Tensor:
    """``[Q, L]`` bool from the rules of docs/semantics.md: tree (prefix + ancestors), causal
    (``j <= C + i``) or non-causal (all), AND the window on positions (``kpos > qpos - W``)."""
    if parents is not None:
        anc = torch.zeros(query, query, dtype=torch.bool)
        for i in range(query):
            x = i
            while x >= 0:
                anc[i, x] = True
                x = parents[x]
        m = torch.cat([torch.ones(query, context, dtype=torch.bool), anc], 1)
    elif causal:
        m = torch.arange(context + query)[None, :] <= context + torch.arange(query)[:, None]
    else:
        m = torch.ones(query, context + query, dtype=torch.bool)
    if window is not None:
        qpos = torch.tensor(positions("", query, context, parents))
        m &= key_positions(query, context, parents)[None, :] > qpos[:, None] - window
    return m


def recompute(blob: dict) -> torch.Tensor:
    """``[N, Hq, D]`` float64: the output docs/semantics.md defines for the saved batch."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = blob["q"].to(dev).double()
    if blob.get("q_fp8") is not None:  # FP8 attention: the quantized queries
        q = blob["q_fp8"].to(dev).double() * blob["q_scale"].to(dev).double().view(1, 1, 1)
    hq, d = q.shape[1], q.shape[2]
    kc, vc = blob["k_cache"].to(dev), blob["v_cache"].to(dev)
    ps, hkv = kc.shape[1], kc.shape[2]
    ks, vs = blob.get("k_scale"), blob.get("v_scale")
    k_all = kc.double() * (ks.to(dev).double().view(1, 1, -1, 1) if ks is not None else 1.0)
    v_all = vc.double() * (vs.to(dev).double().view(1, 1, -1, 1) if vs is not None else 1.0)
    causal = blob.get("causal") or [True] * len(blob["kinds"])
    sinks, slopes = blob.get("sinks"), blob.get("alibi_slopes")
    cap, window = blob.get("softcap"), blob.get("window")
    out = torch.zeros_like(q)
    row = 0
    for i, (ql, cl, par) in enumerate(zip(blob["query_lens"].tolist(), blob["context_lens"].tolist(), blob["tree_parents"])):
        kv = ql + cl
        pages = blob["block_table"][i, : -(-kv // ps)].long().to(dev)
        k = k_all[pages].reshape(-1, hkv, d)[:kv].repeat_interleave(hq // hkv, dim=1)  # [L, Hq, D]
        v = v_all[pages].reshape(-1, hkv, d)[:kv].repeat_interleave(hq // hkv, dim=1)
        m = visible(ql, cl, par, causal[i], window).to(dev)
        qpos = torch.tensor(positions("", ql, cl, par), dtype=torch.float64, device=dev)
        kpos = key_positions(ql, cl, par).to(dev, torch.float64)
        qi = q[row : row + ql]
        if blob.get("rope"):
            qi, k = (rotary(x, p, blob["rope_theta"], blob["rope_scale"]) for x, p in ((qi, qpos), (k, kpos)))
        s = torch.einsum("qhd,lhd->hql", qi, k) * blob["scale"]
        alibi = 0.0
        if slopes is not None:
            alibi = slopes.to(dev).double()[:, None, None] * (kpos[None, None, :] - qpos[None, :, None])
        if cap is not None and blob.get("score_order") == "alibi-softcap":
            s, alibi = s + alibi, 0.0
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        s = s + alibi
        s = s.masked_fill(~m, float("-inf"))
        if sinks is not None:  # one more column holding the sink logit, whose value is zero
            s = torch.cat([s, sinks.to(dev).double()[:, None, None].expand(hq, ql, 1)], 2)
        w = torch.softmax(s, dim=2)[:, :, :kv]
        out[row : row + ql] = torch.einsum("hql,lhd->qhd", w, v)
        row += ql
    return out.cpu()


def mla_outputs(blob: dict) -> torch.Tensor:
    """docs/semantics.md "MLA", from the saved tensors alone: per request, the latent rows
    ``[c_kv | k_rope]`` read through the block table (dequantized if FP8), scores
    ``q . row * scale``, a softmax over the visible keys, values = the rows' first
    ``kv_lora_rank`` dims. ``[N, Hq, kv_lora_rank]`` float64."""
    rank = int(blob["kv_lora_rank"])
    if not torch.equal(blob["v_cache"].float(), blob["k_cache"][..., :rank].float()):
        raise SystemExit("MLA file: v_cache is not the first kv_lora_rank dims of k_cache")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ks = blob.get("k_scale")
    cache = blob["k_cache"].to(dev).double() * (float(ks.double().reshape(-1)[0]) if ks is not None else 1.0)
    q, table, ps = blob["q"].to(dev).double(), blob["block_table"].long().to(dev), cache.shape[1]
    causal = blob.get("causal") or [True] * len(blob["kinds"])
    out, start = [], 0
    for i, (ql, cl, par) in enumerate(zip(blob["query_lens"].tolist(), blob["context_lens"].tolist(), blob["tree_parents"])):
        kv = ql + cl
        rows = cache[table[i, : -(-kv // ps)]].reshape(-1, cache.shape[-1])[:kv]  # [L, rank + rope]
        s = torch.einsum("qhd,ld->qhl", q[start : start + ql], rows) * blob["scale"]
        s = s.masked_fill(~visible(ql, cl, par, causal[i], blob.get("window")).to(dev)[:, None, :], float("-inf"))
        out.append(torch.einsum("qhl,ld->qhd", torch.softmax(s, dim=-1), rows[:, :rank]))
        start += ql
    return torch.cat(out).cpu()


def shared_entries(blob: dict) -> int:
    """Block-table entries (in use) whose page another request also lists."""
    owners: dict = {}
    ps = blob["k_cache"].shape[1]
    for i, (ql, cl) in enumerate(zip(blob["query_lens"].tolist(), blob["context_lens"].tolist())):
        for p in blob["block_table"][i, : -(-(ql + cl) // ps)].tolist():
            owners.setdefault(p, set()).add(i)
    return sum(len(o) for o in owners.values() if len(o) > 1)


def variants(blob: dict) -> str:
    words = [f"{blob['kv_dtype']} KV" if blob.get("kv_dtype") else "", f"window {blob['window']}" if blob.get("window") else "",
             "sinks" if blob.get("sinks") is not None else "", f"softcap {blob['softcap']}" if blob.get("softcap") else "",
             "alibi" if blob.get("alibi_slopes") is not None else "",
             "non-causal" if not all(blob.get("causal") or [True]) else "",
             "more queries than keys" if (blob["context_lens"] < 0).any() else "",
             "k/v scales" if blob.get("k_scale") is not None and not blob.get("kv_dtype") else "",
             f"rope {blob['rope_theta']:g}" if blob.get("rope") else "",
             "alibi before softcap" if blob.get("score_order") == "alibi-softcap" else "",
             f"{blob['q_dtype']} q" if blob.get("q_dtype") else "",
             f"{blob['out_dtype']} out" if blob.get("out_dtype") else "",
             f"MLA {blob['kv_lora_rank']}+{blob['rope_dim']}" if blob.get("attention") == "mla" else ""]
    return ", ".join(w for w in words if w) or "plain"


def main(dirs: list[str], jsonl: str | None = None) -> int:
    bad = 0
    records = []
    for d in dirs:
        for f in sorted(Path(d).glob("*.pt")):
            blob = torch.load(f, weights_only=True)
            ref = mla_outputs(blob) if blob.get("attention") == "mla" else recompute(blob)
            parts = []
            for name, out in sorted(blob["outputs"].items()):
                o = out.double() * (blob["out_scale"] if blob.get("out_dtype") else 1.0)  # an FP8 output
                rel = float("inf") if not torch.isfinite(o).all() else ((o - ref).norm() / ref.norm()).item()
                ok = rel <= (FP8_TOLERANCE if blob.get("q_dtype") or blob.get("out_dtype") else TOLERANCE[out.dtype])
                bad += not ok
                parts.append(f"{name} {rel:.1e}{'' if ok else ' OFF'}")
                records.append({"dir": str(d), "file": f.name, "case_id": blob.get("case_id"), "backend": name,
                                "rel": rel if rel != float("inf") else None, "ok": bool(ok), "variants": variants(blob)})
            print(f"{f.parent.name}/{f.stem} [{variants(blob)}]: shared entries {shared_entries(blob)}; " + ", ".join(parts), flush=True)
    if jsonl:
        with open(jsonl, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    print(f"{bad} output(s) off" if bad else "every saved output matches the recomputation")
    return 1 if bad else 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = None
    if "--jsonl" in argv:
        i = argv.index("--jsonl")
        out = argv[i + 1]
        del argv[i : i + 2]
    sys.exit(main(argv, out))
