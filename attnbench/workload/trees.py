"""Every tree spelling of a scenario -> one canonical parent array (docs/semantics.md, "Trees").

Canonical form: ``parents[0] == -1`` (the root: the last accepted token) and
``0 <= parents[i] < i`` for every other node. Spellings that describe a shape (choices,
full, branching, random) are numbered in level order; an explicit ``parents`` list is
taken as written once it is valid.
"""
from __future__ import annotations

import random as _random
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    import torch

from attnbench.workload.units import short_repr


class TreeError(ValueError):
    """A tree spelling that cannot be turned into a tree. The message names the field."""


SPELLINGS = ("choices", "chain", "full", "branching", "random", "parents", "preset")
MAX_TREE_NODES = 4096


def _int(value: Any, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TreeError(f"{field}: expected an integer >= {minimum}, got {short_repr(value)}")
    if value < minimum:
        raise TreeError(f"{field}: expected an integer >= {minimum}, got {value}")
    return value


def _check_size(n: int, field: str) -> None:
    if n > MAX_TREE_NODES:
        raise TreeError(f"{field}: the tree would have {n} nodes; at most {MAX_TREE_NODES} are allowed")


def from_choices(choices: Any, field: str = "tree.choices") -> list[int]:
    """Medusa/EAGLE tree choices (paths of child ranks, root implicit) -> parents.

    Nodes are numbered by sorting the paths by (length, path), as Medusa, EAGLE and
    xformers do; node 0 is the root.
    """
    if not isinstance(choices, (list, tuple)):
        raise TreeError(f"{field}: expected a list of paths such as [[0], [1], [0, 0]], got {short_repr(choices)}")
    _check_size(len(choices) + 1, field)
    paths: list[tuple[int, ...]] = []
    for i, path in enumerate(choices):
        if not isinstance(path, (list, tuple)) or len(path) == 0:
            raise TreeError(f"{field}[{i}]: expected a non-empty list of child ranks, got {short_repr(path)}")
        if len(path) >= MAX_TREE_NODES:
            raise TreeError(f"{field}[{i}]: a path of {len(path)} ranks is deeper than {MAX_TREE_NODES} nodes allow")
        for j, rank in enumerate(path):
            _int(rank, f"{field}[{i}][{j}]", 0)
        paths.append(tuple(path))
    seen = set()
    for p in paths:
        if p in seen:
            raise TreeError(f"{field}: path {list(p)} appears twice; list each path once")
        seen.add(p)
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise TreeError(
                f"{field}: path {list(p)} has no parent path {list(p[:-1])}; add {list(p[:-1])} to the choices"
            )
    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {(): 0}
    parents = [-1]
    for k, p in enumerate(ordered, start=1):
        index[p] = k
        parents.append(index[p[:-1]])
    return parents


def chain(k: Any, field: str = "tree.chain") -> list[int]:
    """``k`` draft tokens in a line: k + 1 nodes with the root."""
    k = _int(k, field, 0)
    _check_size(k + 1, field)
    return [-1] + list(range(k))


def from_branching(branching: Any, field: str = "tree.branching") -> list[int]:
    """Per-level fan-out: every node of level l has ``branching[l]`` children."""
    if not isinstance(branching, (list, tuple)):
        raise TreeError(f"{field}: expected a list of fan-outs such as [3, 2, 1], got {short_repr(branching)}")
    fan = [_int(b, f"{field}[{i}]", 1) for i, b in enumerate(branching)]
    total, width = 1, 1
    for b in fan:
        width *= b
        total += width
        _check_size(total, field)
    parents = [-1]
    level = [0]
    for b in fan:
        nxt = []
        for node in level:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def full(spec: Any, field: str = "tree.full") -> list[int]:
    """A full tree: ``depth`` levels below the root, each node with ``branching`` children.

    ``{depth: 3, branching: 3}`` is the 40-node tree of attnbench/scenarios/tree-verify-llama3-8b.yaml (1 + 3 + 9 + 27).
    """
    if not isinstance(spec, dict) or set(spec) != {"depth", "branching"}:
        raise TreeError(f"{field}: expected {{depth: D, branching: B}}, got {short_repr(spec)}")
    depth = _int(spec["depth"], f"{field}.depth", 0)
    b = _int(spec["branching"], f"{field}.branching", 1)
    _check_size(depth + 1, field)  # before building a list of `depth` fan-outs
    return from_branching([b] * depth, field)


def random_tree(spec: Any, field: str = "tree.random") -> list[int]:
    """A reproducible irregular tree (EAGLE-2 style), renumbered in level order."""
    allowed = {"nodes", "max_depth", "max_children", "seed"}
    if not isinstance(spec, dict) or not set(spec) <= allowed or "nodes" not in spec:
        raise TreeError(f"{field}: expected {{nodes, max_depth, max_children, seed}}, got {short_repr(spec)}")
    n = _int(spec["nodes"], f"{field}.nodes", 1)
    _check_size(n, field)
    max_depth = _int(spec.get("max_depth", n), f"{field}.max_depth", 0)
    max_children = _int(spec.get("max_children", n), f"{field}.max_children", 1)
    seed = _int(spec.get("seed", 0), f"{field}.seed", 0)
    if n > 1 and max_depth == 0:
        raise TreeError(f"{field}: {n} nodes need max_depth >= 1")
    # capacity of a tree with these bounds
    cap, width = 1, 1
    for _ in range(max_depth):
        width *= max_children
        cap += width
        if cap >= n:
            break
    if cap < n:
        raise TreeError(f"{field}: {n} nodes do not fit in max_depth={max_depth}, max_children={max_children}")
    rng = _random.Random(seed)
    par, depth, kids = [-1], [0], [0]
    # nodes that can still take a child, in index order (kept incrementally: O(n) per step
    # only when a node fills up, so 4096 nodes stay fast); same trees as a full rescan
    open_nodes = [0] if max_depth > 0 else []
    while len(par) < n:
        p = rng.choice(open_nodes)
        par.append(p)
        depth.append(depth[p] + 1)
        kids.append(0)
        kids[p] += 1
        if kids[p] >= max_children:
            open_nodes.remove(p)
        if depth[-1] < max_depth:
            open_nodes.append(len(par) - 1)
    return _level_order(par)


def _level_order(parents: Sequence[int]) -> list[int]:
    """Renumber a tree breadth-first so that parents come first, level by level."""
    children: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    order, frontier = [], [0]
    while frontier:
        order.extend(frontier)
        frontier = [c for node in frontier for c in children[node]]
    new = {old: k for k, old in enumerate(order)}
    return [-1] + [new[parents[old]] for old in order[1:]]


def from_parents(parents: Any, field: str = "tree.parents") -> list[int]:
    if not isinstance(parents, (list, tuple)) or len(parents) == 0:
        raise TreeError(f"{field}: expected a list such as [-1, 0, 0, 1], got {short_repr(parents)}")
    _check_size(len(parents), field)
    out = []
    for i, p in enumerate(parents):
        if isinstance(p, bool) or not isinstance(p, int):
            raise TreeError(f"{field}[{i}]: expected an integer, got {short_repr(p)}")
        if i == 0 and p != -1:
            raise TreeError(f"{field}[0]: the root's parent must be -1, got {p}")
        if i > 0 and not 0 <= p < i:
            raise TreeError(
                f"{field}[{i}]: parent {p} is not an earlier node; each parent must be in 0..{i - 1}"
            )
        out.append(p)
    return out


def tree_is_dynamic(spec: Any, field: str = "tree") -> bool:
    """Whether a scenario's ``tree:`` mapping is dynamic: an engine gets a new tree every step,
    so backends rebuild its metadata in every plan (``dynamic: true``; EAGLE-2/3's
    ``eagle-dynamic-*`` presets are dynamic unless ``dynamic: false``). Other trees are
    static: known at start-up, their topology-derived data is built once and cached."""
    if isinstance(spec, dict) and "dynamic" in spec:
        flag = spec["dynamic"]
        if not isinstance(flag, bool):
            raise TreeError(f"{field}.dynamic: expected true or false, got {short_repr(flag)}")
        return flag
    if isinstance(spec, dict) and "preset" in spec:
        from attnbench.workload.tree_presets import PRESETS

        value = spec["preset"]
        name = value.get("name") if isinstance(value, dict) else value
        preset = PRESETS.get(name) if isinstance(name, str) else None
        return bool(preset is not None and preset.dynamic)
    return False


def parse_tree(spec: Any, field: str = "tree") -> list[int]:
    """A scenario's ``tree:`` mapping (exactly one spelling, and optionally ``dynamic``) ->
    parent array."""
    if isinstance(spec, dict) and "dynamic" in spec:
        tree_is_dynamic(spec, field)  # checks the flag
        spec = {k: v for k, v in spec.items() if k != "dynamic"}
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SPELLINGS:
        raise TreeError(f"{field}: expected exactly one of {', '.join(SPELLINGS)}, got {short_repr(spec)}")
    (key, value), = spec.items()
    sub = f"{field}.{key}"
    if key == "preset":  # a named tree (tree_presets.py): its own spelling, parsed as written
        from attnbench.workload.tree_presets import preset_spec

        return parse_tree(preset_spec(value, sub, TreeError), sub)
    return {
        "choices": from_choices,
        "chain": chain,
        "full": full,
        "branching": from_branching,
        "random": random_tree,
        "parents": from_parents,
    }[key](value, sub)


def depths(parents: Sequence[int]) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """``[T, T]`` bool: row i is True at i and at every ancestor of i."""
    import torch  # here, not at module level: scenarios are parsed without torch

    t = len(parents)
    m = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        m[i, i] = True
        if i > 0:
            m[i] |= m[parents[i]]
    return m


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def ancestor_masks(parents: torch.Tensor, max_depth: Optional[int] = None) -> torch.Tensor:
    """``[B, T]`` parent arrays -> ``[B, T, T]`` bool: row i is True at i and at every ancestor.

    By tensor ops on ``parents``' device, no loop over trees or nodes: pointer doubling, where
    step k ORs in the rows of each node's 2^k-th ancestor (``ceil(log2 T)`` gathers). A parent
    of -1 marks a root; padding nodes past a tree's end are given -1 too, so they see only
    themselves. ``max_depth`` (the deepest node's depth, if the caller knows it, as an engine
    knows its draft depth) cuts the gathers to ``bit_length(max_depth)``."""
    import torch

    b, t = parents.shape
    dev = parents.device
    up = parents.long()
    up = torch.where(up < 0, torch.arange(t, device=dev), up)  # a root is its own ancestor
    anc = torch.eye(t, dtype=torch.bool, device=dev).expand(b, t, t).clone()
    rows = torch.arange(b, device=dev)[:, None]
    for _ in range((t - 1 if max_depth is None else max_depth).bit_length()):  # 2^steps > the deepest depth
        anc |= anc[rows, up]
        up = up[rows, up]
    return anc
