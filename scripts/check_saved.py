"""Check the tensors of ``attnbench run --save-tensors DIR``: rebuild each case's batch from the
saved file alone (q, caches, block table, lengths, kinds, tree parents), compute the float64
reference, and compare every saved backend output with it. Sharing shows only in the block
table: the script reports how many block-table entries point at a page another request uses.

    python3 scripts/check_saved.py DIR [DIR ...]      (exit 1 if an output is off)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from attnbench.workload.batch import Batch, BatchSpec, Request
from attnbench.workload.reference import compare, default_tolerance, reference_attention


def rebuild(blob: dict) -> Batch:
    q, k = blob["q"], blob["k_cache"]
    reqs = tuple(
        Request(kind, int(ql), int(cl), tuple(p) if p is not None else None)
        for kind, ql, cl, p in zip(blob["kinds"], blob["query_lens"], blob["context_lens"], blob["tree_parents"])
    )
    dtype = str(q.dtype).replace("torch.", "")
    spec = BatchSpec(reqs, q.shape[1], k.shape[2], q.shape[2], dtype, k.shape[1], "contiguous", blob["scale"])
    qlens, clens = blob["query_lens"].int(), blob["context_lens"].int()
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(qlens, 0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return Batch(spec, q.to(dev), k.to(dev), blob["v_cache"].to(dev), blob["block_table"].to(dev), qsl.to(dev),
                 qlens.to(dev), clens.to(dev), (qlens + clens).to(dev), float(blob["scale"]))


def shared_entries(batch: Batch) -> int:
    """Block-table entries (in use) whose page another request also lists."""
    owners: dict = {}
    table = batch.block_table.cpu()
    for i, r in enumerate(batch.requests):
        for p in table[i, : batch.spec.pages_of(r)].tolist():
            owners.setdefault(p, set()).add(i)
    return sum(len(o) for o in owners.values() if len(o) > 1)


def main(dirs: list[str]) -> int:
    bad = 0
    for d in dirs:
        for f in sorted(Path(d).glob("*.pt")):
            blob = torch.load(f, weights_only=True)
            batch = rebuild(blob)
            ref, _ = reference_attention(batch)
            tol = default_tolerance(batch.dtype)
            parts = []
            for name, out in sorted(blob["outputs"].items()):
                rel, _ = compare(out.to(ref.device), ref)
                ok = rel <= tol
                bad += not ok
                parts.append(f"{name} {rel:.1e}{'' if ok else ' OFF'}")
            print(f"{f.parent.name}/{f.stem}: shared entries {shared_entries(batch)}; " + ", ".join(parts), flush=True)
    print(f"{bad} output(s) off" if bad else "every saved output matches the reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
