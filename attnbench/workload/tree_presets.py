"""Named draft trees: ``tree: {preset: NAME}`` (optionally ``seed: S`` for the dynamic ones).

Static presets are the published default tree choices of Medusa and EAGLE(-1), copied as data
(paths of child ranks; numbered as every ``choices`` tree is, docs/semantics.md "Trees"):

- ``medusa-mc_sim_7b_63``: ``mc_sim_7b_63`` of FasterDecoding/Medusa,
  ``medusa/model/medusa_choices.py`` at commit 11af0aa503437b40d45f5a47c001c43699b7ae52; the
  default ``medusa_choices`` of ``MedusaModel.medusa_generate`` (``medusa/model/medusa_model.py``,
  same commit). 63 paths: 64 nodes with the root, depth 4.
- ``eagle-mc_sim_7b_63``: ``mc_sim_7b_63`` of SafeAILab/EAGLE, ``eagle/model/choices.py`` at
  commit 08dc06ccb428f2d3cf8380933ea50ed3e4178168, the tree EAGLE-1's ``EaModel`` builds by
  default. 25 paths: 26 nodes, depth 5.

Dynamic presets stand for EAGLE-2/3 trees, which the draft model reshapes every step: seeded
random trees of 61 nodes (60 draft tokens and the root), at most 10 children per node (top-k
10), depth at most 5, 7 or 8, grown as EAGLE-2 grows them (``eagle_like_tree``) from random
draft probabilities; ``seed`` picks another tree. EAGLE's ``EaModel.from_pretrained`` defaults to
``total_token=60, depth=7, top_k=10`` (``eagle/model/ea_model.py`` at commit
47de7b0e9ef609e93256b95c8226c963e09ae524); depths 5 and 8 bracket the settings people run.
"""
from __future__ import annotations

import math
import random as _random
from dataclasses import dataclass
from typing import Any, Optional

from attnbench.workload.units import short_repr

MEDUSA_MC_SIM_7B_63 = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0],
    [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2],
    [3, 0], [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1],
    [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3],
    [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0],
    [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0],
    [0, 0, 0, 1], [1, 6], [0, 7, 0],
]

EAGLE_MC_SIM_7B_63 = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]

DYNAMIC_NODES = 61  # EAGLE's total_token=60 draft tokens, plus the root
DYNAMIC_TOP_K = 10


@dataclass(frozen=True)
class Preset:
    name: str
    spec: dict  # static: a tree spelling parse_tree takes; dynamic: eagle_like_tree's arguments
    source: str
    dynamic: bool = False  # a seeded random tree: `seed` picks another one


def _dynamic(depth: int, source: str) -> Preset:
    spec = {"nodes": DYNAMIC_NODES, "depth": depth, "top_k": DYNAMIC_TOP_K}
    return Preset(f"eagle-dynamic-d{depth}", spec, source, dynamic=True)


# A random stand-in for the draft model's top-k probabilities at a node: the top token gets a
# confidence drawn from TOP1_RANGE (a trained draft head is usually confident, so the likeliest
# path runs deep), the rest of the mass falls off geometrically by TAIL_RATIO per rank.
TOP1_RANGE = (0.5, 0.95)
TAIL_RATIO = 0.5


def _draft_probs(rng: _random.Random, top_k: int) -> list[float]:
    top1 = rng.uniform(*TOP1_RANGE)
    ratio = TAIL_RATIO * rng.uniform(0.8, 1.2)
    return [top1] + [(1 - top1) * (1 - ratio) * ratio**j for j in range(top_k - 1)]


def eagle_like_tree(nodes: int, depth: int, top_k: int, seed: int) -> list[int]:
    """A tree grown the way EAGLE-2 grows its dynamic trees, with random draft probabilities.

    Level by level (``depth`` levels), the ``top_k`` likeliest nodes of the last level (by
    path probability) each get their ``top_k`` likeliest children; then the ``nodes - 1``
    likeliest of all grown nodes are kept (path probabilities fall along a path, so the kept
    set holds every kept node's parent). Returns a parent array in level order."""
    rng = _random.Random(seed)
    grown = [(0.0, -1, 0)]  # (log path probability, parent, depth) per grown node; 0 the root
    frontier = [0]
    for _ in range(depth):
        new = []
        for p in frontier:
            for w in _draft_probs(rng, top_k):
                grown.append((grown[p][0] + math.log(w), p, grown[p][2] + 1))
                new.append(len(grown) - 1)
        frontier = sorted(new, key=lambda i: -grown[i][0])[:top_k]
    keep = [0] + sorted(range(1, len(grown)), key=lambda i: (-grown[i][0], i))[: nodes - 1]
    order = sorted(keep, key=lambda i: (grown[i][2], i))  # level order: parents come first
    index = {old: k for k, old in enumerate(order)}
    return [-1] + [index[grown[i][1]] for i in order[1:]]


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("medusa-mc_sim_7b_63", {"choices": MEDUSA_MC_SIM_7B_63},
               "FasterDecoding/Medusa medusa/model/medusa_choices.py @11af0aa5 (medusa_generate's default)"),
        Preset("eagle-mc_sim_7b_63", {"choices": EAGLE_MC_SIM_7B_63},
               "SafeAILab/EAGLE eagle/model/choices.py @08dc06cc (EAGLE-1 EaModel's default)"),
        _dynamic(5, "EAGLE-2/3 style: 60 drafts, top-k 10, depth <= 5 (seeded)"),
        _dynamic(7, "EAGLE-2/3 style: EaModel.from_pretrained defaults total_token=60, depth=7, top_k=10"
                    " (SafeAILab/EAGLE eagle/model/ea_model.py @47de7b0e; seeded)"),
        _dynamic(8, "EAGLE-2/3 style: 60 drafts, top-k 10, depth <= 8 (seeded)"),
    )
}


def preset_spec(value: Any, field: str, error: type[ValueError]) -> dict:
    """``{preset: NAME}`` or ``{preset: NAME, seed: S}`` -> the preset's tree spelling."""
    if isinstance(value, str):
        name, seed = value, None
    elif isinstance(value, dict) and "name" in value and set(value) <= {"name", "seed"}:
        name, seed = value["name"], value.get("seed")
    else:
        raise error(f"{field}: expected a preset name such as {next(iter(PRESETS))}, or {{name, seed}}")
    preset: Optional[Preset] = PRESETS.get(name) if isinstance(name, str) else None
    if preset is None:
        raise error(f"{field}: unknown preset {short_repr(name)}; presets: {', '.join(PRESETS)} (`attnbench trees` lists them)")
    if seed is not None and not preset.dynamic:
        raise error(f"{field}.seed: {preset.name} is a fixed tree; only eagle-dynamic-* presets take a seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise error(f"{field}.seed: expected an integer >= 0, got {short_repr(seed)}")
    if not preset.dynamic:
        return preset.spec
    return {"parents": eagle_like_tree(**preset.spec, seed=seed or 0)}
