"""Case weights: how many engine steps (or what share of the traffic) each case stands for.

A scenario gives them per swept value, beside its ``sweep``::

    sweep:
      batch: [[...shape 0...], [...shape 1...], [...shape 2...]]
    weights:
      batch: [12, 5, 3]          # one number per value of sweep.batch, in order

A case's weight is the product of its values' weights over the keys ``weights`` names (a key
it leaves out weighs 1); a scenario without ``weights`` weighs every case 1. Variant cases of
``compare_with`` carry their case's weight. ``attnbench import`` writes each shape's step
count this way, and ``attnbench decide`` weighs each case's step time by it, so a decision is
reproducible from the scenario text a run folder keeps and the run folder alone. The weights
stay out of the case ids: re-importing a longer trace changes the weights, not the ids.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence


def weight_problems(sweep: Optional[dict], weights: Any, where: str) -> list[str]:
    """What is wrong with a scenario's ``weights`` against its ``sweep`` (``[]``: nothing)."""
    if weights is None:
        return []
    if not isinstance(weights, dict):
        return [f"{where}: weights: a mapping of swept key -> one number per swept value, "
                f"e.g. weights: {{batch: [12, 5]}}; got {type(weights).__name__}"]
    sweep = sweep if isinstance(sweep, dict) else {}
    out = []
    for key, ws in weights.items():
        if key not in sweep:
            swept = ", ".join(map(str, sweep)) or "nothing"
            out.append(f"{where}: weights.{key}: the scenario does not sweep {key} (it sweeps {swept}); "
                       "weights are given per value of a swept key")
        elif not isinstance(ws, list) or not all(_positive(w) for w in ws):
            out.append(f"{where}: weights.{key}: a list of numbers > 0, one per value of sweep.{key}; got {ws!r}"[:300])
        elif isinstance(sweep[key], list) and len(ws) != len(sweep[key]):
            out.append(f"{where}: weights.{key}: {len(ws)} number(s) for the {len(sweep[key])} value(s) of "
                       f"sweep.{key}; give one weight per value, in the same order")
    if not out and weights:  # a case weighs the product of its values' weights: it must be a float > 0
        heaviest, lightest = (math.prod(max(ws, default=1) for ws in weights.values()),
                               math.prod(min(ws, default=1) for ws in weights.values()))
        if not math.isfinite(heaviest) or lightest <= 0:
            out.append(f"{where}: weights: the heaviest case weighs {heaviest:g} and the lightest {lightest:g} (the "
                       "product of its values' weights): beyond what a float holds; weights count relative to each "
                       "other: scale them, e.g. to step counts")
    return out


def _positive(w: Any) -> bool:
    return isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0


def case_weight(weights: Optional[dict], keys: Sequence[str], indices: Sequence[int]) -> float:
    """The weight of the case that takes value ``indices[i]`` of swept key ``keys[i]``."""
    w = 1.0
    for key, i in zip(keys, indices):
        if weights and key in weights:
            w *= float(weights[key][i])
    return w


def drop_overridden(raw: dict, key: str, where: str) -> list[str]:
    """A ``--set`` that replaces the sweep of ``key`` (or of keys below it) drops their weights:
    the one value it runs weighs 1. Returns notes saying so."""
    weights = raw.get("weights")
    if not isinstance(weights, dict):
        return []
    gone = [k for k in weights if isinstance(k, str) and (k == key or k.startswith(key + "."))]
    for k in gone:
        del weights[k]
    return [f"{where}: drops weights.{k} (the value it runs weighs 1)" for k in gone]
