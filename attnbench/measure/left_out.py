"""Calls a CPU clock did not advance over: no time, so no sample. A call of real work read 0.0 ms on a
thread clock once in a CI run (twelfth session), and the gate then refused that run folder as damaged.
The CPU timer (``timing.time_cpu``) leaves such calls out of a timing pass's samples and says so; a row
timed in several rounds says what all of them left out, summed (``row_note``), not only its last round's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class LeftOut:
    """One timing pass on a CPU clock: its timed calls, and how many of them read 0 ms."""

    clock: str  # "thread" | "process"
    calls: int
    zero: int

    @property
    def on_wall(self) -> bool:
        """The clock advanced over none of the calls: the pass's samples are the wall clock's."""
        return self.calls > 0 and self.zero == self.calls


def advanced(samples: list[float], clock: str) -> tuple[list[float], LeftOut]:
    """The samples ``clock`` advanced over, and what was left out."""
    kept = [x for x in samples if x > 0]
    return kept, LeftOut(clock, len(samples), len(samples) - len(kept))


def left_out_note(parts: Sequence[Optional[LeftOut]]) -> str:
    """What the passes ``parts`` left out, summed per clock ("" when nothing): "3 of 192 calls read 0 ms on
    the thread CPU clock (it did not advance over the call): left out"."""
    said = []
    for clock in dict.fromkeys(p.clock for p in parts if p):  # the clocks in the order the rounds used them
        mine = [p for p in parts if p and p.clock == clock]
        zero, calls, wall = sum(p.zero for p in mine), sum(p.calls for p in mine), sum(p.on_wall for p in mine)
        if not zero:
            continue
        text = f"{zero} of {calls} calls read 0 ms on the {clock} CPU clock (it did not advance over the call): left out"
        if wall:  # those passes kept their calls, timed by the wall clock instead
            text += ("; timed by the wall clock" if wall == len(mine) else
                     f"; the {wall} of its {len(mine)} rounds where it never advanced timed by the wall clock")
        said.append(text)
    return "; ".join(said)


def without_left_out(note: str, part: Optional[LeftOut]) -> str:
    """A pass's note without what it says about ``part`` (the timer puts that last)."""
    said = left_out_note([part])
    return note[: -len(said)].removesuffix("; ") if said and note.endswith(said) else note


def row_note(passes: Sequence[tuple[str, Optional[LeftOut]]]) -> str:
    """A row's timer note over its rounds, each ``(note, left out)``: the last round's own note (where the
    last said nothing, the latest earlier one: the round that moved the row onto the process clock said
    why, and its later rounds follow it), then what every round left out, summed, said once."""
    own = [without_left_out(note, part) for note, part in passes]
    last = next((n for n in reversed(own) if n), "")
    return "; ".join(x for x in (last, left_out_note([part for _, part in passes])) if x)
