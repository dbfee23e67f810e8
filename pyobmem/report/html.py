"""The HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched).

Sections: summary and warnings, the ranks of a distributed job (report/ranks.py), swap mode (the
budget, the peak resident bytes, swaps by cause, plans: report/swap.py), memory over time stacked by
block class (in swap mode with the resident bytes and the budget as lines), iterations, the access
map of one iteration, the idle-interval histogram, the swap saving curve, the top swap
candidates, the properties with their definitions, the environment.
"""

from __future__ import annotations

import time
from html import escape

import numpy as np

from .. import abi
from ..model import CLASSES, Analysis, analyse
from ..model.gpuclock import iteration_ns_gpu
from ..model.queries import block_end_times, cuda_span, drops_hint, live_bytes, resident_bytes
from ..units import format_bytes, format_duration, format_iteration
from . import svg
from .analysis import candidates, property_rows
from .swap import swap_facts

CLASS_COLOURS = {"persistent": "#4e79a7", "iteration-scoped": "#f28e2c", "transient": "#59a14f",
                 "arena": "#af7aa1", "never-accessed": "#bab0ab", "other": "#edc949"}
RESIDENT, BUDGET, BUDGET_EACH = "on the device (swap mode)", "budget", "budget (of each process)"
LINE_COLOURS = {RESIDENT: "#222222", BUDGET: "#e15759", BUDGET_EACH: "#e15759"}
CANDIDATES_NOTE = (
    "<p class=muted>The blocks the saving bound swaps, in the order it takes them (most peak saved per stall "
    "first); block+offset: a sub-block (tensor) inside a segment; from slowdown: the time ratio from which the "
    "bound takes it (the saving curve above); pyobmem plan: whether swap mode's planner may swap the block (whole) "
    "or why not. The bound is the model's ceiling, not a plan: it takes one "
    "iteration on its own, so a window across the iteration's end is taken on both sides (windows 2, each "
    "with its copies), it moves sub-blocks, and it buys peak with stalls. <code>pyobmem plan FILE --budget "
    "SIZE</code> is what swap mode would do: whole cuMemAlloc blocks of 4 MiB and more, the iteration taken "
    "as a cycle, the shim's copy queues and the host running ahead, windows kept only when they lower the "
    "peak; so for the same block it can show another window, another time out and no stall.</p>")
MAX_POINTS = 1200  # memory series samples
MAX_ROWS = 160  # access map rows
MAP_WIDTH = 1100

CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1160px;color:#222;line-height:1.4}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
th{background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.warn{background:#fff1f0;border:1px solid #e15759;padding:8px 12px;margin:8px 0;border-radius:4px}
.ok{color:#2d7d2d}.bad{color:#b3261e}.muted{color:#777}.grid{display:flex;gap:24px;flex-wrap:wrap}
.legend span{display:inline-block;margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
"""



def _table(head: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    h = "".join(f"<th>{escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{escape(str(c))}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _legend(names, line_names=()) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{CLASS_COLOURS.get(n, "#999")}"></i>{escape(n)}</span>' for n in names) + "".join(
        f'<span><i style="height:3px;vertical-align:3px;background:{LINE_COLOURS[n]}"></i>{escape(n)}</span>'
        for n in line_names) + "</div>"


def _swap_section(sw: dict) -> str:
    """Swap mode: the budget, what stayed on the device, the swaps by cause, the plans."""
    budget = "-" if sw["budget"] is None else str(sw["budget"])
    if sw["budget_bytes"] is not None and budget != format_bytes(sw["budget_bytes"]):
        budget += f" ({format_bytes(sw['budget_bytes'])})"
    rows = [["budget", budget]]
    if sw["peak_resident_bytes"] is not None:
        verdict = ""
        if sw["budget_bytes"]:
            verdict = (f"; over the budget for {format_duration(sw['over_budget_ns'])}" if sw["over_budget_ns"]
                       else "; within the budget")
        rows.append(["peak resident on the device", f"{format_bytes(sw['peak_resident_bytes'])} "
                     f"({sw['peak_resident_bytes']:,} B, pid {sw['peak_resident_pid']}){verdict}"])
    rows.append(["blocks never swapped", f"smaller than {format_bytes(sw['min_swap_bytes'])}"
                 if sw["min_swap_bytes"] else "-"])
    rows.append(["pinned host memory", format_bytes(sw["pinned_bytes"])])
    so, si, c = sw["swapped_out"], sw["swapped_in"], sw["swapped_in"]["by_cause"]
    rows.append(["swapped out", f"{format_bytes(so['bytes'])} in {so['count']:,} swap-outs of {so['blocks']:,} blocks"])
    for key, what in (("planned", "planned"), ("budget", "beyond the plan, for the budget"),
                      ("room", "for device memory (the driver had none for a map)")) if so.get("by_cause") else ():
        rows.append([f"swap-outs: {what}", f"{so['by_cause'][key]['count']:,} ({format_bytes(so['by_cause'][key]['bytes'])})"])
    rows.append(["swapped in", f"{format_bytes(si['bytes'])} in {si['count']:,} swap-ins"])
    for key, what in (("prefetch", "prefetch hits (planned, back in time)"),
                      ("late", "late prefetches (planned, not back when their op was issued: its stream waits for the "
                       "copy, a stall only where the GPU gets there first)"),
                      ("demand", "on demand (unplanned: copied in when their op was issued, its stream waits for it)")):
        rows.append([f"swap-ins: {what}", f"{c[key]['count']:,} ({format_bytes(c[key]['bytes'])})"])
    rows.append(["plans adopted / dropped", f"{sw['plans_adopted']:,} / {sw['plans_dropped']:,}"])
    note = ("<p class=muted>A plan is dropped when the launches stop matching the iteration it was made for; "
            "until the next one the shim keeps the budget by evicting the least recently used blocks and "
            "brings blocks back on demand. docs/swap.md explains the mechanism.</p>")
    return _table(["", ""], rows) + note


def memory_series(capture, a: Analysis, max_points: int = MAX_POINTS, span: tuple[int, int] | None = None):
    """(times, [(class, values)]) of live bytes per class over ``span`` ([start, end] ns; default
    the capture's CUDA span, from the first CUDA event), downsampled to at most ``max_points``
    samples: in each time bin, the instant of the highest total is kept, so peaks survive. The
    series starts at ``span``'s start (zero there for the whole capture) and holds its last value
    to the end."""
    blocks = capture.blocks
    times, total = live_bytes(blocks)
    if not len(times):
        return times, []
    s0, s1 = cuda_span(capture) if span is None else (int(span[0]), int(span[1]))
    inside = (times >= s0) & (times <= s1)
    times, total = times[inside], total[inside]
    if len(times) > max_points:
        edges = np.linspace(times[0], times[-1], max_points + 1)
        bin_of = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, max_points - 1)
        pick = []
        for b in np.unique(bin_of):
            idx = np.flatnonzero(bin_of == b)
            pick.append(idx[np.argmax(total[idx])])
        times = times[np.array(pick)]
    # Span the whole of ``span`` (a caching allocator allocates early and never frees, so the
    # last allocation can come long before the iterations): the value at its start (zero at the
    # first CUDA event, t = 0), the last value held to its end.
    times = np.unique(np.r_[s0, times, s1]).astype(np.int64)
    layers = []
    for cls in CLASSES:
        mask = a.block_class == cls
        if not mask.any():
            continue
        t, v = live_bytes(blocks, mask)
        pos = np.searchsorted(t, times, side="right") - 1
        layers.append((cls, np.where(pos >= 0, v[np.maximum(pos, 0)], 0)))
    return times, layers


def downsample_minmax(times: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS):
    """A step series cut to about ``2 * max_points`` samples: in each time bin the instants of the
    lowest and the highest value are kept, in time order, so peaks and dips survive."""
    if len(times) <= 2 * max_points:
        return times, values
    edges = np.linspace(times[0], times[-1], max_points + 1)
    bin_of = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, max_points - 1)
    starts = np.flatnonzero(np.r_[True, bin_of[1:] != bin_of[:-1]])
    lo = np.minimum.reduceat(values, starts)
    hi = np.maximum.reduceat(values, starts)
    pick = set()
    for s, e, vlo, vhi in zip(starts.tolist(), np.r_[starts[1:], len(values)].tolist(), lo.tolist(), hi.tolist()):
        seg = values[s:e]
        pick.add(s + int(np.flatnonzero(seg == vlo)[0]))
        pick.add(s + int(np.flatnonzero(seg == vhi)[0]))
    pick.add(len(times) - 1)
    idx = np.array(sorted(pick))
    return times[idx], values[idx]


def _iteration_chart(capture, a: Analysis, sw: dict | None) -> str:
    """The memory chart zoomed to the analysed iteration (the one of the access map, the saving
    curve and ``pyobmem stats``), with the resident bytes in swap mode."""
    w0, w1 = a.window
    t_s, layers = memory_series(capture, a, span=(w0, w1))
    lines = []
    if sw is not None:
        rt, rv = resident_bytes(capture)
        if len(rt):
            k = np.searchsorted(rt, w0, side="right") - 1
            keep = (rt > w0) & (rt <= w1)
            rt, rv = np.r_[w0, rt[keep]], np.r_[rv[max(k, 0)] if k >= 0 else 0, rv[keep]]
            lines.append((RESIDENT, LINE_COLOURS[RESIDENT], rt, rv, False))
        if sw["budget_bytes"]:
            lines.append((BUDGET, LINE_COLOURS[BUDGET], np.array([w0, w1]), np.array([sw["budget_bytes"]] * 2), True))
    which = format_iteration(a.iterations.step_number(a.saving.iteration), len(a.iterations.step_rows()))
    plot = svg.stacked_area(t_s, [(c, CLASS_COLOURS[c], v) for c, v in layers], lines=lines,
                            xtitle=f"time from the start of {which}")
    t0 = cuda_span(capture)[0]
    return (f"<h3>One iteration: {escape(which)}</h3><p class=muted>The same, zoomed to the analysed iteration "
            f"(t = {escape(format_duration(w0 - t0, significant=4))} to {escape(format_duration(w1 - t0, significant=4))} "
            f"from the first CUDA event; the one of the access map, the saving curve and <code>pyobmem stats</code>).</p>"
            + plot)


def access_map(capture, a: Analysis, width: int = MAP_WIDTH) -> str:
    """Blocks as rows (sorted by first access in the window), accesses as ticks, idle spans shaded."""
    w0, w1 = a.window
    T = w1 - w0
    blocks = capture.blocks
    end = block_end_times(capture)
    rows = []
    for r in np.flatnonzero((blocks["t_alloc"] < w1) & (end > w0)).tolist():
        t = a.accesses_of(r)
        t = t[(t >= w0) & (t < w1)]
        if len(t):
            rows.append((r, t))
    shown = len(rows)
    if len(rows) > MAX_ROWS:
        rows = sorted(rows, key=lambda rt: -int(blocks["size"][rt[0]]))[:MAX_ROWS]
    rows.sort(key=lambda rt: (int(rt[1][0]), rt[0]))
    rh = max(3, min(14, 640 // max(len(rows), 1)))
    left, top = 200, 8
    height = top + rh * len(rows) + 40
    f = svg.Frame(width, height, 0, T, 0, 1, left=left, top=top, bottom=40)
    tu, tname = svg.time_unit(T)
    xt = svg.nice_ticks(0, T / tu)
    f.axes([x * tu for x in xt], [f"{x:g}" for x in xt], [], [], f"time in iteration ({tname})")
    for i, (r, t) in enumerate(rows):
        y = top + i * rh
        colour = CLASS_COLOURS.get(a.block_class[r], "#999")
        la, le = max(int(blocks["t_alloc"][r]), w0) - w0, min(int(end[r]), w1) - w0
        x0, x1 = float(f.px(la)), float(f.px(le))
        label = f"block {capture.block_label(r)} {format_bytes(int(blocks['size'][r]))} {a.block_class[r]}"
        f.add(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="{rh - 1}" fill="#f0f0f0">'
              f'<title>{escape(label)}</title></rect>')
        full = a.accesses_of(r)
        k0 = np.searchsorted(full, w0)
        prev = full[k0 - 1] if k0 > 0 else None
        pts = np.r_[[prev] if prev is not None else [], t, [full[k0 + len(t)]] if k0 + len(t) < len(full) else []]
        for s, e in zip(pts[:-1], pts[1:]):  # idle spans, clipped to the window
            s, e = max(s, w0) - w0, min(e, w1) - w0
            if e > s:
                xs, xe = float(f.px(s)), float(f.px(e))
                if xe - xs >= 1:
                    f.add(f'<rect x="{xs:.1f}" y="{y}" width="{xe - xs:.1f}" height="{rh - 1}" fill="{colour}" '
                          f'opacity="0.22"><title>idle {escape(format_duration(e - s, significant=3))}</title></rect>')
        xs = np.unique(np.round(f.px(t - w0)).astype(int))
        f.add(f'<path d="{"".join(f"M{x} {y}v{rh - 1}" for x in xs.tolist())}" stroke="{colour}" stroke-width="1.5"/>')
        if rh >= 9:
            f.add(f'<text x="{left - 4}" y="{y + rh - 2}" text-anchor="end" font-size="{min(rh - 1, 11)}" '
                  f'font-family="system-ui,sans-serif">{escape(label[: 34])}</text>')
    note = (f"<p class=muted>{len(rows)} of {shown} blocks accessed in this iteration shown (the largest).</p>"
            if shown > len(rows) else "")
    return f.svg("access map") + note


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


def _mapping_text(value, empty: str) -> str:
    """``k=v, ...`` of a metadata mapping; other JSON values (a capture edited by hand) as they are."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or empty
    if value in (None, "", [], {}):
        return empty
    return str(value)


def command_text(meta) -> str:
    """The traced command from the capture metadata (``command``, else ``argv``), any JSON types."""
    command = meta.get("command") if isinstance(meta, dict) else None
    if command not in (None, ""):
        return command if isinstance(command, str) else str(command)
    argv = meta.get("argv") if isinstance(meta, dict) else None
    if isinstance(argv, list) and argv:
        return " ".join(str(a) for a in argv)
    if isinstance(argv, str) and argv:
        return argv
    return "?"


def _environment(capture) -> str:
    meta = capture.meta if isinstance(capture.meta, dict) else {}
    rows = []
    for pid in sorted(capture.notes):
        notes = capture.notes[pid]
        n_dev = int(notes.get(abi.NOTE_DEVICE_COUNT, "0") or 0)
        for d in range(max(n_dev, 1)):
            name = notes.get(f"{abi.NOTE_DEVICE}{d}.name")
            if name:
                total = notes.get(f"{abi.NOTE_DEVICE}{d}.total_bytes")
                cc = notes.get(f"{abi.NOTE_DEVICE}{d}.cc", "?")
                mem = format_bytes(int(total)) if total and total.isdigit() else "?"
                rows.append([f"pid {pid}: GPU {d}", f"{name}, {mem}, compute capability {cc}"])
        for key in (abi.NOTE_DRIVER_VERSION, abi.NOTE_CUPTI):
            if key in notes:
                rows.append([f"pid {pid}: {key}", notes[key]])
        for key in sorted(k for k in notes if k == abi.NOTE_SWAP or k.startswith(abi.NOTE_SWAP + ".")):
            rows.append([f"pid {pid}: {key}", notes[key]])
        unhooked = [k for k in notes if k.startswith(abi.NOTE_UNHOOKED)]
        if unhooked:
            rows.append([f"pid {pid}: unhooked", ", ".join(notes[k] for k in unhooked)])
    for p in capture.processes:
        if not any(str(int(p["pid"])) in r[0] and "driver" in r[0] for r in rows):
            rows.append([f"pid {int(p['pid'])}: driver (process record)", str(int(p["driver_version"]))])
        rows.append([f"pid {int(p['pid'])}: launches attributed from",
                     "CUPTI" if int(p["source"]) == abi.LaunchSource.CUPTI else "shim hooks"])
    rows.append(["allocator settings", _mapping_text(meta.get("env"), "none set")])
    rows.append(["presets applied", _mapping_text(meta.get("presets"), "none")])
    for key in ("hostname", "pyobmem_version", "start_time_iso", "cwd"):
        if key in meta:
            rows.append([key, str(meta[key])])
    return _table(["what", "value"], rows)


def render(capture, generated: str | None = None, ranks: str | None = None, subject: str | None = None) -> str:
    """The report of ``capture`` as one HTML string. ``ranks``: the body of a Ranks section (after the
    summary; pyobmem.report.ranks), ``subject``: what ``capture`` is ("rank 0"), said in the title line."""
    a = analyse(capture, progress=False)
    blocks, ops = capture.blocks, capture.ops
    t0, t1 = cuda_span(capture)
    times, total = live_bytes(blocks)
    peak = int(total.max()) if len(total) else 0
    n_opaque = int((ops["flags"][ops["type"] == abi.Ev.LAUNCH] & abi.LaunchFlag.OPAQUE != 0).sum())
    command = command_text(capture.meta)
    about = f"{escape(subject)} of " if subject else ""
    parts = [f"<h1>pyobmem report</h1><p class=muted>{about}{escape(capture.path)} · {escape(command)} · "
             f"generated {escape(generated or time.strftime('%Y-%m-%d %H:%M:%S'))}</p>"]

    warnings = []
    if capture.dropped:
        warnings.append(f"{capture.dropped} events were dropped: allocations, frees or accesses are missing, "
                        f"and what follows undercounts them. To avoid it, {drops_hint(capture.meta)}.")
    n_corrupt = int(getattr(capture, "corrupt_records", 0))
    if n_corrupt:
        warnings.append(f"The capture has {n_corrupt} corrupt records (impossible times or sizes); they were "
                        f"left out.")
    if not capture.complete:
        warnings.append("The capture has no end record: the traced process or the daemon was killed; "
                        "it is read up to its last whole record.")
    if len(capture.untracked):
        warnings.append(f"{len(capture.untracked)} frees or unmaps of addresses never seen allocated "
                        f"(allocated before tracing, or outside the hooked calls).")
    if n_opaque:
        warnings.append(f"{n_opaque} launches are opaque (their touched blocks may be incomplete); "
                        f"the blocks they may touch are never swapped.")
    parts += [f'<div class="warn">{escape(w)}</div>' for w in warnings]

    n_iter = len(a.iteration_windows)  # the template-following ones, which the model analyses
    n_steps = len(a.iterations.step_rows())
    found = "-" if not n_steps else f"{n_steps} ({n_steps - n_iter} deviating from the template)" if n_steps > n_iter else n_steps
    stats = [
        ["duration (first to last CUDA event)", format_duration(t1 - t0, significant=3)],
        ["processes", len(capture.processes)], ["blocks", len(blocks)],
        ["kernel launches, copies, sets", len(ops)], ["accesses", len(capture.accesses)],
        ["peak live bytes", format_bytes(peak)], ["bytes never freed", format_bytes(int(blocks["size"][blocks["t_free"] < 0].sum()))],
        ["dropped events", capture.dropped], ["complete", "yes" if capture.complete else "no"],
        ["exit status", "?" if capture.exit_status is None else capture.exit_status],
        ["iterations found", found],
    ]
    for cls in CLASSES:
        m = a.block_class == cls
        if m.any():
            stats.append([f"{cls} blocks (bytes summed over the run)", f"{int(m.sum())} ({format_bytes(int(blocks['size'][m].sum()))})"])
    tm = a.tensors
    if tm is not None and np.any(tm.refined):
        stats.append(["sub-blocks (tensors in segments)", f"{len(tm)} in {len(np.unique(tm.block))} blocks"])
        for i, cls in enumerate(CLASSES):
            m = tm.cls == i
            if m.any():
                stats.append([f"{cls} sub-blocks (bytes summed over the run)", f"{int(m.sum())} ({format_bytes(int(tm.size[m].sum()))})"])
    sw = swap_facts(capture)
    if sw is not None and sw["peak_resident_bytes"] is not None:
        stats.insert(6, ["peak resident bytes (swap mode: live minus swapped out)", format_bytes(sw["peak_resident_bytes"])])
    parts.append(_section("Summary", _table(["", ""], stats, {1}), "summary"))
    if ranks is not None:
        parts.append(_section("Ranks", ranks, "ranks"))
    if sw is not None:
        parts.append(_section("Swap mode", _swap_section(sw), "swap"))

    t_s, layers = memory_series(capture, a)
    if len(t_s):
        marks = [tuple(x) for x in a.iteration_windows.tolist()][:: max(1, n_iter // 50)][:50] if n_iter else []
        lines, names = [], [c for c, _ in layers]
        if sw is not None:
            rt, rv = downsample_minmax(*resident_bytes(capture))
            if len(rt):
                lines.append((RESIDENT, LINE_COLOURS[RESIDENT], rt, rv, False))
            if sw["budget_bytes"]:
                name = BUDGET if len(np.unique(blocks["pid"])) <= 1 else BUDGET_EACH
                lines.append((name, LINE_COLOURS[BUDGET], np.array([t_s[0], t_s[-1]]),
                              np.array([sw["budget_bytes"]] * 2), True))
        plot = svg.stacked_area(t_s, [(c, CLASS_COLOURS[c], v) for c, v in layers], marks=marks,
                                xtitle="time from the first CUDA event", lines=lines)
        body = _legend(names, [name for name, *_ in lines]) + plot
        if n_iter:
            body += "<p class=muted>Shaded: detected iterations (every one up to 50).</p>"
        if lines:
            body += ("<p class=muted>Areas: live (allocated) bytes by block class; a block swapped out to host "
                     "memory still counts there. Line: the bytes resident on the device (live minus swapped "
                     "out), which swap mode keeps under the budget (dashed).</p>")
    else:
        body = "<p>No allocation was recorded.</p>"
    if a.window is not None and len(t_s):
        body += _iteration_chart(capture, a, sw)
    parts.append(_section("Memory over time, by block class", body, "memory"))

    if n_iter:
        lens = a.iteration_windows[:, 1] - a.iteration_windows[:, 0]
        gpu_ns = iteration_ns_gpu(capture, a.iterations)
        it_body = _table(["", ""], [
            ["iterations", found], ["ops per iteration", a.iteration_ops],
            ["iteration time (median)", format_duration(float(np.median(lens)), significant=3)
             + ("" if gpu_ns is None else f" host, {format_duration(gpu_ns, significant=3)} GPU clock")],
            ["iteration time (min / max)",
             f"{format_duration(float(lens.min()), significant=3)} / {format_duration(float(lens.max()), significant=3)}"],
            ["first iteration starts", f"t = {format_duration(int(a.iteration_windows[0, 0]) - t0, significant=3)} (t = 0 at the first CUDA event)"],
            ["analysed iteration", "-" if a.window is None else f"{format_iteration(a.iterations.step_number(a.saving.iteration), n_steps)}, "
                                   f"{format_duration(a.window[1] - a.window[0], significant=3)}, peak {format_bytes(a.saving.peak_bytes)} live"],
        ], {1})
    else:
        it_body = ("<p class=bad><b>No iteration was found</b>: the sequence of kernel launches does not repeat "
                   "(too short a run, or not a training loop). The access map, the saving curve and the swap "
                   "candidates need iterations; memory over time and the statistics above do not.</p>")
    parts.append(_section("Iterations", it_body, "iterations"))

    if a.window is not None:
        parts.append(_section("Access map of one iteration", _legend(
            [c for c in CLASSES if (a.block_class == c).any()]) + access_map(capture, a)
            + "<p class=muted>Rows: blocks, in order of first access. Ticks: accesses at their launch "
              "times (the host may launch a whole step ahead of the GPU and then wait for it). Shaded: "
              "idle intervals. Grey: the block is allocated.</p>", "access-map"))

    idle = np.diff(a.blocks.acc_t)
    same_block = np.ones(len(idle), bool)
    if len(idle):
        starts = a.blocks.acc_ptr[1:-1]
        same_block[starts[(starts > 0) & (starts <= len(idle))] - 1] = False
    idle = idle[same_block & (idle > 0)].astype(np.float64)
    hist = svg.histogram_log(idle, width=1100, xtitle="idle interval (time between consecutive accesses of a block)")
    parts.append(_section("Idle intervals", hist + f"<p class=muted>{len(idle)} idle intervals over all blocks, "
                          f"log-spaced bins, log counts.</p>", "idle"))

    if a.window is not None:
        pts = np.array(a.saving.points, dtype=np.float64).reshape(-1, 2)
        ratio, saved, peak_bytes = pts[:, 0], pts[:, 1].astype(np.int64), int(a.saving.peak_bytes)
        curve = svg.line_plot(ratio, saved.astype(np.float64), width=600,
                              xtitle="time ratio (iteration time with swapping / without)")
        rows = [[f"{r:g}x", format_bytes(int(s)), f"{100 * s / peak_bytes:.1f}%" if peak_bytes else "-"]
                for r, s in zip(ratio.tolist(), saved.tolist())]
        body = (f'<div class=grid><div>{curve}</div><div>{_table(["time ratio", "peak saved", "of peak"], rows, {1, 2})}'
                f"</div></div><p class=muted>Peak device memory of the analysed iteration that swapping idle blocks "
                f"to host memory could save, if the iteration may run that much longer (pyobmem.model's saving "
                f"bound, copies at {a.saving.bandwidth / 1e9:g} GB/s each way), "
                + ("on the GPU clock (the shim's GPU time samples)." if a.saving.clock == "gpu" else
                   "on an estimated GPU clock (the capture has no GPU time samples).") + "</p>")
        parts.append(_section("Saving curve", body, "saving"))
        cand = [[f'{c["block"]}+{format_bytes(c["offset"])}' if c["sub"] else c["block"], format_bytes(c["size"]),
                 c["class"], c["accesses"], format_duration(c["longest_idle_ns"], significant=3), c["windows"],
                 format_duration(c["out_ns"], significant=3), format_duration(c["copy_ns"], significant=3),
                 format_duration(c["stall_ns"], significant=3) if c["stall_ns"] else "none", f'{c["from_ratio"]:.2f}x',
                 c["plan"]]
                for c in candidates(a)]
        body = (_table(["block", "size", "class", "accesses / iteration", "longest idle", "windows",
                        "out of device in the iteration", "copy out + in", "stall", "from slowdown", "pyobmem plan"], cand,
                       {1, 3, 4, 5, 6, 7, 8, 9}) if cand
                else "<p>No block is worth swapping in this iteration.</p>")
        parts.append(_section("Top swap candidates", body + CANDIDATES_NOTE, "candidates"))

    prow = []
    for p in property_rows(a.properties):
        state = "not measured" if p.holds is None else ("holds" if p.holds else "does not hold")
        cls = "muted" if p.holds is None else ("ok" if p.holds else "bad")
        val = "-" if p.value is None else f"{p.value:.3f}"
        prow.append(f'<tr><td><b>{escape(p.name)}</b></td><td class="{cls}">{state}</td><td class=n>{val}</td>'
                    f"<td>{escape(p.definition)}<br><span class=muted>{escape(p.detail)}</span></td></tr>")
    body = ("<table><tr><th>property</th><th></th><th>value</th><th>definition</th></tr>" + "".join(prow) + "</table>")
    if not n_iter:
        body += "<p class=muted>The properties are measured over iterations; none was found.</p>"
    parts.append(_section("Properties", body, "properties"))
    parts.append(_section("Environment", _environment(capture), "environment"))
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>pyobmem report</title>"
            f"<style>{CSS}</style></head><body>" + "".join(parts) + "</body></html>")
