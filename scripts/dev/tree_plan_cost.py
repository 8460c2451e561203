"""Host time of a steady-state triton plan of 8 x 40-node trees at 4k (page 16, fp16, 32/8 heads) on this
machine, with and without the Gluon tree option, off Hopper and with Hopper patched in (the plan's route
through triton_tree_gluon.fit on a CPU machine), and fit's own time; best of 3 x 2000 plans:

  TRITON_INTERPRET=1 python3 scripts/dev/tree_plan_cost.py
"""
from __future__ import annotations

import time
import timeit

from attnbench.kernels.tree import gluon as tg
from attnbench.backends.triton import TritonBackend
from attnbench.workload import trees
from attnbench.workload.batch import BatchSpec, Request, materialize

PARENTS = tuple(trees.full({"depth": 3, "branching": 3}))  # 40 nodes
BATCH = materialize(BatchSpec(tuple(Request("tree", 40, 4096, PARENTS) for _ in range(8)), 32, 8, 128,
                              dtype="float16", page_size=16), 0)


def per_plan(be: TritonBackend, n: int = 2000) -> float:
    for _ in range(50):
        be.plan(BATCH)
    t = time.perf_counter()
    for _ in range(n):
        be.plan(BATCH)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    for label, hop in (("off Hopper", False), ("Hopper patched in", True)):
        tg.hopper = lambda device, hop=hop: hop
        for tree in ("", "gluon"):
            print(f"{label:<18} tree={tree!r:<8} {min(per_plan(TritonBackend(tree=tree)) for _ in range(3)):6.1f} us a plan")
    p = TritonBackend().plan(BATCH)
    print(f"fit {min(timeit.repeat(lambda: tg.fit(p), number=2000, repeat=3)) / 2000 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
