#!/usr/bin/env python3
"""Write a small synthetic engine step trace (``attnbench-steps`` JSONL, workload/traces.py).

A simulated serving run, deterministic for a seed: requests arrive with prompts of
``--prompt`` tokens (40-200) and want ``--want`` output tokens (8-24); the engine keeps at most
``--running`` requests (4), prefills prompts in chunks of at most ``--chunk`` tokens (64;
chunked prefill: a chunk's context is the prompt already prefilled), and decodes the others.
Every other request decodes speculatively: each step verifies 3 draft tokens as a chain
(query 4) and accepts 0-3 of them plus the bonus token; with ``--tree PRESET`` it verifies
that draft tree (``attnbench trees``; query = its node count) and accepts 0 to its depth.

    python scripts/dev/synth_trace.py --steps 40 --seed 0 > attnbench/scenarios/traces/synthetic-serving.jsonl
    python scripts/dev/synth_trace.py --steps 64 --seed 0 --tree eagle-mc_sim_7b_63 --running 8 \\
        --prompt 512-3072 --want 32-96 --chunk 512 > attnbench/scenarios/traces/eagle-serving.jsonl
"""
from __future__ import annotations

import argparse
import json
import random


def _tree(preset: str) -> tuple[int, int]:
    """(node count, depth) of a named tree."""
    from attnbench.workload.trees import depths, parse_tree

    parents = parse_tree({"preset": preset})
    return len(parents), max(depths(parents))


def _verify(r: dict, rng: random.Random, drafts: int, tree: str, nodes: int, depth: int) -> dict:
    """A speculative verify of ``r``; advances it by the tokens accepted plus the bonus one."""
    if tree:
        req = {"query_len": nodes, "context_len": r["done"], "tree": {"preset": tree}}
        got = 1 + rng.randint(0, depth)
    else:
        req = {"query_len": drafts + 1, "context_len": r["done"], "spec_tokens": drafts}
        got = 1 + rng.randint(0, drafts)
    r["done"] += got
    r["made"] += got
    return req


def simulate(steps: int, seed: int, max_running: int = 4, chunk: int = 64, drafts: int = 3,
             prompt: tuple[int, int] = (40, 200), want: tuple[int, int] = (8, 24), tree: str = ""):
    rng = random.Random(seed)
    nodes, depth = _tree(tree) if tree else (0, 0)
    running, next_id, out = [], 0, []
    for step in range(steps):
        while len(running) < max_running:
            running.append({"id": next_id, "prompt": rng.randint(*prompt), "done": 0, "want": rng.randint(*want),
                            "made": 0, "spec": next_id % 2 == 1})
            next_id += 1
        reqs = []
        for r in running:
            if r["done"] < r["prompt"]:  # prefill (a chunk of the prompt)
                q = min(chunk, r["prompt"] - r["done"])
                reqs.append({"query_len": q, "context_len": r["done"]})
                r["done"] += q
            elif r["spec"]:  # verify drafts: the context is what the cache holds
                reqs.append(_verify(r, rng, drafts, tree, nodes, depth))
            else:
                reqs.append({"query_len": 1, "context_len": r["done"]})
                r["done"] += 1
                r["made"] += 1
        out.append({"step": step, "requests": reqs})
        running = [r for r in running if r["made"] < r["want"]]
    return out


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--running", type=int, default=4, help="requests the engine keeps running")
    ap.add_argument("--chunk", type=int, default=64, help="prefill chunk (tokens)")
    ap.add_argument("--prompt", type=_range, default=(40, 200), help="prompt tokens, LO-HI")
    ap.add_argument("--want", type=_range, default=(8, 24), help="output tokens, LO-HI")
    ap.add_argument("--tree", default="", help="verify this draft tree preset instead of 3-token chains")
    a = ap.parse_args()
    for s in simulate(a.steps, a.seed, a.running, a.chunk, prompt=a.prompt, want=a.want, tree=a.tree):
        print(json.dumps(s, separators=(",", ":")))


if __name__ == "__main__":
    main()
