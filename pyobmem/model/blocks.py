"""The per-block model: lifetimes, accesses per iteration, idle intervals, classes.

``build_blocks(capture, iterations) -> BlockModel``. One row per row of ``capture.blocks``; all
times are CLOCK_MONOTONIC ns (launch times as the shim saw them, not GPU execution times), sizes
bytes, op indices rows of ``capture.ops``. "Positions" count ops of the main launch sequence
(``IterationModel.seq_rows``) from the start of the iteration. Classes, roles and thresholds are
defined in docs/model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import abi
from .gpuclock import gpu_op_times
from .iterations import IterationModel
from .queries import live_bytes_peak

CLASSES = ("persistent", "iteration-scoped", "transient", "arena", "never-accessed", "other")
PERSISTENT, SCOPED, TRANSIENT, ARENA, NEVER, OTHER = range(6)
ARENA_OPS = 0.5  # an arena is touched by at least this share of the main sequence's ops ...
ARENA_BYTES = 0.2  # ... and is at least this share of the peak of live bytes
TRANSIENT_ITER = 0.05  # transient: lifetime below this share of an iteration
NO_ITER_PERSISTENT = 0.5  # without iterations: persistent above this share of the capture span
NO_ITER_TRANSIENT = 0.01  # ... transient below this share
ITERATIVE_SHARE = 0.9  # a role is iterative when one signature covers this share of its iterations

_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class IdleIntervals:
    """Idle intervals: the time between two consecutive accesses of a block (one row each).

    ``block`` (int32, block row), ``iteration`` (int32, iteration of the first access, -1 outside
    iterations), ``index`` (int32, rank of the first access among the block's accesses in that
    iteration, so (role, index) names "the same interval" across iterations), ``start_op`` and
    ``end_op`` (int64 op rows of the two accesses), ``ns`` (int64 duration, on the GPU clock when the
    capture has one: pyobmem.model.gpuclock), ``ops`` (int64, ops
    of the main sequence between the two), ``end_iteration`` (int32, iteration of the second
    access, -1 outside), ``wrap`` (bool: the second access is in the next iteration, i.e. the
    interval from the last access of iteration i to the first of i+1). Iterations are indices
    into the main regime's iterations (``IterationModel.main_rows()``).
    """

    block: np.ndarray = field(repr=False)
    iteration: np.ndarray = field(repr=False)
    index: np.ndarray = field(repr=False)
    start_op: np.ndarray = field(repr=False)
    end_op: np.ndarray = field(repr=False)
    ns: np.ndarray = field(repr=False)
    ops: np.ndarray = field(repr=False)
    end_iteration: np.ndarray = field(repr=False)
    wrap: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.ns)


@dataclass(frozen=True)
class BlockModel:
    """What each block did. Arrays have one row per block (rows of ``capture.blocks``).

    ``size`` (int64 B); ``t_alloc``, ``t_free`` (ns, t_free -1 when never freed); ``t_end`` (ns,
    t_free or the end of the capture); ``lifetime_ns``; ``lifetime_iters`` (float, lifetime over
    the median iteration; nan without iterations); ``n_accesses`` (distinct ops touching it);
    ``first_op``/``last_op`` (op rows, -1 when none); ``first_t``/``last_t`` (ns, -1 when none);
    ``n_iterations`` (iterations of the main regime with an access); ``touch_share`` (share of the
    main sequence's ops that touch it); ``full_iterations`` (main-regime iterations lying wholly
    inside its lifetime); ``cls`` (int8 index into ``CLASSES``); ``role`` (int64: the block itself
    when it lives across iterations, else a key (>= 0) shared by the k-th blocks of one size
    allocated at one position of their iterations); ``iterative`` (bool, see docs/model.md); ``opaque``
    (bool: touched by an opaque launch, never swappable). ``acc_ptr`` (int64, n_blocks+1) indexes
    the access arrays ``acc_op`` (int64 op rows), ``acc_t`` (ns), ``acc_iter`` (int32, -1 outside
    the main regime: an index into ``IterationModel.main_rows()``), ``acc_pos`` (int32 position in the iteration, -1 outside), sorted by block
    then op. ``intervals``: ``IdleIntervals``. ``peak_live_bytes``/``peak_live_t``: the largest sum
    of live block sizes over the capture and when it happened. ``capture_end`` (ns).
    """

    size: np.ndarray = field(repr=False)
    t_alloc: np.ndarray = field(repr=False)
    t_free: np.ndarray = field(repr=False)
    t_end: np.ndarray = field(repr=False)
    lifetime_ns: np.ndarray = field(repr=False)
    lifetime_iters: np.ndarray = field(repr=False)
    n_accesses: np.ndarray = field(repr=False)
    first_op: np.ndarray = field(repr=False)
    last_op: np.ndarray = field(repr=False)
    first_t: np.ndarray = field(repr=False)
    last_t: np.ndarray = field(repr=False)
    n_iterations: np.ndarray = field(repr=False)
    touch_share: np.ndarray = field(repr=False)
    full_iterations: np.ndarray = field(repr=False)
    cls: np.ndarray = field(repr=False)
    role: np.ndarray = field(repr=False)
    iterative: np.ndarray = field(repr=False)
    opaque: np.ndarray = field(repr=False)
    acc_ptr: np.ndarray = field(repr=False)
    acc_op: np.ndarray = field(repr=False)
    acc_t: np.ndarray = field(repr=False)
    acc_iter: np.ndarray = field(repr=False)
    acc_pos: np.ndarray = field(repr=False)
    intervals: IdleIntervals = field(repr=False)
    peak_live_bytes: int = 0
    peak_live_t: int = -1
    capture_end: int = 0

    def __len__(self) -> int:
        return len(self.size)

    def class_name(self, row: int) -> str:
        return CLASSES[int(self.cls[row])]

    def class_names(self) -> list[str]:
        """One class name per block row."""
        return [CLASSES[c] for c in self.cls]

    def accesses(self, row: int) -> np.ndarray:
        """The accesses of block ``row`` in op order: a structured array with ``op`` (op row),
        ``ts_ns``, ``iteration`` (-1 outside the main regime) and ``position`` (in the iteration)."""
        a, b = int(self.acc_ptr[row]), int(self.acc_ptr[row + 1])
        out = np.zeros(b - a, dtype=[("op", "<i8"), ("ts_ns", "<i8"), ("iteration", "<i4"), ("position", "<i4")])
        out["op"], out["ts_ns"] = self.acc_op[a:b], self.acc_t[a:b]
        out["iteration"], out["position"] = self.acc_iter[a:b], self.acc_pos[a:b]
        return out


def capture_end_ns(capture) -> int:
    """The last time seen in the capture (ops, allocations, frees)."""
    cands = [0]
    if len(capture.ops):
        cands.append(int(capture.ops["ts_ns"].max()))
    if len(capture.blocks):
        cands.append(int(capture.blocks["t_alloc"].max()))
        cands.append(int(capture.blocks["t_free"].max()))
    return max(cands)


def build_blocks(capture, it: IterationModel) -> BlockModel:
    """The per-block model of ``capture`` under the iterations ``it`` (see BlockModel)."""
    blocks, ops = capture.blocks, capture.ops
    nb = len(blocks)
    end = capture_end_ns(capture)
    size = blocks["size"].astype(np.int64)
    t_alloc = blocks["t_alloc"].astype(np.int64)
    t_free = blocks["t_free"].astype(np.int64)
    t_end = np.where(t_free >= 0, t_free, end)
    lifetime = t_end - t_alloc
    peak, peak_t = live_bytes_peak(blocks)

    # Accesses, one per (block, op), sorted by block then op.
    acc = capture.accesses
    order = np.argsort(acc["block"], kind="stable")  # accesses are already in op order
    ab = acc["block"][order].astype(np.int64)
    ao = acc["op"][order].astype(np.int64)
    del order
    keep = np.ones(len(ab), bool)
    keep[1:] = (ab[1:] != ab[:-1]) | (ao[1:] != ao[:-1])
    ab, ao = ab[keep], ao[keep]
    del keep
    acc_ptr = np.concatenate(([0], np.cumsum(np.bincount(ab, minlength=nb)))).astype(np.int64)
    at = ops["ts_ns"][ao].astype(np.int64)
    gpu = gpu_op_times(capture)  # idle intervals last their GPU time when the capture has a GPU clock
    at_run = at if gpu is None else gpu[ao].astype(np.int64)
    n_acc = np.diff(acc_ptr)
    has = n_acc > 0
    first_op = np.where(has, ao[np.minimum(acc_ptr[:-1], max(len(ao) - 1, 0))] if len(ao) else -1, -1)
    last_op = np.where(has, ao[np.maximum(acc_ptr[1:] - 1, 0)] if len(ao) else -1, -1)
    first_t = np.where(has, ops["ts_ns"][np.maximum(first_op, 0)] if len(ops) else -1, -1).astype(np.int64)
    last_t = np.where(has, ops["ts_ns"][np.maximum(last_op, 0)] if len(ops) else -1, -1).astype(np.int64)

    opaque_op = (ops["type"] == abi.Ev.LAUNCH) & ((ops["flags"] & int(abi.LaunchFlag.OPAQUE)) != 0)
    opaque = np.zeros(nb, bool)
    if len(ao):
        opaque[ab[opaque_op[ao]]] = True

    # Positions in the main sequence and iterations (main regime only).
    seq_rows = it.seq_rows
    in_seq = np.zeros(len(ops), bool)
    in_seq[seq_rows] = True
    seq_of_op = (np.cumsum(in_seq) - 1).astype(np.int64)  # last sequence op at or before the row
    del in_seq
    main = it.main_rows()
    m_start_op, m_end_op = it.start_op[main], it.end_op[main]
    m_start_seq = it.start_seq[main]
    m_t0, m_t1 = it.t_start[main], it.t_end[main]
    k = np.searchsorted(m_start_op, ao, side="right") - 1
    inside = (k >= 0) & (ao < m_end_op[np.maximum(k, 0)]) if len(main) else np.zeros(len(ao), bool)
    acc_iter = np.where(inside, k, -1).astype(np.int32)
    acc_pos = np.where(inside, seq_of_op[ao] - m_start_seq[np.maximum(k, 0)] if len(main) else 0, -1).astype(np.int32)
    del k, inside
    seq_pos = seq_of_op[ao]

    # Groups (block, iteration) of accesses inside iterations.
    gstart = np.ones(len(ab), bool)
    gstart[1:] = (ab[1:] != ab[:-1]) | (acc_iter[1:] != acc_iter[:-1])
    gidx = np.flatnonzero(gstart)
    g_block = ab[gidx]
    g_iter = acc_iter[gidx]
    n_iters_touched = np.bincount(g_block[g_iter >= 0], minlength=nb).astype(np.int64)
    n_seq = max(len(seq_rows), 1)
    seq_acc = np.isin(ao, seq_rows) if len(seq_rows) else np.zeros(len(ao), bool)
    touch_share = np.bincount(ab[seq_acc], minlength=nb) / n_seq
    del seq_acc

    # Classes.
    iter_ns = it.iteration_ns
    if len(main):
        full = np.searchsorted(np.sort(m_t1), t_end, side="right") - np.searchsorted(np.sort(m_t0), t_alloc, side="left")
        full = np.maximum(full, 0).astype(np.int64)
        lifetime_iters = lifetime / iter_ns if iter_ns else np.full(nb, np.nan)
    else:
        full = np.zeros(nb, np.int64)
        lifetime_iters = np.full(nb, np.nan)
    cls = np.full(nb, SCOPED if len(main) else OTHER, np.int8)
    if len(main):
        cls[lifetime < TRANSIENT_ITER * iter_ns] = TRANSIENT
        cls[full >= 1] = PERSISTENT
    else:
        span = max(end - (int(t_alloc.min()) if nb else 0), 1)
        cls[lifetime < NO_ITER_TRANSIENT * span] = TRANSIENT
        cls[lifetime >= NO_ITER_PERSISTENT * span] = PERSISTENT
    cls[(touch_share >= ARENA_OPS) & (size >= ARENA_BYTES * max(peak, 1))] = ARENA
    cls[~has] = NEVER

    # Roles: a block living across iterations is its own role; others are keyed by (size, the
    # position of their allocation in its iteration).
    role = -(np.arange(nb, dtype=np.int64) + 1)
    if len(main):
        ka = np.searchsorted(m_t0, t_alloc, side="right") - 1
        in_it = (ka >= 0) & (t_alloc < m_t1[np.maximum(ka, 0)]) & (full == 0) & (cls != ARENA)
        seq_ts = ops["ts_ns"][seq_rows]
        apos = np.searchsorted(seq_ts, t_alloc, side="left") - m_start_seq[np.maximum(ka, 0)]
        if np.any(in_it):
            # (size, position, rank among the same-size allocations at that position of the
            # iteration): the k-th such allocation plays the same role every iteration.
            r = np.flatnonzero(in_it)
            o = r[np.lexsort((r, size[r], apos[r], ka[r]))]
            same = np.zeros(len(o), bool)
            same[1:] = (ka[o][1:] == ka[o][:-1]) & (apos[o][1:] == apos[o][:-1]) & (size[o][1:] == size[o][:-1])
            starts = np.flatnonzero(~same)
            rank = np.arange(len(o)) - starts[np.cumsum(~same) - 1]
            keys = np.zeros(len(o), dtype=[("s", "<i8"), ("p", "<i8"), ("k", "<i8")])
            keys["s"], keys["p"], keys["k"] = size[o], apos[o], rank
            _, inv = np.unique(keys, return_inverse=True)
            role[o] = inv.ravel().astype(np.int64)

    # Access signatures per (block, iteration): an order-free hash of the positions.
    with np.errstate(over="ignore"):
        h = acc_pos.astype(np.uint64) + np.uint64(1)
        h = (h * _MIX) ^ (h >> np.uint64(7))
        h = h * _MIX
        sig = np.add.reduceat(h, gidx) if len(gidx) else np.zeros(0, np.uint64)
        sig = sig + np.diff(np.append(gidx, len(ab))).astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
    iterative = np.zeros(nb, bool)
    ok = g_iter >= 0
    if np.any(ok):
        g_role = role[g_block[ok]]
        _, r_inv, r_cnt = np.unique(g_role, return_inverse=True, return_counts=True)
        pairs = np.zeros(len(g_role), dtype=[("r", "<i8"), ("s", "<u8")])
        pairs["r"], pairs["s"] = g_role, sig[ok]
        _, p_inv, p_cnt = np.unique(pairs, return_inverse=True, return_counts=True)
        best = np.zeros(len(r_cnt), np.int64)
        np.maximum.at(best, r_inv.ravel(), p_cnt[p_inv.ravel()])
        role_iter = (best >= 2) & (best >= ITERATIVE_SHARE * r_cnt)
        blk_role_iter = np.zeros(nb, bool)
        blk_role_iter[g_block[ok]] = role_iter[r_inv.ravel()]
        iterative = blk_role_iter

    # Idle intervals between consecutive accesses of a block.
    nxt = np.flatnonzero(ab[1:] == ab[:-1]) if len(ab) > 1 else np.zeros(0, np.int64)
    g_of_acc = np.cumsum(gstart) - 1
    rank = np.arange(len(ab)) - gidx[g_of_acc]
    intervals = IdleIntervals(
        block=ab[nxt].astype(np.int32),
        iteration=acc_iter[nxt],
        index=rank[nxt].astype(np.int32),
        start_op=ao[nxt],
        end_op=ao[nxt + 1],
        ns=at_run[nxt + 1] - at_run[nxt],
        ops=seq_pos[nxt + 1] - seq_pos[nxt],
        end_iteration=acc_iter[nxt + 1],
        wrap=(acc_iter[nxt + 1] == acc_iter[nxt] + 1) & (acc_iter[nxt] >= 0),
    )
    return BlockModel(
        size=size, t_alloc=t_alloc, t_free=t_free, t_end=t_end, lifetime_ns=lifetime,
        lifetime_iters=np.asarray(lifetime_iters, np.float64), n_accesses=n_acc.astype(np.int64),
        first_op=np.asarray(first_op, np.int64), last_op=np.asarray(last_op, np.int64), first_t=first_t,
        last_t=last_t, n_iterations=n_iters_touched, touch_share=touch_share, full_iterations=full, cls=cls,
        role=role, iterative=iterative, opaque=opaque, acc_ptr=acc_ptr, acc_op=ao, acc_t=at, acc_iter=acc_iter,
        acc_pos=acc_pos, intervals=intervals, peak_live_bytes=peak, peak_live_t=peak_t, capture_end=end,
    )


SUBRANGE_DTYPE = np.dtype([("start", "<i8"), ("end", "<i8"), ("ops", "<i8"), ("first_op", "<i8"), ("last_op", "<i8")])


def segment_subranges(capture, row: int) -> np.ndarray:
    """Tensor-level refinement of block ``row`` (a segment): the distinct offsets kernel
    arguments and copies pointed at inside it, each taken as the start of a sub-range that ends
    at the next offset (the last at the block's end). Structured array (SUBRANGE_DTYPE): start,
    end (bytes, end exclusive), ops (distinct ops pointing at the start), first_op, last_op (op
    rows). One row [0, size) when only offset 0 is seen. It is a refinement, not ground truth:
    a kernel given a pointer into the middle of a tensor (a view) splits it too."""
    acc = capture.accesses
    sel = np.flatnonzero(acc["block"] == row)
    size = int(capture.blocks["size"][row])
    if not len(sel):
        return np.zeros(0, SUBRANGE_DTYPE)
    off = acc["offset"][sel].astype(np.int64)
    op = acc["op"][sel].astype(np.int64)
    pairs = np.unique(np.stack((off, op), axis=1), axis=0)  # distinct (offset, op)
    starts, first, counts = np.unique(pairs[:, 0], return_index=True, return_counts=True)
    out = np.zeros(len(starts), SUBRANGE_DTYPE)
    out["start"] = starts
    out["end"] = np.append(starts[1:], max(size, int(starts[-1]) + 1))
    out["ops"] = counts
    out["first_op"] = pairs[first, 1]
    out["last_op"] = pairs[first + counts - 1, 1]
    return out
