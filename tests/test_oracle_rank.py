"""The oracle is no competitor (issue 24 item 4): "reference fastest in 50 of 100 cases" and
`best` next to the float64 reference misread a table. It stays out of ranks, bests, x_fastest
and the summary lines, unless asked for (compare backends --baseline reference)."""
from __future__ import annotations

import math

import pytest

from attnbench.analyze import compare as cmp
from attnbench.analyze.summary import backend_summary
from attnbench.analyze.tables import fastest_by_case, vs_best
from attnbench.store.row_parts import RowIdentity, RowTiming
from attnbench.store.rows import Row, is_oracle, rows_frame


def _row(case: str, backend: str, ms: float) -> Row:
    rounds = [ms * f for f in (0.99, 1.0, 1.01, 1.0, 0.995, 1.005)]
    return Row(RowIdentity(scenario="s", case_id=case, backend=backend), status="ok",
               timing=RowTiming(samples_ms=list(rounds), round_medians_ms=list(rounds), median_ms=ms, n=len(rounds),
                                timing_method="cpu"))


@pytest.fixture
def rows():
    # on a CPU the float64 reference can beat a library on small cases: it must not rank
    return [_row("c=1", "reference", 0.5), _row("c=1", "sdpa", 1.0), _row("c=1", "flex", 2.0),
            _row("c=2", "reference", 3.0), _row("c=2", "sdpa", 1.0), _row("c=2", "flex", 2.0)]


def test_the_oracle_is_never_best(rows):
    best = fastest_by_case(rows)
    assert {c: r.id.backend for c, r in best.items()} == {"c=1": "sdpa", "c=2": "sdpa"}
    assert [vs_best(r, best) for r in rows[:3]] == ["oracle", "best", "2.00×"]
    assert fastest_by_case(rows, rank_oracle=True)["c=1"].id.backend == "reference"
    assert is_oracle("reference") and not is_oracle("sdpa")


def test_the_summary_leaves_the_oracle_out(rows):
    lines = backend_summary(rows)
    assert not any("reference" in x for x in lines), lines
    assert any("sdpa fastest in 2 of 2 cases" in x for x in lines)
    assert any("reference fastest in 1 of 2" in x for x in backend_summary(rows, rank_oracle=True))


def test_x_fastest_is_relative_to_the_fastest_competitor(rows):
    df = rows_frame(rows)
    got = dict(zip(zip(df["case_id"], df["backend"]), df["x_fastest"]))
    assert got[("c=1", "sdpa")] == 1.0 and got[("c=1", "reference")] == 0.5 and got[("c=1", "flex")] == 2.0
    assert not math.isnan(got[("c=2", "reference")])


def test_compare_backends_compares_with_the_fastest_competitor_unless_the_oracle_is_asked_for(rows):
    comps = cmp.compare_backends(rows)
    assert {c.reference for c in comps} == {"sdpa"}
    asked = cmp.compare_backends(rows, baseline="reference")
    assert {c.reference for c in asked} == {"reference"}
