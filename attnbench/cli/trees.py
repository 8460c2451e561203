"""``attnbench trees``: the named draft trees (``tree: {preset: NAME}``) with their sizes;
``attnbench tree-costs``: the tree vs chain vs decode report of a run."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from attnbench.cli.app import UsageError, app, check_format, console, handle_errors
from attnbench.cli.numbers import check_numbers


@app.command("trees")
def list_trees():
    """List the tree presets: node count (root included), depth, widest fan-out, source."""
    from attnbench.analyze.fit import NAME, PROSE, Col, print_fitted
    from attnbench.workload.tree_presets import PRESETS
    from attnbench.workload.trees import depths, parse_tree

    cols = [Col("preset", NAME), Col("nodes", justify="right"), Col("depth", justify="right"),
            Col("max children", justify="right", drop=1), Col("kind", PROSE), Col("source", PROSE, drop=0)]
    rows = []
    for p in PRESETS.values():
        parents = parse_tree({"preset": p.name})
        kids = [0] * len(parents)
        for q in parents[1:]:
            kids[q] += 1
        kind = "dynamic (seed 0; tree: {preset: {name, seed}})" if p.dynamic else "static"
        rows.append([p.name, str(len(parents)), str(max(depths(parents))), str(max(kids)), kind, p.source])
    print_fitted(console, cols, rows, where="attnbench/workload/tree_presets.py")


@app.command("tree-costs")
@handle_errors
def tree_costs_cmd(
    run: Path = typer.Argument(..., help="run folder (or baseline file) of a scenario with compare_with"),
    gain: Optional[float] = typer.Option(
        None, help="expected accepted tokens of the tree / of the chain: mark where the tree pays"
    ),
    format: str = typer.Option("table", "--format", help="table | markdown | csv | json"),
):
    """What a tree costs against chains of equal node count and plain decodes, per backend and case.

    Ratios with 95% intervals over timing rounds (timing.rounds >= 4). The tree pays against the chain while
    tree/chain stays below the tree's acceptance gain (accepted tokens per step, tree over
    chain); against plain decoding it must accept more than tree/decode tokens per step."""
    from attnbench.analyze.compare_tables import Column, fmt_ratio, render
    from attnbench.analyze.tables import fmt_time
    from attnbench.analyze.tree_costs import TreeCostError, records
    from attnbench.store.baselines import BaselineError, load_rows

    check_numbers(gain=gain)
    check_format(format)
    try:
        recs = records(load_rows(run).rows, gain, str(run))
    except (TreeCostError, BaselineError) as e:
        raise UsageError(str(e)) from None
    cols = [
        Column("case", "backend"), Column("point", "case"), Column("requests", "requests", justify="right"),
        Column("tree_ms", "tree", fmt_time, "right"), Column("chain_ms", "chain", fmt_time, "right"),
        Column("decode_ms", "decode", fmt_time, "right"),
        Column("tree_over_chain", "tree/chain", fmt_ratio, "right"), Column("_chain_ci", "95% interval"),
        Column("tree_over_decode", "tree/decode", fmt_ratio, "right"), Column("_decode_ci", "95% interval"),
    ]
    if gain is not None:
        cols.append(Column("verdict", f"at gain {gain:g}"))
    if any(r["missing"] for r in recs):
        cols.append(Column("missing", "missing"))
    if format in ("table", "markdown"):  # CSV and JSON keep the raw bounds
        for r in recs:
            for side in ("chain", "decode"):
                lo, hi = r[f"{side}_lo"], r[f"{side}_hi"]
                r[f"_{side}_ci"] = f"[{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) and math.isfinite(hi) else "-"
    render(recs, cols, format, console, f"tree vs chain vs decode: {run}")
    if format in ("table", "markdown"):
        console.print(
            "tree/chain < the tree's acceptance gain over the chain: the tree pays; tree/decode: tokens per step "
            "the tree must accept to beat plain decoding (attention time only)", style="dim", highlight=False,
        )
