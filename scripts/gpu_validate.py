"""The whole GPU validation of the timing harness, in one command (issue 3).

    python3 scripts/gpu_validate.py [--out DIR] [--quick]

Checks, on SDPA and FlexAttention over decode, prefill and tree cases:
  1. the harness's median agrees with the profiler's summed device kernel time (3%, >50 µs);
  2. five repeated runs of one case spread under 2%;
  3. cold and warm L2 differ where the working set fits in L2, not where it is 10x larger;
  4. SDPA's achieved bandwidth on a plain large decode is 60-100% of the measured copy bandwidth.
Prints a summary table last and writes every row to DIR (default $OUT or ./gpu-validate).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnbench.measure.metrics import ceilings_for
from attnbench.analyze.tables import print_results
from attnbench.execute.runner import RunOptions, Runner
from attnbench.workload.scenario import load_text

MODEL = "model: {num_q_heads: 32, num_kv_heads: 8, head_dim: 128, dtype: bfloat16}"


def scenario(name: str, batch: str, page: int = 16, layout: str = "shuffled", extra: str = "") -> str:
    return textwrap.dedent(
        f"""
        name: {name}
        seed: 0
        device: cuda
        {MODEL}
        kv_cache: {{page_size: {page}, layout: {layout}}}
        batch:
        {textwrap.indent(batch.strip(), '  ')}
        {extra}
        """
    )


def run(text: str, backends, profile_dir=None, **opt):
    sf = load_text(text, "<gpu_validate>")
    r = Runner(sf, RunOptions(backends=list(backends), profile_dir=profile_dir, **opt))
    return list(r.rows())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-validate"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    con = Console(width=160)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    ceil = ceilings_for(dev, "bfloat16")
    con.print(
        f"device {ceil.device_name}, L2 {props.L2_cache_size / 2**20:.0f} MiB, torch {torch.__version__}: "
        f"copy {ceil.copy_tbps:.2f} TB/s, read {ceil.read_tbps:.2f} TB/s, bf16 matmul {ceil.matmul_tflops['bfloat16']:.0f} TFLOP/s"
    )
    summary = []
    all_rows = []

    # 1. median vs profiler kernel sum
    cases = {
        "decode B8 ctx4k p16": scenario("decode", "- {kind: decode, count: 8, context: 4k}"),
        "decode B32 ctx16k p256": scenario("decode-big", "- {kind: decode, count: 32, context: 16k}", page=256),
        "prefill 4x1k": scenario("prefill", "- {kind: prefill, count: 4, query: 1k}"),
        "chunked 2x512@3k": scenario("chunked", "- {kind: prefill, count: 2, query: 512, context: 3k}"),
        "tree40 B8 ctx4k p16": scenario("tree", "- {kind: tree, count: 8, context: 4k, tree: {full: {depth: 3, branching: 3}}}"),
    }
    for label, text in cases.items():
        rows = run(text, ["sdpa", "flex"], profile_dir=out / "profiles" / label.replace(" ", "_"))
        for r in rows:
            r.case_id = label
            all_rows.append(r)
            if r.status != "ok":
                summary.append(("profile vs median", f"{label} {r.backend}", f"{r.status}: {r.reason[:60]}", "FAIL"))
                continue
            diff = (r.median_ms - r.kernel_sum_ms) / r.kernel_sum_ms
            verdict = "n/a (<50 µs)" if r.median_ms < 0.05 else ("ok" if abs(diff) <= 0.03 else "FAIL")
            summary.append(
                (
                    "profile vs median",
                    f"{label} {r.backend} [{r.timing_method}]",
                    f"median {r.median_ms * 1e3:.1f} µs, kernels {r.kernel_sum_ms * 1e3:.1f} µs ({r.kernels_per_call}/call), diff {diff:+.1%}",
                    verdict,
                )
            )

    # 2. five repeated runs of the same case
    for backend in ("sdpa", "flex"):
        meds = []
        for i in range(5):
            (r,) = run(cases["decode B8 ctx4k p16"], [backend])
            meds.append(r.median_ms)
            r.case_id = f"decode B8 ctx4k p16 repeat {i + 1}"
            all_rows.append(r)
        spread = (max(meds) - min(meds)) / sorted(meds)[2]
        summary.append(
            (
                "5 repeated runs",
                f"decode B8 ctx4k p16 {backend}",
                "medians " + ", ".join(f"{m * 1e3:.1f}" for m in meds) + f" µs; spread {spread:.1%}",
                "ok" if spread < 0.02 else "FAIL",
            )
        )

    # 3. cold vs warm L2
    l2 = props.L2_cache_size
    for label, text, fits in [
        ("decode B4 ctx1k (KV 17 MB)", scenario("small", "- {kind: decode, count: 4, context: 1k}"), True),
        ("decode B32 ctx16k (KV 2.1 GB)", scenario("large", "- {kind: decode, count: 32, context: 16k}"), False),
    ]:
        (cold,) = run(text, ["sdpa"])
        (warm,) = run(text, ["sdpa"], warm_l2=True)
        cold.case_id, warm.case_id = f"{label} cold L2", f"{label} warm L2"
        kv = cold.bytes
        ratio = cold.median_ms / warm.median_ms
        differs = ratio > 1.05
        ok = differs if fits else abs(ratio - 1) < 0.03
        summary.append(
            (
                "cold vs warm L2",
                f"{label}, {kv / l2:.1f}x L2",
                f"cold {cold.median_ms * 1e3:.1f} µs, warm {warm.median_ms * 1e3:.1f} µs, ratio {ratio:.3f}",
                ("ok" if ok else "FAIL") + (" (expect to differ)" if fits else " (expect the same)"),
            )
        )
        all_rows += [cold, warm]

    # 4. SDPA bandwidth on a plain large decode (contiguous pages; the gather is in plan)
    (bw,) = run(scenario("bw", "- {kind: decode, count: 32, context: 16k}", page=256, layout="contiguous"), ["sdpa"])
    bw.case_id = "decode B32 ctx16k contiguous"
    frac = bw.tbps / ceil.copy_tbps
    frac_mem = bw.tbps / ceil.memory_tbps
    summary.append(
        (
            "SDPA decode bandwidth",
            "decode B32 ctx16k",
            f"{bw.median_ms * 1e3:.1f} µs, {bw.tbps:.2f} TB/s = {frac:.0%} of copy {ceil.copy_tbps:.2f} TB/s, "
            f"{frac_mem:.0%} of the memory ceiling {ceil.memory_tbps:.2f} TB/s",
            "ok" if 0.6 <= frac_mem <= 1.0 else "FAIL",
        )
    )
    all_rows.append(bw)

    print_results(all_rows, con, title="rows measured by the validation")
    (out / "gpu_validate_rows.jsonl").write_text("\n".join(json.dumps(r.to_json(), default=str) for r in all_rows))
    t = Table("check", "case", "measured", "verdict", title=f"GPU timing validation on {ceil.device_name}")
    for s in summary:
        t.add_row(*s)
    con.print(t)
    (out / "gpu_validate_summary.json").write_text(json.dumps(summary, indent=1))
    return 0 if all(s[3].startswith(("ok", "n/a")) for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
