#!/usr/bin/env python3
"""Write a small synthetic engine step trace (``attnbench-steps`` JSONL, workload/traces.py).

A simulated serving run, deterministic for a seed: requests arrive with prompts of 40-200
tokens and want 8-24 output tokens; the engine keeps at most 4 requests running, prefills
prompts in chunks of at most 64 tokens (chunked prefill: a chunk's context is the prompt
already prefilled), and decodes the others. Every other request decodes speculatively: each
step verifies 3 draft tokens (query 4) and accepts 0-3 of them plus the bonus token.

    python scripts/dev/synth_trace.py --steps 40 --seed 0 > attnbench/scenarios/traces/synthetic-serving.jsonl
"""
from __future__ import annotations

import argparse
import json
import random


def simulate(steps: int, seed: int, max_running: int = 4, chunk: int = 64, drafts: int = 3):
    rng = random.Random(seed)
    running, next_id, out = [], 0, []
    for step in range(steps):
        while len(running) < max_running:
            running.append({"id": next_id, "prompt": rng.randint(40, 200), "done": 0, "want": rng.randint(8, 24),
                            "made": 0, "spec": next_id % 2 == 1})
            next_id += 1
        reqs = []
        for r in running:
            if r["done"] < r["prompt"]:  # prefill (a chunk of the prompt)
                q = min(chunk, r["prompt"] - r["done"])
                reqs.append({"query_len": q, "context_len": r["done"]})
                r["done"] += q
            elif r["spec"]:  # verify drafts: the context is what the cache holds
                reqs.append({"query_len": drafts + 1, "context_len": r["done"], "spec_tokens": drafts})
                got = 1 + rng.randint(0, drafts)
                r["done"] += got
                r["made"] += got
            else:
                reqs.append({"query_len": 1, "context_len": r["done"]})
                r["done"] += 1
                r["made"] += 1
        out.append({"step": step, "requests": reqs})
        running = [r for r in running if r["made"] < r["want"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for s in simulate(a.steps, a.seed):
        print(json.dumps(s, separators=(",", ":")))


if __name__ == "__main__":
    main()
