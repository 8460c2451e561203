"""Build FlashInfer's JIT kernels once, before the rows or tests that need them, in a few worker
processes side by side. FlashInfer keeps one file lock per module (two processes never build the
same one) and its cache (~/.cache/flashinfer) is the machine's: every later process only loads
what was built here. attnbench keeps JIT time out of every row anyway (the backend's first use
runs untimed); this is about wall time: modules built in parallel before the rows, instead of
one after another inside the first rows (or a test timing out in a 300 s build).

Items: a FlashInfer backend spec (``flashinfer``, ``flashinfer:route=fa3``, ...) and a batch
shrunk by ``gpulib.shrink`` (what decides the kernels kept, lengths cut), deduplicated by
``gpulib.kernel_signature``. A worker materializes the batch on the GPU, asks the backend's
reasons (an item the route cannot take is skipped, as its rows will be) and runs ``prepare`` and
one call (the backend's first-use call builds or loads the module). Items are handed out one
bundle at a time (those likely to share a module together; the slow families first: fa3,
persistent, MLA); at ``--budget-s`` the workers still building are killed with their compilers
(the rows then build what is left). Never fails the caller: exit 0, a summary on stdout.

    python3 scripts/gpu/flashinfer_warmup.py --scenarios FILE... [--specs SPEC,...] --procs 3 --budget-s 240
    python3 scripts/gpu/flashinfer_warmup.py --tests ...     # the batches of the GPU tests (-m gpu)
    ... --list                                               # print the items only (no GPU needed)
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpulib  # noqa: E402

SLOW_FIRST = ("route=fa3", "route=persistent")


def scenario_items(paths: list[str], specs: list[str], overrides: list[str],
                   pick: str | None = None) -> list[tuple[str, object, str]]:
    """(spec, batch spec, label) for every case and spec; with ``pick`` (attnbench run -k's
    expression, as verify_all.py --pick) only the rows it selects: a job finishing cut rows on a
    fresh machine builds their modules, not those of every case of the file."""
    from attnbench.execute.cases import select_rows
    from attnbench.workload.scenario import load

    picks = select_rows(pick)
    out = []
    for p in paths:
        sf = load(p, overrides or None)
        for case in sf.cases:
            spec = case.scenario.batch_spec()
            out += [(s, spec, f"{sf.name}/{case.case_id}") for s in specs if picks(case.case_id, s, case.params)]
    return out


def test_items() -> list[tuple[str, object, str]]:
    """The FlashInfer batches of the GPU tests (tests/test_variants_gpu.py, test_lib_backends.py,
    test_flashinfer_wiring_gpu.py, test_flashinfer_alibi_gpu.py)."""
    sys.path.insert(0, str(gpulib.ROOT))
    from attnbench.workload.spec import BatchSpec
    from tests import test_lib_backends as lib
    from tests import test_variants_gpu as var

    out = []
    for name, feature, d, noncausal in var.matrix():
        if name == "flashinfer":
            out.append(("flashinfer", var.batch_spec(feature, d, noncausal, name), f"variants/{feature}-d{d}-{noncausal}"))
    for case, reqs, layout in lib.gpu_cases("flashinfer"):
        out.append(("flashinfer", BatchSpec(tuple(reqs), 16, 4, 128, "bfloat16", 16, layout), f"lib/{case}"))
    from tests import test_flashinfer_alibi_gpu as alibi
    from tests import test_flashinfer_wiring_gpu as wiring

    return out + wiring.warmup_items() + alibi.warmup_items()


def declined(spec_str: str, small, cache: dict) -> list[str]:
    """The backend's reasons for the shrunk batch, asked on the CPU (FlashInfer's are pure logic
    over the batch; the CUDA-only one is left out): an item its route cannot take builds nothing."""
    from attnbench.backend import make_backend
    from attnbench.workload.batch import materialize

    be = cache.setdefault(spec_str, make_backend(spec_str))
    return [r for r in be.reasons(materialize(small, 0, "cpu")) if "runs on CUDA devices only" not in r]


def bundles_of(items: list[tuple[str, object, str]]) -> list[list[dict]]:
    """Unique (spec, shrunk batch) items the backend takes, in bundles (same spec, dtypes, head
    dim, variants: likely one module), the slow families first, larger bundles before smaller."""
    seen, groups, cache = set(), {}, {}
    for spec_str, spec, label in items:
        small = gpulib.shrink(spec)
        sig = gpulib.kernel_signature(spec_str, small)
        if sig in seen:
            continue
        seen.add(sig)
        if declined(spec_str, small, cache):
            continue
        key = (spec_str, small.dtype, small.kv_dtype, small.head_dim, small.window is not None, small.softcap is not None,
               small.sinks, small.attention)
        groups.setdefault(key, []).append({"spec": spec_str, "batch": gpulib.spec_to_json(small), "label": label})

    def rank(kv):
        (spec_str, *_rest), group = kv
        slow = any(s in spec_str for s in SLOW_FIRST) or kv[0][-1] == "mla"
        return (0 if slow else 1, -len(group))

    return [g for _, g in sorted(groups.items(), key=rank)]


# -- worker -----------------------------------------------------------------------------------
def worker(device: str) -> int:
    """Read bundles (JSON lists) on stdin, warm each item, write one JSON line per item and
    ``{"bundle_done": true}`` per bundle on the original stdout (all else goes to stderr)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # FlashInfer's and ninja's output: the log, never the protocol
    import torch

    from attnbench.backend import make_backend
    from attnbench.workload.batch import materialize

    backends: dict = {}
    for line in sys.stdin:
        for item in json.loads(line):
            t0 = time.perf_counter()
            res = {"spec": item["spec"], "label": item["label"]}
            try:
                be = backends.setdefault(item["spec"], make_backend(item["spec"]))
                batch = materialize(gpulib.spec_from_json(item["batch"]), 0, device)
                why = be.reasons(batch)
                if why:
                    res.update(status="skipped", reason="; ".join(why))
                else:
                    plan = be.prepare(batch)
                    be.run(plan)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    res.update(status="ok", mode=str(getattr(plan, "mode", "")))
            except Exception as e:  # the rows will say it again; the warm-up goes on
                res.update(status="error", reason=f"{type(e).__name__}: {e}"[:300])
            res["s"] = round(time.perf_counter() - t0, 1)
            proto.write(json.dumps(res) + "\n")
        proto.write(json.dumps({"bundle_done": True}) + "\n")
    return 0


# -- parent -----------------------------------------------------------------------------------
def run(bundles: list[list[dict]], procs: int, budget_s: float, log: Path, device: str = "cuda") -> list[dict]:
    """Hand the bundles to ``procs`` workers until done or ``budget_s``; kill the rest (each
    worker is a session of its own: killing it takes its ninja and nvcc along)."""
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(2, (os.cpu_count() or 8) // max(1, procs))))  # nvcc jobs per build
    deadline = time.monotonic() + budget_s
    todo, results, sel = list(bundles), [], selectors.DefaultSelector()
    workers, busy = [], {}
    with open(log, "a") as logf:
        try:
            for _ in range(min(procs, len(todo))):
                p = subprocess.Popen([sys.executable, __file__, "--worker", "--device", device], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=logf, env=env, start_new_session=True)
                workers.append(p)
                sel.register(p.stdout, selectors.EVENT_READ, p)

            def feed(p) -> None:
                if todo:
                    busy[p] = todo.pop(0)
                    p.stdin.write((json.dumps(busy[p]) + "\n").encode())
                    p.stdin.flush()
                else:
                    busy.pop(p, None)
                    p.stdin.close()

            for p in workers:
                feed(p)
            pending = {p: b"" for p in workers}  # bytes read, not yet a whole line
            while busy and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                    p = key.data
                    data = os.read(p.stdout.fileno(), 1 << 16)  # unbuffered: select sees every line
                    if not data:  # the worker ended; a bundle it held is lost
                        sel.unregister(p.stdout)
                        done = {(r["spec"], r["label"]) for r in results}
                        results += [{"spec": it["spec"], "label": it["label"], "status": "error",
                                     "reason": f"warm-up worker exited (code {p.poll()})"}
                                    for it in busy.pop(p, []) if (it["spec"], it["label"]) not in done]
                        continue
                    *lines, pending[p] = (pending[p] + data).split(b"\n")
                    for line in lines:
                        msg = json.loads(line)
                        if msg.get("bundle_done"):
                            feed(p)
                        else:
                            results.append(msg)
        finally:
            done = {(r["spec"], r["label"]) for r in results}
            results += [{"spec": it["spec"], "label": it["label"], "status": "cut", "reason": f"warm-up budget {budget_s:.0f} s"}
                        for bundle in busy.values() for it in bundle if (it["spec"], it["label"]) not in done]
            results += [{"spec": it["spec"], "label": it["label"], "status": "cut", "reason": "not started (budget)"}
                        for b in todo for it in b]
            for p in workers:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)  # the worker and its ninja/nvcc children
                    except ProcessLookupError:
                        pass
                p.wait()
    return results


def _stop(signum, frame):  # SIGTERM (the caller is done): leave through run()'s cleanup
    raise SystemExit(143)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenarios", nargs="*", default=[], help="scenario files or built-in names")
    ap.add_argument("--tests", action="store_true", help="the FlashInfer batches of the GPU tests")
    ap.add_argument("--specs", default="all", help="FlashInfer specs, comma-separated (all: every route option)")
    ap.add_argument("--set", action="append", default=[], help="scenario override KEY=VALUE (as attnbench run --set)")
    ap.add_argument("--pick", default=None, help="only the rows attnbench run -k EXPR selects (as verify_all.py --pick)")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--log", type=Path, default=Path("/tmp/flashinfer_warmup.log"), help="the workers' output (JIT builds)")
    ap.add_argument("--jsonl", type=Path, default=None, help="also write one JSON line per item here")
    ap.add_argument("--list", action="store_true", help="print the items and exit (no GPU needed)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the CPU test of the worker protocol
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.device)
    signal.signal(signal.SIGTERM, _stop)
    t0 = time.monotonic()
    specs = gpulib.route_specs("flashinfer") if args.specs == "all" else [s for s in args.specs.split(",") if s]
    items = scenario_items(args.scenarios, specs, args.set, args.pick) + (test_items() if args.tests else [])
    bundles = bundles_of(items)
    n = sum(map(len, bundles))
    print(f"flashinfer warm-up: {len(items)} (spec, case) pairs -> {n} distinct kernel sets the routes take, "
          f"in {len(bundles)} bundles", flush=True)
    if args.list:
        for b in bundles:
            for it in b:
                print(f"  {it['spec']:28s} {it['label']}")
        return 0
    if not n:
        return 0
    from attnbench.backend import backend_name, get_backend_class

    # every spec the items name: the tests' own (e.g. flashinfer:route=auto) are not all in --specs
    why = {s: get_backend_class(backend_name(s)).unavailable() for s in {it["spec"] for b in bundles for it in b}}
    bundles = [b for b in bundles if not why[b[0]["spec"]]]
    if not bundles:
        print(f"flashinfer warm-up: nothing to build ({'; '.join(sorted({w for w in why.values() if w}))})")
        return 0
    results = run(bundles, args.procs, args.budget_s, args.log, args.device)
    by = {}
    for r in results:
        by[r["status"]] = by.get(r["status"], 0) + 1
    print(f"flashinfer warm-up: {', '.join(f'{k} {v}' for k, v in sorted(by.items()))} in {time.monotonic() - t0:.0f} s "
          f"({args.procs} workers; the builds' output: {args.log})")
    for r in sorted(results, key=lambda r: -r.get("s", 0))[:8]:
        if r.get("s"):
            print(f"  {r.get('s', 0):6.1f} s  {r['spec']}  {r['label']}  {r['status']} {r.get('mode', '')}")
    for r in results:
        if r["status"] in ("error", "cut"):
            print(f"  {r['status']}: {r['spec']}  {r['label']}: {r.get('reason', '')}")
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
