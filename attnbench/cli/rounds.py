"""Enough timing rounds for a verdict: ``compare backends`` and ``calibrate`` add a
``--set timing.rounds=N`` when the scenario has too few rounds for any ratio to be
significant (the shipped scenarios mostly time in one round: fine for a table, but a
comparison of one round can only say ``unclear``, and a check of one round is refused)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

DEFAULT_ROUNDS = 10  # what a comparison runs when the scenario's rounds give no verdict


def with_enough_rounds(scenario: Path, sets: list[str], need: int) -> tuple[list[str], Optional[str]]:
    """``(sets, note)``: ``sets`` plus ``timing.rounds=max(need, 10)`` when a case of the
    scenario (with ``sets`` applied) has fewer than ``need`` rounds and the user did not set
    them; the note says what was added and why (None when nothing was)."""
    from attnbench.workload.scenario import load  # pydantic: not for --help

    if any(s.split("=", 1)[0].strip() == "timing.rounds" for s in sets):
        return sets, None  # asked for: kept, the comparison says when it is too few
    sf = load(scenario, sets)
    have = min((c.scenario.timing.rounds for c in sf.cases), default=need)
    if have >= need:
        return sets, None
    rounds = max(need, DEFAULT_ROUNDS)
    note = (f"{scenario.name} times in {have} round(s): no ratio can be significant with fewer than {need}; "
            f"running with --set timing.rounds={rounds} (set timing.rounds yourself to choose)")
    return [*sets, f"timing.rounds={rounds}"], note
