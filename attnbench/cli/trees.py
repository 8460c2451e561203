"""``attnbench trees``: the named draft trees (``tree: {preset: NAME}``) with their sizes."""
from __future__ import annotations

from attnbench.cli.app import app, console


@app.command("trees")
def list_trees():
    """List the tree presets: node count (root included), depth, widest fan-out, source."""
    from rich.markup import escape
    from rich.table import Table

    from attnbench.workload.tree_presets import PRESETS
    from attnbench.workload.trees import depths, parse_tree

    t = Table("preset", "nodes", "depth", "max children", "kind", "source")
    for p in PRESETS.values():
        parents = parse_tree({"preset": p.name})
        kids = [0] * len(parents)
        for q in parents[1:]:
            kids[q] += 1
        kind = "dynamic (seed 0; tree: {preset: {name, seed}})" if p.dynamic else "static"
        t.add_row(p.name, str(len(parents)), str(max(depths(parents))), str(max(kids)), escape(kind), escape(p.source))
    console.print(t)
