"""Queries over a capture's tables that the model, the report, the exports and the verbs share.

Time spans (``time_span``, ``cuda_span``: t = 0 of every verb is the first CUDA event),
``block_end_times``, live bytes (``live_bytes``, ``live_bytes_peak``) and device-resident bytes in
swap mode (``resident_bytes``) as step functions (``step_function``), readable op names
(``op_names``), the card's memory (``card_bytes``) and the hint said with dropped events
(``drops_hint``). Times are CLOCK_MONOTONIC ns, sizes bytes, all int64.

Times of the swap records (native/swap.c): a SWAP_OUT is recorded when the block's device memory was
released, or handed to another block (its copy out may still run then); a SWAP_IN when the block
was handed back to its consumer, ``duration_ns`` after its memory was mapped again. So a block is
off the device over [SWAP_OUT ts, SWAP_IN ts - duration).
"""

from __future__ import annotations

import numpy as np

from .. import abi


def time_span(capture) -> tuple[int, int]:
    """(first, last) CLOCK_MONOTONIC ns seen in the capture: allocations, frees, ops, processes."""
    times = [capture.blocks["t_alloc"], capture.blocks["t_free"][capture.blocks["t_free"] >= 0],
             capture.ops["ts_ns"], capture.processes["ts_ns"], capture.untracked["ts_ns"]]
    times = [np.asarray(t, np.int64) for t in times if len(t)]
    if not times:
        return 0, 0
    allt = np.concatenate(times)
    return int(allt.min()), int(allt.max())


def cuda_span(capture) -> tuple[int, int]:
    """(first, last) CLOCK_MONOTONIC ns of the capture's CUDA events (launches, copies, sets,
    allocations, frees): t = 0 of every verb is the first (the summary's duration is the span)."""
    b = capture.blocks
    times = [capture.ops["ts_ns"], b["t_alloc"], b["t_free"][b["t_free"] >= 0]]
    times = [np.asarray(t, np.int64) for t in times if len(t)]
    if not times:
        return time_span(capture)
    return int(min(t.min() for t in times)), int(max(t.max() for t in times))


def block_end_times(capture) -> np.ndarray:
    """Each block's free time, or the end of the capture for blocks never freed (int64 ns)."""
    end = time_span(capture)[1]
    t_free = capture.blocks["t_free"].astype(np.int64)
    return np.where(t_free >= 0, t_free, end)


def live_bytes(blocks: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Live bytes as a step function: (times, bytes after the change at each time), int64.

    Allocations add ``size`` at ``t_alloc``; frees subtract it at ``t_free``. Changes at one
    instant are merged, so ``times`` is strictly increasing. ``mask`` selects blocks. Host blocks
    (pinned host memory) are not device memory and are left out.
    """
    b = blocks if mask is None else blocks[mask]
    b = b[b["kind"] != abi.AllocKind.HOST]
    freed = b["t_free"] >= 0
    t = np.concatenate([b["t_alloc"].astype(np.int64), b["t_free"][freed].astype(np.int64)])
    d = np.concatenate([b["size"].astype(np.int64), -b["size"][freed].astype(np.int64)])
    return step_function(t, d)


def step_function(t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of the changes ``d`` made at times ``t`` (int64) as a step function: (times, the sum
    after the changes at each time). Changes at one instant are merged, so ``times`` is strictly
    increasing; no change: two empty arrays.
    """
    if not len(t):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    times, first = np.unique(t, return_index=True)
    last = np.r_[first[1:], len(t)] - 1
    return times, np.cumsum(d)[last]


def live_bytes_peak(blocks: np.ndarray) -> tuple[int, int]:
    """(peak of the sum of live block sizes in B, its time in ns; 0, -1 without device blocks) over
    ``blocks`` (rows of ``capture.blocks``); a free at time t counts before an allocation at t."""
    blocks = blocks[blocks["kind"] != abi.AllocKind.HOST]
    if not len(blocks):
        return 0, -1
    size = blocks["size"].astype(np.int64)
    freed = blocks["t_free"] >= 0
    t = np.concatenate((blocks["t_alloc"], blocks["t_free"][freed]))
    d = np.concatenate((size, -size[freed]))
    order = np.lexsort((d, t))  # frees (negative) first at one time
    live = np.cumsum(d[order])
    k = int(np.argmax(live))
    return int(live[k]), int(t[order][k])


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


def op_names(capture) -> list[str]:
    """Readable name of every op row (``Capture.kernel_name``), computed once per distinct kind."""
    ops = capture.ops
    if not len(ops):
        return []
    keys = np.stack([ops["pid"].astype(np.uint64), ops["type"].astype(np.uint64), ops["handle"],
                     ops["copy_kind"].astype(np.uint64)], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    names = [capture.kernel_name(int(i)) for i in first]
    return [names[i] for i in inverse.reshape(-1)]


def card_bytes(capture) -> int | None:
    """The card's total memory (device0.total_bytes, noted by the shim), or None."""
    for notes in capture.notes.values():
        v = notes.get("device0.total_bytes")
        if v and v.isdigit():
            return int(v)
    return None


def drops_hint(meta: dict) -> str:
    """How to avoid dropped events next time, for the line that counts them: the ring was full (the
    daemon drains it more slowly than the job writes), so give the launcher a larger ring."""
    size = meta.get("ring_capacity") if isinstance(meta, dict) else None
    now = f" than its {size:,} records" if isinstance(size, int) and size > 0 else ""
    bigger = f" (e.g. --capacity {2 * size})" if now else ""
    return f"the event ring was full: run pyobmem-run again with a --capacity larger{now}{bigger}"
