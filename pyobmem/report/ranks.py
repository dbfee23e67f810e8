"""The report's Ranks section: every rank of the captures side by side (pyobmem.ranks).

A table (one row per rank: processes, GPU, peak live bytes, blocks, launches, attributed and opaque
shares, iteration time, NCCL calls, bytes and blocks) and each rank's live device bytes over
time, one line per rank, each from its own first CUDA event.
"""

from __future__ import annotations

from html import escape

import numpy as np

from ..model.queries import cuda_span, live_bytes
from ..ranks import rank_figures, table_rows
from ..units import format_bytes
from . import svg

COLOURS = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949", "#af7aa1", "#ff9da7", "#9c755f",
           "#bab0ab"]
MAX_POINTS = 600  # per rank


def _series(cap, max_points: int = MAX_POINTS):
    """(times from the first CUDA event, live bytes) of one rank, the highest value of each bin kept."""
    t, v = live_bytes(cap.blocks)
    if not len(t):
        return t, v
    t0, t1 = cuda_span(cap)
    t, v = np.r_[t0, t, t1], np.r_[0, v, v[-1]]
    if len(t) > max_points:
        edges = np.linspace(t[0], t[-1], max_points + 1)
        bins = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
        keep = [idx[np.argmax(v[idx])] for idx in np.split(np.arange(len(t)), np.flatnonzero(np.diff(bins)) + 1)]
        keep = sorted(set(keep) | {0, len(t) - 1})
        t, v = t[keep], v[keep]
    return t - t0, v


def memory_plot(views, width: int = 1100, height: int = 280) -> str:
    """Live bytes over time, one step line per (label, capture)."""
    series = [(label, *_series(cap)) for label, cap in views]
    series = [(label, t, v) for label, t, v in series if len(t)]
    if not series:
        return "<p>No allocation was recorded.</p>"
    span = max(float(t[-1]) for _, t, _ in series) or 1.0
    ymax = max(float(v.max()) for _, _, v in series) or 1.0
    yt, uname, unit = svg.bytes_ticks(ymax)
    tu, tname = svg.time_unit(span)
    f = svg.Frame(width, height, 0, span, 0, yt[-1] if yt[-1] > 0 else 1)
    xt = svg.nice_ticks(0, span / tu)
    f.axes([x * tu for x in xt], [f"{x:g}" for x in xt], yt, [f"{y / unit:g}" for y in yt],
           f"time from the rank's first CUDA event ({tname})", uname)
    legend = []
    for i, (label, t, v) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        xs, ys = f.px(t), f.py(v)
        pts = [f"{xs[0]:.1f},{ys[0]:.1f}"]
        for k in range(1, len(xs)):  # steps: hold the value until the next change
            pts += [f"{xs[k]:.1f},{ys[k - 1]:.1f}", f"{xs[k]:.1f},{ys[k]:.1f}"]
        f.add(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(pts)}">'
              f"<title>{escape(label)}: peak {escape(format_bytes(int(v.max())))}</title></polyline>")
        legend.append(f'<span><i style="background:{colour}"></i>{escape(label)}</span>')
    return '<div class="legend">' + "".join(legend) + "</div>" + f.svg("live bytes per rank")


def section(views, analysed: str) -> str:
    """The body of the Ranks section for ``views`` ((pyobmem.ranks.Rank or None, capture) pairs, as
    pyobmem.ranks.rank_views gives); ``analysed`` says which one the rest of the report is about."""
    rows = [rank_figures(cap, r, file=cap.path) for r, cap in views]
    files = {row["file"] for row in rows}
    headers, cells = table_rows(rows, with_file=len(files) > 1)
    numeric = {4, 5, 6, 7, 8, 9, 10, 11, 12}
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{escape(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in cells)
    n_ranks = sum(r is not None for r, _ in views)
    parts = [f"<p>{n_ranks} ranks in {len(files)} capture{'s' if len(files) != 1 else ''}; each rank's processes "
             f"alone (the rank's own process and the processes it started). The sections below analyse "
             f"{escape(analysed)}.</p>", f"<table><tr>{head}</tr>{body}</table>"]
    peaks = [(row["peak_live_bytes"], row["rank"]) for row in rows if row["rank"] is not None]
    if len(peaks) > 1:
        (lo, r_lo), (hi, r_hi) = min(peaks), max(peaks)
        parts.append(f"<p class=muted>Peak live bytes from {escape(format_bytes(lo))} (rank {r_lo}) to "
                     f"{escape(format_bytes(hi))} (rank {r_hi}). NCCL calls: the collectives and point-to-point "
                     f"calls the rank made; NCCL blocks: the blocks they named (never swapped in swap mode).</p>")
    labels = [("?" if r is None else r.label) + ("" if len(files) == 1 else f" ({cap.path.rsplit('/', 1)[-1]})")
              for r, cap in views]
    parts.append(memory_plot(list(zip(labels, [cap for _, cap in views]))))
    return "".join(parts)
