"""The route table: which of our kernels runs a batch, and why the others do not.

A route is one kernel (and its plan's shape) the triton backend can run a batch through. Each is one ``Route``
below: the name users type (``-b triton:route=gluon-tree``), the words the row's ``mode`` gives, what it takes
(``reasons``: why it cannot take a batch, [] when it can; ``declines``: why ``auto`` leaves a batch it can take to
another route, from measurements), its plan's shape (``config``: the tiles it asks the plan for), ``fit`` (why a
plan's tiles do not suit it, '' when they do) and its ``launch``.

``select`` runs once a plan: ``route=auto`` takes the first route of ``AUTO`` (MLA batches: ``AUTO_MLA``) that
neither refuses nor declines the batch; a named route is taken as is (the backend skips the batch with that route's
reasons when it has some). ``settle`` checks the plan against the route (``fit``): under ``auto`` a plan whose tiles
do not suit it runs on the route's ``fallback`` (the mode says why); a named route raises ``RouteError``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from attnbench.kernels.decode import gluon as decode
from attnbench.kernels.mla import gluon as mla_gluon
from attnbench.kernels.mla import plan as mla
from attnbench.kernels.paged import launch as paged
from attnbench.kernels.prefill import gluon as prefill_gluon
from attnbench.kernels.prefill import launch as prefill
from attnbench.kernels.shared import gluon as gluon_host
from attnbench.kernels.tree import gluon as tree

TILES = ("block_m", "block_n", "block_nf", "num_warps", "num_stages")


class RouteError(ValueError):
    """A named route whose plan it cannot run (the tiles the options asked for do not suit it)."""


@dataclass(frozen=True)
class Options:
    """The triton backend's declared options, parsed (attnbench/backends/triton.py declares them; 0: the plan's
    own choice)."""

    route: str = "auto"
    splits: int = 0  # KV splits a row block
    block_m: int = 0  # rows a unit (query tokens x G)
    block_n: int = 0  # keys a tile of the masked loop
    block_nf: int = 0  # keys a tile of the unmasked loop (a multiple of block_n)
    num_warps: int = 0
    num_stages: int = 0

    TUNING = ("splits",) + TILES  # the numeric options, in the backend's declaration

    def tiles(self) -> dict:
        """The tile options set (the plan's config overrides)."""
        return {k: getattr(self, k) for k in TILES if getattr(self, k)}


def _none(batch) -> list[str]:
    return []


def _no_config(batch) -> dict:
    return {}


def _fits(p) -> str:
    return ""


@dataclass(frozen=True)
class Route:
    name: str  # what users type: route=NAME
    kernel: str  # what the row's mode says ran
    mla: bool  # MLA batches (else the paged MHA / GQA layout)
    reasons: Callable = _none  # (batch) -> why it cannot take it
    launch: Callable = None  # (plan) -> the output
    declines: Callable = _none  # (batch) -> why auto leaves it to another route
    config: Callable = _no_config  # (batch) -> the plan's config overrides (its tiles)
    fit: Callable = _fits  # (plan) -> '' when the plan's tiles suit it
    fallback: str = ""  # the route auto runs a plan on that does not fit
    fixed_tiles: tuple = ()  # tile options it sets itself (a user's value: a reason)
    plan_kw: dict = field(default_factory=dict)  # how its plan differs (paged/plan.py, mla/plan.py's arguments)
    gluon: bool = False  # a Gluon kernel: it also needs the installed triton's Gluon API (shared/gluon.py)

    def refusals(self, batch, opts: Options) -> list[str]:
        """Every reason it cannot take ``batch`` with ``opts``, in the words a skipped row gives (each naming the
        route)."""
        out = [f"route {self.name} runs {'MLA' if self.mla else 'MHA / GQA'} batches only"] \
            if self.mla != _is_mla(batch) else []
        out += [f"route {self.name} sets {k} itself (option {k}={getattr(opts, k)})" for k in self.fixed_tiles
                if getattr(opts, k)]
        if out:
            return out
        why = self.reasons(batch)
        if not why and self.gluon:  # a batch it would take: the kernel must also compile with this triton
            why = [w for w in (gluon_host.api_problem(),) if w]
        return [f"route {self.name}: {w}" for w in why]


def _is_mla(batch) -> bool:
    from attnbench.workload.mla import is_mla

    return is_mla(batch)


ROUTES = (
    Route("gluon-prefill", "Gluon prefill kernel", False, prefill_gluon.reasons, prefill_gluon.launch,
          prefill_gluon.declines, prefill_gluon.config_args, prefill_gluon.fit, "prefill", ("block_m", "block_n"),
          gluon=True),
    Route("gluon-tree", "Gluon tree kernel", False, tree.reasons, tree.launch, config=tree.config_args,
          fit=tree.fit, fallback="paged", fixed_tiles=("block_m", "block_n"),
          plan_kw=dict(half=tree.HALF_PARTIALS, waves=True), gluon=True),
    Route("gluon-decode", "Gluon decode kernel", False, decode.reasons, decode.launch, decode.declines,
          decode.config_args, decode.fit, "paged", ("block_nf",), gluon=True),
    Route("prefill", "Triton prefill kernel", False, prefill.reasons, prefill.launch),
    Route("paged", "Triton paged kernel", False, launch=paged.launch),
    Route("gluon-mla", "Gluon MLA kernel", True, mla_gluon.reasons, mla.launch_gluon, fit=mla_gluon.fit,
          fallback="mla", fixed_tiles=("block_m", "block_n"), plan_kw=dict(gluon=True), gluon=True),
    Route("mla", "Triton MLA kernel", True, mla.mla_problems, mla.launch),
)
BY_NAME = {r.name: r for r in ROUTES}
NAMES = ("auto",) + tuple(BY_NAME)
AUTO = tuple(r for r in ROUTES if not r.mla)  # auto's order: the first that neither refuses nor declines
AUTO_MLA = tuple(r for r in ROUTES if r.mla)


def select(batch, opts: Options) -> Route:
    """The route that plans and runs ``batch``: the named one, or auto's first taker (the last, which takes every
    batch of its kind, when none other does)."""
    if opts.route != "auto":
        return BY_NAME[opts.route]
    order = AUTO_MLA if _is_mla(batch) else AUTO
    return next((r for r in order if not r.refusals(batch, opts) and not r.declines(batch)), order[-1])


def settle(route: Route, p, opts: Options) -> tuple[Route, str]:
    """The route that runs plan ``p`` and, when that is not ``route``, why not (its ``fit``)."""
    why = route.fit(p)
    if not why:
        return route, ""
    if opts.route != "auto" or not route.fallback:
        raise RouteError(f"route {route.name}: {why}")
    return BY_NAME[route.fallback], why


def mode(route: Route, chosen: Route, why: str) -> str:
    """The row's ``mode`` for a plan run by ``route`` (``chosen``: the one selected, ``why`` it fell back)."""
    text = f"{route.name} ({route.kernel})"
    return f"{text}, not {chosen.name}: {why}" if why else text
