"""GPU checks of the harness that cannot be a scenario: each compares runs with each other,
with the profiler or with the device's measured ceilings.

    python3 scripts/gpu/gpu_checks.py [--out DIR] [--only NAME ...]

Every case is a shipped scenario with ``--set``-style overrides, run through attnbench's own
runner: every time comes from ``attnbench.measure.timing`` and every FLOP and byte count from
``attnbench.measure.metrics``. Nothing here times or counts by itself.

The checks are the entries of ``CHECKS`` (name -> function returning ``Verdict``s); add one by
writing a function of the same shape and naming it there. ``--only NAME`` runs some of them.
Prints one table of verdicts last; writes every row measured (``gpu_checks_rows.jsonl``) and
the verdicts (``gpu_checks.json``) to DIR (default ``$OUT`` or ``./gpu-checks``). Exit 1 when
a verdict fails, 2 without a CUDA device.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from rich.console import Console
from rich.table import Table

from attnbench.analyze.run_table import print_results
from attnbench.execute.options import RunOptions
from attnbench.execute.runner import Runner
from attnbench.measure.ceilings import ceilings_for
from attnbench.measure.timing import FLUSH_MODES
from attnbench.store.rows import Row, Status
from attnbench.workload.scenario import load

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "attnbench" / "scenarios"

# name -> (shipped scenario, overrides): one case each ("sweep={}" keeps the base case)
CASES = {
    "decode B8 ctx4k p16": ("decode-llama3-8b.yaml", []),
    "decode B32 ctx16k p256": ("decode-llama3-8b.yaml", ["batch.0.count=32", "batch.0.context=16k", "kv_cache.page_size=256"]),
    "decode B32 ctx16k p256 contiguous": (
        "decode-llama3-8b.yaml",
        ["batch.0.count=32", "batch.0.context=16k", "kv_cache.page_size=256", "kv_cache.layout=contiguous"],
    ),
    "decode B4 ctx1k p16": ("decode-llama3-8b.yaml", ["batch.0.count=4", "batch.0.context=1k"]),
    "decode B8 ctx16k p16": ("decode-llama3-8b.yaml", ["batch.0.context=16k"]),
    "prefill 4x1k p16": ("prefill-llama3-8b.yaml", []),
    "chunked 4x1k@3k p16": ("prefill-llama3-8b.yaml", ["batch.0.context=3k"]),
    "tree40 B8 ctx4k p16": ("tree-verify-llama3-8b.yaml", []),
}


@dataclass
class Verdict:
    check: str
    case: str
    measured: str
    ok: Optional[bool]  # None: not applicable (said in ``measured``)


class Checks:
    """What every check shares: the device, its ceilings, the rows measured so far."""

    def __init__(self, out: Path, device: str = "cuda", overrides: tuple[str, ...] = ()):
        self.out = out
        self.device = torch.device(device)
        self.overrides = list(overrides)  # added to every case (the CPU test shrinks the shapes)
        self.ceilings = ceilings_for(self.device, "bfloat16")
        self.rows: list[Row] = []

    def run(self, label: str, backends: list[str], tag: str = "", **options) -> list[Row]:
        """The rows of case ``label`` (``CASES``) through ``backends``, with RunOptions ``options``
        (``tag`` is added to their case id in the rows written)."""
        path, overrides = CASES[label]
        sf = load(SCENARIOS / path, ["sweep={}", f"device={self.device}", *overrides, *self.overrides])
        rows = list(Runner(sf, RunOptions(backends=backends, **options)).rows())
        for r in rows:
            r.id.case_id = f"{label} {tag}".strip()
        self.rows += rows
        return rows


def not_ok(check: str, r: Row) -> Verdict:
    """A row that could not be judged: failed (error, mismatch), or n/a when it was skipped."""
    return Verdict(check, f"{r.id.case_id} {r.id.backend}", f"{r.status}: {r.reason[:80]}",
                   None if r.status is Status.SKIPPED else False)


def profiler_vs_timer(c: Checks) -> list[Verdict]:
    """The timer's median agrees with the profiler's summed kernel time per call (within 3%;
    calls under 50 µs are reported, not judged: launch gaps weigh there)."""
    out = []
    for label in ("decode B8 ctx4k p16", "decode B32 ctx16k p256", "prefill 4x1k p16", "chunked 4x1k@3k p16", "tree40 B8 ctx4k p16"):
        prof = c.out / "profiles" / label.replace(" ", "_").replace("@", "at")
        for r in c.run(label, ["sdpa", "flex"], profile_dir=prof):
            if r.status is not Status.OK:
                out.append(not_ok("profiler vs timer", r))
                continue
            diff = (r.timing.median_ms - r.profile.kernel_sum_ms) / r.profile.kernel_sum_ms
            measured = (
                f"median {r.timing.median_ms * 1e3:.1f} µs [{r.timing.timing_method}], kernels {r.profile.kernel_sum_ms * 1e3:.1f} µs "
                f"({r.profile.kernels_per_call}/call), diff {diff:+.1%}"
            )
            ok = None if r.timing.median_ms < 0.05 else abs(diff) <= 0.03
            out.append(Verdict("profiler vs timer", f"{label} {r.id.backend}", measured, ok))
    return out


def repeatability(c: Checks) -> list[Verdict]:
    """Five runs of the same case: medians spread under 2% (max - min over the median)."""
    out = []
    for backend in ("sdpa", "flex"):
        rows = [c.run("decode B8 ctx4k p16", [backend])[0] for _ in range(5)]
        bad = [r for r in rows if r.status is not Status.OK]
        if bad:
            out.append(not_ok("5 repeated runs", bad[0]))
            continue
        meds = sorted(r.timing.median_ms for r in rows)
        spread = (meds[-1] - meds[0]) / meds[2]
        measured = "medians " + ", ".join(f"{r.timing.median_ms * 1e3:.1f}" for r in rows) + f" µs; spread {spread:.1%}"
        out.append(Verdict("5 repeated runs", f"decode B8 ctx4k p16 {backend}", measured, spread < 0.02))
    return out


def cold_vs_warm_l2(c: Checks) -> list[Verdict]:
    """Flushing the L2 matters where the working set fits in it, and not where it is far larger."""
    l2 = torch.cuda.get_device_properties(c.device).L2_cache_size if c.device.type == "cuda" else 1
    out = []
    for label, fits in (("decode B4 ctx1k p16", True), ("decode B32 ctx16k p256", False)):
        (cold,) = c.run(label, ["sdpa"])
        (warm,) = c.run(label, ["sdpa"], tag="warm L2", warm_l2=True)
        if cold.status is not Status.OK or warm.status is not Status.OK:
            out.append(not_ok("cold vs warm L2", cold if cold.status is not Status.OK else warm))
            continue
        ratio = cold.timing.median_ms / warm.timing.median_ms
        ok = ratio > 1.05 if fits else abs(ratio - 1) < 0.03
        measured = f"cold {cold.timing.median_ms * 1e3:.1f} µs, warm {warm.timing.median_ms * 1e3:.1f} µs, ratio {ratio:.3f}"
        expect = "expect to differ" if fits else "expect the same"
        out.append(Verdict("cold vs warm L2", f"{label} ({cold.roofline.bytes / l2:.1f}x L2; {expect})", measured, ok))
    return out


def decode_bandwidth(c: Checks) -> list[Verdict]:
    """SDPA on a plain large decode (contiguous pages: its gather is in plan) reads at 60-100% of
    the measured memory ceiling (the bytes are metrics' minimum, the time the timer's median)."""
    (r,) = c.run("decode B32 ctx16k p256 contiguous", ["sdpa"])
    if r.status is not Status.OK:
        return [not_ok("SDPA decode bandwidth", r)]
    frac = r.roofline.tbps / c.ceilings.memory_tbps
    measured = (
        f"{r.timing.median_ms * 1e3:.1f} µs, {r.roofline.tbps:.2f} TB/s = {frac:.0%} of the memory ceiling {c.ceilings.memory_tbps:.2f} TB/s"
        f" (copy {c.ceilings.copy_tbps:.2f}, read {c.ceilings.read_tbps:.2f})"
    )
    return [Verdict("SDPA decode bandwidth", r.id.case_id, measured, 0.6 <= frac <= 1.0)]


FLUSH_REPEATS = 3  # interleaved repeats per flush kind


def l2_flush(c: Checks) -> list[Verdict]:
    """The cold-L2 flush adds nothing to the call it precedes. Each case is timed under every
    flush kind of ``attnbench.measure.timing.L2Flusher`` and with none (warm L2), the kinds
    interleaved over ``FLUSH_REPEATS`` repeats so a slow spell hits all alike; each cell is the
    median of the repeats' medians. Judged on a decode whose KV is >= 10x the L2 (nothing useful
    survives there between calls): the read flush (the default) and warm L2 agree within 2%;
    a flush that leaves dirty lines behind fails it. The other cases are reported."""
    l2 = torch.cuda.get_device_properties(c.device).L2_cache_size if c.device.type == "cuda" else 1
    kinds = ["none", *FLUSH_MODES]
    out = []
    for label in ("decode B8 ctx4k p16", "decode B8 ctx16k p16", "tree40 B8 ctx4k p16"):
        for backend in ("sdpa", "triton"):
            per: dict[str, list[float]] = {k: [] for k in kinds}
            failed = None
            for _ in range(FLUSH_REPEATS):
                for k in kinds:
                    budget = {"warmup_ms": 5, "measure_ms": 40}
                    opts = {"warm_l2": True, "timing_overrides": budget} if k == "none" else {"timing_overrides": {**budget, "flush": k}}
                    (r,) = c.run(label, [backend], tag=f"flush {k}", **opts)
                    if r.status is not Status.OK:
                        failed = failed or r
                    per[k].append(r.timing.median_ms * 1e3)
            if failed is not None:
                out.append(not_ok("L2 flush", failed))
                continue
            med = {k: statistics.median(v) for k, v in per.items()}
            gap = med["read"] / med["none"] - 1
            kv_ratio = r.roofline.bytes / l2
            judged = label.startswith("decode") and kv_ratio >= 10
            measured = ", ".join(f"{k} {med[k]:.1f}" for k in kinds) + f" µs; read vs warm {gap:+.1%}"
            out.append(Verdict("L2 flush", f"{label} {backend} ({kv_ratio:.1f}x L2)", measured,
                               abs(gap) <= 0.02 if judged else None))
    return out


# The checks, in the order they run. A new one: def name(c: Checks) -> list[Verdict], added here.
CHECKS: dict[str, Callable[[Checks], list[Verdict]]] = {
    "profiler-vs-timer": profiler_vs_timer,
    "repeatability": repeatability,
    "cold-vs-warm-l2": cold_vs_warm_l2,
    "decode-bandwidth": decode_bandwidth,
    "l2-flush": l2_flush,
}


def _word(v: Verdict) -> str:
    return "n/a" if v.ok is None else "ok" if v.ok else "FAIL"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-checks")))
    ap.add_argument("--only", nargs="+", choices=list(CHECKS), help="run only these checks")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_checks: no CUDA device here", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    con = Console(width=160)
    c = Checks(args.out)
    cl = c.ceilings
    con.print(
        f"{cl.device_name}, L2 {torch.cuda.get_device_properties(c.device).L2_cache_size / 2**20:.0f} MiB, torch "
        f"{torch.__version__}: copy {cl.copy_tbps:.2f} TB/s, read {cl.read_tbps:.2f} TB/s, "
        f"bf16 matmul {cl.matmul_tflops['bfloat16']:.0f} TFLOP/s",
        highlight=False,
    )
    verdicts: list[Verdict] = []
    for name in args.only or list(CHECKS):
        try:
            got = CHECKS[name](c)
        except Exception as e:  # one broken check must not hide the others' verdicts
            got = [Verdict(name, "-", f"the check raised {type(e).__name__}: {str(e)[:200]}", False)]
        for v in got:  # one line each as it comes: a run cut short keeps what it measured
            print(f"verdict {_word(v)}: {v.check} | {v.case} | {v.measured}", flush=True)
        verdicts += got
    print_results(c.rows, con, title="rows measured by the checks")
    (args.out / "gpu_checks_rows.jsonl").write_text("".join(json.dumps(r.to_json(), default=str) + "\n" for r in c.rows))
    (args.out / "gpu_checks.json").write_text(json.dumps([asdict(v) for v in verdicts], indent=1))
    t = Table("check", "case", "measured", "verdict", title=f"GPU checks on {cl.device_name}")
    for v in verdicts:
        t.add_row(v.check, v.case, v.measured, _word(v))
    con.print(t)
    failed = sum(v.ok is False for v in verdicts)
    con.print(f"gpu_checks: {len(verdicts)} verdicts, {failed} failed", highlight=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
