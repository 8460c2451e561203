"""Plots of a run, read the way kernel people read them:

- ``time-vs-<x>.png`` and ``roofline-vs-<x>.png``: median kernel time and % of the roofline
  ceiling against one swept parameter, one line per backend (``--by``), one panel per fixed
  combination of the other swept parameters (panel titles name it; a figure per value of the
  first one when the panels would be too many). Seeds are replicates, not a parameter: their
  median is drawn, with the min-max band. Powers of two get a log2 axis.
- ``roofline.png``: achieved FLOP/s against arithmetic intensity (FLOPs per byte), every ok row
  a point coloured by backend, under the measured ceilings (memory bandwidth x intensity, the
  matmul rate) the rows' roofline columns were computed with.

matplotlib is optional (``pip install attnbench[plot]``); it is imported only here, with the
Agg backend, so plotting works on a headless CI machine.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Optional

from attnbench.store.rows import Row, Status
from attnbench.workload.sweeps import display_name, key_matches, value_order, value_text
from attnbench.workload.units import safe_name

MAX_PANELS = 12  # per figure; more: one figure per value of the first facet
REPLICATE = "seed"  # a swept key ending in this is a replicate: its rows are summarised, not faceted


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


def _short(key: str) -> str:
    return display_name(key) if key != "backend" else key


def _value(row: Row, key: str):
    return row.id.backend if key == "backend" else row.workload.params.get(key)


def _resolve(name: str, keys: list[str], flag: str) -> str:
    """A swept key by its full path or its last part (``context`` for ``batch.0.context``)."""
    if name in keys or name == "backend":
        return name
    hits = [k for k in keys if key_matches(name.lower(), k)]
    if len(hits) == 1:
        return hits[0]
    hint = ", ".join(keys) or "none (the scenario has no sweep)"
    raise PlotError(f"{flag} {name}: no such swept column; sweep columns of this run: {hint}")


def _numeric(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _log2_axis(values: list) -> bool:
    """Powers of two (page sizes, contexts) or a range of 16x and more: a log2 axis."""
    if len(set(values)) < 3 or not _numeric(values) or min(values) <= 0:
        return False
    pow2 = all(float(v).is_integer() and int(v) & (int(v) - 1) == 0 for v in values)
    return pow2 or max(values) / min(values) >= 16


def _label(v) -> str:
    return v if isinstance(v, str) else value_text(v)


def plot_run(rows: list[Row], x: str, out_dir: Path, by: str = "backend", title: str = "") -> list[Path]:
    """Write the time and %-of-ceiling figures against ``x`` and the roofline chart into
    ``out_dir``; return their paths."""
    keys = list(dict.fromkeys(k for r in rows for k in r.workload.params))
    x = _resolve(x, keys, "--x")
    by = _resolve(by, keys, "--by")
    ok = [r for r in rows if r.status is Status.OK]  # a null x is a value of its own (a category)
    if not ok:
        raise PlotError("no ok rows to plot")
    varying = [k for k in keys if len({json.dumps(_value(r, k), default=str) for r in ok}) > 1]
    replicates = [k for k in varying if _short(k) == REPLICATE and k not in (x, by)]
    facets = [k for k in varying if k not in (x, by, *replicates)] + (["backend"] if by != "backend" else [])
    fixed = [f"{_short(k)}={_label(_value(ok[0], k))}" for k in keys if k not in varying]
    plt = _matplotlib()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scenario = title or (ok[0].id.scenario + " on " + ok[0].id.device)
    note = (f"median of {len({_value(r, replicates[0]) for r in ok})} {_short(replicates[0])}s, band min-max"
            if replicates else "")
    paths = []
    for metric, ylabel, stem in (("median_ms", "median kernel time (ms)", "time"),
                                 ("pct_of_ceiling", "% of roofline ceiling", "roofline")):
        for suffix, group in _figure_groups(ok, facets):
            head = f"{scenario}: {ylabel} vs {_short(x)}"
            sub = ", ".join(filter(None, [", ".join(fixed), suffix, note]))
            path = out_dir / f"{stem}-vs-{safe_name(_short(x))}{('-' + safe_name(suffix)) if suffix else ''}.png"
            _facet_figure(plt, group, x, by, facets if not suffix else facets[1:], metric, ylabel, head, sub, path)
            paths.append(path)
    roof = roofline_chart(plt, ok, out_dir / "roofline.png", scenario)
    return paths + ([roof] if roof else [])


def _figure_groups(rows: list[Row], facets: list[str]) -> list[tuple[str, list[Row]]]:
    """[("", rows)] when the panels fit one figure, else one group per value of the first facet."""
    combos = {tuple(json.dumps(_value(r, k), default=str) for k in facets) for r in rows}
    if len(combos) <= MAX_PANELS or not facets:
        return [("", rows)]
    first = facets[0]
    values = sorted(dict.fromkeys(_value(r, first) for r in rows), key=value_order)
    return [(f"{_short(first)}={_label(v)}", [r for r in rows if _value(r, first) == v]) for v in values]


def _series(rows: list[Row], x: str, metric: str) -> tuple[list, list[float], list[float], list[float]]:
    """(x values, median, min, max of ``metric`` over the replicates at each x)."""
    at: dict = {}
    for r in rows:
        y = r.flat()[metric]  # by its on-disk name: the metric is in the row's timing or roofline
        if y is not None and math.isfinite(y):
            at.setdefault(_value(r, x), []).append(y)
    xs = sorted(at, key=value_order)
    return xs, [statistics.median(at[v]) for v in xs], [min(at[v]) for v in xs], [max(at[v]) for v in xs]


def _save(fig, path: Path, metadata: Optional[dict] = None) -> None:
    """The PNG through ``atomic_write``: never written through a link or over a device or fifo
    placed where a plot goes, never half written. ``metadata``: text chunks of the PNG."""
    import io

    from attnbench.store.runfolder import atomic_write

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata=metadata)
    atomic_write(path, buf.getvalue())


def _facet_figure(plt, rows, x, by, facets, metric, ylabel, head, sub, path) -> None:
    combos = sorted(dict.fromkeys(tuple(_value(r, k) for k in facets) for r in rows),
                    key=lambda c: [value_order(v) for v in c])[:MAX_PANELS]
    ncols = min(3, len(combos))
    nrows = -(-len(combos) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 3.3 * nrows + 0.9), dpi=110, sharey=True,
                             squeeze=False)
    xs_all = [_value(r, x) for r in rows]
    numeric = _numeric(xs_all)
    cats = None if numeric else [_label(v) for v in sorted(dict.fromkeys(xs_all), key=value_order)]
    lines = list(dict.fromkeys(_value(r, by) for r in rows))
    colors = {v: f"C{i % 10}" for i, v in enumerate(lines)}
    for ax, combo in zip(axes.flat, combos):
        here = [r for r in rows if tuple(_value(r, k) for k in facets) == combo]
        for v in lines:
            xs, med, lo, hi = _series([r for r in here if _value(r, by) == v], x, metric)
            if not xs:
                continue
            xv = xs if numeric else [cats.index(_label(s)) for s in xs]
            ax.plot(xv, med, marker="o", ms=3.5, color=colors[v], label=str(v))
            if any(a != b for a, b in zip(lo, hi)):
                ax.fill_between(xv, lo, hi, color=colors[v], alpha=0.18, lw=0)
        ax.set_title(", ".join(f"{_short(k)}={_label(c)}" for k, c in zip(facets, combo)) or "all cases", fontsize=9)
        _axes(ax, xs_all, numeric, cats, metric)
        ax.set_xlabel(_short(x), fontsize=8)
    for ax in list(axes.flat)[len(combos):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    # every panel's lines: a backend that skipped the first panel's cases (flash-attn at page 16) has a
    # line only in later ones, and still needs its legend entry
    drawn = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            drawn.setdefault(label, h)
    labels = [str(v) for v in lines if str(v) in drawn]
    if labels:  # no line when no row has the metric (no ceilings: no % of ceiling)
        fig.legend([drawn[lb] for lb in labels], labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8,
                   frameon=False)
    fig.suptitle(head + (f"\n{sub}" if sub else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    # the x values in their plotted order and the legend's entries, as text chunks of the PNG (what a
    # reader or a test checks without reading pixels)
    order = cats or [_label(v) for v in sorted(set(xs_all), key=value_order)]
    _save(fig, path, {"attnbench x": f"{_short(x)}: {' '.join(order)}", "attnbench legend": " ".join(labels)})
    plt.close(fig)


def _axes(ax, xs_all, numeric, cats, metric) -> None:
    if cats:
        ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=8)
    elif _log2_axis(xs_all):
        ax.set_xscale("log", base=2)
        ticks = sorted(set(xs_all))
        ax.set_xticks(ticks, [_label(t) for t in ticks], fontsize=8)
        ax.minorticks_off()
    if metric == "median_ms":
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
    ax.tick_params(labelsize=8)
    ax.grid(True, which="both", alpha=0.3)


def ceilings_of(rows: list[Row]) -> tuple[Optional[float], Optional[float], str]:
    """(memory ceiling B/s, compute ceiling FLOP/s, where they come from): from the rows'
    own roofline columns (floor_ms is bytes / bandwidth when memory-bound, FLOPs / matmul rate
    when compute-bound), the compute ceiling from the ceilings cache when no row reached it."""
    roofs = [r.roofline for r in rows]
    mem = [f.bytes / (f.floor_ms / 1e3) for f in roofs if f.bound == "memory" and f.floor_ms > 0]
    cmp_ = [f.flops / (f.floor_ms / 1e3) for f in roofs if f.bound == "compute" and f.floor_ms > 0]
    bw = statistics.median(mem) if mem else None
    # the cached matmul rate (and a note per damaged entry, whichever ceiling the rows reached:
    # the report said so only when no row was compute-bound, which varied with the machine's load)
    peak, notes = _cached_matmul(rows[0].id.device, rows[0].workload.dtype)
    if cmp_:
        return bw, statistics.median(cmp_), "measured on this device (memory stream; dense matmul)" + \
            "".join(f"; {n}" for n in notes)
    # no row reached the compute ceiling: the cached rate, if it agrees with the rows
    # (a memory-bound row says the rate was at least its FLOPs over its floor time)
    least = max((f.flops / (f.floor_ms / 1e3) for f in roofs if f.bound == "memory" and f.floor_ms > 0), default=0.0)
    if peak is not None and peak < least * 0.999:
        peak = None
    return bw, peak, "measured on this device (memory stream" + ("; dense matmul, from the cache)" if peak else
                                                                 "; no row reached the compute ceiling)") \
        + "".join(f"; {n}" for n in notes)


def _cached_matmul(device: str, dtype: str) -> tuple[Optional[float], list[str]]:
    """The matmul rate (FLOP/s) attnbench measured on ``device`` for ``dtype``, from its cache,
    and a note per kept value that is not a rate (ignored)."""
    from attnbench.measure.ceilings import kept_matmul_rate  # torch: only when a chart is drawn

    rate, notes = kept_matmul_rate(device, dtype)
    return (rate * 1e12 if rate is not None else None), notes


def roofline_chart(plt, rows: list[Row], path: Path, scenario: str) -> Optional[Path]:
    """Achieved FLOP/s against FLOPs per byte, under the measured ceilings; None without data."""
    pts = [r for r in rows if r.roofline.flops > 0 and r.roofline.bytes > 0 and r.timing.median_ms > 0
           and math.isfinite(r.timing.median_ms)]
    if not pts:
        return None
    bw, peak, source = ceilings_of(pts)
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=110)
    backends = list(dict.fromkeys(r.id.backend for r in pts))
    for i, b in enumerate(backends):
        mine = [r for r in pts if r.id.backend == b]
        ax.scatter([r.roofline.flops / r.roofline.bytes for r in mine],
                   [r.roofline.flops / (r.timing.median_ms / 1e3) for r in mine], s=14, color=f"C{i % 10}", alpha=0.75,
                   label=b, zorder=3)
    ai = [r.roofline.flops / r.roofline.bytes for r in pts]
    lo, hi = min(ai) / 4, max(ai) * 4
    if bw and peak:
        lo, hi = min(lo, peak / bw / 8), max(hi, peak / bw * 8)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    if bw:
        ax.plot(grid, [min(bw * a, peak or math.inf) for a in grid], color="k", lw=1.4,
                label=f"ceiling: {bw / 1e9:.3g} GB/s x intensity" + (f", {peak / 1e12:.3g} TFLOP/s" if peak else ""))
    elif peak:
        ax.axhline(peak, color="k", lw=1.4, label=f"ceiling: {peak / 1e12:.3g} TFLOP/s")
    if bw and peak:
        ax.axvline(peak / bw, color="k", lw=0.6, ls=":")
        ax.annotate(f"ridge {peak / bw:.3g} FLOP/B", (peak / bw, peak), textcoords="offset points", xytext=(4, -12),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved, minimum bytes)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"{scenario}: roofline\nceilings {source}" if (bw or peak) else f"{scenario}: roofline (no ceilings)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def default_plot_dir(run: Path) -> Path:
    return Path(run) / "plots"
