"""Each backend's plan next to its library's own plan call, timed alone with the same inputs.

Checks the plan-time target of the fidelity issue: a library backend's plan_ms within 2x of
the library's own plan call (FlashInfer's ``wrapper.plan``, Flex's ``create_block_mask``).
The library call's arguments are recorded from one real plan (a spy that only records), then
that call is timed alone; both through attnbench's host timer (``measure.timing.time_host``).

    python3 scripts/dev/plan_split.py [SCENARIO.yaml ...] [--set KEY=VALUE ...] [-b BACKEND ...]

Default: the tree cases of the fidelity issue (tree-verify-llama3-8b at 4k, and
tree-random-60-gqa8), page 16, every available backend, on the scenario's device.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from attnbench.backend import get_backend_class
from attnbench.execute.runner import default_backends, resolve_device
from attnbench.measure.timing import time_host
from attnbench.workload.batch import materialize
from attnbench.workload.scenario import load

DEFAULT = [("attnbench/scenarios/tree-verify-llama3-8b.yaml", ["sweep={batch.0.context: [4k], kv_cache.page_size: [16, 256]}"]),
           ("attnbench/scenarios/tree-random-60-gqa8.yaml", [])]


def median_ms(fn, device) -> float:
    return statistics.median(time_host(fn, device))


def library_call(name: str, be, converted):
    """The library's own plan call of one real plan, as a zero-argument callable (or None)."""
    seen: dict = {}
    if name == "flashinfer":
        w = be.plan(converted).wrapper  # the backend reuses this wrapper in every plan
        real = w.plan
        w.plan = lambda *a, **k: (seen.update(a=a, k=k), real(*a, **k))[1]
        be.plan(converted)
        del w.plan
        return lambda: real(*seen["a"], **seen["k"])
    if name == "flex":
        import torch.nn.attention.flex_attention as fa

        real = fa.create_block_mask
        fa.create_block_mask = lambda *a, **k: (seen.update(a=a, k=k), real(*a, **k))[1]
        try:
            be.plan(converted)
        finally:
            fa.create_block_mask = real
        return lambda: real(*seen["a"], **seen["k"])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("-b", "--backend", action="append", default=None)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    todo = [(s, args.set) for s in args.scenarios] or DEFAULT
    names = args.backend or [n for n in default_backends() if n != "reference"]
    print(f"{'case':44s} {'backend':11s} {'convert':>10s} {'plan':>10s} {'library plan':>13s} {'plan/lib':>8s}")
    for path, overrides in todo:
        sf = load(path, overrides)
        for case in sf.cases:
            spec = case.scenario.batch_spec()
            dev = resolve_device(args.device or case.scenario.device)
            if dev.type == "cpu":
                torch.set_num_threads(1)  # as the runner times CPU rows: steady host times
            batch = materialize(spec, case.scenario.seed, dev)
            for name in names:
                be = get_backend_class(name)()
                why = get_backend_class(name).unavailable() or "; ".join(be.reasons(batch))
                label = f"{sf.name}/{case.case_id}"
                if why:
                    print(f"{label:44s} {name:11s} skipped: {why[:80]}")
                    continue
                converted = be.convert(batch)
                conv = median_ms(lambda: be.convert(batch), dev) if be.converts() else 0.0
                plan = median_ms(lambda: be.plan(converted), dev)
                call = library_call(name, be, converted)
                lib = f"{median_ms(call, dev):11.3f}ms" if call else f"{'-':>13s}"
                ratio = f"{plan / float(lib[:-2]):8.2f}" if call else f"{'-':>8s}"
                print(f"{label:44s} {name:11s} {conv:8.3f}ms {plan:8.3f}ms {lib} {ratio}", flush=True)
            del batch
            if dev.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
