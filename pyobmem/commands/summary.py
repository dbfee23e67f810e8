"""``pyobmem summary FILE``: what a capture holds, in one screen (``--json``: the same as a dict).

``summarize(capture) -> dict`` does the computation (the run command and the tests reuse it);
``format_summary`` and ``format_short`` turn the dict into text.
"""

from __future__ import annotations

import argparse
import json
import shlex

import numpy as np

from .. import abi, ranks
from ..capture import Capture
from ..model.gpuclock import clock_facts, iteration_ns_gpu
from ..model.iterations import detect_iterations
from ..model.queries import cuda_span, drops_hint, live_bytes_peak
from ..ranks import rank_rows
from ..report.swap import swap_facts
from ..units import format_bytes, format_duration
from .common import distinct, load

NAME = "summary"
NO_ACTIVITY = "no CUDA activity was seen"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="summarise a capture: allocations, launches, iteration length, drops",
        description="Summarise a capture: allocations, launches, copies, the iteration length, "
        "dropped events, processes and environment.",
    )
    p.add_argument("capture", nargs="+", metavar="FILE",
                   help="a .pyobmem capture; several (e.g. one per rank): a table of their ranks, then each in short")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def run(args) -> int:
    paths = distinct(args.capture)
    if len(paths) > 1:
        summary = summarize_many([load(path) for path in paths])
        text = format_many
    else:
        summary, text = summarize(load(paths[0])), format_summary
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(text(summary))
    return 0


# --- computation -----------------------------------------------------------------------------


def summarize(cap: Capture) -> dict:
    """Everything the summary shows, as plain JSON-serialisable values (sizes in bytes, times ns)."""
    ops, blocks = cap.ops, cap.blocks
    launches = ops[ops["type"] == abi.Ev.LAUNCH]
    copies = ops[ops["type"] == abi.Ev.MEMCPY]
    memsets = ops[ops["type"] == abi.Ev.MEMSET]
    graphs = ops[ops["type"] == abi.Ev.GRAPH_LAUNCH]
    la = attribution(cap)
    return {
        "capture": {
            "path": cap.path,
            "argv": cap.meta.get("argv"),
            "command": cap.meta.get("command") or (shlex.join(cap.meta["argv"]) if cap.meta.get("argv") else None),
            "complete": cap.complete,
            "exit_status": cap.exit_status,
            "dropped": cap.dropped,
            "drops_hint": drops_hint(cap.meta) if cap.dropped else None,
            "untracked_frees": int(np.count_nonzero(cap.untracked["kind"] == abi.UntrackedKind.FREE)),
            "untracked_unmaps": int(np.count_nonzero(cap.untracked["kind"] == abi.UntrackedKind.UNMAP)),
            "duration_ns": _duration(cap),
        },
        "cuda_activity": bool(len(blocks) or len(ops)),
        "allocations": _allocations(blocks),
        "launches": {
            "count": len(launches),
            "attributed_pct": _pct(la["attribution"]["attributed"], len(launches)),
            "opaque_pct": _pct(np.count_nonzero(launches["flags"] & abi.LaunchFlag.OPAQUE), len(launches)),
            "graph_launches": len(graphs),
            "blocks_touched": _stats(launches["n_touched"]),
            **la,
        },
        "copies": _copies(copies),
        "memsets": {"count": len(memsets), "bytes": int(memsets["bytes"].sum())},
        "iteration": _iteration(cap),
        "gpu_clock": _gpu_clock(cap),
        "swap": swap_facts(cap),
        "ranks": rank_rows([cap]) if ranks.has_ranks([cap]) else None,
        "processes": [
            {
                "pid": int(p["pid"]),
                "ppid": int(p["ppid"]),
                "driver_version": int(p["driver_version"]),
                "source": abi.LaunchSource(int(p["source"])).name.lower()
                if int(p["source"]) in abi.LaunchSource._value2member_map_
                else str(int(p["source"])),
                "rank": int(p["rank"]) if int(p["rank_source"]) != abi.RankSource.NONE and int(p["rank"]) >= 0 else None,
            }
            for p in cap.processes
        ],
        "environment": {
            "notes": {str(pid): dict(sorted(n.items())) for pid, n in sorted(cap.notes.items())},
            "presets": cap.meta.get("presets", {}),
            "blocks": cap.meta.get("blocks"),
            "env": cap.meta.get("env", {}),
            "cupti": cap.meta.get("cupti"),
            "hostname": cap.meta.get("hostname"),
        },
    }


UNKNOWN_NOTE = "unknown_address."
TOP_KERNELS = 10


def attribution(cap: Capture) -> dict:
    """How the kernel launches of ``cap`` were attributed, and by which path (summary's
    ``attributed_pct`` is ``attributed`` of all launches).

    ``attribution``: launch counts that add up to all launches: ``attributed`` (the words it names
    are in recorded blocks, one at least a device block), ``host_only`` (only host blocks, pinned
    host memory), ``unattributed`` (a word the driver knows as an address is in no recorded block,
    LaunchFlag.UNKNOWN_ADDRESS), ``no_addresses`` (no word in a block or known to the driver).
    ``unattributed_kernels`` and ``host_only_kernels``: [{"kernel", "launches"}] by count (at most
    10 each). ``unknown_addresses``: what the driver said of each (kernel, argument offset) whose
    word was in no block ({"pid", "kernel", "offset", "what"}), from the shim's NOTEs.
    ``traced_by``: launches recorded from the shim's hooks and from CUPTI callbacks (graph
    launches are always the hooks').
    """
    ops = cap.ops
    is_launch = ops["type"] == abi.Ev.LAUNCH
    rows = np.flatnonzero(is_launch)
    acc = cap.accesses
    on_device = np.zeros(len(ops), bool)
    if len(acc):
        dev = cap.blocks["kind"][acc["block"]] != abi.AllocKind.HOST
        on_device[acc["op"][dev]] = True
    unknown = (ops["flags"] & abi.LaunchFlag.UNKNOWN_ADDRESS) != 0
    touched = ops["n_touched"] > 0
    classes = {
        "attributed": is_launch & ~unknown & on_device,
        "host_only": is_launch & ~unknown & touched & ~on_device,
        "unattributed": is_launch & unknown,
        "no_addresses": is_launch & ~unknown & ~touched,
    }
    via_cupti = int(np.count_nonzero(ops["flags"][rows] & abi.LaunchFlag.VIA_CUPTI))
    unknown_addresses = []
    for pid, notes in sorted(cap.notes.items()):
        for key, what in sorted(notes.items()):
            if key.startswith(UNKNOWN_NOTE):
                handle, _, offset = key[len(UNKNOWN_NOTE):].partition("+")
                try:
                    name = cap.kernel_names.get((pid, int(handle, 16)), f"kernel {handle}")
                except ValueError:
                    continue
                unknown_addresses.append({"pid": pid, "kernel": name, "offset": int(offset or 0), "what": what})
    return {
        "attribution": {k: int(np.count_nonzero(v)) for k, v in classes.items()},
        "unattributed_kernels": _kernels(cap, np.flatnonzero(classes["unattributed"])),
        "host_only_kernels": _kernels(cap, np.flatnonzero(classes["host_only"])),
        "unknown_addresses": unknown_addresses,
        "traced_by": {"hooks": len(rows) - via_cupti + int(np.count_nonzero(ops["type"] == abi.Ev.GRAPH_LAUNCH)),
                      "cupti": via_cupti},
    }


def _kernels(cap: Capture, rows: np.ndarray) -> list[dict]:
    """The kernels of op rows ``rows`` with their launch counts, most launched first."""
    if not len(rows):
        return []
    keys = np.stack([cap.ops["pid"][rows].astype(np.uint64), cap.ops["handle"][rows]], axis=1)
    uniq, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))[:TOP_KERNELS]
    return [{"kernel": cap.kernel_name(int(rows[first[i]])), "launches": int(counts[i])} for i in order]


def summarize_many(caps: list[Capture]) -> dict:
    """Several captures (one per rank, or any): the rank table over all of them and each one's summary."""
    return {"ranks": rank_rows(caps), "captures": [summarize(cap) for cap in caps]}


def _pct(n: int, total: int) -> float | None:
    return round(100.0 * n / total, 2) if total else None


def _stats(values: np.ndarray) -> dict:
    if not len(values):
        return {"mean": None, "median": None, "max": None}
    v = values.astype(np.float64)
    return {"mean": round(float(v.mean()), 3), "median": float(np.median(v)), "max": int(values.max())}


def _duration(cap: Capture) -> int | None:
    """First to last CUDA event (the span every verb measures time in)."""
    if not (len(cap.ops) or len(cap.blocks)):
        return None
    first, last = cuda_span(cap)
    return last - first


def size_histogram(sizes: np.ndarray) -> list[dict]:
    """Power-of-two buckets [2^k, 2^(k+1)) with count and bytes; empty buckets left out."""
    if not len(sizes):
        return []
    sizes = sizes.astype(np.uint64)
    _, exp = np.frexp(sizes.astype(np.float64))  # size = m * 2^exp with m in [0.5, 1)
    k = np.where(sizes > 0, exp - 1, -1)
    out = []
    for b in np.unique(k):
        sel = k == b
        lo = 0 if b < 0 else 1 << int(b)
        out.append({"lo": lo, "hi": 1 if b < 0 else lo << 1, "count": int(sel.sum()), "bytes": int(sizes[sel].sum())})
    return out


def _allocations(blocks: np.ndarray) -> dict:
    peak, t_peak = live_bytes_peak(blocks)
    by_kind = {}
    for kind in np.unique(blocks["kind"]):
        sel = blocks["kind"] == kind
        name = abi.AllocKind(int(kind)).name.lower() if int(kind) in abi.AllocKind._value2member_map_ else str(int(kind))
        by_kind[name] = {"count": int(sel.sum()), "bytes": int(blocks["size"][sel].sum())}
    never_freed = blocks["t_free"] < 0
    return {
        "count": len(blocks),
        "bytes": int(blocks["size"].sum()),
        "peak_live_bytes": peak,
        "peak_ts_ns": t_peak if len(blocks) else None,
        "live_at_end": {"count": int(never_freed.sum()), "bytes": int(blocks["size"][never_freed].sum())},
        "by_kind": by_kind,
        "histogram": size_histogram(blocks["size"]),
    }


def _copies(copies: np.ndarray) -> dict:
    kinds = copies["copy_kind"] & 0xFF
    by_kind = {}
    for kind in np.unique(kinds):
        sel = kinds == kind
        name = abi.CopyKind(int(kind)).name if int(kind) in abi.CopyKind._value2member_map_ else str(int(kind))
        by_kind[name] = {"count": int(sel.sum()), "bytes": int(copies["bytes"][sel].sum())}
    return {
        "count": len(copies),
        "bytes": int(copies["bytes"].sum()),
        "async": int(np.count_nonzero(copies["copy_kind"] & abi.COPY_ASYNC)),
        "by_kind": by_kind,
    }


def _out_causes(by_cause: dict | None) -> str:
    """': P planned, B beyond the plan for the budget, R for device memory' (empty when the
    capture did not record why blocks went out)."""
    if not by_cause:
        return ""
    return (f": {_num(by_cause['planned']['count'])} planned, {_num(by_cause['budget']['count'])} beyond the plan "
            f"for the budget, {_num(by_cause['room']['count'])} for device memory")


def _swap_lines(w: dict) -> list[str]:
    """The swap section as lines (the budget first)."""
    budget = "-" if w["budget"] is None else w["budget"]
    if w["budget_bytes"] is not None and w["budget"] != format_bytes(w["budget_bytes"]):
        budget += f" ({format_bytes(w['budget_bytes'])})"
    si, c = w["swapped_in"], w["swapped_in"]["by_cause"]
    lines = [
        f"budget {budget}; pinned host memory {format_bytes(w['pinned_bytes'])}",
        f"swapped out {format_bytes(w['swapped_out']['bytes'])} in {_num(w['swapped_out']['count'])} swap-outs "
        f"({_num(w['swapped_out']['blocks'])} blocks){_out_causes(w['swapped_out'].get('by_cause'))}",
        f"swapped in {format_bytes(si['bytes'])} in {_num(si['count'])}: {_num(c['prefetch']['count'])} prefetch hits, "
        f"{_num(c['late']['count'])} late (not back when their op was issued: its stream waits for the copy), "
        f"{_num(c['demand']['count'])} on demand",
        f"plans adopted {_num(w['plans_adopted'])}, dropped {_num(w['plans_dropped'])}"
        + (" (dropped: the launches stopped matching the plan's iteration)"
           if w["plans_dropped"] else ""),
    ]
    for d in w.get("drops", []):
        lines.append(f"{_num(d['count'])} dropped at op {d['position']:,} of the iteration: issued {d['issued']}, "
                     f"the plan expected {d['expected']}")
    if w.get("peak_resident_bytes") is not None:
        line = f"on the device: peak {format_bytes(w['peak_resident_bytes'])} resident (live blocks minus those swapped out)"
        if w["budget_bytes"]:
            over = w.get("over_budget_ns") or 0
            line += (f", over the budget for {format_duration(over)}" if over
                     else f", within the budget ({w['peak_resident_bytes']:,} <= {w['budget_bytes']:,} B)")
        lines.insert(1, line)
    return lines


def _iteration(cap: Capture) -> dict | None:
    """The iteration of the main process, from the model's detection (pyobmem.model.iterations,
    the one period detector): ops per iteration of the main regime (launches, graph launches and
    copies: the training step), mean template match, iterations found, how many deviate from the
    template (an aside at their end, the warm-up), the micro-steps of gradient accumulation and
    the median iteration time; None when no iteration repeats."""
    it = detect_iterations(cap)
    main = it.main_regime
    if main is None:
        return None
    gpu = iteration_ns_gpu(cap, it)
    return {"launches": int(main.period_ops), "score": round(float(main.confidence), 4),
            "repeats": int(main.count), "deviating": int(main.deviating), "micro_steps": int(main.micro_steps),
            "micro_launches": main.micro_period_ops, "period_ns": int(round(it.iteration_ns)), "pid": int(it.pid),
            "period_gpu_ns": None if gpu is None else int(round(gpu))}


def _gpu_clock(cap: Capture) -> dict | None:
    """The GPU clock's samples and how far the GPU ran behind the host (pyobmem.model.gpuclock)."""
    return clock_facts(cap)


def _gpu_clock_line(s: dict) -> str:
    g = s.get("gpu_clock")
    if g is None:
        return "GPU clock: no GPU time samples (times are the host's; the model estimates GPU time)"
    how = [f"one every {g['every']} ops"] if g["every"] else []
    how += [f"{g['skipped']:,} skipped"] if g["skipped"] else []
    how = f" ({', '.join(how)})" if how else ""
    return (f"GPU clock: {g['samples']:,} samples{how}; the GPU ran ops up to "
            f"{format_duration(g['lag_max_ns'])} after the host issued them (median {format_duration(g['lag_median_ns'])})")


# --- text ------------------------------------------------------------------------------------


def _num(n) -> str:
    return "-" if n is None else f"{n:,}"


def _pct_text(p) -> str:
    return "-" if p is None else f"{p:.1f}%"


def table(rows: list[list], headers: list[str] | None = None, indent: int = 2, numeric: bool = True) -> str:
    """Plain aligned columns: the first left-aligned, the others right-aligned (``numeric``) or
    left-aligned (a list of names and values)."""
    rows = [[str(c) for c in r] for r in rows]
    if headers:
        rows.insert(0, list(headers))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) if numeric else c.ljust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append(" " * indent + "  ".join(cells).rstrip())
    return "\n".join(lines)


def _status_line(s: dict) -> str:
    c = s["capture"]
    if not c["complete"]:
        state = "incomplete (the run or the daemon was cut short)"
    elif c["exit_status"] is None:
        state = "complete, exit status unknown"
    elif c["exit_status"] < 0:
        state = f"complete, command killed by signal {-c['exit_status']}"
    else:
        state = f"complete, exit status {c['exit_status']}"
    return state


def _attribution_line(la: dict) -> str:
    a = la["attribution"]
    return (f"{_num(a['attributed'])} attributed (device blocks), {_num(a['host_only'])} host-only (pinned host "
            f"memory), {_num(a['unattributed'])} unattributed, {_num(a['no_addresses'])} without addresses")


def _traced_by_line(la: dict) -> str:
    t = la["traced_by"]
    return f"the shim's hooks {_num(t['hooks'])}, CUPTI {_num(t['cupti'])} (kernel and graph launches)"


def _iteration_line(s: dict) -> str:
    it = s["iteration"]
    if it is None:
        return "no repeating pattern"
    gpu = it.get("period_gpu_ns")
    micro = f" ({it['micro_steps']} micro-steps of {it['micro_launches']:,})" if it["micro_launches"] else ""
    return (
        f"{it['launches']:,} ops per iteration{micro}, {format_duration(it['period_ns'])} each"
        + (f" (GPU clock: {format_duration(gpu)})" if gpu is not None and gpu != it["period_ns"] else "")
        + f" ({it['repeats']:,} iterations, {it['deviating']:,} deviating, {100 * it['score']:.1f}% template match)"
    )


def format_short(s: dict) -> str:
    """A few lines for the end of ``pyobmem run``."""
    if not s["cuda_activity"]:
        lines = [NO_ACTIVITY]
    else:
        a, la, c = s["allocations"], s["launches"], s["copies"]
        lines = [
            f"{_num(a['count'])} allocations, peak {format_bytes(a['peak_live_bytes'])} live; "
            f"{_num(la['count'])} launches ({_pct_text(la['attributed_pct'])} attributed, "
            f"{_pct_text(la['opaque_pct'])} opaque); {_num(c['count'])} copies ({format_bytes(c['bytes'])})",
            f"iteration: {_iteration_line(s)}",
        ]
        if la.get("attribution"):
            lines.insert(1, f"launches: {_attribution_line(la)}; traced by {_traced_by_line(la)}")
        if s.get("swap"):
            lines += ["swap: " + line for line in _swap_lines(s["swap"])]
        if s.get("ranks"):
            lines += [f"{len(s['ranks'])} ranks (the figures above are of all processes together):",
                      rank_table(s["ranks"])]
    cap = s["capture"]
    drops = f"{_num(cap['dropped'])} events dropped ({cap['drops_hint']})" if cap["dropped"] else "no events dropped"
    lines.append(f"{drops}; capture {_status_line(s)}")
    return "\n".join(lines)


def format_summary(s: dict) -> str:
    """The full text of ``pyobmem summary``."""
    c = s["capture"]
    out = [f"Capture {c['path']}"]
    if c["command"]:
        out.append(f"  command   {c['command']}")
    out.append(f"  status    {_status_line(s)}")
    out.append(f"  duration  {format_duration(c['duration_ns'])}")
    out.append(
        f"  dropped   {_num(c['dropped'])} events; untracked frees {_num(c['untracked_frees'])}, "
        f"unmaps {_num(c['untracked_unmaps'])}"
    )
    if c.get("drops_hint"):
        out.append(f"            {c['drops_hint']}")
    if not s["cuda_activity"]:
        out += ["", NO_ACTIVITY]
    else:
        a = s["allocations"]
        out += ["", "Allocations"]
        out.append(
            table(
                [
                    ["count", _num(a["count"])],
                    ["total", format_bytes(a["bytes"])],
                    ["peak live", format_bytes(a["peak_live_bytes"])],
                    ["live at end", f"{format_bytes(a['live_at_end']['bytes'])} in {_num(a['live_at_end']['count'])} blocks"],
                ],
                numeric=False,
            )
        )
        if a["by_kind"]:
            out += ["", table([[k, _num(v["count"]), format_bytes(v["bytes"])] for k, v in a["by_kind"].items()], ["kind", "count", "bytes"])]
        if a["histogram"]:
            rows = [[f"{format_bytes(h['lo'])} - {format_bytes(h['hi'])}", _num(h["count"]), format_bytes(h["bytes"])] for h in a["histogram"]]
            out += ["", table(rows, ["size", "count", "bytes"])]
        la = s["launches"]
        bt = la["blocks_touched"]
        out += ["", "Launches"]
        out.append(
            table(
                [
                    ["kernel launches", _num(la["count"])],
                    ["attributed", _pct_text(la["attributed_pct"])],
                    ["opaque", _pct_text(la["opaque_pct"])],
                    ["by kind", _attribution_line(la)],
                    ["traced by", _traced_by_line(la)],
                    ["graph launches", _num(la["graph_launches"])],
                    ["blocks touched", "-" if bt["mean"] is None else f"mean {bt['mean']:.2f}, median {bt['median']:g}, max {bt['max']}"],
                ],
                numeric=False,
            )
        )
        for key, title in (("unattributed_kernels", "Unattributed launches (an address in no recorded block), by kernel"),
                           ("host_only_kernels", "Host-only launches (pinned host memory only), by kernel")):
            if la.get(key):
                out += ["", title, table([[k["kernel"], _num(k["launches"])] for k in la[key]], ["kernel", "launches"])]
        if la.get("unknown_addresses"):
            out += ["", "Addresses in no recorded block (what the driver says, once per kernel and argument offset)",
                    table([[f"{u['kernel']} +{u['offset']}", u["what"]] for u in la["unknown_addresses"]],
                          ["kernel, argument offset", "memory"], numeric=False)]
        cp, ms = s["copies"], s["memsets"]
        out += ["", "Copies and sets"]
        rows = [[f"memcpy {k}", _num(v["count"]), format_bytes(v["bytes"])] for k, v in cp["by_kind"].items()]
        rows.append(["memcpy (all)", _num(cp["count"]), format_bytes(cp["bytes"])])
        rows.append(["memset", _num(ms["count"]), format_bytes(ms["bytes"])])
        out.append(table(rows, ["", "count", "bytes"]))
        out += ["", "Iteration", f"  {_iteration_line(s)}", f"  {_gpu_clock_line(s)}"]
        if s.get("swap"):
            out += ["", "Swap mode"] + [f"  {line}" for line in _swap_lines(s["swap"])]
        if s.get("ranks"):
            out += ["", "Ranks (each rank's processes alone; the figures above are of all together)",
                    rank_table(s["ranks"])]
    if s["processes"]:
        out += ["", "Processes"]
        rows = [[p["pid"], p["ppid"], _driver(p["driver_version"]), p["source"], _num(p.get("rank"))]
                for p in s["processes"]]
        out.append(table(rows, ["pid", "ppid", "driver", "launches from", "rank (environment)"], numeric=False))
    env = s["environment"]
    rows = []
    seen = set()
    for pid, notes in env["notes"].items():
        for k, v in notes.items():
            if (k, v) not in seen:
                seen.add((k, v))
                rows.append([k, v])
    rows += [[k, v] for k, v in env["env"].items()]
    rows += [[k, f"{v} (preset)"] for k, v in env["presets"].items()]
    if env.get("blocks") == "tensor":
        rows.append(["blocks", "tensors (per-tensor allocation presets)"])
    if env["cupti"]:
        rows.append(["libcupti", "not used (launches traced from the shim's hooks; --cupti to use it)"
                     if env["cupti"] == "0" else env["cupti"]])
    if env["hostname"]:
        rows.append(["host", env["hostname"]])
    if rows:
        out += ["", "Environment", table(rows, numeric=False)]
    return "\n".join(out)


def rank_table(rows: list[dict], with_file: bool = False) -> str:
    """The rank table: per rank its processes, GPU, peak live bytes, blocks, launches, attributed and
    opaque shares, iteration time, NCCL calls, bytes and the blocks they named."""
    headers, cells = ranks.table_rows(rows, with_file)
    return table(cells, headers)


def format_many(m: dict) -> str:
    """The text of ``pyobmem summary`` with several captures."""
    out = [f"{len(m['captures'])} captures, {sum(r['rank'] is not None for r in m['ranks'])} ranks",
           rank_table(m["ranks"], with_file=True)]
    for s in m["captures"]:
        out += ["", f"Capture {s['capture']['path']}"]
        out += [f"  {line}" for line in format_short({**s, "ranks": None}).splitlines()]
    return "\n".join(out)


def _driver(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "-"
