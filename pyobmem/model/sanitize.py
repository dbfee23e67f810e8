"""Records with impossible values (a corrupted or hand-edited capture) left out before analysis.

``sanitize(capture) -> (Capture, n_corrupt)`` returns a copy of the capture without the rows whose
values cannot come from a real run, and how many there were; the verbs say so once
(``corrupt_note``). What counts as impossible (docs/model.md, "Corrupt records"):

- a time before the capture started (metadata ``start_monotonic_ns``, 1 s of slack), or outside the
  run's cluster of times: sorted, the times of a run have no gap of a day; a value beyond such a
  gap from the bulk of the times (a random 64-bit number: centuries away) is corrupt;
- an op whose time jumps away from both its neighbours by more than 10 s (the records are drained
  in time order: an isolated spike up or down is a corrupted time, a pause moves every later op);
- a block larger than 1 PiB, a copy or set of more than 1 PiB, a launch touching more blocks than
  the block ids can name (2^24), a free before its allocation (the free is dropped: never freed),
  an access at an offset beyond its block's end.

Rows are dropped (ops, blocks, accesses, drops, untracked addresses) and the accesses re-indexed;
a process whose first time is corrupt keeps its row with the time of its first valid op.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import abi

MAX_BYTES = 1 << 50  # 1 PiB: no device allocation, copy or set is larger
MAX_TOUCHED = 1 << 24  # block ids are 24 bits
CLUSTER_GAP_NS = 24 * 3600 * 10**9  # no real run has a day without a CUDA event inside it... and
# a corrupted 64-bit time lands days to centuries away from the run
SPIKE_NS = 10 * 10**9  # an op out of order with both neighbours by more than this is corrupt
START_SLACK_NS = 10**9


def _cluster_bounds(times: np.ndarray) -> tuple[int, int] | None:
    """[lo, hi] of the largest group of times with no gap over CLUSTER_GAP_NS between them."""
    if not len(times):
        return None
    t = np.sort(times.astype(np.int64))
    cut = np.flatnonzero(np.diff(t) > CLUSTER_GAP_NS) + 1
    starts = np.r_[0, cut]
    ends = np.r_[cut, len(t)]
    k = int(np.argmax(ends - starts))
    return int(t[starts[k]]), int(t[ends[k] - 1])


def _spikes(ts: np.ndarray) -> np.ndarray:
    """Isolated times: more than SPIKE_NS above (or below) both neighbours."""
    t = ts.astype(np.int64)
    n = len(t)
    bad = np.zeros(n, bool)
    if n < 3:
        return bad
    d_prev = t[1:-1] - t[:-2]
    d_next = t[1:-1] - t[2:]
    bad[1:-1] = ((d_prev > SPIKE_NS) & (d_next > SPIKE_NS)) | ((d_prev < -SPIKE_NS) & (d_next < -SPIKE_NS))
    # the ends compare with their one neighbour, only when going backwards in time
    bad[0] = t[0] - t[1] > SPIKE_NS
    bad[-1] = t[-2] - t[-1] > SPIKE_NS
    return bad


def sanitize(capture):
    """(a capture without impossible rows, the number of rows left out); the capture itself when
    nothing is wrong. Idempotent."""
    if getattr(capture, "_pyobmem_sanitized", False):
        return capture, int(getattr(capture, "corrupt_records", 0))
    blocks, ops, acc = capture.blocks, capture.ops, capture.accesses
    start = capture.meta.get("start_monotonic_ns") if isinstance(capture.meta, dict) else None
    lo_meta = int(start) - START_SLACK_NS if isinstance(start, int) and not isinstance(start, bool) and start > 0 else 0

    # times are int64: a corrupted 64-bit time may read as negative
    cand = np.concatenate([ops["ts_ns"], blocks["t_alloc"], blocks["t_free"]]).astype(np.int64)
    bounds = _cluster_bounds(cand[cand >= lo_meta])
    t_free = blocks["t_free"].astype(np.int64)

    def ok_time(t) -> np.ndarray:
        t = np.asarray(t, np.int64)
        if bounds is None:
            return np.zeros(len(t), bool)
        return (t >= max(bounds[0], lo_meta)) & (t <= bounds[1])

    def ok_near(t) -> np.ndarray:
        """Records that need not be CUDA events (process starts, untracked frees, drops): after
        the start, within a day of the CUDA events."""
        t = np.asarray(t, np.int64)
        if bounds is None:
            return np.ones(len(t), bool)
        return (t >= max(bounds[0] - CLUSTER_GAP_NS, lo_meta)) & (t <= bounds[1] + CLUSTER_GAP_NS)

    op_ok = ok_time(ops["ts_ns"])
    op_ok &= ~(np.isin(ops["type"], [int(abi.Ev.MEMCPY), int(abi.Ev.MEMSET)]) & (ops["bytes"].astype(np.uint64) > MAX_BYTES))
    op_ok &= ops["n_touched"].astype(np.uint64) <= MAX_TOUCHED
    idx = np.flatnonzero(op_ok)
    sp = _spikes(ops["ts_ns"][idx].astype(np.int64))
    op_ok[idx[sp]] = False

    blk_ok = ok_time(blocks["t_alloc"]) & (blocks["size"].astype(np.uint64) <= MAX_BYTES)
    freed = t_free >= 0
    free_bad = freed & ~(ok_time(np.where(freed, t_free, 0)) & (t_free >= blocks["t_alloc"].astype(np.int64)))
    free_bad &= blk_ok
    n_bad = int((~op_ok).sum() + (~blk_ok).sum() + free_bad.sum())

    # accesses: to dropped ops or blocks (not counted: the op or block was), beyond the block's end
    a_ok = op_ok[acc["op"]] & blk_ok[acc["block"]] if len(acc) else np.zeros(0, bool)
    beyond = np.zeros(len(acc), bool)
    if len(acc):
        beyond = acc["offset"].astype(np.uint64) >= blocks["size"][acc["block"]].astype(np.uint64)
        beyond &= blk_ok[acc["block"]] & op_ok[acc["op"]]
        n_bad += int(beyond.sum())
        a_ok &= ~beyond

    drops_ok = ok_near(capture.drops["ts_ns"])
    unt_ok = ok_near(capture.untracked["ts_ns"])
    proc_bad = ~ok_near(capture.processes["ts_ns"])
    n_bad += int((~drops_ok).sum() + (~unt_ok).sum() + proc_bad.sum())

    if n_bad == 0:
        capture._pyobmem_sanitized = True
        capture.corrupt_records = 0
        return capture, 0

    new_op = np.cumsum(op_ok) - 1
    new_blk = np.cumsum(blk_ok) - 1
    acc2 = acc[a_ok].copy()
    acc2["op"] = new_op[acc2["op"]]
    acc2["block"] = new_blk[acc2["block"]]
    blocks2 = blocks[blk_ok].copy()
    blocks2["t_free"][free_bad[blk_ok]] = -1
    ops2 = ops[op_ok]
    procs = capture.processes.copy()
    for i in np.flatnonzero(proc_bad):
        mine = ops2["ts_ns"][ops2["pid"] == procs["pid"][i]]
        procs["ts_ns"][i] = int(mine[0]) if len(mine) else (bounds[0] if bounds else 0)

    def block_rows(rows: np.ndarray) -> np.ndarray:
        """Block rows renumbered; -1 for none or a block left out."""
        rows = np.asarray(rows, np.int64)
        ok = rows >= 0
        ok[ok] = blk_ok[rows[ok]]
        return np.where(ok, new_blk[np.where(ok, rows, 0)], -1) if len(new_blk) else np.full(len(rows), -1)

    swaps, nccl = capture.swaps.copy(), capture.nccl.copy()
    swaps["block"] = block_rows(swaps["block"])
    nccl["send_block"], nccl["recv_block"] = block_rows(nccl["send_block"]), block_rows(nccl["recv_block"])
    out = dataclasses.replace(capture, blocks=blocks2, ops=ops2, accesses=acc2, processes=procs,
                              drops=capture.drops[drops_ok], untracked=capture.untracked[unt_ok], swaps=swaps,
                              nccl=nccl)
    out._pyobmem_sanitized = True
    out.corrupt_records = n_bad
    return out, n_bad


def corrupt_note(n: int) -> str:
    """The one line said about corrupt records."""
    return (f"the capture has {n} corrupt record{'s' if n != 1 else ''} (impossible times or sizes); "
            f"{'they were' if n != 1 else 'it was'} left out")
