"""The triton backend's plan (host metadata per engine step), timed alone on this machine's CPU
for every case of the shipped scenarios (issue 33's last row: <= 200 us per step).

    PYTHONPATH=. python3 scripts/dev/triton_plan_time.py [SCENARIO.yaml ...] [--sms 132]
        [--runs 50] [--skip cpu-sweep] [--profile CASE_SUBSTRING] [--device cuda] [--no-ops]
        [--save JSON] [--compare JSON]

Each case's batch is built on the CPU (``--device cuda``: on the GPU, where the plan pays its
real host-to-device copies and allocations) with uninitialized K/V caches (the plan reads only the
lengths, the tree inputs and the shapes), and the plan runs as the runner times it: one engine
step per call (``Batch.new_step`` first), through attnbench's host timer
(``measure.timing.time_host``), one thread. The split heuristic sees ``--sms`` SMs (an H100's
132 by default, not the interpreter's 4), so the units are the GPU's. ``ops``: the torch
operators one plan dispatches (on a GPU each is a kernel launch, an allocation or a copy of a
few microseconds of host time that this CPU timing does not show; views are not counted);
``h2d``: of those, the copies from host memory to the batch's device (counted on a batch placed
on the meta device, which runs every operator without data). ``new-shape us``: the same plan
with the backend's per-shape caches emptied before each call (triton_step.py: what a step whose
query lengths or trees differ from every earlier step's pays; "-" for a tree without them).
``serving us``: the same plan on steps whose contexts grow by one token per request each call
(a decode or verify loop: the query side as it was, every key length new, so the split
pattern changes when an engine's would); the other columns replay one batch, whose key side
the plan rebuilds every step all the same (docs/kernels.md, "The plan").
``--primitives`` (on a GPU): the host time of the torch calls a plan makes (allocations, the
copy, views, a synchronize), each alone, before the table.
At the end, per scenario: the median and the max over its cases of the per-case medians;
``--save`` writes the per-case medians (JSON), ``--compare`` prints them beside a saved run's
(the baseline: e.g. an older attnbench on PYTHONPATH, same script, same machine).
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import glob
import json
import pstats
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnbench.kernels.shared import plan as tp
from attnbench.backends.triton import TritonBackend
from attnbench.measure.timing import time_host
from attnbench.workload import batch as wb
from attnbench.workload.mla import default_scale, is_mla
from attnbench.workload.scenario import load
from attnbench.workload.spec import FP8_DTYPES

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(glob.glob(str(ROOT / "attnbench/scenarios/*.yaml"))) + sorted(
    glob.glob(str(ROOT / "attnbench/scenarios/gpu/*.yaml")))


def _empty_cache(spec, device):
    """``(k_cache, v_cache, k_scale, v_scale)`` of the spec's shapes, dtype and order, never
    drawn nor touched (the plan reads only the shapes, lengths and tree inputs)."""
    shape = (spec.num_pages, spec.page_size, spec.num_kv_heads, spec.head_dim)
    dt = getattr(torch, FP8_DTYPES[spec.kv_dtype][0]) if spec.fp8 else spec.torch_dtype
    scale = torch.ones(spec.num_kv_heads if spec.kv_scale == "per-head" else 1, device=device) if spec.fp8 else None
    k = wb.to_order(torch.empty(shape, dtype=dt, device=device), spec.kv_order)[1]
    if is_mla(spec):  # one latent cache, its first kv_lora_rank dims the values
        return k, k[..., : spec.kv_lora_rank], scale, scale
    return k, wb.to_order(torch.empty(shape, dtype=dt, device=device), spec.kv_order)[1], scale, scale


def light_batch(spec, seed: int, device: str = "cpu") -> wb.Batch:
    """The case's batch (its page layout from the seed, as ``materialize`` draws it) with
    uninitialized q and caches, on ``device`` (the meta device runs every operator without data)."""
    pages = wb.page_assignment(spec, torch.Generator().manual_seed(seed))
    table = torch.zeros(len(spec.requests), max(1, max(map(len, pages), default=1)), dtype=torch.int32)
    for i, p in enumerate(pages):
        table[i, : len(p)] = torch.tensor(p, dtype=torch.int32)
    q = torch.tensor([r.query for r in spec.requests], dtype=torch.int32)
    c = torch.tensor([r.context for r in spec.requests], dtype=torch.int32)
    k, v, ks, vs = _empty_cache(spec, device)
    starts = torch.cat([torch.zeros(1, dtype=torch.int32), q.cumsum(0).to(torch.int32)])
    queries = torch.empty(spec.num_tokens, spec.num_q_heads, spec.head_dim, dtype=spec.torch_dtype, device=device)
    return wb.Batch(
        spec=spec, q=queries,
        k_cache=k, v_cache=v, k_scale=ks, v_scale=vs,
        sinks=torch.zeros(spec.num_q_heads, device=device) if spec.sinks else None,
        alibi_slopes=wb.alibi_slopes(spec.num_q_heads).to(device) if spec.alibi else None,
        block_table=table.to(device), query_start_loc=starts.to(device),
        query_lens=q.to(device), context_lens=c.to(device), kv_lens=(q + c).to(device),
        scale=float(spec.scale if spec.scale is not None else default_scale(spec)),
    )


class _Ops(TorchDispatchMode):
    """Counts the device work of the operators dispatched: ``launches`` (an operator that is no
    view: on a GPU a kernel, a memset or an allocation), ``h2d`` (of those, copies from host
    memory to the device)."""

    def __init__(self):
        super().__init__()
        self.launches, self.h2d = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not any(r.alias_info is not None for r in func._schema.returns):  # views launch nothing
            self.launches += 1
            srcs = [a for a in args if isinstance(a, torch.Tensor) and a.device.type == "cpu"]
            self.h2d += bool(srcs) and isinstance(out, torch.Tensor) and out.device.type == "meta"
        return out


def count_ops(spec, seed: int) -> tuple[int, int]:
    """Device operators (no views) and host-to-device copies of one plan, on a meta-device batch."""
    try:
        batch = light_batch(spec, seed, "meta")
        be = TritonBackend()
        be.plan(batch)  # per-topology caches built once, as in the timed calls
        batch.new_step()
        with _Ops() as m:
            be.plan(batch)
        return m.launches, m.h2d
    except Exception:  # an operator meta tensors cannot run (data-dependent): not counted
        return -1, -1


def cases(paths, skip):
    for path in paths:
        sf = load(path, [])
        if sf.name in skip:
            continue
        for case in sf.cases:
            yield sf.name, case


def describe(batch) -> str:
    h, t = batch.host, batch.trees
    kind = "dynamic" if t.dynamic else "static" if t.tmax else "-"
    return f"B={len(h.query_lens)} N={int(h.query_lens.sum())} trees={len(t.reqs)}x{t.tmax} {kind}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*")
    ap.add_argument("--device", default="cpu", help="cpu (default), or cuda: the plan with its real copies")
    ap.add_argument("--sms", type=int, default=None,
                    help="SMs the split heuristic plans for (default: an H100's 132 on the CPU, the GPU's own on cuda)")
    ap.add_argument("--runs", type=int, default=50, help="timed plans per case (at most; 50 ms budget)")
    ap.add_argument("--skip", action="append", default=None, help="scenario names to leave out (default cpu-sweep)")
    ap.add_argument("--profile", default=None, help="cProfile the first case whose name holds this")
    ap.add_argument("--no-ops", action="store_true", help="skip the operator count")
    ap.add_argument("--save", default=None, help="write the per-case medians (us) to this JSON file")
    ap.add_argument("--compare", default=None, help="a --save file (the baseline) to print beside this run")
    ap.add_argument("--primitives", action="store_true", help="first time the torch calls of a plan alone")
    args = ap.parse_args()
    if args.primitives:
        primitives(torch.device(args.device))
    torch.set_num_threads(1)  # as the runner times CPU rows
    skip = set(args.skip if args.skip is not None else ["cpu-sweep"])
    be = TritonBackend()
    worst, rows = [], {}
    print(f"{'case':58s} {'batch':40s} {'plan us':>8s} {'p20-p80 us':>13s} {'new-shape us':>12s} {'serving us':>10s} {'ops':>5s} {'h2d':>4s}")
    sms = args.sms or (132 if args.device == "cpu" else None)
    with mock.patch.object(tp, "num_sms", (lambda dev: sms) if sms else tp.num_sms):
        for name, case in cases(args.scenarios or SHIPPED, skip):
            label = f"{name}/{case.case_id}"[:58]
            spec = case.scenario.batch_spec()
            batch = light_batch(spec, case.scenario.seed, args.device)
            step = lambda: (batch.new_step(), be.plan(batch))  # noqa: E731 (one engine step)
            if args.profile and args.profile in label:
                args.profile = None
                _profile(step, label)
            s = sorted(time_host(step, batch.device, budget_ms=50.0, max_runs=args.runs)) 
            med = statistics.median(s) * 1e3
            p20, p80 = s[len(s) // 5] * 1e3, s[(4 * len(s)) // 5 - (len(s) % 5 == 0)] * 1e3
            new, grow = _new_shape(be, batch), _serving(be, batch)
            ops, h2d = (-1, -1) if args.no_ops else count_ops(spec, case.scenario.seed)
            print(f"{label:58s} {describe(batch)[:40]:40s} {med:8.1f} {p20:6.0f}-{p80:<6.0f} {new:>12s} {grow:>10s} {ops:5d} {h2d:4d}")
            sys.stdout.flush()
            worst.append((med, label))
            rows[f"{name}/{case.case_id}"] = (name, med)
    worst.sort(reverse=True)
    print(f"\n{len(worst)} cases; slowest: " + ", ".join(f"{lab} {m:.0f} us" for m, lab in worst[:3]))
    print(f"median over cases {statistics.median(m for m, _ in worst):.0f} us, max {worst[0][0]:.0f} us, "
          f"{sum(m <= 200 for m, _ in worst)} of {len(worst)} <= 200 us")
    if args.save:
        Path(args.save).write_text(json.dumps(rows))
    base = json.loads(Path(args.compare).read_text()) if args.compare else None
    per_scenario(rows, base)


def _new_shape(be, batch) -> str:
    """Median of plans with the backend's per-shape caches emptied first, or "-" without them."""
    forget = getattr(be, "forget_shapes", None)
    if forget is None:
        return "-"
    s = time_host(lambda: (batch.new_step(), forget(), be.plan(batch)), batch.device, budget_ms=25.0, max_runs=25)
    return f"{statistics.median(s) * 1e3:.1f}"


def _serving(be, batch) -> str:
    """Median of plans on steps whose contexts grow by one token per request each call (the
    lengths made before the timing, so the timed call is the step and the plan alone)."""
    host0 = batch.host
    hosts = [dataclasses.replace(host0, context_lens=host0.context_lens + k, kv_lens=host0.kv_lens + k)
             for k in range(1, 200)]
    it = iter(hosts)

    def step():
        batch.new_step()
        batch.__dict__["host"] = next(it)
        be.plan(batch)

    try:
        s = time_host(step, batch.device, budget_ms=25.0, max_runs=25)
    finally:
        batch.__dict__["host"] = host0
    return f"{statistics.median(s) * 1e3:.1f}"


def primitives(dev: torch.device) -> None:
    """The host time (us, median of 200) of each torch call a plan makes, alone, on ``dev``."""
    import numpy as np
    import time

    host, host64, big = np.zeros(1024, np.int32), np.zeros(16384, np.int32), (1056, 32, 128)
    d = torch.empty(1024, dtype=torch.int32, device=dev)
    cuda = dev.type == "cuda"
    calls = {
        "torch.empty [8, 32, 128] bf16": lambda: torch.empty(8, 32, 128, dtype=torch.bfloat16, device=dev),
        "torch.empty [1056, 32, 128] bf16": lambda: torch.empty(*big, dtype=torch.bfloat16, device=dev),
        "torch.empty [3, 1082, 32, 128] float32": lambda: torch.empty(3, 1082, 32, 128, device=dev),
        "from_numpy(4 KB).to(dev) (pageable)": lambda: torch.from_numpy(host).to(dev),
        "from_numpy(64 KB).to(dev) (pageable)": lambda: torch.from_numpy(host64).to(dev),
        "as_strided": lambda: d.as_strided((16, 16), (16, 1), 64),
        "view(int64)": lambda: d.view(torch.int64),
    }
    if cuda:
        pin = torch.empty(1024, dtype=torch.int32, pin_memory=True)
        calls.update({
            "torch.empty(4 KB, pin_memory=True)": lambda: torch.empty(1024, dtype=torch.int32, pin_memory=True),
            "pinned 4 KB .to(dev, non_blocking=True)": lambda: pin.to(dev, non_blocking=True),
            "torch.cuda.current_stream()": torch.cuda.current_stream,
            "torch.cuda.synchronize() (idle)": lambda: torch.cuda.synchronize(dev),
        })
    print(f"torch calls of a plan, alone, on {dev} (us, median of 200):")
    for name, fn in calls.items():
        s = []
        for _ in range(220):
            t0 = time.perf_counter()
            fn()
            s.append(time.perf_counter() - t0)
            if cuda:
                torch.cuda.synchronize(dev)
        print(f"  {name:44s} {statistics.median(s[20:]) * 1e6:7.1f}")


def per_scenario(rows: dict, base: dict | None) -> None:
    """Per scenario: cases, median and max of the case medians (us); beside a baseline's, on the
    cases both runs have."""
    groups: dict = {}
    for key, (name, med) in rows.items():
        old = base.get(key) if base else None
        groups.setdefault(name, []).append((med, old[1] if old else None))
    print(f"\n{'scenario':34s} {'cases':>5s} {'median us':>10s} {'max us':>8s}" +
          (f" {'base median':>12s} {'base max':>9s}" if base else ""))
    for name, vals in groups.items():
        now = [m for m, _ in vals]
        line = f"{name[:34]:34s} {len(vals):5d} {statistics.median(now):10.1f} {max(now):8.1f}"
        olds = [o for _, o in vals if o is not None]
        if base:
            line += f" {statistics.median(olds):12.1f} {max(olds):9.1f}" if olds else f" {'-':>12s} {'-':>9s}"
        print(line)


def _profile(step, label: str) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        step()
    prof.disable()
    print(f"--- cProfile of 200 plans of {label}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
