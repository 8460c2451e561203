"""Why `attnbench run`'s plan column reads up to 2x the plan table's (issue 33, twelfth session): the triton
plan of one scenario's cases timed by attnbench's host timer (``measure.timing.time_host``, the runner's
settings: 10 ms budget, 20 samples, 10 ms warm-up capped at 20 calls) in four conditions, alternated over
rounds in one process, on the GPU machine from the repo root:

    PYTHONPATH=. python3 scripts/dev/host_timing_probe.py [SCENARIO.yaml] [--rounds 5] [--device cuda]

``idle``: after 100 ms of sleep (as a row's plan timing follows waits on the GPU), the runner's warm-up;
``busy``: after the same sleep, 50 ms of plans untimed first; ``1t``: ``idle`` with one intra-op thread (the
plan table's setting; the runner keeps torch's default on a GPU row); ``gpu``: ``idle`` with the sleep spent
waiting on a GPU kernel (a synchronize). Prints each condition's median over
the cases and rounds of the per-row medians (us), and the share of rows above 200 us."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_plan_time import light_batch  # noqa: E402

from attnbench.backends.triton_paged import TritonBackend  # noqa: E402
from attnbench.measure.timing import time_host  # noqa: E402
from attnbench.workload.scenario import load  # noqa: E402


def row(be, batch, device, busy_ms: float, gpu_wait: bool) -> float:
    """One row's plan median (us) as the runner times it, after an idle gap (``gpu_wait``: 100 ms of a GPU kernel
    waited for by a synchronize instead of a sleep) and ``busy_ms`` of untimed plans."""
    if gpu_wait:
        torch.cuda._sleep(2 * 10**8)  # clock cycles: ~100 ms at an H100/H200's 1.98 GHz
        torch.cuda.synchronize(device)
    else:
        time.sleep(0.1)
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < busy_ms:
        batch.new_step()
        be.plan(batch)
    s = time_host(lambda: (batch.new_step(), be.plan(batch)), device, 10.0)
    return statistics.median(s) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default="attnbench/scenarios/tree-costs-llama3-8b.yaml")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    device = torch.device(a.device)
    default_threads = torch.get_num_threads()
    cases = [(c.case_id, light_batch(c.scenario.batch_spec(), 0, a.device)) for c in load(a.scenario, []).cases]
    conds = {"idle": (0.0, default_threads, False), "busy": (50.0, default_threads, False), "1t": (0.0, 1, False)}
    if device.type == "cuda":
        conds["gpu"] = (0.0, default_threads, True)
    got: dict = {k: [] for k in conds}
    for r in range(a.rounds):
        for name, (busy, threads, gpu_wait) in conds.items():
            torch.set_num_threads(threads)
            for cid, batch in cases:
                be = TritonBackend()
                be.plan(batch)
                got[name].append((cid, row(be, batch, device, busy, gpu_wait)))
    torch.set_num_threads(default_threads)
    print(f"{a.scenario}: {len(cases)} cases x {a.rounds} rounds; torch threads by default {default_threads}")
    for name, rows in got.items():
        us = [u for _, u in rows]
        print(f"{name:5s} median {statistics.median(us):6.1f} us, max {max(us):6.1f}, rows > 200 us: "
              f"{sum(u > 200 for u in us)} of {len(us)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
