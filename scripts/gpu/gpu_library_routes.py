"""Every library route on the GPU (issue 22): each FlashInfer route and both Flex mask builds on
the shipped shapes and the variant shapes, checked against attnbench's float64 reference and
timed by attnbench's own timer, graph-captured and event-timed.

    source scripts/gpu/device_setup.sh
    FLASHINFER_CUDA_ARCH_LIST=9.0 python3 scripts/gpu/gpu_library_routes.py --group all --budget-s 500 --flex-plan-s 40

(print straight to the terminal: a pipe through ``tail`` loses everything when a time limit
kills the command; the jsonl under the output folder keeps each row as it is measured).

Per (case, backend spec): status (ok / mismatch / skipped with the reason / error), the row's
mode, relative error vs the reference, plan time (median host time of ``plan``), kernel time
graph-captured and event-timed (medians, read flush, cold L2), and the first call's seconds
(FlashInfer's JIT build or load, Flex's compile). Groups: ``core`` (decode 8x4k/8x16k pages 16
and 256, tree 8x40 @4k, EAGLE g8, prefill 4x1k, a mixed batch for POD) and ``variants`` (FP8,
window + sinks, soft-cap, HND). Stops starting new rows when ``--budget-s`` is spent (the table
says which were not run). Prints a compact table; writes ``library_routes.md`` and
``library_routes.jsonl`` under ``$OUT`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from attnbench.backend import make_backend
from attnbench.backends import flashinfer as fi_mod
from attnbench.execute.runner import check_output
from attnbench.measure.timing import TimingConfig, time_host, time_run
from attnbench.workload.batch import materialize
from attnbench.workload.reference import default_tolerance, reference_attention
from attnbench.workload.scenario import load_text

LLAMA = "{num_q_heads: 32, num_kv_heads: 8, head_dim: 128, dtype: bfloat16}"
FI_DECODE = ["flashinfer", "flashinfer:route=decode", "flashinfer:route=xqa", "flashinfer:route=fa2",
             "flashinfer:route=persistent"]
FI_ANY = ["flashinfer", "flashinfer:route=fa2", "flashinfer:route=fa3", "flashinfer:route=persistent"]
FLEX = ["flex", "flex:mask=dense"]


def case(name, model, batch, page, backends, kv="", extra=""):
    text = f"name: {name}\nseed: 0\nmodel: {model}\nkv_cache: {{page_size: {page}, layout: shuffled{kv}}}\n" \
           f"batch:\n{batch}\n{extra}"
    return name, text, backends


def dec(n, ctx):
    return f"  - {{kind: decode, count: {n}, context: {ctx}}}"


CORE = [
    case("decode 8x4k p16", LLAMA, dec(8, "4k"), 16, FI_DECODE + FLEX),
    case("decode 8x16k p16", LLAMA, dec(8, "16k"), 16, FI_DECODE + FLEX),
    case("decode 8x4k p256", LLAMA, dec(8, "4k"), 256, FI_DECODE + FLEX),
    case("decode 8x16k p256", LLAMA, dec(8, "16k"), 256, FI_DECODE + FLEX),
    case("tree 8x40 @4k p16", LLAMA, "  - {kind: tree, count: 8, context: 4k, tree: {full: {depth: 3, branching: 3}}}",
         16, FI_ANY + FLEX),
    case("eagle-g8 16x61 @8k p256", "{num_q_heads: 32, num_kv_heads: 4, head_dim: 128, dtype: bfloat16}",
         "  - {kind: tree, count: 16, context: 8k, tree: {preset: eagle-dynamic-d7}}", 256, FI_ANY + FLEX),
    case("prefill 4x1k p16", LLAMA, "  - {kind: prefill, count: 4, query: 1k, context: 0}", 16, FI_ANY + FLEX),
    case("mixed 2x512+16 decode @4k p16", LLAMA,
         "  - {kind: prefill, count: 2, query: 512, context: 1k}\n  - {kind: decode, count: 16, context: 4k}", 16,
         FI_ANY + ["flashinfer:route=pod"] + FLEX),
]
GPTOSS = "{num_q_heads: 64, num_kv_heads: 8, head_dim: 64, dtype: bfloat16, window: 128, sinks: true}"
GEMMA = "{num_q_heads: 16, num_kv_heads: 8, head_dim: 256, dtype: bfloat16, softcap: 50.0, window: 4096}"
VARIANTS = [
    case("fp8 decode 8x16k p16", LLAMA, dec(8, "16k"), 16, ["flashinfer", "flashinfer:route=decode",
         "flashinfer:route=fa2", "flex"], kv=", dtype: fp8_e4m3"),
    case("gpt-oss decode 8x4k W128 sinks p16", GPTOSS, dec(8, "4k"), 16,
         ["flashinfer", "flashinfer:route=fa2", "flex"]),
    case("gpt-oss tree 8x40 @4k W128 sinks p16", GPTOSS,
         "  - {kind: tree, count: 8, context: 4k, tree: {full: {depth: 3, branching: 3}}}", 16, ["flashinfer", "flex"]),
    case("gemma2 prefill 2x1k @4k softcap W4096 p16", GEMMA, "  - {kind: prefill, count: 2, query: 1k, context: 4k}",
         16, ["flashinfer", "flashinfer:route=fa2", "flex"]),
    case("gemma2 decode 8x8k softcap W4096 p16", GEMMA, dec(8, "8k"), 16, ["flashinfer", "flex"]),
    case("hnd decode 8x4k p16", LLAMA, dec(8, "4k"), 16, ["flashinfer", "flashinfer:route=xqa", "flex"],
         kv=", order: HND"),
    case("non-causal prefill 8x16 @1k p64", LLAMA,
         "  - {kind: prefill, count: 8, query: 16, context: 1k, causal: false}", 64,
         ["flashinfer", "xformers:triton_only=on", "flex", "flash-attn"]),
    case("window+softcap decode 8x4k W128 p256", "{num_q_heads: 32, num_kv_heads: 8, head_dim: 128, dtype: bfloat16, "
         "window: 128, softcap: 30.0}", dec(8, "4k"), 256, ["flashinfer", "flash-attn", "flex"]),
    case("fp8 hnd tree 8x40 @4k p16", LLAMA,
         "  - {kind: tree, count: 8, context: 4k, tree: {full: {depth: 3, branching: 3}}}", 16,
         ["flashinfer", "flex"], kv=", dtype: fp8_e4m3, order: HND"),
]


# "all": the cases in the order they matter, so a spent budget cuts the least important
ORDER = ["decode 8x4k p16", "tree 8x40 @4k p16", "prefill 4x1k p16", "eagle-g8 16x61 @8k p256", "fp8 decode 8x16k p16",
         "gpt-oss decode 8x4k W128 sinks p16", "decode 8x16k p16", "mixed 2x512+16 decode @4k p16",
         "gpt-oss tree 8x40 @4k W128 sinks p16", "decode 8x4k p256", "decode 8x16k p256",
         "gemma2 prefill 2x1k @4k softcap W4096 p16", "hnd decode 8x4k p16", "non-causal prefill 8x16 @1k p64",
         "window+softcap decode 8x4k W128 p256", "gemma2 decode 8x8k softcap W4096 p16", "fp8 hnd tree 8x40 @4k p16"]


def ordered_all() -> list:
    by = {c[0]: c for c in CORE + VARIANTS}
    return [by[n] for n in ORDER] + [c for c in CORE + VARIANTS if c[0] not in ORDER]


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def measure(spec: str, batch, ref, cfg: TimingConfig) -> dict:
    be = make_backend(spec)
    why = be.why_unavailable() or "; ".join(be.reasons(batch))
    if why:
        return {"status": "skipped", "reason": why}
    keys = set(fi_mod.FIRST_USE_S)
    t0 = time.perf_counter()
    converted = be.convert(batch)
    plan = be.plan(converted)
    out = be.run(plan)
    if batch.device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    jit = {k: round(v, 1) for k, v in fi_mod.FIRST_USE_S.items() if k not in keys}
    tol = default_tolerance(batch.dtype)
    status, reason, rel, _ = check_output(out, ref, batch, tol)
    row = {"status": status.value, "reason": reason, "mode": getattr(plan, "mode", ""), "rel_err": rel,
           "first_call_s": round(first_s, 2), "jit_s": jit}
    if status.value != "ok":
        return row
    row["plan_ms"] = _median(time_host(lambda: be.plan(converted), batch.device))
    capturable = getattr(plan, "capturable", True)
    for label, graphs in (("graph", True), ("events", False)):
        res = time_run(lambda: be.run(plan), batch.device, TimingConfig(**{**cfg.__dict__, "cuda_graphs": graphs}),
                       capturable=capturable)
        row[f"{label}_us"] = _median(res.samples_ms) * 1e3
        row[f"{label}_method"] = res.method + (f" ({res.note})" if res.note else "")
        st2, why2, _, _ = check_output(res.output, ref, batch, tol)
        if st2.value != "ok":
            row["status"], row["reason"] = "mismatch", f"under {res.method}: {why2}"
    return row


def run_group(cases, deadline: float, cfg: TimingConfig, log, device: str = "cuda") -> list[dict]:
    rows = []
    for name, text, backends in cases:
        if time.time() > deadline:
            rows += [{"case": name, "backend": b, "status": "not run", "reason": "budget spent"} for b in backends]
            continue
        sf = load_text(text, f"<{name}>")
        batch = materialize(sf.cases[0].scenario.batch_spec(), 0, torch.device(device))
        ref = reference_attention(batch)[0]
        for b in backends:
            if time.time() > deadline:
                rows.append({"case": name, "backend": b, "status": "not run", "reason": "budget spent"})
                continue
            try:
                row = measure(b, batch, ref, cfg)
            except Exception as e:  # a route that fails is a row, and the script goes on
                row = {"status": "error", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            row = {"case": name, "backend": b, **row}
            rows.append(row)
            log.write(json.dumps(row, default=str) + "\n")
            log.flush()
            print(_line(row), flush=True)
        del batch, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


SCENARIOS = Path(__file__).resolve().parents[2] / "attnbench" / "scenarios"
NOT_GPU = {"cpu-sweep", "variants-cpu"}


def flex_plans(deadline: float, device: str = "cuda", per_scenario: int = 6, log=None) -> list[dict]:
    """Flex's plan time with the BlockMask from KV blocks vs ``create_block_mask`` over the padded
    grid, on (up to ``per_scenario``) cases of every shipped scenario: plan only, no kernel."""
    from attnbench.workload.scenario import load

    out = []
    for f in sorted(SCENARIOS.glob("*.yaml")):
        if f.stem in NOT_GPU or time.time() > deadline:
            continue
        ms: dict = {"blocks": [], "dense": []}
        for c in load(f).cases[:per_scenario]:
            if time.time() > deadline:
                break
            batch = materialize(c.scenario.batch_spec(), c.scenario.seed, torch.device(device))
            for mask in ms:
                be = make_backend(f"flex:mask={mask}")
                if be.reasons(batch):
                    continue
                conv = be.convert(batch)
                be.plan(conv)
                ms[mask].append(_median(time_host(lambda: be.plan(conv), batch.device)))
            del batch
        row = {"scenario": f.stem, "cases": len(ms["blocks"])}
        for mask, xs in ms.items():
            row[f"{mask}_median_ms"] = _median(xs)
            row[f"{mask}_max_ms"] = max(xs) if xs else float("nan")
        out.append(row)
        print(_plan_line(row), flush=True)
        if log is not None:  # kept as it comes: a run cut by its time limit keeps what it measured
            log.write(json.dumps({"flex_plan": row}) + "\n")
            log.flush()
    return out


PLAN_HEADER = ("| scenario | cases | Flex plan, BlockMask from KV blocks: median / max ms | "
               "create_block_mask (before): median / max ms |\n|---|---|---|---|")


def _plan_line(r: dict) -> str:
    return (f"| {r['scenario']} | {r['cases']} | {_fmt(r['blocks_median_ms'], '.3f')} / {_fmt(r['blocks_max_ms'], '.3f')} | "
            f"{_fmt(r['dense_median_ms'], '.2f')} / {_fmt(r['dense_max_ms'], '.2f')} |")


def _fmt(x, spec=".1f"):
    return "" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def _line(r: dict) -> str:
    jit = "; ".join(f"{k}: {v} s" for k, v in (r.get("jit_s") or {}).items())
    note = r.get("reason") or ""
    if "graph_method" in r and not r["graph_method"].startswith("cuda-graph"):
        note = (note + "; " if note else "") + r["graph_method"]
    return (f"| {r['case']} | {r['backend']} | {r['status']} | {r.get('mode', '')} | {_fmt(r.get('rel_err'), '.1e')} | "
            f"{_fmt(r.get('plan_ms'), '.3f')} | {_fmt(r.get('graph_us'))} | {_fmt(r.get('events_us'))} | "
            f"{_fmt(r.get('first_call_s'), '.1f')} | {jit} | {note[:160]} |")


HEADER = ("| case | backend | status | mode | rel err | plan ms | graph µs | events µs | first call s | "
          "FlashInfer first use (JIT) | note |\n|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", choices=("core", "variants", "all"), default="core")
    ap.add_argument("--flex-plan-s", type=float, default=0.0, help="first spend up to this on Flex plan before/after")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--warmup-ms", type=float, default=5.0)
    ap.add_argument("--measure-ms", type=float, default=30.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "library-routes"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = {"core": CORE, "variants": VARIANTS, "all": ordered_all()}[a.group]
    cfg = TimingConfig(warmup_ms=a.warmup_ms, measure_ms=a.measure_ms)
    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; group {a.group}", flush=True)
    if not a.flex_plan_s:
        print(HEADER, flush=True)
    start = time.time()
    plans = []
    with open(out / "library_routes.jsonl", "a") as log:
        log.write(json.dumps({"device": device, "torch": torch.__version__, "group": a.group}) + "\n")
        if a.flex_plan_s > 0:
            print(PLAN_HEADER, flush=True)
            plans = flex_plans(start + a.flex_plan_s, log=log)
            print(HEADER, flush=True)
        rows = run_group(cases, start + a.budget_s, cfg, log)
    text = f"device: {device}, torch {torch.__version__}\n\n{HEADER}\n" + "\n".join(_line(r) for r in rows) + "\n"
    if plans:
        text += f"\n{PLAN_HEADER}\n" + "\n".join(_plan_line(r) for r in plans) + "\n"
    (out / f"library_routes_{a.group}.md").write_text(text)
    bad = [r for r in rows if r["status"] in ("mismatch", "error")]
    print(f"{len(rows)} rows: " + ", ".join(f"{s} {sum(r['status'] == s for r in rows)}"
                                             for s in ("ok", "skipped", "mismatch", "error", "not run")))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
