"""Random scenarios nobody wrote by hand, for a correctness sweep on the GPU: every file is a valid
attnbench scenario drawn from a seed (model shape, dtype, page size and layout, request kinds and
lengths, tree shapes, the attention variants, FP8 caches, MLA), small enough that every backend
runs it in seconds. ``verify_all.py --scenarios DIR/*.yaml`` runs them through every backend and
route and rechecks the saved outputs; a wrong output there is a defect the shipped scenarios
missed (held-out checks find such batches too).

    python3 scripts/gpu/random_scenarios.py --n 24 --seed 7 --out /tmp/rand
    python3 scripts/gpu/random_scenarios.py --n 24 --seed 7 --out /tmp/rand --profile flashinfer

``--profile flashinfer`` keeps the draws FlashInfer's JIT can build in minutes (head dims 64/128,
16-bit dtypes): every new (dtype, head dim, variant) is a new module of 30-250 s there. About a
third of the ``all`` draws (every ``--profile plain`` draw) keep to what every library reads (16-bit,
head dim 128, NHD pages of 64/256/512, no variant), so that flash-attn and xformers run them too.
``--profile decode``: decodes alone over an FP8 cache, 16-bit q, the ``all`` head dims and variants (the triton
backend's Gluon decode kernel's batches, and the shipped kernel's where it refuses one).
``--profile routes``: in turn, batches the triton backend's narrow routes take, which the ``all`` draws
seldom reach: trees for the Gluon tree kernel (16-bit q, head dim 64/128, pages it reads as TMA boxes,
no variant, at most 192 rows a request), MLA decodes and MTP chains for the Gluon MLA kernel, and MLA
trees and prefills (route ``mla``).
Each file says its seed and index at the top; the same seed always gives the same files.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LAYOUTS = ("contiguous", "shuffled", "shuffled-within", "reversed", "interleaved")
PAGES = (1, 3, 8, 16, 16, 32, 64, 128, 256, 256)


def draw_tree(r: random.Random, max_nodes: int = 64) -> dict[str, Any]:
    kind = r.choice(["chain", "full", "random", "random", "choices", "branching", "preset"])
    if kind == "chain":
        return {"chain": r.randint(1, 12)}
    if kind == "full":
        return {"full": {"depth": r.randint(1, 3), "branching": r.randint(2, 3)}}
    if kind == "random":
        nodes = r.randint(2, max_nodes)
        if nodes > 64:  # (past one ancestor word: depth and fan-out that hold them; 64 keeps the seeds' draws)
            return {"random": {"nodes": nodes, "max_depth": r.randint(5, 12), "max_children": r.randint(3, 6),
                               "seed": r.randint(0, 999)}}
        return {"random": {"nodes": nodes, "max_depth": r.randint(1, 9), "max_children": r.randint(1, 5),
                           "seed": r.randint(0, 999)}}
    if kind == "branching":
        return {"branching": [r.randint(1, 3) for _ in range(r.randint(1, 3))]}
    if kind == "preset":
        return {"preset": r.choice(["eagle-mc_sim_7b_63", "medusa-mc_sim_7b_63", "eagle-dynamic-d5"])}
    paths: list[list[int]] = []
    for _ in range(r.randint(1, 8)):
        base = r.choice(paths) if paths and r.random() < 0.6 else []
        p = base + [r.randint(0, 2)]
        if p not in paths and all(p[:k] in paths for k in range(1, len(p))):
            paths.append(p)
    return {"choices": paths or [[0]]}


def draw_group(r: random.Random, max_ctx: int, max_nodes: int = 64) -> dict[str, Any]:
    kind = r.choice(["decode", "decode", "prefill", "tree", "tree"])
    ctx = r.choice([0, r.randint(1, 64), r.randint(1, max_ctx), r.randint(1, max_ctx)])
    g: dict[str, Any] = {"kind": kind, "count": r.choice([1, 1, 2, 3, 5])}
    if kind == "decode":
        g["context"] = max(ctx, 1)
    elif kind == "prefill":
        g["query"] = r.choice([1, r.randint(2, 40), r.randint(2, 400)])
        g["context"] = ctx
        if r.random() < 0.2:
            g["causal"] = False
    else:
        g["context"] = ctx
        g["tree"] = draw_tree(r, max_nodes)
        if r.random() < 0.15:
            g["tree"]["dynamic"] = True
    if g["count"] > 1 and g["context"] >= 32 and r.random() < 0.15:
        g["shared_prefix"] = r.randint(1, g["context"])
    return g


def draw_plain(r: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """A model and cache every library reads (16-bit, head dim 128, NHD, pages of 64/256/512, no
    variant): the libraries with narrow limits (flash-attn, xformers) then run the random batch."""
    kv = r.choice([1, 2, 4, 8])
    model = {"num_q_heads": kv * r.choice([1, 2, 4, 8]), "num_kv_heads": kv, "head_dim": 128,
             "dtype": r.choice(["bfloat16", "float16"])}
    return model, {"page_size": r.choice([64, 256, 256, 512]), "layout": r.choice(LAYOUTS)}


def draw_model(r: random.Random, profile: str) -> dict[str, Any]:
    if profile == "all" and r.random() < 0.08:
        return {"attention": "mla", "num_q_heads": r.choice([1, 16, 16, 128]), "kv_lora_rank": 512, "rope_dim": 64,
                "dtype": r.choice(["bfloat16", "float16"])}
    kv = r.choice([1, 1, 2, 4, 8])
    group = r.choice([1, 2, 4, 4, 8, 16]) if kv * 16 <= 64 else r.choice([1, 2, 4])
    if profile == "flashinfer":
        head_dim, dtype = r.choice([64, 128, 128]), r.choice(["bfloat16", "float16"])
    else:
        head_dim = r.choice([32, 64, 64, 96, 128, 128, 128, 256, 80])
        dtype = r.choice(["bfloat16", "bfloat16", "float16", "float16"] + (["float32"] if profile == "all" else []))
    m: dict[str, Any] = {"num_q_heads": kv * group, "num_kv_heads": kv, "head_dim": head_dim, "dtype": dtype}
    if r.random() < 0.25:
        m["window"] = r.choice([1, r.randint(2, 64), r.randint(65, 2048)])
    if r.random() < 0.2:
        m["sinks"] = True
    if r.random() < 0.2:
        m["softcap"] = round(r.uniform(5.0, 60.0), 1)
    if r.random() < 0.12:
        m["alibi"] = True
    return m


def draw_decodes(r: random.Random) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """``--profile decode``: (model, cache, batch) of decodes alone over an FP8 cache."""
    kv = {"page_size": r.choice(PAGES), "layout": r.choice(LAYOUTS), "dtype": r.choice(["fp8_e4m3", "fp8_e5m2"]),
          "scale": r.choice(["per-tensor", "per-head"]), "order": r.choice(["NHD", "NHD", "HND"])}
    max_ctx = r.choice([300, 2000, 6000, 20000])
    batch = [{"kind": "decode", "count": r.choice([1, 2, 3, 5, 8]),
              "context": r.choice([1, r.randint(1, 64), r.randint(1, max_ctx), r.randint(1, max_ctx)])}
             for _ in range(r.randint(1, 4))]
    return draw_model(r, "decode"), kv, batch


ROUTE_TARGETS = ("gluon-tree", "gluon-mla", "mla")


def draw_routes(r: random.Random, index: int) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """``--profile routes``: (model, cache, batch) for route ``ROUTE_TARGETS[index % 3]``."""
    target = ROUTE_TARGETS[index % len(ROUTE_TARGETS)]
    dtype = r.choice(["bfloat16", "float16"])
    kv: dict[str, Any] = {"page_size": r.choice([8, 16, 32, 64, 128, 256]), "layout": r.choice(LAYOUTS)}
    max_ctx = r.choice([300, 2000, 6000])
    ctx = lambda: r.choice([0, r.randint(1, 64), r.randint(1, max_ctx)])  # noqa: E731
    decodes = [{"kind": "decode", "count": r.choice([1, 2, 3]), "context": max(ctx(), 1)}] if r.random() < 0.6 else []
    if target == "gluon-tree":  # three query heads a KV head at most: a 64-node tree is 192 rows
        kvh, group = r.choice([1, 2, 4, 8]), r.choice([1, 2, 3])
        model = {"num_q_heads": kvh * group, "num_kv_heads": kvh, "head_dim": r.choice([64, 128]), "dtype": dtype}
        if r.random() < 0.3:
            kv["dtype"] = r.choice(["fp8_e4m3", "fp8_e5m2"])
        trees = [{"kind": "tree", "count": r.choice([1, 2, 3, 5]), "context": ctx(), "tree": draw_tree(r)}
                 for _ in range(r.randint(1, 3))]
        return model, kv, trees + decodes
    model = {"attention": "mla", "num_q_heads": r.choice([16, 32, 64, 128]), "kv_lora_rank": 512, "rope_dim": 64,
             "dtype": dtype}
    if target == "gluon-mla":
        chains = [{"kind": "tree", "count": r.choice([1, 2, 4]), "context": max(ctx(), 1), "tree": {"chain": r.randint(1, 4)}}
                  for _ in range(r.randint(0, 2))]
        return model, kv, (chains + decodes) or [{"kind": "decode", "count": 2, "context": max(ctx(), 1)}]
    groups = [draw_group(r, max_ctx, 40) for _ in range(r.randint(1, 3))]
    return model, kv, groups + decodes


def draw_scenario(seed: int, index: int, profile: str = "all", max_nodes: int = 64) -> dict[str, Any]:
    r = random.Random(seed * 100_003 + index)
    if profile == "decode":
        model, kv, batch = draw_decodes(r)
    elif profile == "routes":
        model, kv, batch = draw_routes(r, index)
    elif profile == "plain" or (profile == "all" and r.random() < 0.35):
        model, kv = draw_plain(r)
    else:
        model = draw_model(r, profile)
        mla = model.get("attention") == "mla"
        kv = {"page_size": r.choice(PAGES), "layout": r.choice(LAYOUTS)}
        if not mla and model["dtype"] != "float32" and r.random() < 0.25:
            kv["dtype"] = r.choice(["fp8_e4m3", "fp8_e4m3", "fp8_e5m2"])
            kv["scale"] = r.choice(["per-tensor", "per-head"])
        if not mla and r.random() < 0.2:
            kv["order"] = "HND"
    if profile not in ("decode", "routes"):
        max_ctx = r.choice([300, 2000, 6000])
        batch = [draw_group(r, max_ctx, max_nodes) for _ in range(r.randint(1, 5))]
    return {
        "name": f"random-{seed}-{index:03d}",
        "description": f"scripts/gpu/random_scenarios.py --seed {seed} (index {index}, profile {profile}"
                       + (f", max nodes {max_nodes})" if max_nodes != 64 else ")"),
        "seed": r.randint(0, 10_000),
        "model": model,
        "kv_cache": kv,
        "batch": batch,
        "timing": {"warmup_ms": 1, "measure_ms": 3},
    }


def valid(doc: dict[str, Any]) -> bool:
    from attnbench.workload.scenario import ScenarioError, load_text

    try:
        load_text(yaml.safe_dump(doc, sort_keys=False), f"{doc['name']}.yaml")
        return True
    except (ScenarioError, ValueError):
        return False


def generate(n: int, seed: int, profile: str = "all", max_nodes: int = 64) -> list[dict[str, Any]]:
    """``n`` valid scenarios (a draw the loader refuses is drawn again with the next index)."""
    out, index = [], 0
    while len(out) < n:
        doc = draw_scenario(seed, index, profile, max_nodes)
        index += 1
        if valid(doc):
            out.append(doc)
        if index > 20 * n + 100:
            raise SystemExit(f"random_scenarios: only {len(out)} of {n} draws were valid scenarios")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", choices=("all", "flashinfer", "plain", "decode", "routes"), default="all")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-nodes", type=int, default=64,
                    help="random trees of up to this many nodes (default 64: one ancestor word, the seeds' old draws)")
    a = ap.parse_args(argv)
    if a.max_nodes < 2:
        ap.error(f"--max-nodes {a.max_nodes}: a random tree has 2 nodes at least")
    a.out.mkdir(parents=True, exist_ok=True)
    for doc in generate(a.n, a.seed, a.profile, a.max_nodes):
        text = f"# {doc['description']}\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
        (a.out / f"{doc['name']}.yaml").write_text(text)
    print(f"wrote {a.n} scenarios to {a.out} (seed {a.seed}, profile {a.profile})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
