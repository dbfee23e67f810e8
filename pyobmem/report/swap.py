"""Swap mode in a capture, for ``pyobmem summary`` and the HTML report.

``swap_facts(capture)``: the budget, swap-outs, swap-ins by cause, plans adopted and dropped, pinned
host memory, and what the budget bounds: the device-resident bytes (``resident_bytes``), i.e. the
live blocks minus those swapped out to host memory. Live bytes alone (the summary's "peak live")
count a swapped-out block as if it were still on the device.

Times of the swap records (native/swap.c): a SWAP_OUT is recorded when the block's device memory was
released; a SWAP_IN when the block was handed back to its consumer, ``duration_ns`` after its
memory was mapped again. So a block is off the device over [SWAP_OUT ts, SWAP_IN ts - duration).
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ..export import cuda_span, step_function


def resident_bytes(capture, pid: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Device-resident bytes as a step function (times, bytes after the change at each time),
    int64: live blocks (of ``pid``, or of every process) minus the ones swapped out. A block still
    out at the end of the capture stays out; one freed while out stops counting at its free. Host
    blocks (pinned host memory) are not device memory."""
    blocks = capture.blocks
    sel = blocks["kind"] != abi.AllocKind.HOST
    if pid is not None:
        sel &= blocks["pid"] == pid
    rows = np.flatnonzero(sel)
    freed = blocks["t_free"][rows] >= 0
    t = [blocks["t_alloc"][rows].astype(np.int64), blocks["t_free"][rows][freed].astype(np.int64)]
    d = [blocks["size"][rows].astype(np.int64), -blocks["size"][rows][freed].astype(np.int64)]
    s = capture.swaps
    s = s[(s["block"] >= 0) & (sel[np.maximum(s["block"], 0)] if len(s) else np.zeros(0, bool))]
    if len(s):
        out_t, out_d = [], []
        order = np.lexsort((s["ts_ns"], s["block"]))
        t_free = blocks["t_free"]
        since: dict[int, tuple[int, int]] = {}  # block row -> (out since, bytes)
        for blk, ts, nbytes, direction, dur in zip(s["block"][order].tolist(), s["ts_ns"][order].tolist(),
                                                   s["bytes"][order].tolist(), s["direction"][order].tolist(),
                                                   s["duration_ns"][order].tolist()):
            if direction == 0:
                if blk not in since:
                    since[blk] = (ts, nbytes)
            elif blk in since:
                t0, n = since.pop(blk)
                out_t += [t0, max(t0, ts - dur)]
                out_d += [-n, n]
        for blk, (t0, n) in since.items():
            out_t.append(t0)
            out_d.append(-n)
            if t_free[blk] >= 0:  # freed while out: its free above subtracts it once more
                out_t.append(max(t0, int(t_free[blk])))
                out_d.append(n)
        t.append(np.asarray(out_t, np.int64))
        d.append(np.asarray(out_d, np.int64))
    return step_function(np.concatenate(t), np.concatenate(d))


def _over(times: np.ndarray, values: np.ndarray, limit: int, end: int) -> int:
    """ns during which the step function is above ``limit`` (up to ``end``)."""
    if not len(times):
        return 0
    dt = np.diff(np.r_[times, max(end, int(times[-1]))])
    return int(dt[values > limit].sum())


def swap_facts(cap) -> dict | None:
    """Swap mode in ``cap`` as plain JSON values (bytes, ns); None when the run was no swap run and
    has no swap events. ``peak_resident_bytes``: the highest device-resident bytes of one process
    (the budget holds per process), ``over_budget_ns``: how long that process was over the budget."""
    sw = cap.meta.get("swap") if isinstance(cap.meta.get("swap"), dict) else None
    swaps, plans = cap.swaps, cap.plans
    if sw is None and not len(swaps) and not len(plans):
        return None
    out = swaps[swaps["direction"] == 0]
    ins = swaps[swaps["direction"] == 1]
    by_cause = {}
    for cause in abi.SwapInCause:
        sel = ins["cause"] == int(cause)
        by_cause[cause.name.lower()] = {"count": int(sel.sum()), "bytes": int(ins["bytes"][sel].sum())}
    pinned = [int(n[abi.NOTE_SWAP_PINNED_BYTES]) for n in cap.notes.values()
              if str(n.get(abi.NOTE_SWAP_PINNED_BYTES, "")).isdigit()]
    budget_bytes = None
    if sw is not None:
        budget_bytes = sw.get("budget_bytes")
        if budget_bytes is None and sw.get("budget_fraction"):
            from ..planner import card_bytes

            total = card_bytes(cap)
            budget_bytes = int(sw["budget_fraction"] * total) if total else None
    peak, peak_pid, peak_ts, over = None, None, None, None
    if len(cap.blocks):
        end = cuda_span(cap)[1]
        for pid in np.unique(cap.blocks["pid"]).tolist():
            times, values = resident_bytes(cap, pid)
            if not len(values):
                continue
            k = int(np.argmax(values))
            if peak is None or int(values[k]) > peak:
                peak, peak_pid, peak_ts = int(values[k]), int(pid), int(times[k])
            if budget_bytes:
                over = max(over or 0, _over(times, values, int(budget_bytes), end))
    return {
        "budget": None if sw is None else sw.get("budget"),
        "budget_bytes": budget_bytes,
        "min_swap_bytes": None if sw is None else sw.get("min_swap_bytes"),
        "swapped_out": {"count": len(out), "bytes": int(out["bytes"].sum()), "blocks": int(len(np.unique(out["block"])))},
        "swapped_in": {"count": len(ins), "bytes": int(ins["bytes"].sum()), "by_cause": by_cause},
        "plans_adopted": int(np.count_nonzero(~plans["dropped"])),
        "plans_dropped": int(np.count_nonzero(plans["dropped"])),
        "pinned_bytes": max(pinned) if pinned else None,
        "peak_resident_bytes": peak,
        "peak_resident_pid": peak_pid,
        "peak_resident_ts_ns": peak_ts,
        "over_budget_ns": over,
    }
