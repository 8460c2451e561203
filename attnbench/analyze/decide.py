"""From a run of weighted cases to a decision: which backend an engine should run per batch
shape, and what dispatching buys over one backend for all (``attnbench decide``).

What a step costs a backend in a case: ``plan + kernel (+ convert)``. ``plan`` is the metadata
work an engine redoes every step; ``convert`` is the K/V gather and dense mask of a backend
that cannot read the paged cache (SDPA, Flex): an engine that runs such a backend on its paged
cache pays it every step too, so it counts unless ``parts`` leaves it out (an engine whose
cache is already in the layout the library reads). ``kernel`` is the row's median call.
``parts=("kernel",)`` gives the decision a kernel benchmark alone would make: beside the
step's, it shows where the plan changes the pick.

Intervals come from the timing rounds (``analyze/significance.py``: the round, not the call,
is the replicate). Round ``i`` of a row costs ``plan_i + convert_i + its round-i median``: plan
and convert are timed on the host apart from the kernel's rounds (``plan_samples_ms``,
``convert_samples_ms``), so their samples are split in order into as many groups as there are
rounds and group ``i``'s median stands for round ``i`` (``spread``): their spread enters the
intervals, which it dominates where the plan is most of a step. A row with fewer samples than
rounds counts its median in every round, and the notes say how many samples it kept. A
backend's total in round ``i`` is its weighted mean step ``sum(w * cost_i) / sum(w)`` over the
cases it covers, with each weight taken relative to the largest of them (so that no weight,
however small or large a scenario gives it, underflows or overflows the sums: ``5e-324`` weighs
as much as ``1``); every estimate shown is the center of the statistic its interval comes from,
so it lies inside its interval by construction:

* a total is the center of the round totals (median of their Walsh averages) with its
  signed-rank interval (the parts, plan, convert and kernel, are weighted means of medians: they need not
  add up to it exactly);
* per case, the runner-up against the pick is the paired ratio of their round costs, with its
  interval and its verdict (``verdict.judge``, the rule of every command); ``tie`` when the
  verdict is ``same`` or ``unclear`` (the interval holds 1: the rounds cannot tell them apart,
  and the pick is the lower median);
* the gain of dispatching over one backend is the paired ratio of the round totals (that
  backend's over the dispatch's), with its interval.

Only ``ok`` rows count, the oracle never does. A backend not ``ok`` in every dispatched case
is shown with its coverage and never ranked as a single backend: its total covers fewer steps.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from attnbench.analyze import ranks
from attnbench.analyze.significance import Ratio, compare_paired, rounds_needed
from attnbench.analyze.verdict import TIES, Thresholds, judge, thresholds_for
from attnbench.store.rows import Row, Status, is_oracle


class DecideError(ValueError):
    """Rows that cannot give a decision; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Timed:
    """A time (ms) with its interval over timing rounds (NaN bounds: too few rounds)."""

    ms: float
    lo: float = math.nan
    hi: float = math.nan


@dataclass(frozen=True)
class Gain:
    """``other / dispatch`` total (> 1: dispatching is faster) and its paired interval; the
    ratio is the interval's own center (exp of the Hodges-Lehmann center of the per-round log
    ratios) where the rounds pair up, so it always lies inside it."""

    ratio: float
    lo: float
    hi: float


@dataclass
class Cost:
    """One backend in one case: the parts of a step (ms) and the cost of each round."""

    backend: str
    plan: float
    convert: float
    kernel: float
    route: str  # the row's mode: the route a library took for the batch (FlashInfer auto: its choice)
    rounds: list[float]

    @property
    def step(self) -> float:
        return self.plan + self.convert + self.kernel


@dataclass
class CaseChoice:
    """One case: its weight, every ok backend's cost (fastest first), and the pick."""

    case_id: str
    shape: str  # the row's batch text, e.g. "4 decode@3k + 2 tree(26)@3k"
    params: dict
    weight: float
    costs: list[Cost]  # ok competitors, lowest step cost first
    not_ok: dict[str, str]  # backend -> status (skipped / error / mismatch / no row)
    runner_up: Optional[Gain] = None  # runner-up / pick, paired by round
    verdict: str = ""  # the runner-up against the pick (verdict.judge): regressed, slower, same, unclear, faster
    tie: bool = False  # the runner-up's interval holds 1 (verdict same or unclear)
    kernel_pick: str = ""  # the fastest by kernel alone, when plan (or convert) changed the pick

    @property
    def pick(self) -> Optional[Cost]:
        return self.costs[0] if self.costs else None


@dataclass
class Total:
    """A backend's (or the dispatch's) weighted step cost over the cases it covers."""

    backend: str
    cases: int  # cases it covers
    weight: float  # the weight of those cases
    step: Timed  # the weighted mean step cost (ms): sum(w * step) / sum(w)
    plan: float  # its parts: the weighted mean plan, convert, kernel (ms)
    convert: float
    kernel: float
    full: bool  # it covers every dispatched case
    vs_dispatch: Optional[Gain] = None  # its total over the dispatch's (full coverage only)


@dataclass
class Decision:
    cases: list[CaseChoice]
    totals: list[Total]  # single backends, full coverage first, each by its total
    dispatch: Optional[Total]
    best: Optional[Total]  # the best single backend of full coverage (None: no backend covers all)
    parts: tuple[str, ...]  # what a step counts: of PARTS
    confidence: float
    rounds: int  # timing rounds per row (0: they differ, so no interval)
    notes: list[str] = field(default_factory=list)
    kernel_only: Optional["Decision"] = None  # the same rows decided by kernel time alone


def _finite(x: float) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else 0.0


PARTS = ("plan", "kernel", "convert")


def spread(median: float, samples: Sequence[float], rounds: int) -> list[float]:
    """One value per round: the medians of ``samples`` split in order into ``rounds`` groups,
    or ``median`` in every round where there are fewer samples than rounds."""
    if rounds < 1 or len(samples) < rounds:
        return [median] * rounds
    size, extra = divmod(len(samples), rounds)
    starts = [i * size + min(i, extra) for i in range(rounds + 1)]  # the first groups take the extra samples
    return [statistics.median(samples[a:b]) for a, b in zip(starts, starts[1:])]


def host_constant(row: Row, parts: Sequence[str]) -> bool:
    """The row's plan or convert counts one median in every round (its samples were not kept)."""
    t = row.timing
    n = len(t.round_medians_ms)
    return ("plan" in parts and math.isfinite(t.plan_ms) and len(t.plan_samples_ms) < n) or (
        "convert" in parts and bool(t.convert_ms) and math.isfinite(t.convert_ms) and len(t.convert_samples_ms) < n)


def cost_of(row: Row, parts: Sequence[str]) -> Cost:
    plan = _finite(row.timing.plan_ms) if "plan" in parts else 0.0
    conv = _finite(row.timing.convert_ms) if "convert" in parts else 0.0
    n = len(row.timing.round_medians_ms)
    plans = spread(plan, row.timing.plan_samples_ms, n) if plan else [0.0] * n
    convs = spread(conv, row.timing.convert_samples_ms, n) if conv else [0.0] * n
    return Cost(row.id.backend, plan, conv, row.timing.median_ms, row.id.mode,
                [p + c + m for p, c, m in zip(plans, convs, row.timing.round_medians_ms)])


def _paired_ratio(a: Sequence[float], b: Sequence[float], confidence: float) -> Optional[Ratio]:
    """``a / b`` paired by round (``significance.compare_paired``); None when the rounds do not
    pair up."""
    if not a or len(a) != len(b) or min(min(a), min(b)) <= 0:
        return None
    return compare_paired([math.log(x) for x in a], [math.log(x) for x in b], confidence)


def _gain(a: Sequence[float], b: Sequence[float], total_a: float, total_b: float, confidence: float) -> Gain:
    """``a / b``: the paired ratio and its interval, or the ratio of the totals (no interval)
    where the rounds do not pair up."""
    r = _paired_ratio(a, b, confidence)
    if r is None:
        return Gain(total_a / total_b if total_b > 0 else math.nan, math.nan, math.nan)
    return Gain(r.ratio, *_bounded(r.lo if r.lo > 0 else math.nan, r.hi))


def _bounded(lo: float, hi: float) -> tuple[float, float]:
    """An interval, or NaN bounds where the rounds are too few to bound it."""
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else (math.nan, math.nan)


def choose(case_id: str, rows: Sequence[Row], weight: float, backends: Sequence[str], parts: Sequence[str],
           th: Thresholds) -> CaseChoice:
    """The pick of one case among its ok competitors, and how sure it is against the runner-up."""
    by_backend = {r.id.backend: r for r in rows if not is_oracle(r.id.backend)}
    ok = [r for r in by_backend.values() if r.status is Status.OK and math.isfinite(r.timing.median_ms)]
    costs = sorted((cost_of(r, parts) for r in ok), key=lambda c: (c.step, c.backend))
    not_ok = {b: (by_backend[b].status.value if b in by_backend else "no row") for b in backends
              if b not in {c.backend for c in costs}}
    first = rows[0]
    ch = CaseChoice(case_id, first.workload.batch, dict(first.workload.params), weight, costs, not_ok)
    if len(costs) >= 2:
        ch.runner_up = _gain(costs[1].rounds, costs[0].rounds, costs[1].step, costs[0].step, th.confidence)
        r = _paired_ratio(costs[1].rounds, costs[0].rounds, th.confidence)
        ch.verdict = judge(r, costs[1].step, th).verdict if r is not None else "unclear"
        ch.tie = ch.verdict in TIES
        by_kernel = min(costs, key=lambda c: (c.kernel, c.backend))
        ch.kernel_pick = by_kernel.backend if by_kernel.backend != costs[0].backend else ""
    return ch


def _center(totals: Sequence[float], confidence: float) -> Optional[Timed]:
    """The center of the round totals (median of their Walsh averages) with its signed-rank
    interval: the estimate lies inside its interval by construction. None without rounds."""
    if len(totals) < 1:
        return None
    s = ranks.paired_shift(totals, confidence)
    return Timed(s.estimate, *_bounded(s.lo, s.hi))


def total_of(name: str, picks: Sequence[tuple[CaseChoice, Cost]], full: bool,
             confidence: float) -> tuple[Total, list[float]]:
    """The weighted mean step of ``picks`` (a case and the cost counted for it), and its round
    means (``[]`` when the rows' round counts differ). Weights count relative to the largest:
    each share is in (0, 1], one of them 1, so no sum underflows to 0 or overflows."""
    top = max(ch.weight for ch, _ in picks)
    shares = [ch.weight / top for ch, _ in picks]
    whole = math.fsum(shares)

    def mean(values) -> float:
        return math.fsum(s * v for s, v in zip(shares, values)) / whole

    n = {len(c.rounds) for _, c in picks}
    rounds = [mean([c.rounds[i] for _, c in picks]) for i in range(n.pop())] if len(n) == 1 else []
    costs = [c for _, c in picks]
    step = _center(rounds, confidence) or Timed(mean([c.step for c in costs]))
    return Total(name, len(picks), sum(ch.weight for ch, _ in picks),  # shown only (may be inf)
                 step, mean([c.plan for c in costs]), mean([c.convert for c in costs]),
                 mean([c.kernel for c in costs]), full), rounds


def decide(rows: Iterable[Row], weights: dict[str, float], parts: Sequence[str] = PARTS,
           thresholds: Optional[Thresholds] = None) -> Decision:
    """The decision over ``rows`` (one run), each case weighed by ``weights[case_id]``, a step
    counting ``parts`` (``kernel`` always), the runner-ups judged by ``thresholds`` (default:
    what ``check`` uses without flags on these rows, ``verdict.thresholds_for``)."""
    parts = tuple(p for p in PARTS if p in parts or p == "kernel")
    rows_list = list(rows)
    th = thresholds or thresholds_for(rows_list)
    confidence = th.confidence
    by_case: dict[str, list[Row]] = {}
    for r in rows_list:
        by_case.setdefault(r.id.case_id, []).append(r)
    backends = sorted({r.id.backend for rs in by_case.values() for r in rs if not is_oracle(r.id.backend)})
    if not backends:
        raise DecideError("no competitor rows (only the reference, or none): run the scenario with backends to "
                          "choose among, e.g. -b sdpa -b flex")
    bad = sorted(cid for cid in by_case if not (math.isfinite(weights.get(cid, 1.0)) and weights.get(cid, 1.0) > 0))
    if bad:
        raise DecideError(f"case {bad[0]} weighs {weights.get(bad[0], 1.0)!r}: a weight is a finite number > 0 "
                          "(the scenario's weights multiply to more than a float holds, or to 0): give smaller "
                          "or larger weights; they count relative to each other")
    cases = [choose(cid, rs, weights.get(cid, 1.0), backends, parts, th) for cid, rs in by_case.items()]
    dispatched = [c for c in cases if c.pick is not None]
    if not dispatched:
        raise DecideError("no case has an ok competitor row: nothing to choose from (see the run's reasons)")
    dis, dis_rounds = total_of("dispatch", [(c, c.pick) for c in dispatched], True, confidence)
    totals = []
    for b in backends:
        picks = [(c, next(x for x in c.costs if x.backend == b)) for c in dispatched if b in {x.backend for x in c.costs}]
        if not picks:
            continue
        t, t_rounds = total_of(b, picks, len(picks) == len(dispatched), confidence)
        if t.full:
            t.vs_dispatch = _gain(t_rounds, dis_rounds, t.step.ms, dis.step.ms, confidence)
        totals.append(t)
    totals.sort(key=lambda t: (not t.full, t.step.ms if t.full else -t.weight, t.backend))
    best = totals[0] if totals and totals[0].full else None
    rounds = {len(c.rounds) for ch in dispatched for c in ch.costs}
    d = Decision(cases, totals, dis, best, parts, confidence, rounds.pop() if len(rounds) == 1 else 0)
    d.notes = notes(d) + host_notes([r for r in rows_list if r.id.backend in backends], parts)
    if parts != ("kernel",):
        d.kernel_only = decide(rows_list, weights, ("kernel",), th)
    return d


def host_notes(rows: Sequence[Row], parts: Sequence[str]) -> list[str]:
    """Per backend whose ok rows kept fewer plan or convert samples than timing rounds: how many
    were kept, and that the median then counts in every round (``spread``)."""
    few: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for r in rows:
        if r.status is not Status.OK or not host_constant(r, parts):
            continue
        n, t = len(r.timing.round_medians_ms), r.timing
        for part, kept in (("plan", t.plan_samples_ms), ("convert", t.convert_samples_ms)):
            ms = t.plan_ms if part == "plan" else t.convert_ms
            if part in parts and ms and math.isfinite(ms) and len(kept) < n:
                few.setdefault(r.id.backend, {}).setdefault(part, []).append((len(kept), n))
    out = []
    for backend, by_part in sorted(few.items()):
        said = []
        for part, counts in by_part.items():
            k, n = [c for c, _ in counts], sorted({n for _, n in counts})
            kept = f"{min(k)}" if min(k) == max(k) else f"{min(k)}-{max(k)}"
            said.append(f"{kept} {part} sample(s) for {'/'.join(map(str, n))} rounds in {len(counts)} case(s)")
        out.append(f"{backend}: {'; '.join(said)}, fewer than one per round: there its median counts in every "
                   "round, so the intervals leave that part's spread between rounds out")
    return out


def notes(d: Decision) -> list[str]:
    """What changes a reading of ``d``: rounds too few for intervals, cases no backend ran,
    backends that cover only some cases, no backend that covers all."""
    out = []
    need = rounds_needed(d.confidence, paired=True)
    if d.rounds < need:
        out.append(f"{d.rounds or 'no common number of'} timing round(s) per row: intervals need at least {need} "
                   f"at {d.confidence:.0%} (run with --set timing.rounds={max(need, 10)}); until then every pick is "
                   "marked ≈ (the rounds cannot tell it from the runner-up)")
    lost = [c for c in d.cases if c.pick is None]
    if lost:
        out.append(f"{len(lost)} case(s) have no ok backend and are left out of every total (weight "
                   f"{sum(c.weight for c in lost):g}): " + ", ".join(c.case_id for c in lost[:3])
                   + (", ..." if len(lost) > 3 else ""))
    for t in d.totals:
        if not t.full:
            out.append(f"{t.backend} is ok in {t.cases} of {d.dispatch.cases} case(s) (weight {t.weight:g} of "
                       f"{d.dispatch.weight:g}): its total covers only those, so it is not ranked as a single backend")
    if d.best is None:
        out.append("no backend is ok in every case: the dispatch is the only way to run them all, and its gain over a "
                   "single backend is not defined")
    return out

