"""Small inline-SVG plots for the HTML report: no library, no network, text escaped.

A ``Frame`` maps data to pixels inside margins and draws axes with ticks; the plot functions
return one ``<svg>`` string each.
"""

from __future__ import annotations

import math
from html import escape

import numpy as np

from ..units import BYTE_UNITS, DURATION_UNITS, format_duration

FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    last = math.ceil(hi / step - 1e-9) * step  # the last tick covers hi
    return [first + i * step for i in range(int(round((last - first) / step)) + 1)]


def bytes_ticks(hi: float, n: int = 5) -> tuple[list[float], str, float]:
    """Ticks for a byte axis in a binary unit: (ticks in bytes, unit name, unit)."""
    unit, name = 1, "B"
    for nm, u in reversed(BYTE_UNITS[1:]):
        if hi >= u:
            unit, name = u, nm
            break
    return [t * unit for t in nice_ticks(0, hi / unit, n)], name, unit


def time_unit(span_ns: float) -> tuple[float, str]:
    """(ns per unit, unit name) suited to a span."""
    for nm, u in reversed(DURATION_UNITS[1:]):
        if span_ns >= 2 * u:
            return u, nm
    return 1.0, "ns"


class Frame:
    """Pixel mapping of a plot area: x in [x0, x1], y in [y0, y1] (log axes optional)."""

    def __init__(self, width, height, x0, x1, y0, y1, left=70, right=20, top=14, bottom=40, logx=False, logy=False):
        self.w, self.h = width, height
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.logx, self.logy = logx, logy
        self.x0, self.x1, self.y0, self.y1 = x0, x1 if x1 > x0 else x0 + 1, y0, y1 if y1 > y0 else y0 + 1
        self.parts: list[str] = []

    def _t(self, v, lo, hi, log):
        if log:
            v, lo, hi = np.log10(np.maximum(v, 1e-300)), math.log10(lo), math.log10(hi)
        return (np.asarray(v, np.float64) - lo) / (hi - lo)

    def px(self, x):
        return self.left + self._t(x, self.x0, self.x1, self.logx) * (self.w - self.left - self.right)

    def py(self, y):
        return self.h - self.bottom - self._t(y, self.y0, self.y1, self.logy) * (self.h - self.top - self.bottom)

    def add(self, s: str) -> None:
        self.parts.append(s)

    def axes(self, xticks, xlabels, yticks, ylabels, xtitle="", ytitle="") -> None:
        bx, by = self.left, self.h - self.bottom
        for t, lab in zip(yticks, ylabels):
            y = float(self.py(t))
            self.add(f'<line x1="{bx}" y1="{y:.1f}" x2="{self.w - self.right}" y2="{y:.1f}" stroke="#e3e3e3"/>')
            self.add(f'<text x="{bx - 4}" y="{y + 4:.1f}" text-anchor="end" {FONT}>{escape(lab)}</text>')
        for t, lab in zip(xticks, xlabels):
            x = float(self.px(t))
            self.add(f'<line x1="{x:.1f}" y1="{by}" x2="{x:.1f}" y2="{by + 4}" stroke="#555"/>')
            self.add(f'<text x="{x:.1f}" y="{by + 16}" text-anchor="middle" {FONT}>{escape(lab)}</text>')
        self.add(f'<line x1="{bx}" y1="{by}" x2="{self.w - self.right}" y2="{by}" stroke="#555"/>')
        self.add(f'<line x1="{bx}" y1="{self.top}" x2="{bx}" y2="{by}" stroke="#555"/>')
        if xtitle:
            self.add(f'<text x="{(bx + self.w - self.right) / 2:.0f}" y="{self.h - 6}" text-anchor="middle" '
                     f'{FONT}>{escape(xtitle)}</text>')
        if ytitle:
            self.add(f'<text x="12" y="{(self.top + by) / 2:.0f}" text-anchor="middle" {FONT} '
                     f'transform="rotate(-90 12 {(self.top + by) / 2:.0f})">{escape(ytitle)}</text>')

    def svg(self, label: str) -> str:
        return (f'<svg width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}" role="img" aria-label="{escape(label)}">'
                + "".join(self.parts) + "</svg>")


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e4 else f"{v:.3g}"


def stacked_area(t_ns: np.ndarray, layers: list[tuple[str, str, np.ndarray]], width=1100, height=300,
                 marks: list[tuple[float, float]] | None = None, xtitle: str = "time",
                 lines: list[tuple[str, str, np.ndarray, np.ndarray, bool]] | None = None) -> str:
    """Stacked step areas: ``layers`` are (name, colour, values at t_ns); ``marks`` shade spans;
    x is the time from ``t_ns[0]``. ``lines``: step lines over the areas, (name, colour, times in
    the same clock as ``t_ns``, values, dashed)."""
    total = np.sum([v for _, _, v in layers], axis=0) if layers else np.zeros(len(t_ns))
    ymax = float(total.max()) if len(total) else 1.0
    for _, _, _, v, _ in lines or []:
        if len(v):
            ymax = max(ymax, float(np.max(v)))
    yt, uname, unit = bytes_ticks(max(ymax, 1))
    t0 = float(t_ns[0]) if len(t_ns) else 0.0
    span = float(t_ns[-1] - t0) if len(t_ns) > 1 else 1.0
    tu, tname = time_unit(span)
    f = Frame(width, height, 0, span, 0, yt[-1] if yt[-1] > 0 else 1)
    xt = nice_ticks(0, span / tu)
    f.axes([x * tu for x in xt], [_fmt(x) for x in xt], yt, [_fmt(y / unit) for y in yt],
           f"{xtitle} ({tname})", uname)
    for s, e in marks or []:
        x0, x1 = float(f.px(s - t0)), float(f.px(e - t0))
        f.add(f'<rect x="{x0:.1f}" y="{f.top}" width="{max(x1 - x0, 0.5):.1f}" height="{f.h - f.top - f.bottom}" '
              f'fill="#fff3c4" opacity="0.6"/>')
    base = np.zeros(len(t_ns))
    xs = f.px(t_ns - t0)
    for name, colour, v in layers:
        top = base + v
        # step path: hold each value until the next time
        xx = np.repeat(xs, 2)[1:]
        xx = np.r_[xx, xs[-1]] if len(xs) else xx
        up = np.repeat(f.py(top), 2)
        lo = np.repeat(f.py(base), 2)
        pts = [f"{x:.1f},{y:.1f}" for x, y in zip(xx, up)] + [f"{x:.1f},{y:.1f}" for x, y in zip(xx[::-1], lo[::-1])]
        f.add(f'<polygon points="{" ".join(pts)}" fill="{colour}" stroke="none"><title>{escape(name)}</title></polygon>')
        base = top
    for name, colour, t, v, dashed in lines or []:
        keep = (t >= t0) & (t <= t0 + span)
        t, v = np.asarray(t, np.float64)[keep], np.asarray(v, np.float64)[keep]
        if not len(t):
            continue
        xs, ys = f.px(t - t0), f.py(v)
        d = f"M{xs[0]:.1f} {ys[0]:.1f}" + "".join(f"H{x:.1f}V{y:.1f}" for x, y in zip(xs[1:].tolist(), ys[1:].tolist()))
        d += f"H{float(f.px(span)):.1f}"  # the last value holds to the end
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        f.add(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}><title>{escape(name)}</title></path>')
    return f.svg("memory over time")


def histogram_log(values: np.ndarray, width=540, height=260, xtitle="", bins_per_decade=4) -> str:
    """Histogram of positive ``values`` on log-spaced bins; counts on a log axis."""
    v = values[values > 0]
    if not len(v):
        return '<p class="muted">No idle interval to show.</p>'
    lo = 10 ** math.floor(math.log10(v.min()))
    hi = 10 ** math.ceil(math.log10(v.max()) + 1e-12)
    edges = np.logspace(math.log10(lo), math.log10(hi), int(round(math.log10(hi / lo))) * bins_per_decade + 1)
    counts, _ = np.histogram(v, edges)
    cmax = max(int(counts.max()), 1)
    ytop = 10 ** math.ceil(math.log10(cmax) + 1e-12) if cmax > 1 else 10
    f = Frame(width, height, lo, hi, 0.8, ytop, logx=True, logy=True)
    xt = [10 ** k for k in range(int(math.log10(lo)), int(math.log10(hi)) + 1)]
    yt = [10 ** k for k in range(0, int(math.log10(ytop)) + 1)]
    f.axes(xt, [format_duration(x, significant=3) for x in xt], yt, [_fmt(y) for y in yt], xtitle, "count")
    for c, a, b in zip(counts, edges[:-1], edges[1:]):
        if c:
            x0, x1, y = float(f.px(a)), float(f.px(b)), float(f.py(c))
            f.add(f'<rect x="{x0 + 0.5:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 1, 0.5):.1f}" '
                  f'height="{f.h - f.bottom - y:.1f}" fill="#4e79a7"><title>{format_duration(a, significant=3)}–'
                  f'{format_duration(b, significant=3)}: {c}</title></rect>')
    return f.svg("idle interval histogram")


def line_plot(x: np.ndarray, y: np.ndarray, width=540, height=260, xtitle="", ybytes=True) -> str:
    """A line with point markers; y in bytes."""
    ymax = float(max(y.max(), 1)) if len(y) else 1.0
    yt, uname, unit = bytes_ticks(ymax)
    f = Frame(width, height, float(x.min()), float(x.max()), 0, yt[-1] if yt[-1] > 0 else 1)
    xt = nice_ticks(float(x.min()), float(x.max()))
    f.axes(xt, [_fmt(t) for t in xt], yt, [_fmt(t / unit) for t in yt], xtitle, f"peak saved ({uname})")
    xs, ys = f.px(x), f.py(y)
    f.add('<polyline fill="none" stroke="#e15759" stroke-width="2" points="'
          + " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(xs, ys)) + '"/>')
    for a, b, xv, yv in zip(xs, ys, x, y):
        f.add(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="#e15759"><title>{xv:g}x: {yv / unit:.2f} {uname}'
              f'</title></circle>')
    return f.svg("saving curve")
