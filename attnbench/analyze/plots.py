"""Plots of a run: median kernel time and % of the roofline ceiling vs a swept parameter.

matplotlib is optional (``pip install attnbench[plot]``); it is imported only here, with the
Agg backend, so plotting works on a headless CI machine.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

from attnbench.store.rows import Row, Status, rows_frame

from attnbench.workload.units import safe_name


class PlotError(ValueError):
    """A user-facing problem: matplotlib missing, unknown column, nothing to plot."""


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plotting needs matplotlib, which is not installed: pip install 'attnbench[plot]'") from None
    return plt


def _x_values(col: "pd.Series") -> tuple[list, bool]:
    """Numeric x values as numbers; anything else as categories (in first-seen order)."""
    import pandas as pd

    num = pd.to_numeric(col, errors="coerce")
    if num.notna().all():
        return list(num), True
    return [str(v) for v in col], False


def plot_run(rows: list[Row], x: str, out_dir: Path, by: str = "backend", title: str = "") -> list[Path]:
    """Write ``time-vs-<x>.png`` and ``roofline-vs-<x>.png`` into ``out_dir``; return their paths.

    One line per value of ``by``; when other sweep columns vary too, each of their
    combinations gets its own line (label ``backend · col=value``)."""
    df = rows_frame(rows)
    sweep_cols = [c for c in df.columns if c not in {"x_fastest"} and any(c in r.params for r in rows)]
    if x not in df.columns:
        hint = ", ".join(sweep_cols) or "none (the scenario has no sweep)"
        raise PlotError(f"--x {x}: no such column; sweep columns of this run: {hint}")
    if by not in df.columns:
        raise PlotError(f"--by {by}: no such column; try backend, or one of: {', '.join(sweep_cols)}")
    df = df[df["status"] == Status.OK.value].copy()
    if df.empty:
        raise PlotError("no ok rows to plot")
    others = [c for c in sweep_cols if c not in (x, by) and df[c].nunique() > 1]
    xs, numeric = _x_values(df[x])
    df["_x"] = xs
    categories = list(dict.fromkeys(xs)) if not numeric else None
    plt = _matplotlib()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric, ylabel, stem in (
        ("median_ms", "median kernel time (ms)", "time"),
        ("pct_of_ceiling", "% of roofline ceiling", "roofline"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        for key, g in df.groupby([by, *others], sort=False, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            label = " · ".join([str(key[0]), *(f"{c}={v}" for c, v in zip(others, key[1:]))])
            g = g.sort_values("_x", key=(lambda s: s.map(categories.index)) if categories else None)
            xv = [categories.index(v) for v in g["_x"]] if categories else list(g["_x"])
            ys = list(g[metric])
            if all(not math.isfinite(y) for y in ys):
                continue
            ax.plot(xv, ys, marker="o", label=label)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        if categories:
            ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
        elif len(set(xs)) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 16:
            ax.set_xscale("log", base=2)
        if metric == "median_ms":
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title or f"{ylabel} vs {x}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}-vs-{safe_name(x)}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def default_plot_dir(run: Path) -> Path:
    return Path(run) / "plots"

