"""What a tree costs: ``compare_with: [chain, decode]`` on a tree group runs every case again
with that group as chains of equal node count and as plain decodes.

A tree of T nodes (the root, the last accepted token, and T - 1 drafts) verified at context C
is compared with
- ``chain``: T new tokens at context C, verified as a causal extend (``kind: prefill``, query T),
  the way an engine verifies a linear draft of T - 1 tokens: the same tokens, the same keys
  per token count, no tree mask;
- ``decode``: one new token at context C, no speculation at all.
The group keeps its count, context and shared prefix. Each variant is a case of its own, with
``variant: tree | chain | decode`` among its parameters (so in its case id); every other group
of the batch stays as written. ``attnbench tree-costs`` reads the three back.
"""
from __future__ import annotations

import copy
from typing import Any

VARIANTS = ("tree", "chain", "decode")


def _as(group: Any, variant: str) -> dict:
    """The mapping of a validated tree group re-spelled as ``variant``."""
    out = {"kind": "prefill" if variant == "chain" else "decode", "count": group.count, "context": group.context}
    if variant == "chain":
        out["query"] = group.query
    if group.shared_prefix:
        out["shared_prefix"] = group.shared_prefix
    return out


def variant_docs(doc: dict, groups: list) -> list[tuple[str, dict]]:
    """``doc`` (one case, validated into ``groups``) -> ``[(variant, document), ...]``, the tree
    itself first; ``[]`` when no group asks for a comparison."""
    wanted = [v for v in VARIANTS[1:] if any(v in g.compare_with for g in groups)]
    if not wanted:
        return []
    out = [("tree", doc)]
    for v in wanted:
        d = copy.deepcopy(doc)
        for i, g in enumerate(groups):
            if v in g.compare_with:
                d["batch"][i] = _as(g, v)
        out.append((v, d))
    return out
