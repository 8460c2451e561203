"""Paired before/after table of ``triton_plan_time.py --save`` runs made alternately on one
noisy machine (issue 33, plan round 4): run k of the baseline and run k of the change ran back
to back, so each pair shares the machine's phase.

    python3 scripts/dev/triton_plan_paired.py --before b1.json b2.json ... --after a1.json a2.json ...
        [--cases out.txt]
    python3 scripts/dev/triton_plan_paired.py --after a1.json a2.json ...    (no baseline: the summary only)

Per scenario: the median over the runs of the scenario's median and of its max (of the case
medians), before and after, and the median over its cases of each case's median paired ratio
(after_k / before_k over the runs k); then every shipped case's. ``--cases``: the per-case
numbers (median over runs before, after, paired ratio) into a text file.

Last, for each side, each case's median over the runs summarized: its median and max over the
cases and how many are <= 200 us (issue 33's plan target). One run's max is the host's worst
second as much as the plan's (a case timed 95 us in one run read 208 us in the next on the same
idle host, 2026-11-28); the median over alternating runs is what a case costs.
"""
from __future__ import annotations

import argparse
import json
import statistics as st
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", default=[])
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--cases", default=None)
    args = ap.parse_args()
    if args.before and len(args.before) != len(args.after):
        raise SystemExit("as many runs before as after (run k of each was made back to back)")
    b = [json.loads(Path(p).read_text()) for p in args.before]
    a = [json.loads(Path(p).read_text()) for p in args.after]
    if not b:
        summary("this tree", a, [k for k in a[0] if all(k in x for x in a)])
        return
    keys = [k for k in b[0] if all(k in x for x in b + a)]
    ratio = {k: st.median(y[k][1] / x[k][1] for x, y in zip(b, a)) for k in keys}
    groups: dict = {}
    for k in keys:
        groups.setdefault(b[0][k][0], []).append(k)
    groups[f"every shipped case ({len(keys)})"] = keys
    print("| scenario (cases) | before median / max | after median / max | after / before (paired, per case) |")
    print("|---|---|---|---|")
    for name, ks in groups.items():
        label = name if name.startswith("every") else f"{name} ({len(ks)})"
        (bm, bx), (am, ax) = _agg(b, ks), _agg(a, ks)
        print(f"| {label} | {bm:.0f} / {bx:.0f} | {am:.0f} / {ax:.0f} | {st.median(ratio[k] for k in ks):.2f} |")
    r = sorted(ratio.values())
    print(f"\nper-case paired ratio: median {st.median(r):.3f}, p10 {r[len(r) // 10]:.3f}, "
          f"p90 {r[9 * len(r) // 10]:.3f}, min {r[0]:.3f}, max {r[-1]:.3f}")
    print("per-run median over cases, before:", [round(st.median(x[k][1] for k in keys)) for x in b])
    print("per-run median over cases, after: ", [round(st.median(x[k][1] for k in keys)) for x in a])
    summary("before", b, keys)
    summary("after", a, keys)
    if args.cases:
        lines = [f"{'case':100s} {'before us':>9s} {'after us':>9s} {'ratio':>6s}"]
        for k in keys:
            lines.append(f"{k[:100]:100s} {st.median(x[k][1] for x in b):9.1f} "
                         f"{st.median(x[k][1] for x in a):9.1f} {ratio[k]:6.2f}")
        Path(args.cases).write_text("\n".join(lines) + "\n")


def summary(side: str, runs: list, keys: list) -> None:
    """Each case's median over the runs: their median, max and count <= 200 us."""
    per = {k: st.median(x[k][1] for x in runs) for k in keys}
    worst = max(per, key=per.get)
    print(f"{side}, each case's median over {len(runs)} runs: median {st.median(per.values()):.0f} us, "
          f"max {per[worst]:.0f} us ({worst}), {sum(v <= 200 for v in per.values())} of {len(per)} <= 200 us")


def _agg(runs: list, ks: list) -> tuple[float, float]:
    """Median over the runs of the cases' median and of their max."""
    return st.median(st.median(x[k][1] for k in ks) for x in runs), st.median(max(x[k][1] for k in ks) for x in runs)


if __name__ == "__main__":
    main()
