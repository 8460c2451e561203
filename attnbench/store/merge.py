"""Rows of several runs of one scenario as one row per (case, backend): the timing rounds of the
runs, in run order, become the rounds of the merged row (``compare commits`` splits each side
into several processes and judges the sides round by round)."""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from attnbench.store.rows import Row, Status


class MergeError(ValueError):
    """Runs whose rows cannot be merged (another scenario, a case missing from one of them)."""


def merge_rows(runs: Sequence[Sequence[Row]], labels: Sequence[str]) -> list[Row]:
    """One row per key of the first run. A key that is not ``ok`` in some run takes that run's
    row (its status and reason: a case that broke once is broken); a key missing from a run
    is an error naming the run."""
    if not runs:
        return []
    keys = [r.key for r in runs[0]]
    by_run = [{r.key: r for r in rows} for rows in runs]
    out = []
    for key in keys:
        parts = []
        for rows, label in zip(by_run, labels):
            if key not in rows:
                raise MergeError(f"{label} has no row for {key[1]} · {key[2]}: the runs did not run the same cases")
            parts.append(rows[key])
        out.append(_merged(parts))
    for rows, label in zip(by_run, labels):
        extra = set(rows) - set(keys)
        if extra:
            k = sorted(extra)[0]
            raise MergeError(f"{label} has a row ({k[1]} · {k[2]}) the first run lacks: the runs did not run the same cases")
    return out


def _merged(parts: Sequence[Row]) -> Row:
    bad = next((r for r in parts if r.status is not Status.OK), None)
    if bad is not None:
        return bad
    samples = [x for r in parts for x in r.timing.samples_ms]
    rounds = [x for r in parts for x in r.timing.round_medians_ms]
    timing = dataclasses.replace(
        parts[0].timing,
        samples_ms=samples,
        round_medians_ms=rounds,
        n=sum(r.timing.n for r in parts),
        median_ms=statistics.median(samples) if samples else statistics.median(r.timing.median_ms for r in parts),
        min_ms=min(r.timing.min_ms for r in parts),
        p20_ms=math.nan, p80_ms=math.nan, iqr_rel=math.nan,  # not recomputed: see the runs' own rows
    )
    return dataclasses.replace(parts[0], timing=timing)
