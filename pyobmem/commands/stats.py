"""``pyobmem stats FILE``: the pattern model of a capture in tables: iterations and their period,
the properties iterative / regular / extremal, blocks by class, the largest blocks, the swap
saving bound (``--json``: the same as a dict).

``stats_dict(analysis) -> dict`` does the computation (tests and other reporters reuse it);
``format_stats`` turns it into text.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..model import CLASSES, analyse, blocks_by_class
from ..model.gpuclock import clock_facts
from ..model.properties import in_iteration_intervals
from ..model.queries import cuda_span, drops_hint
from ..units import format_bytes, format_duration, format_iteration
from .common import TIME_ORIGIN, count, load, positive_float

NAME = "stats"
NO_ITERATION = "no iteration was found"
MAX_LISTED_ITERATIONS = 10_000


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="iterations, access-pattern properties, blocks by class, swap saving bound",
        description="Analyse a capture: the training iterations found in the launch stream, the "
        "properties iterative / regular / extremal, blocks by class, the largest blocks and the "
        "device memory swapping could save at a given slowdown.",
    )
    p.add_argument("capture", metavar="FILE", help="a .pyobmem capture")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--top", type=count, default=10, metavar="N", help="largest blocks to list (default 10)")
    p.add_argument("--bandwidth", type=positive_float, default=None, metavar="B/s",
                   help="host<->device copy bandwidth for the saving bound, bytes/s each way "
                   "(default: the capture's, else 55e9)")
    return p


def run(args) -> int:
    a = analyse(load(args.capture), bandwidth=args.bandwidth)
    d = stats_dict(a, top=args.top)
    print(json.dumps(d, indent=2, sort_keys=True) if args.json else format_stats(d))
    return 0


# --- computation -----------------------------------------------------------------------------


def origin_ns(cap) -> int:
    """The time of the first CUDA event of the capture (ns): t = 0 of the output (as in the
    summary, whose duration runs from it to the last CUDA event)."""
    return cuda_span(cap)[0]


def drops_dict(cap) -> dict:
    """How many events were lost, and where: time range (ns from the origin) and op indices."""
    t0 = origin_ns(cap)
    out = {"dropped": int(cap.dropped), "records": int(len(cap.drops)),
           "hint": drops_hint(cap.meta) if cap.dropped else None}
    if len(cap.drops):
        ts = cap.drops["ts_ns"].astype(np.int64)
        ops_at = np.searchsorted(cap.ops["ts_ns"], ts) if len(cap.ops) else np.zeros(len(ts), np.int64)
        out.update({
            "first_ns": int(ts.min() - t0), "last_ns": int(ts.max() - t0),
            "first_op": int(ops_at.min()), "last_op": int(ops_at.max()),
            "where": [{"t_ns": int(t - t0), "op": int(o), "pid": int(p), "count": int(c)}
                      for t, o, p, c in zip(ts[:20], ops_at[:20], cap.drops["pid"][:20], cap.drops["count"][:20])],
        })
    return out


def _round(x, n=4):
    return None if x is None else round(float(x), n)


def _props(pr) -> dict:
    return {
        "level": pr.level,
        "iterative_blocks": _round(pr.iterative_blocks), "iterative_bytes": _round(pr.iterative_bytes),
        "iterative_intervals": _round(pr.iterative_intervals),
        "regular": _round(pr.regular), "regular_ops": _round(pr.regular_ops),
        "extremal_top10_share": _round(pr.extremal_top), "extremal_gini": _round(pr.extremal_gini),
        "intervals": pr.n_intervals,
    }


def stats_dict(a, top: int = 10) -> dict:
    """Everything ``stats`` shows, as JSON values (sizes B, times ns from the capture's origin;
    blocks named ``pid:id`` as in every verb, ``row``: the capture row; ``blocks_by_class``: whole
    allocations, ``sub_blocks_by_class``: tensors, byte totals summed over the run)."""
    cap, it, bm, pr = a.capture, a.iterations, a.blocks, a.properties
    t0 = origin_ns(cap)
    main = it.main_regime
    regimes = []
    for i, r in enumerate(it.regimes):
        rows = np.flatnonzero(it.regime == i)
        regimes.append({
            "period_ops": r.period_ops, "micro_period_ops": r.micro_period_ops, "micro_steps": r.micro_steps,
            "iterations": r.count, "deviating": r.deviating, "confidence": _round(r.confidence), "phase": r.phase,
            "main": i == it.main,
            "first_op": int(it.start_op[rows[0]]), "end_op": int(it.end_op[rows[-1]]),
            "start_ns": int(it.t_start[rows[0]] - t0), "end_ns": int(it.t_end[rows[-1]] - t0),
            "iteration_ns": int(np.median(it.t_end[rows] - it.t_start[rows])),
        })
    iterations = [
        {"regime": int(g), "start_op": int(s), "end_op": int(e), "start_ns": int(ts - t0), "end_ns": int(te - t0),
         "match": _round(m), "ops": int(q - p), "deviating": bool(d)}
        for g, s, e, ts, te, m, p, q, d in zip(it.regime[:MAX_LISTED_ITERATIONS], it.start_op, it.end_op, it.t_start,
                                               it.t_end, it.match, it.start_seq, it.end_seq, it.deviating)
    ]
    # Largest blocks, with the longest idle interval inside an iteration as a share of it.
    iv = bm.intervals
    longest = np.zeros(len(bm), np.int64)
    m = in_iteration_intervals(it, bm)
    if np.any(m):
        np.maximum.at(longest, iv.block[m], iv.ns[m])
    ref = it.iteration_ns
    order = np.lexsort((np.arange(len(bm)), -bm.size))[:top]
    top_blocks = [{
        "block": cap.block_label(r), "row": int(r), "block_id": int(cap.blocks["block_id"][r]),
        "pid": int(cap.blocks["pid"][r]),
        "size": int(bm.size[r]), "class": CLASSES[int(bm.cls[r])],
        "lifetime_iterations": None if np.isnan(bm.lifetime_iters[r]) else _round(bm.lifetime_iters[r], 2),
        "accesses": int(bm.n_accesses[r]),
        "longest_idle_share": _round(longest[r] / ref) if ref else None,
    } for r in order]
    return {
        "capture": {"path": cap.path, "complete": cap.complete, "ops": int(len(cap.ops)), "blocks": int(len(bm)),
                    "accesses": int(len(cap.accesses)), "corrupt_records": int(getattr(cap, "corrupt_records", 0))},
        "time_origin": TIME_ORIGIN, "origin_monotonic_ns": int(t0),
        "drops": drops_dict(cap),
        "pid": it.pid,
        "iterations_found": it.count,
        "deviating_iterations": it.n_deviating,
        "message": None if main else NO_ITERATION,
        "period_ops": main.period_ops if main else None,
        "micro_period_ops": main.micro_period_ops if main else None,
        "micro_steps": main.micro_steps if main else None,
        "iteration_ns": int(it.iteration_ns) if main else None,
        "gpu_clock": clock_facts(cap, it),
        "regimes": regimes,
        "iterations": iterations,
        "properties": _props(pr),
        "segment_properties": _props(pr.segment) if pr.segment is not None else None,
        "sub_blocks_by_class": blocks_by_class(a.tensors if a.tensors is not None else bm),
        "blocks_by_class": blocks_by_class(bm),
        "sub_blocks": int(len(a.tensors)) if a.tensors is not None else None,
        "peak_live_bytes": int(bm.peak_live_bytes),
        "top_blocks": top_blocks,
        "saving": None if a.saving is None else {
            "bandwidth": a.saving.bandwidth, "iteration": it.step_number(a.saving.iteration),
            "peak_bytes": a.saving.peak_bytes, "main_iterations": len(it.step_rows()),
            "curve": [[r, b] for r, b in a.saving.points],
        },
    }


# --- text --------------------------------------------------------------------------------------


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def table(headers: list, rows: list) -> str:
    """Plain text table, columns right-aligned except the first."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join(["  " + fmt(cells[0]), "  " + "  ".join("-" * x for x in w)] + ["  " + fmt(r) for r in cells[1:]])


def format_stats(d: dict) -> str:
    out = [f"capture {d['capture']['path']}: {d['capture']['ops']} ops, {d['capture']['blocks']} blocks"
           + ("" if d["capture"]["complete"] else " (cut short: no clean end)"),
           f"times: {d.get('time_origin', TIME_ORIGIN)}"]
    dr = d["drops"]
    if dr["dropped"]:
        where = ""
        if dr["records"]:
            where = (f" between {format_duration(dr['first_ns'], digits=3)} and {format_duration(dr['last_ns'], digits=3)}"
                     f" (around ops {dr['first_op']}..{dr['last_op']})")
        out.append(f"warning: {dr['dropped']} events were dropped{where}; the model may miss accesses there "
                   f"({dr['hint']})")
    out.append("")
    if d["message"]:
        out.append(f"iterations: {d['message']} in the launch stream"
                   + (f" of pid {d['pid']}" if d["pid"] is not None else ""))
    else:
        micro = f", micro-step {d['micro_period_ops']} ops x {d['micro_steps']}" if d["micro_period_ops"] else ""
        g = d.get("gpu_clock") or {}
        gpu = f" host, {format_duration(g['iteration_ns_gpu'], digits=3)} GPU clock" if g.get("iteration_ns_gpu") else ""
        out.append(f"iterations: {d['iterations_found']} (main: {d['period_ops']} ops per iteration{micro}, "
                   f"{format_duration(d['iteration_ns'], digits=3)}{gpu}, pid {d['pid']}), "
                   f"{d['deviating_iterations']} deviating from the template")
        out.append(table(
            ["regime", "period", "micro-step", "iterations", "deviating", "ops", "time", "iteration", "match", "phase"],
            [[f"{i}{' *' if r['main'] else ''}", r["period_ops"],
              f"{r['micro_period_ops']} x {r['micro_steps']}" if r["micro_period_ops"] else "-", r["iterations"],
              r["deviating"],
              f"{r['first_op']}..{r['end_op']}", f"{format_duration(r['start_ns'], digits=3)}..{format_duration(r['end_ns'], digits=3)}",
              format_duration(r["iteration_ns"], digits=3), _pct(r["confidence"]), r["phase"]] for i, r in enumerate(d["regimes"])]))
    na = d["message"] is not None
    for key, title in (("properties", "tensor level: sub-blocks at the offsets kernels point at"),
                       ("segment_properties", "block level: whole allocations / segments")):
        p = d.get(key)
        if p is None:
            continue
        out += ["", f"properties, {title} (main regime, arenas left out):"]
        iv = f", {_pct(p['iterative_intervals'])} of reuse intervals" if p.get("iterative_intervals") is not None else ""
        ops = f" (ops {p['regular_ops']:.3f})" if p.get("regular_ops") is not None else ""
        out.append(table(["property", "value", "measure"], [
            ["iterative", "n/a" if na else f"{_pct(p['iterative_blocks'])} of blocks, {_pct(p['iterative_bytes'])} of bytes{iv}",
             "access pattern repeats across iterations"],
            ["regular", "n/a" if na or p["regular"] is None else f"{p['regular']:.3f}{ops}",
             "mean of 1 - min(CV, 1) of idle intervals"],
            ["extremal", "n/a" if na or p["extremal_top10_share"] is None
             else f"{_pct(p['extremal_top10_share'])} in top 10%, Gini {p['extremal_gini']:.3f}",
             "idle time in the longest intervals"],
        ]))
    for key, title in (("sub_blocks_by_class", f"sub-blocks by class ({d.get('sub_blocks')} sub-blocks"),
                       ("blocks_by_class", "blocks by class (whole allocations")):
        out += ["", f"{title}; bytes summed over the run, not live at once: peak live "
                f"{format_bytes(d['peak_live_bytes'], digits=2)}):"]
        out.append(table(["class", "count", "bytes (sum)"], [[c, v["count"], format_bytes(v["bytes"], digits=2)]
                                                        for c, v in d[key].items() if v["count"]]))
    if d["top_blocks"]:
        out += ["", f"largest {len(d['top_blocks'])} blocks:"]
        out.append(table(["block", "size", "class", "lifetime", "accesses", "longest idle"], [
            [b["block"], format_bytes(b["size"], digits=2), b["class"],
             "n/a" if b["lifetime_iterations"] is None else f"{b['lifetime_iterations']} it", b["accesses"],
             _pct(b["longest_idle_share"]) + (" of it" if b["longest_idle_share"] is not None else "")]
            for b in d["top_blocks"]]))
    s = d["saving"]
    out.append("")
    if s is None:
        out.append("swap saving bound: n/a (no iteration)")
    else:
        out.append(f"swap saving bound ({format_iteration(s['iteration'], s['main_iterations'])}, peak {format_bytes(s['peak_bytes'], digits=2)}, "
                   f"{s['bandwidth'] / 1e9:.1f} GB/s each way):")
        out.append(table(["slowdown", "saved", "of peak"], [
            [f"{r:.2f}x", format_bytes(b, digits=2), _pct(b / s["peak_bytes"] if s["peak_bytes"] else 0)] for r, b in s["curve"]]))
    return "\n".join(out)
