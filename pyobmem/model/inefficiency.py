"""Memory inefficiencies per block: early allocation, late free, long idle, never accessed, leaked.

Leaked (``leak_cutoff``): never freed and no longer used at the end of the run (not in the last
two iterations); a block never accessed is reported as never-accessed only.

Blocks allocated afresh every iteration at the same place (one role, docs/model.md) are reported
once, with the number of instances; sizes are per instance (one instance is live at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blocks import CLASSES, NEVER, BlockModel
from .gpuclock import gpu_op_times
from .iterations import IterationModel
from .properties import in_iteration_intervals

KINDS = ("early-allocation", "late-free", "long-idle", "never-accessed", "leaked")
SLACK_PCT = 10.0  # early allocation / late free: more than this % of an iteration
IDLE_PCT = 50.0  # long idle: an idle interval over this % of an iteration


@dataclass(frozen=True)
class Finding:
    """One inefficiency. ``kind``: one of KINDS. ``block``: a block row (the first instance).
    ``instances``: blocks of the same role with the finding. ``cls``: the block's class.
    ``bytes``: the block size (B). ``wasted_ns``: how long the bytes sit unused (ns; median over
    instances). ``iteration_share``: wasted_ns over the iteration length (None without
    iterations). ``start_pct``/``end_pct``: where in its iteration the waste starts and ends, as %
    of the iteration (None outside iterations). ``kernel_before``/``kernel_after``: op rows of
    the access before and after the waste (-1: none)."""

    kind: str
    block: int
    instances: int
    cls: str
    bytes: int
    wasted_ns: int
    iteration_share: float | None
    start_pct: float | None
    end_pct: float | None
    kernel_before: int
    kernel_after: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _pct(it: IterationModel, t: np.ndarray, clock: np.ndarray | None = None) -> np.ndarray:
    """% position of times in the main regime's iteration that contains them (nan outside).
    ``clock``: the time of every op row (pyobmem.model.gpuclock.gpu_op_times): ``t`` is on that
    clock and so are the iterations' bounds, else both are the host's."""
    main = it.main_rows()
    t = np.asarray(t, np.int64)
    if not len(main):
        return np.full(len(t), np.nan)
    if clock is None:
        t0, t1 = it.t_start[main], it.t_end[main]
    else:
        t0 = clock[it.start_op[main]]
        t1 = np.where(it.end_op[main] < len(clock), clock[np.minimum(it.end_op[main], len(clock) - 1)], clock[-1])
    k = np.searchsorted(t0, t, side="right") - 1
    kk = np.maximum(k, 0)
    ok = (k >= 0) & (t < t1[kk])
    return np.where(ok, 100.0 * (t - t0[kk]) / np.maximum(t1[kk] - t0[kk], 1), np.nan)


def leak_cutoff(it: IterationModel, bm: BlockModel) -> int:
    """A block never freed whose last access comes before this time (ns) is leaked: the start of
    the second-to-last iteration of the main regime (not used in the last two iterations, nor
    after them), or without iterations the middle of the span from the first allocation to the
    end of the capture. A block still used at the end is held on purpose, freed or not (PyTorch's
    caching allocator keeps its segments to exit)."""
    main = it.main_rows()
    if len(main) >= 2:
        return int(it.t_start[main[-2]])
    t0 = int(bm.t_alloc.min()) if len(bm) else 0
    return t0 + (int(bm.capture_end) - t0) // 2


def find_inefficiencies(
    capture, it: IterationModel, bm: BlockModel, *, slack_pct: float = SLACK_PCT, idle_pct: float = IDLE_PCT
) -> list:
    """All findings, sorted by bytes (then wasted time), largest first."""
    ref = it.iteration_ns
    span = max(bm.capture_end - (int(bm.t_alloc.min()) if len(bm) else 0), 1)
    slack = slack_pct / 100.0 * (ref if ref else span)
    has = bm.n_accesses > 0
    rows_kind = []  # (kind, rows, start_t, end_t, before_op, after_op)
    early = has & (bm.first_t - bm.t_alloc > slack)
    r = np.flatnonzero(early)
    rows_kind.append(("early-allocation", r, bm.t_alloc[r], bm.first_t[r], np.full(len(r), -1), bm.first_op[r]))
    late = has & (bm.t_free >= 0) & (bm.t_free - bm.last_t > slack)
    r = np.flatnonzero(late)
    rows_kind.append(("late-free", r, bm.last_t[r], bm.t_free[r], bm.last_op[r], np.full(len(r), -1)))
    if ref:
        iv = bm.intervals
        m = np.flatnonzero(in_iteration_intervals(it, bm) & (iv.ns > idle_pct / 100.0 * ref))
        if len(m):
            # the longest such interval of each block
            o = m[np.lexsort((-iv.ns[m], iv.block[m]))]
            first = np.ones(len(o), bool)
            first[1:] = iv.block[o][1:] != iv.block[o][:-1]
            o = o[first]
            # on the clock of the threshold: the GPU's when the capture has one (iv.ns), else the host's
            g = gpu_op_times(capture)
            ts = capture.ops["ts_ns"].astype(np.int64) if g is None else g
            rows_kind.append(("long-idle", iv.block[o].astype(np.int64), ts[iv.start_op[o]], ts[iv.end_op[o]],
                              iv.start_op[o], iv.end_op[o], g))
    r = np.flatnonzero(bm.cls == NEVER)
    rows_kind.append(("never-accessed", r, bm.t_alloc[r], bm.t_end[r], np.full(len(r), -1), np.full(len(r), -1)))
    r = np.flatnonzero((bm.t_free < 0) & has & (bm.last_t < leak_cutoff(it, bm)))
    rows_kind.append(("leaked", r, bm.last_t[r], np.full(len(r), bm.capture_end), bm.last_op[r], np.full(len(r), -1)))

    out = []
    for kind, rows, st, en, before, aft, *clock in rows_kind:
        if not len(rows):
            continue
        dur = (en - st).astype(np.int64)
        sp, ep = _pct(it, st, *clock), _pct(it, en, *clock)
        role = bm.role[rows]
        _, first, inv, cnt = np.unique(role, return_index=True, return_inverse=True, return_counts=True)
        inv = inv.ravel()
        by_group = np.argsort(inv, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(cnt)))
        for g, i0 in enumerate(first):
            i = int(i0)
            med = int(dur[i]) if cnt[g] == 1 else int(np.median(dur[by_group[bounds[g] : bounds[g + 1]]]))
            out.append(Finding(
                kind=kind, block=int(rows[i]), instances=int(cnt[g]), cls=CLASSES[int(bm.cls[rows[i]])],
                bytes=int(bm.size[rows[i]]), wasted_ns=med, iteration_share=(med / ref) if ref else None,
                start_pct=None if np.isnan(sp[i]) else round(float(sp[i]), 2),
                end_pct=None if np.isnan(ep[i]) else round(float(ep[i]), 2),
                kernel_before=int(before[i]), kernel_after=int(aft[i]),
            ))
    out.sort(key=lambda f: (-f.bytes, -f.wasted_ns, KINDS.index(f.kind), f.block))
    return out
