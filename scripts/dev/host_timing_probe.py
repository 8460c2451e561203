"""Why `attnbench run`'s plan column reads up to 2x the plan table's (issue 33, twelfth session): the triton
plan of one scenario's cases timed by attnbench's host timer (``measure.timing.time_host``, the runner's
settings: 10 ms budget, 20 samples, 10 ms warm-up capped at 20 calls) in four conditions, alternated over
rounds in one process, on the GPU machine from the repo root:

    PYTHONPATH=. python3 scripts/dev/host_timing_probe.py [SCENARIO.yaml] [--rounds 5] [--device cuda]
        [--conditions idle,spread] [--spread-rounds 8] [--gap-ms 5] [--round-warmup-ms 1]

``idle``: after 100 ms of sleep (as a row's plan timing follows waits on the GPU), the runner's warm-up and
one window of samples (the runner's way until h34plan); ``busy``: after the same sleep, 50 ms of plans untimed
first; ``1t``: ``idle`` with one intra-op thread (the plan table's setting; the runner keeps torch's default
on a GPU row); ``gpu``: ``idle`` with the sleep spent waiting on a GPU kernel (a synchronize); ``spread``: the
runner's way since h34plan (``execute.host_samples.HostSampler``, the same 10 ms budget and 20 calls): half
the calls after the sleep and the warm-up, the rest over ``--spread-rounds`` rounds, each after ``--gap-ms`` of
waiting on a GPU kernel (a sleep on a CPU), as a row's rounds follow the other backends' kernel timing, each
round's samples after its untimed calls (``--round-warmup-ms``; a list, such as 0,1,2, names one condition
``spread@W`` each: how long the GPU host's plan takes to warm up again after a round). Prints
per condition the median, 90th percentile and max over the cases and rounds of the per-row medians (us), the
rows above 200 us, and the spread of a case's rows (the median over cases of their max / median): the old
and the new way's spread, side by side, from one call."""
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

from attnbench.backends.triton import TritonBackend  # noqa: E402
from attnbench.execute.host_samples import ROUND_WARMUP_MS, HostSampler  # noqa: E402
from attnbench.measure.timing import time_host  # noqa: E402
from attnbench.workload.scenario import load  # noqa: E402


def wait(device, ms: float, gpu_wait: bool) -> None:
    """``ms`` idle: waiting on a GPU kernel (a synchronize) or asleep."""
    if gpu_wait:
        torch.cuda._sleep(int(ms * 1.98e6))  # clock cycles at an H100/H200's 1.98 GHz
        torch.cuda.synchronize(device)
    else:
        time.sleep(ms / 1e3)


def spread_row(be, batch, device, rounds: int, gap_ms: float, warmup_ms: float) -> float:
    """One row's plan median (us) as the runner times it since h34plan: half the calls after the idle gap, the
    rest a share after each of ``rounds`` waits of ``gap_ms`` (the other backends' kernels in the runner)."""
    wait(device, 100.0, False)
    sampler = HostSampler(lambda: (batch.new_step(), be.plan(batch)), device, 10.0, rounds, round_warmup_ms=warmup_ms)
    sampler.first()
    for _ in range(rounds):
        wait(device, gap_ms, device.type == "cuda")
        sampler.round()
    return statistics.median(sampler.samples) * 1e3


def row(be, batch, device, busy_ms: float, gpu_wait: bool) -> float:
    """One row's plan median (us) as the runner timed it in one window, after an idle gap (``gpu_wait``: 100 ms
    of a GPU kernel waited for by a synchronize instead of a sleep) and ``busy_ms`` of untimed plans."""
    wait(device, 100.0, gpu_wait)
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
    ap.add_argument("--conditions", default="", help="comma-separated, of idle,busy,1t,gpu,spread (default: all)")
    ap.add_argument("--spread-rounds", type=int, default=8, help="spread: a row's timing rounds (tree-costs: 8)")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="spread: the wait before each round's plans")
    ap.add_argument("--round-warmup-ms", default=str(ROUND_WARMUP_MS),
                    help="spread: untimed calls before each round's samples, ms; several comma-separated")
    a = ap.parse_args()
    device = torch.device(a.device)
    default_threads = torch.get_num_threads()
    cases = [(c.case_id, light_batch(c.scenario.batch_spec(), 0, a.device)) for c in load(a.scenario, []).cases]
    conds = {"idle": (0.0, default_threads, False), "busy": (50.0, default_threads, False), "1t": (0.0, 1, False)}
    if device.type == "cuda":
        conds["gpu"] = (0.0, default_threads, True)
    warmups = [float(w) for w in a.round_warmup_ms.split(",")]
    spreads = {"spread" if len(warmups) == 1 else f"spread@{w:g}": w for w in warmups}
    conds.update({name: (0.0, default_threads, w) for name, w in spreads.items()})  # a float: HostSampler's rounds
    wanted = [c for c in a.conditions.split(",") if c] or list(conds)
    wanted = [x for c in wanted for x in (spreads if c == "spread" else [c])]  # spread: each of its warm-ups
    unknown = [c for c in wanted if c not in conds]
    if unknown:
        ap.error(f"--conditions: {', '.join(unknown)} not one of {', '.join(conds)}")
    got: dict = {k: [] for k in wanted}
    for r in range(a.rounds):
        for name in wanted:
            busy, threads, gpu_wait = conds[name]
            torch.set_num_threads(threads)
            for cid, batch in cases:
                be = TritonBackend()
                be.plan(batch)
                us = (row(be, batch, device, busy, gpu_wait) if isinstance(gpu_wait, bool)
                      else spread_row(be, batch, device, a.spread_rounds, a.gap_ms, gpu_wait))
                got[name].append((cid, us))
    torch.set_num_threads(default_threads)
    print(f"{a.scenario}: {len(cases)} cases x {a.rounds} rounds; torch threads by default {default_threads}; "
          f"spread: {a.spread_rounds} rounds, {a.gap_ms:g} ms apart")
    for name, rows in got.items():
        report(name, rows)
    return 0


def report(name: str, rows: list) -> None:
    """One condition's line: the rows' medians over every case, and how far a case's rows spread."""
    us = sorted(u for _, u in rows)
    per_case: dict = {}
    for cid, u in rows:
        per_case.setdefault(cid, []).append(u)
    ratio = statistics.median(max(v) / statistics.median(v) for v in per_case.values())
    print(f"{name:9s} median {statistics.median(us):6.1f} us, p90 {us[int(0.9 * (len(us) - 1))]:6.1f}, "
          f"max {us[-1]:6.1f}, rows > 200 us: {sum(u > 200 for u in us)} of {len(us)}; "
          f"a case's max / median row: {ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
