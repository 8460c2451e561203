"""Which backend may normalize a check (``--normalize-by``), and what its normalization did.

Dividing each round of a row by the normalizer's time in the same round cancels what hits
both alike (a faster, slower or busier machine, a slow spell). It also adds the normalizer's
own noise: the normalized value of a round is ``log(row) - log(normalizer)``, so a normalizer
whose rounds scatter more than the row's makes the ratio noisier than no normalization, and a
normalizer that got faster by itself makes an unchanged row look slower (issue 24: a check
normalized by the float64 reference called sdpa "1.2× slower" while its times fell from 108
to 105 µs, because the reference's fell more). So a normalizer is refused (``CompareError``)
when

* it is the oracle (``reference``): float64 per request in Python, there to be right, not
  fast; its time moves with the interpreter and the allocator, not with the kernels it would
  normalize;
* its rounds scatter clearly more than the rows it normalizes (``NOISIER``): the robust
  spread (MAD) of its rounds' log times around each row's median, pooled over every case of
  both runs, against the same for the other ok rows.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Sequence

from attnbench.store.rows import ORACLE_BACKEND, Row, Status

if TYPE_CHECKING:  # the annotations' numpy; imported where it is used
    import numpy as np

NOISIER = 2.0  # refused when its rounds scatter over twice as much as the rows it normalizes


class NormalizerError(ValueError):
    """A normalizer the check must not use (the oracle, or one noisier than the rows)."""


def _deviations(rows: Sequence[Row]) -> "np.ndarray":
    """Each ok row's round log times minus their median, pooled."""
    import numpy as np  # here: `attnbench --help` imports this module

    out = []
    for r in rows:
        if r.status is Status.OK and len(r.timing.round_medians_ms) > 1:
            x = np.log(np.asarray(r.timing.round_medians_ms, dtype=float))
            out.append(x - np.median(x))
    return np.concatenate(out) if out else np.zeros(0)


def round_spread(rows: Sequence[Row]) -> float:
    """Robust spread (1.4826 x MAD, in log units: 0.01 is about 1%) of the rows' rounds
    around each row's own median; NaN without rounds to measure."""
    import numpy as np  # here: `attnbench --help` imports this module

    d = _deviations(rows)
    return float(1.4826 * np.median(np.abs(d))) if len(d) else math.nan


def refuse_normalizer(name: Optional[str], current: Sequence[Row], baseline: Sequence[Row]) -> None:
    """Raise NormalizerError when ``name`` must not normalize these runs (module docstring)."""
    if not name:
        return
    if name == ORACLE_BACKEND:
        raise NormalizerError(
            f"--normalize-by {name}: {name} is the oracle (float64 per request, written to be right, not fast); "
            "its time does not move with the kernels it would normalize, so a normalized check by it can call an "
            "unchanged or faster kernel slower. Normalize by a backend you do not change (e.g. sdpa), or check "
            "without --normalize-by"
        )
    rows = [*current, *baseline]
    norm = round_spread([r for r in rows if r.id.backend == name])
    others = round_spread([r for r in rows if r.id.backend != name])
    if math.isfinite(norm) and math.isfinite(others) and norm > NOISIER * others:
        raise NormalizerError(
            f"--normalize-by {name}: its timing rounds scatter {norm:.2%} (robust spread of the round medians, both "
            f"runs), over {NOISIER:g}x the {others:.2%} of the rows it would normalize: dividing by it would add more "
            "noise than it cancels. Normalize by a steadier backend, or check without --normalize-by"
        )


def normalizer_note(name: str, cur: Row, base: Row) -> str:
    """``reference 0.71 → 0.52 ms`` for the case's normalizer rows (what each round was divided by)."""
    def ms(r: Row) -> str:
        med = r.timing.median_ms
        return f"{med:.4g}" if r.status is Status.OK and math.isfinite(med) else str(r.status)

    return f"÷ {name} ({ms(base)} → {ms(cur)} ms)"
