"""Charts drawn as inline SVG text (no matplotlib, no network), for the HTML report.

* ``case_bars``: per case, one horizontal bar per (run, backend) with its median time and a
  p20-p80 whisker; failed or skipped rows are listed by status instead of drawn.
* ``roofline``: achieved FLOP/s against FLOPs per byte on log-log axes, under the measured
  ceilings ``plots.ceilings_of`` reads from the rows (memory bandwidth x intensity, matmul rate).
* ``trend``: median time per point of a history, one line per (case, backend).

Every chart is an ``<svg>`` element with a ``data-chart`` attribute naming its kind, so a test
can find it in the rendered page.
"""
from __future__ import annotations

import math
from html import escape
from typing import Optional, Sequence

from attnbench.store.columns import fmt_time
from attnbench.store.rows import Row, Status

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten within [lo, hi] (at least the two ends when none falls inside)."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [10.0 ** e for e in range(a, b + 1) if lo <= 10.0 ** e <= hi]
    return ticks or [lo, hi]


class LogAxis:
    """Maps a positive value onto [p0, p1] pixels on a log scale."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float):
        if hi <= lo:
            lo, hi = lo / 2, lo * 2
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1

    def __call__(self, v: float) -> float:
        f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return self.p0 + f * (self.p1 - self.p0)


def _svg(kind: str, w: int, h: int, body: list[str], label: str) -> str:
    return (f'<svg data-chart="{kind}" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>")


def _text(x, y, s, size=11, anchor="start", extra="") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {extra}>{escape(str(s))}</text>'


# ---------------------------------------------------------------------------- per-case bars
def case_bars(case_id: str, series: Sequence[tuple[str, Row]], colors: dict[str, str]) -> str:
    """Bars of one case: ``series`` is [(label, row)], the label naming run and backend."""
    ok = [(lab, r) for lab, r in series
          if r.status is Status.OK and _finite(r.timing.median_ms) and r.timing.median_ms > 0]
    other = [(lab, r) for lab, r in series if (lab, r) not in ok]
    left, width, bar_h = 190, 380, 18
    h = 28 + bar_h * 1.4 * max(len(ok), 1) + 16 * len(other) + 10
    top = max([r.timing.p80_ms if _finite(r.timing.p80_ms) else r.timing.median_ms for _, r in ok]
              + [r.timing.median_ms for _, r in ok], default=1.0)
    scale = width / (top * 1.05)
    body = [_text(4, 16, f"case {case_id}", 12, extra='font-weight="bold"')]
    y = 28.0
    for lab, r in ok:
        w = r.timing.median_ms * scale
        c = colors.get(r.id.backend, "#888")
        body.append(_text(left - 6, y + bar_h * 0.75, lab, 11, "end"))
        body.append(f'<rect x="{left}" y="{y:.1f}" width="{w:.1f}" height="{bar_h}" fill="{c}" '
                    f'data-backend="{escape(r.id.backend)}"><title>{escape(lab)}: {fmt_time(r.timing.median_ms)}'
                    '</title></rect>')
        if _finite(r.timing.p20_ms) and _finite(r.timing.p80_ms):
            x0, x1, ym = left + r.timing.p20_ms * scale, left + r.timing.p80_ms * scale, y + bar_h / 2
            body.append(f'<line x1="{x0:.1f}" y1="{ym:.1f}" x2="{x1:.1f}" y2="{ym:.1f}" stroke="#000" stroke-width="1.2"/>')
        body.append(_text(left + w + 6, y + bar_h * 0.75, fmt_time(r.timing.median_ms), 10))
        y += bar_h * 1.4
    if not ok:
        y += bar_h * 1.4
    for lab, r in other:
        body.append(_text(left - 6, y + 10, lab, 11, "end"))
        body.append(_text(left, y + 10, f"{r.status.value}: {r.reason[:80]}", 10, extra='fill="#a00"'))
        y += 16
    return _svg("bars", left + width + 70, int(h), body, f"median time per backend, case {case_id}")


# ---------------------------------------------------------------------------- roofline
def _frame(body: list[str], x: LogAxis, y: LogAxis, xlabel: str, ylabel: str, yfmt) -> None:
    """Axes, log ticks, grid lines and labels of a log-log plot."""
    body.append(f'<rect x="{x.p0}" y="{y.p1}" width="{x.p1 - x.p0}" height="{y.p0 - y.p1}" fill="none" stroke="#444"/>')
    for t in _log_ticks(x.lo, x.hi):
        px = x(t)
        body.append(f'<line x1="{px:.1f}" y1="{y.p1}" x2="{px:.1f}" y2="{y.p0}" stroke="#ddd"/>')
        body.append(_text(px, y.p0 + 14, f"{t:g}", 10, "middle"))
    for t in _log_ticks(y.lo, y.hi):
        py = y(t)
        body.append(f'<line x1="{x.p0}" y1="{py:.1f}" x2="{x.p1}" y2="{py:.1f}" stroke="#ddd"/>')
        body.append(_text(x.p0 - 4, py + 4, yfmt(t), 10, "end"))
    body.append(_text((x.p0 + x.p1) / 2, y.p0 + 32, xlabel, 11, "middle"))
    body.append(_text(14, (y.p0 + y.p1) / 2, ylabel, 11, "middle",
                      f'transform="rotate(-90 14 {(y.p0 + y.p1) / 2:.1f})"'))


def _flops_text(v: float) -> str:
    for unit, f in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= f:
            return f"{v / f:g}{unit}"
    return f"{v:g}"


def roofline(rows: Sequence[Row], bw: Optional[float], peak: Optional[float], source: str,
             colors: dict[str, str]) -> Optional[str]:
    """The roofline of ``rows`` (ok rows with FLOPs and bytes); None when none has them."""
    pts = [r for r in rows if r.status is Status.OK and r.roofline.flops > 0 and r.roofline.bytes > 0
           and _finite(r.timing.median_ms) and r.timing.median_ms > 0]
    if not pts:
        return None
    ai = [r.roofline.flops / r.roofline.bytes for r in pts]
    rate = [r.roofline.flops / (r.timing.median_ms / 1e3) for r in pts]
    xlo, xhi = min(ai) / 4, max(ai) * 4
    if bw and peak:
        xlo, xhi = min(xlo, peak / bw / 8), max(xhi, peak / bw * 8)
    roof = [min(bw * a, peak or math.inf) for a in (xlo, xhi)] if bw else ([peak] if peak else [])
    ylo, yhi = min(rate) / 4, max(rate + roof) * 2
    W, H = 640, 420
    x, y = LogAxis(xlo, xhi, 70, W - 20), LogAxis(ylo, yhi, H - 50, 30)
    body = [_text(W / 2, 18, f"roofline; ceilings {source}" if (bw or peak) else "roofline (no ceilings)", 12,
                  "middle")]
    _frame(body, x, y, "arithmetic intensity (FLOPs per byte)", "achieved FLOP/s", _flops_text)
    if bw:
        grid = [xlo * (xhi / xlo) ** (i / 100) for i in range(101)]
        pts_line = " ".join(f"{x(a):.1f},{y(max(min(bw * a, peak or math.inf), ylo)):.1f}" for a in grid)
        body.append(f'<polyline data-ceiling="memory" points="{pts_line}" fill="none" stroke="#000" stroke-width="1.6"/>')
        lab = f"ceiling: {bw / 1e9:.3g} GB/s x intensity" + (f", {peak / 1e12:.3g} TFLOP/s" if peak else "")
        body.append(_text(x.p0 + 6, y.p1 + 14, lab, 10))
    elif peak:
        body.append(f'<line data-ceiling="compute" x1="{x.p0}" y1="{y(peak):.1f}" x2="{x.p1}" y2="{y(peak):.1f}" '
                    f'stroke="#000" stroke-width="1.6"/>')
        body.append(_text(x.p0 + 6, y(peak) - 4, f"ceiling: {peak / 1e12:.3g} TFLOP/s", 10))
    for r, a, f in zip(pts, ai, rate):
        c = colors.get(r.id.backend, "#888")
        body.append(f'<circle cx="{x(a):.1f}" cy="{y(f):.1f}" r="4" fill="{c}" fill-opacity="0.8" '
                    f'data-backend="{escape(r.id.backend)}"><title>{escape(r.id.case_id)} · {escape(r.id.backend)}: '
                    f'{_flops_text(f)}FLOP/s at {a:.3g} FLOP/B</title></circle>')
    _legend(body, [b for b in dict.fromkeys(r.id.backend for r in pts)], colors, W - 150, y.p0 - 16)
    return _svg("roofline", W, H, body, "roofline chart")


def _legend(body: list[str], names: list[str], colors: dict[str, str], x0: float, y_bottom: float) -> None:
    for i, name in enumerate(reversed(names)):
        yy = y_bottom - 14 * i
        body.append(f'<rect x="{x0}" y="{yy - 8:.1f}" width="10" height="10" fill="{colors.get(name, "#888")}"/>')
        body.append(_text(x0 + 14, yy + 1, name, 10))


# ---------------------------------------------------------------------------- history trend
def trend(title: str, lines: dict[str, list[tuple[str, float]]]) -> Optional[str]:
    """Median time per history point: ``lines`` maps a label to [(point label, ms)]. The x axis
    is the points of every line together, in the order of their labels (which start with the
    run's start time), each tick labelled with its point label (date and commit)."""
    vals = [v for pts in lines.values() for _, v in pts if _finite(v) and v > 0]
    if not vals:
        return None
    xs = sorted({lab for pts in lines.values() for lab, _ in pts})
    at = {lab: i for i, lab in enumerate(xs)}
    n = len(xs)
    W, H = 640, 360
    y = LogAxis(min(vals) / 1.5, max(vals) * 1.5, H - 110, 30)
    x0, x1 = 70, W - 170
    step = (x1 - x0) / max(n - 1, 1)
    body = [_text(W / 2, 18, title, 12, "middle")]
    body.append(f'<rect x="{x0}" y="{y.p1}" width="{x1 - x0}" height="{y.p0 - y.p1}" fill="none" stroke="#444"/>')
    for t in _log_ticks(y.lo, y.hi):
        body.append(f'<line x1="{x0}" y1="{y(t):.1f}" x2="{x1}" y2="{y(t):.1f}" stroke="#ddd"/>')
        body.append(_text(x0 - 4, y(t) + 4, fmt_time(t), 10, "end"))
    every = max(1, math.ceil(n / 12))  # at most 12 labelled ticks
    for i, lab in enumerate(xs):
        if i % every and i != n - 1:
            continue
        xt = x0 + i * step
        body.append(f'<line x1="{xt:.1f}" y1="{y.p0}" x2="{xt:.1f}" y2="{y.p0 + 4}" stroke="#444"/>')
        body.append(_text(xt, y.p0 + 12, lab[:30], 9, "end", f'transform="rotate(-35 {xt:.1f} {y.p0 + 12})"'))
    names = list(lines)
    for i, name in enumerate(names):
        pts = [(at[lab], v) for lab, v in lines[name] if _finite(v) and v > 0]
        coords = " ".join(f"{x0 + j * step:.1f},{y(v):.1f}" for j, v in pts)
        body.append(f'<polyline points="{coords}" fill="none" stroke="{color(i)}" stroke-width="1.5"/>')
        body += [f'<circle cx="{x0 + j * step:.1f}" cy="{y(v):.1f}" r="3" fill="{color(i)}"/>' for j, v in pts]
        body.append(f'<rect x="{x1 + 10}" y="{36 + 14 * i}" width="10" height="10" fill="{color(i)}"/>')
        body.append(_text(x1 + 24, 45 + 14 * i, name[:24], 10))
    body.append(_text((x0 + x1) / 2, H - 8, f"run start (UTC) and commit, oldest first ({n} points)", 11, "middle"))
    return _svg("trend", W, H, body, title)
