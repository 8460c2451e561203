"""The closing lines of a results table: per backend, in how many cases it was the fastest
and its geometric-mean speed against one baseline backend."""
from __future__ import annotations

import math
from typing import Iterable, Optional

from attnbench.analyze.tables import fmt_time, weak_timing
from attnbench.store.rows import Row, Status, is_interpreted, is_oracle


def ok_times(rows: Iterable[Row]) -> dict[str, dict[str, float]]:
    """case -> backend -> median of the ok rows."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.status == "ok" and math.isfinite(r.timing.median_ms) and r.timing.median_ms > 0:
            out.setdefault(r.id.case_id, {})[r.id.backend] = r.timing.median_ms
    return out


def pick_baseline(backends: list[str]) -> Optional[str]:
    """sdpa (the torch baseline every library is measured against) when it ran, else the first."""
    return "sdpa" if "sdpa" in backends else (backends[0] if backends else None)


def geo_mean_speedup(times: dict[str, dict[str, float]], backend: str, baseline: str) -> tuple[float, int]:
    """(geometric mean of baseline time / backend time over the cases both ran ok, cases)."""
    logs = [math.log(t[baseline] / t[backend]) for t in times.values() if backend in t and baseline in t]
    return (math.exp(sum(logs) / len(logs)) if logs else math.nan), len(logs)


def backend_summary(rows: Iterable[Row], rank_oracle: bool = False) -> list[str]:
    """``triton fastest in 14 of 18 cases, geo-mean 1.90x faster than sdpa (18 cases)``, one
    line per backend; nothing when fewer than two backends ran ok. The oracle is no
    competitor: left out unless ``rank_oracle``."""
    rows = [r for r in rows if rank_oracle or not is_oracle(r.id.backend)]
    interpreted = list(dict.fromkeys(r.id.backend for r in rows if is_interpreted(r)))
    rows = [r for r in rows if not is_interpreted(r)]
    times = ok_times(rows)
    backends = list(dict.fromkeys(b for t in times.values() for b in t))
    if len(backends) < 2:
        return []
    base = pick_baseline(backends)
    lines = ["summary (over the cases with an ok row; geo-mean = geometric mean of the time ratios):"]
    for b in backends:
        ran = sum(1 for t in times.values() if b in t)
        won = sum(1 for t in times.values() if b in t and t[b] == min(t.values()))
        text = f"  {b} fastest in {won} of {len(times)} cases"
        if ran < len(times):
            text += f" (ok in {ran})"
        if b != base:
            g, n = geo_mean_speedup(times, b, base)
            if n:
                how = f"{g:.2f}× faster than" if g >= 1 else f"{1 / g:.2f}× slower than"
                text += f", geo-mean {how} {base}" + (f" ({n} shared cases)" if n < ran else "")
        lines.append(text)
    lines += [f"  {b} not ranked: run by an interpreter (its mode says), not the compiled kernel" for b in interpreted]
    return lines + weak_lines(rows)


def weak_lines(rows: list[Row]) -> list[str]:
    """A warning when ranks rest on rows timed once (``tables.weak_timing``, shown with ``?``)."""
    ok = [r for r in rows if r.status is Status.OK]
    weak = [r for r in ok if weak_timing(r)]
    if not weak:
        return []
    slowest = max(r.timing.median_ms for r in weak)
    budget = float(f"{3 * slowest:.2g}")  # ~2.5 calls' time buys the 5-call floor (measure.timing._counts)
    return [f"  warning: {len(weak)} of {len(ok)} ok rows were timed once (n=1: a call took longer than the "
            "measurement budget), so their medians and ranks (marked ?) rest on one sample. Their calls took up "
            f"to {fmt_time(slowest)} here: --measure-ms {budget:g} would time each about 5 times (the run takes "
            "longer: pick fewer cases with -k to keep it short); a busy machine makes calls slower"]
