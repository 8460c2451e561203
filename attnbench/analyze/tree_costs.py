"""What a tree costs: per backend and case, the tree's time against the same requests as chains
of equal node count and as plain decodes (the ``variant`` cases of ``compare_with``,
``workload/variants.py``), as ratios with 95% intervals whose replicates are timing rounds
(``analyze/significance.py``: each variant is its own case, so the two sides are two samples
of round medians; ``timing.rounds`` of at least 4 gives a finite interval).

Reading it: a tree that accepts ``g`` times the tokens a chain of the same node count accepts
per step pays (in attention time) while ``tree/chain < g``; against no speculation, the tree
must accept more than ``tree/decode`` tokens per step. With ``gain``, each row gets a verdict:
``pays`` when the whole interval of tree/chain is below ``gain``, ``does not pay`` when it is
above, ``unclear`` otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

from attnbench.analyze.significance import REPORT_CONFIDENCE, compare_runs, round_logs
from attnbench.store.rows import Row

VARIANT = "variant"


class TreeCostError(ValueError):
    """The rows hold no tree/chain/decode variants; the message says how to get them."""


@dataclass
class Point:
    """One case of a sweep (all swept values but the variant) for one backend."""

    scenario: str
    backend: str
    params: dict
    rows: dict  # variant -> Row

    @property
    def label(self) -> str:
        return ",".join(f"{k.split('.')[-1]}={v}" for k, v in self.params.items()) or "default"


def _usable(row: Optional[Row]) -> bool:
    return row is not None and row.status == "ok" and bool(row.timing.round_medians_ms)


def _ratio(a: Optional[Row], b: Optional[Row]) -> tuple[float, float, float]:
    """``a / b`` from their rounds (Hodges-Lehmann shift of the log round medians) and its
    interval; the interval is unbounded with fewer than 4 rounds a side."""
    if not (_usable(a) and _usable(b)):
        return math.nan, math.nan, math.nan
    r = compare_runs(round_logs(a), round_logs(b), REPORT_CONFIDENCE)
    return r.ratio, r.lo, r.hi


def points(rows: Iterable[Row]) -> list[Point]:
    """Rows of variant cases grouped by (scenario, backend, the other swept values)."""
    out: dict = {}
    for r in rows:
        v = r.workload.params.get(VARIANT)
        if v is None:
            continue
        rest = {k: x for k, x in r.workload.params.items() if k != VARIANT}
        key = (r.id.scenario, r.id.backend, repr(sorted(rest.items(), key=lambda kv: kv[0])))
        out.setdefault(key, Point(r.id.scenario, r.id.backend, rest, {})).rows[v] = r
    return list(out.values())


def verdict(lo: float, hi: float, gain: Optional[float]) -> str:
    if gain is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    if hi < gain:
        return "pays"
    if lo > gain:
        return "does not pay"
    return "unclear"


def records(rows: Iterable[Row], gain: Optional[float] = None, where: str = "the run") -> list[dict]:
    """One record per backend and case: median times (ms), ``tree/chain`` and ``tree/decode``
    with their 95% intervals, the tree case's request count, and the verdict for ``gain``."""
    pts = points(rows)
    if not pts:
        raise TreeCostError(
            f"{where}: no tree/chain/decode cases; run a scenario whose tree groups have"
            " compare_with: [chain, decode] (e.g. attnbench/scenarios/tree-costs-llama3-8b.yaml)"
        )
    out = []
    for p in pts:
        tree, chain, dec = (p.rows.get(v) for v in ("tree", "chain", "decode"))
        c, c_lo, c_hi = _ratio(tree, chain)
        d, d_lo, d_hi = _ratio(tree, dec)
        any_row = tree or chain or dec
        out.append({
            "case": p.backend,  # render() starts a section per backend
            "point": p.label,
            "requests": any_row.workload.num_requests,
            "batch": tree.workload.batch if tree is not None else "",
            "tree_ms": tree.timing.median_ms if _usable(tree) else math.nan,
            "chain_ms": chain.timing.median_ms if _usable(chain) else math.nan,
            "decode_ms": dec.timing.median_ms if _usable(dec) else math.nan,
            "tree_over_chain": c, "chain_lo": c_lo, "chain_hi": c_hi,
            "tree_over_decode": d, "decode_lo": d_lo, "decode_hi": d_hi,
            "verdict": verdict(c_lo, c_hi, gain),
            "missing": ", ".join(f"{v}: {p.rows[v].status.value}" if v in p.rows else f"{v}: no row"
                                 for v in ("tree", "chain", "decode") if not _usable(p.rows.get(v))),
        })
    out.sort(key=lambda r: (r["case"], r["requests"], r["point"]))
    return out
