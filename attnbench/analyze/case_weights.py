"""The weight of each case of a run (``workload/weights.py``), read back from the scenario text
and ``--set`` overrides its manifest keeps, so that ``attnbench decide`` needs the run folder
alone (or a baseline file, which keeps the manifest too)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row


@dataclass
class RunWeights:
    by_case: dict[str, float]  # the run's case ids -> weight
    scenario_weight: float  # every case of the scenario together (the run may hold fewer: -k)
    scenario_cases: int
    weighted: bool  # the scenario gives weights (else every case weighs 1)
    notes: list[str] = field(default_factory=list)


class WeightsError(ValueError):
    """The run's scenario cannot be read back; the message names the run and the fix."""


def _params_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def run_weights(manifest: Manifest, rows: Iterable[Row], where: str) -> RunWeights:
    """Each row's case weight, from the scenario the run ran (matched by case id, else by the
    swept values: ids made by another attnbench version still match)."""
    from attnbench.workload.scenario import ScenarioError, load_text

    if not manifest.scenario_text:
        raise WeightsError(f"{where}: its manifest keeps no scenario text, so the case weights cannot be read; "
                           "run the scenario again with this attnbench")
    try:
        sf = load_text(manifest.scenario_text, manifest.scenario_path or where, manifest.overrides)
    except ScenarioError as e:
        raise WeightsError(f"{where}: the scenario its manifest keeps does not load here ({e}); "
                           "run it again with this attnbench") from None
    by_id = {c.case_id: c.weight for c in sf.cases}
    by_params = {_params_key(c.params): c.weight for c in sf.cases}
    out: dict[str, float] = {}
    for r in rows:
        w = by_id.get(r.id.case_id, by_params.get(_params_key(r.workload.params)))
        if w is None:
            raise WeightsError(f"{where}: case {r.id.case_id} is not a case of the scenario its manifest keeps; "
                               "the rows and the manifest do not belong together")
        out[r.id.case_id] = w
    weighted = sf.scenario.weights is not None
    res = RunWeights(out, sum(c.weight for c in sf.cases), len(sf.cases), weighted)
    if not weighted:
        res.notes.append("the scenario gives no weights: every case weighs 1 (`attnbench import` writes each shape's "
                         "step count as weights:; docs/decide.md)")
    if manifest.status and not manifest.complete:
        res.notes.append(f"the run folder is marked {manifest.status}: cases or backends it did not finish are not "
                         "in the decision (finish it with attnbench run --resume)")
    if len(out) < len(sf.cases):
        res.notes.append(f"the run holds {len(out)} of the scenario's {len(sf.cases)} case(s) (weight "
                         f"{sum(out.values()):g} of {res.scenario_weight:g})" + (f", picked by -k {manifest.select!r}"
                                                                                  if manifest.select else ""))
    return res
