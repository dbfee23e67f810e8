"""Swap mode in a capture, for ``pyobmem summary`` and the HTML report.

``swap_facts(capture)``: the budget, swap-outs, swap-ins by cause, plans adopted and dropped, pinned
host memory, and what the budget bounds: the device-resident bytes (``resident_bytes`` in
pyobmem.model.queries), i.e. the live blocks minus those swapped out to host memory. Live bytes
alone (the summary's "peak live") count a swapped-out block as if it were still on the device.
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ..model.queries import card_bytes, cuda_span, resident_bytes


def _over(times: np.ndarray, values: np.ndarray, limit: int, end: int) -> int:
    """ns during which the step function is above ``limit`` (up to ``end``)."""
    if not len(times):
        return 0
    dt = np.diff(np.r_[times, max(end, int(times[-1]))])
    return int(dt[values > limit].sum())


def swaps_by_cause(swaps: np.ndarray, causes) -> dict:
    """{cause name (lower case): {count, bytes}} of ``swaps`` (rows of Capture.swaps, one
    direction) for every member of ``causes`` (abi.SwapInCause or abi.SwapOutCause)."""
    return {c.name.lower(): {"count": int(np.count_nonzero(swaps["cause"] == int(c))),
                             "bytes": int(swaps["bytes"][swaps["cause"] == int(c)].sum())} for c in causes}


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
    by_cause = swaps_by_cause(ins, abi.SwapInCause)
    # recorded since session 13
    out_by_cause = swaps_by_cause(out, abi.SwapOutCause) if np.any(out["cause"] != 0) else None
    pinned = [int(n[abi.NOTE_SWAP_PINNED_BYTES]) for n in cap.notes.values()
              if str(n.get(abi.NOTE_SWAP_PINNED_BYTES, "")).isdigit()]
    budget_bytes = None
    if sw is not None:
        budget_bytes = sw.get("budget_bytes")
        if budget_bytes is None and sw.get("budget_fraction"):
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
        "swapped_out": {"count": len(out), "bytes": int(out["bytes"].sum()), "blocks": int(len(np.unique(out["block"]))),
                        "by_cause": out_by_cause},
        "swapped_in": {"count": len(ins), "bytes": int(ins["bytes"].sum()), "by_cause": by_cause},
        "plans_adopted": int(np.count_nonzero(~plans["dropped"])),
        "plans_dropped": int(np.count_nonzero(plans["dropped"])),
        "drops": _drops(cap),
        "pinned_bytes": max(pinned) if pinned else None,
        "peak_resident_bytes": peak,
        "peak_resident_pid": peak_pid,
        "peak_resident_ts_ns": peak_ts,
        "over_budget_ns": over,
    }


def _drops(cap, top: int = 3) -> list[dict]:
    """The plan drops by where they happened: position in the iteration, the op issued there
    and the one the template expected (kernel names, or the copy or set kind), and how many
    drops each; the most frequent ``top``, most frequent first."""
    d = cap.plans[cap.plans["dropped"]]
    if not len(d):
        return []

    def op_name(pid: int, key: int) -> str:
        if key >> 56 == 0xFF:  # PYOBMEM_OP_KEY_COPY(type, kind)
            kind = key & 0xFF
            if (key >> 16) & 0xFFFF == abi.Ev.MEMSET:
                return "memset"
            return f"memcpy {abi.CopyKind(kind).name}" if kind in abi.CopyKind._value2member_map_ else "memcpy"
        return cap.kernel_names.get((pid, key), f"kernel {key:#x}")

    counts: dict = {}
    for r in d:
        k = (int(r["pid"]), int(r["value"]), int(r["seen"]), int(r["expected"]))
        counts[k] = counts.get(k, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return [{"position": pos, "issued": op_name(pid, seen), "expected": op_name(pid, exp), "count": n}
            for (pid, pos, seen, exp), n in ranked]
