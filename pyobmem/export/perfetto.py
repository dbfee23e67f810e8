"""Chrome trace-event JSON, opened by ui.perfetto.dev (and chrome://tracing).

Trace Event Format (JSON object form): ``{"traceEvents": [...], "displayTimeUnit": "ns",
"otherData": {...}}``; ``ts``/``dur`` in microseconds (floats keep the ns), here counted from the
first CUDA event of the capture (``otherData.t0_monotonic_ns``). Per traced process (``pid``):

- ``M`` metadata naming the process, its stream tracks and block tracks;
- a ``C`` counter ``device N live bytes`` per device: the sum of the sizes of live blocks;
- in swap mode, a ``C`` counter ``resident bytes (swap mode)``: live blocks minus the ones swapped
  out to host memory (what the budget bounds; pyobmem.model.queries.resident_bytes);
- with a GPU clock (``capture.gpu_times``: a sample every N ops, native/gpuclock.c), a ``C``
  counter ``host lead over the GPU (ms)`` per pid: at the GPU time a sampled op ran, how long
  before that the host had launched it (what swap mode's prefetches live on);
- one thread track per (pid, stream) with an ``X`` slice per kernel launch, copy or memset. The
  capture has no per-kernel run time, so a slice starts at the host's launch and lasts until the
  next op on its stream (at most ``OP_SLICE_CAP_US``): it shows order and density, not run time;
- one thread track per block for the ``top`` largest blocks: an ``X`` slice for the lifetime
  (allocation to free or capture end) and, nested in it, an ``X`` slice per idle interval.
"""

from __future__ import annotations

import json

import numpy as np

from .. import abi
from ..units import format_bytes
from ..model import analyse
from ..model.queries import block_end_times, cuda_span, live_bytes, op_names, resident_bytes

TOP_BLOCKS = 64
OP_SLICE_CAP_US = 50.0
MIN_IDLE_NS = 1000  # idle intervals shorter than this are left out of the block tracks
BLOCK_TID_BASE = 1_000_000
_OP_CAT = {abi.Ev.LAUNCH: "kernel", abi.Ev.MEMCPY: "memcpy", abi.Ev.MEMSET: "memset",
           abi.Ev.GRAPH_LAUNCH: "graph"}


def _us(ns) -> float:
    return round(float(ns) / 1000.0, 3)


def counter_series(capture, t0: int) -> list[dict]:
    """``C`` events: live bytes per (pid, device) after every change."""
    out = []
    blocks = capture.blocks
    for pid in np.unique(blocks["pid"]):
        for dev in np.unique(blocks["device"][blocks["pid"] == pid]):
            mask = (blocks["pid"] == pid) & (blocks["device"] == dev)
            times, live = live_bytes(blocks, mask)
            name = f"device {int(dev)} live bytes"
            out += [{"ph": "C", "name": name, "pid": int(pid), "ts": _us(t - t0), "args": {"bytes": int(v)}}
                    for t, v in zip(times.tolist(), live.tolist())]
    return out


def resident_series(capture, t0: int) -> list[dict]:
    """``C`` events: device-resident bytes per pid that swapped (swap mode) after every change."""
    if not len(capture.swaps):
        return []
    out = []
    for pid in np.unique(capture.swaps["pid"]).tolist():
        times, res = resident_bytes(capture, pid)
        out += [{"ph": "C", "name": "resident bytes (swap mode)", "pid": int(pid), "ts": _us(t - t0),
                 "args": {"bytes": int(v)}} for t, v in zip(times.tolist(), res.tolist())]
    return out


def lead_series(capture, t0: int) -> list[dict]:
    """``C`` events: per pid, at each GPU clock sample's GPU time, the host's lead over the GPU
    (the sample's GPU time less its op's launch time, ms). None without samples."""
    g = capture.gpu_times
    g = g[g["op"] >= 0]
    if not len(g):
        return []
    t = g["t_gpu"].astype(np.int64)
    lead = t - capture.ops["ts_ns"][g["op"]].astype(np.int64)
    order = np.lexsort((t, g["pid"]))
    return [{"ph": "C", "name": "host lead over the GPU (ms)", "pid": int(g["pid"][i]), "ts": _us(t[i] - t0),
             "args": {"ms": round(float(lead[i]) / 1e6, 3)}} for i in order.tolist()]


def op_events(capture, t0: int) -> tuple[list[dict], dict]:
    """``X`` slices for ops, on one track per (pid, stream); returns (events, {(pid, stream): tid})."""
    ops = capture.ops
    events: list[dict] = []
    tids: dict = {}
    if not len(ops):
        return events, tids
    names = op_names(capture)
    touched: dict[int, list[int]] = {}
    acc = capture.accesses
    if len(acc):
        labels = [capture.block_label(r) for r in range(len(capture.blocks))]
        blk = acc["block"].tolist()
        bounds = np.flatnonzero(np.diff(acc["op"])) + 1
        for rows in np.split(np.arange(len(acc)), bounds):
            touched[int(acc["op"][rows[0]])] = [labels[blk[k]] for k in rows.tolist()]
    keys = list(zip(ops["pid"].tolist(), ops["stream"].tolist()))
    for k in keys:
        tids.setdefault(k, len(tids) + 1)
    ts = ops["ts_ns"].astype(np.int64)
    # duration: until the next op on the same track, capped
    dur_ns = np.full(len(ops), int(OP_SLICE_CAP_US * 1000), np.int64)
    last_row: dict = {}
    for i in range(len(ops) - 1, -1, -1):
        j = last_row.get(keys[i])
        if j is not None:
            dur_ns[i] = min(dur_ns[i], max(int(ts[j] - ts[i]), 1))
        last_row[keys[i]] = i
    for i in range(len(ops)):
        op = ops[i]
        args = {"seq": int(op["seq"]), "blocks": touched.get(i, [])}
        t = int(op["type"])
        if t == abi.Ev.LAUNCH:
            args["grid"] = int(op["grid"])
            if int(op["flags"]) & abi.LaunchFlag.OPAQUE:
                args["opaque"] = True
        elif t in (abi.Ev.MEMCPY, abi.Ev.MEMSET):
            args["bytes"] = int(op["bytes"])
        events.append({"ph": "X", "name": names[i], "cat": _OP_CAT.get(t, "op"), "pid": int(op["pid"]),
                       "tid": tids[keys[i]], "ts": _us(ts[i] - t0), "dur": _us(dur_ns[i]), "args": args})
    return events, tids


def idle_intervals(capture, rows: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """Idle intervals of the given block rows: (start, end) ns between consecutive accesses, from
    the model's Analysis (pyobmem.model)."""
    a = analyse(capture, progress=False)
    return {int(r): a.idle_intervals(int(r)) for r in rows}


def block_events(capture, t0: int, top: int) -> list[dict]:
    """Lifetime slices with nested idle slices for the ``top`` largest blocks, one track each."""
    blocks = capture.blocks
    if not len(blocks) or top <= 0:
        return []
    order = np.lexsort((np.arange(len(blocks)), -blocks["size"].astype(np.int64)))[:top]
    end = block_end_times(capture)
    classes = list(analyse(capture, progress=False).block_class)
    idle = idle_intervals(capture, order)
    n_acc = np.bincount(capture.accesses["block"], minlength=len(blocks)) if len(capture.accesses) else \
        np.zeros(len(blocks), np.int64)
    events = []
    for rank, r in enumerate(order.tolist()):
        b = blocks[r]
        pid, tid = int(b["pid"]), BLOCK_TID_BASE + rank
        label = f"block {capture.block_label(r)} {format_bytes(int(b['size']))} {classes[r]}"
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": BLOCK_TID_BASE + rank}})
        events.append({"ph": "X", "name": label, "cat": "block", "pid": pid, "tid": tid,
                       "ts": _us(int(b["t_alloc"]) - t0), "dur": _us(int(end[r]) - int(b["t_alloc"])),
                       "args": {"block": capture.block_label(r), "addr": hex(int(b["addr"])), "size": int(b["size"]),
                                "class": classes[r], "accesses": int(n_acc[r]), "freed": bool(b["t_free"] >= 0)}})
        for s, e in idle[r]:
            if e - s >= MIN_IDLE_NS:
                events.append({"ph": "X", "name": "idle", "cat": "idle", "pid": pid, "tid": tid,
                               "ts": _us(s - t0), "dur": _us(e - s), "args": {"idle_ns": int(e - s)}})
    return events


def trace(capture, top: int = TOP_BLOCKS) -> dict:
    """The trace-event JSON object for ``capture``."""
    t0, _ = cuda_span(capture)
    events: list[dict] = []
    pids = sorted(set(capture.processes["pid"].tolist()) | set(capture.blocks["pid"].tolist())
                  | set(capture.ops["pid"].tolist()))
    for pid in pids:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"pid {pid}"}})
    op_ev, tids = op_events(capture, t0)
    for (pid, stream), tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"stream {stream:#x} (launches)"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    events += counter_series(capture, t0)
    events += resident_series(capture, t0)
    events += lead_series(capture, t0)
    events += op_ev
    events += block_events(capture, t0, top)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": "pyobmem", "capture": capture.path, "t0_monotonic_ns": t0,
                          "time_origin": "t = 0 at the first CUDA event of the capture",
                          "dropped_events": capture.dropped,
                          "note": "op slices start at host launch time; their length is invented: the gap "
                                  f"to the next op on the stream, at most {OP_SLICE_CAP_US:g} µs, not the kernel "
                                  "run time"}}


def write(capture, f) -> None:
    """Write the JSON trace of ``capture`` to the text file ``f``."""
    json.dump(trace(capture), f, separators=(",", ":"))
