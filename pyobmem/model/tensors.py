"""Tensor-level refinement of the per-block model (docs/model.md, "Tensor level").

A block is what the driver handed out; PyTorch's caching allocator (and JAX/TF arenas) place many
tensors inside one segment and keep the segment for the whole run, so at block level nearly
everything is "persistent" and touched all the time. Kernel arguments point at tensors inside
segments, so the distinct (block, offset) pairs seen in accesses name finer ranges:

- **Sub-block**: one distinct (block, offset) seen in an access; it extends to the next offset
  seen in that block over the whole capture (the last to the block's end). Bytes of a block
  before its first offset seen, and blocks never accessed, are one untouched sub-block each, so
  sub-block bytes add up to block bytes.
- **Stable**: a sub-block touched at the same set of positions (its *signature*) in at least
  ``max(2, floor(0.9 n))`` of the n main-regime iterations its block lives through. A stable
  sub-block is what a persistent tensor looks like (weights, gradients, optimizer state never move
  in PyTorch); an activation the allocator happens to put at the same offset every iteration looks
  the same, so "persistent" at tensor level is an upper bound.
- **Classes** (refined only in blocks whose block-level class is persistent or arena, the ones
  block level cannot split, and where at least two offsets were seen, i.e. that hold several
  tensors; a block holding one tensor keeps its block-level class): never-accessed (untouched sub-block), persistent (stable),
  transient (touched in main iterations, not stable, and within each iteration its accesses span
  under 5% of the iteration, median), iteration-scoped (touched in main iterations, not stable:
  what lives there changes from one iteration to the next, so it does not carry data across the
  iteration), other (touched only outside the main regime's iterations: warm-up, evaluation, the
  end). Sub-blocks of other blocks take their block's class.
- **Reuse intervals**: consecutive accesses of one sub-block (the idle intervals at tensor
  level). The same interval in another iteration is the one between the same two positions (the
  second taken + P when it lies in the next iteration), wherever the allocator put the tensor, so
  intervals stay comparable when activations move between segments.

Everything is vectorised (sorts and bincounts over the accesses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .blocks import ARENA, NEVER, OTHER, PERSISTENT, SCOPED, TRANSIENT, TRANSIENT_ITER, BlockModel
from .iterations import IterationModel

STABLE_SHARE = 0.9  # a sub-block / an interval recurs when seen in floor(0.9 n) of n iterations
_MIX = np.uint64(0x9E3779B97F4A7C15)
_OFF_BITS = 40  # sub-block key: block << 40 | offset (offsets below 1 TiB)


def recur_threshold(n: int) -> int:
    """Iterations out of n in which a pattern must be seen to recur: max(2, floor(0.9 n))."""
    return max(2, int(np.floor(STABLE_SHARE * n + 1e-9)))


@dataclass(frozen=True)
class TensorIntervals:
    """Reuse intervals of sub-blocks (one row each): ``sub`` (sub-block row), ``start_op``/``end_op``
    (op rows), ``ns``, ``iteration`` and ``end_iteration`` (main-regime iteration indices, -1
    outside), ``key`` (int64: pos_a * 2P + pos_b (+P when the second access is in the next
    iteration); -1 when not measured), ``measured`` (bool: inside one iteration, or the wrap into the
    next contiguous one), ``recurring`` (bool: measured and its key is seen in at least
    ``recur_threshold`` iterations)."""

    sub: np.ndarray = field(repr=False)
    start_op: np.ndarray = field(repr=False)
    end_op: np.ndarray = field(repr=False)
    ns: np.ndarray = field(repr=False)
    iteration: np.ndarray = field(repr=False)
    end_iteration: np.ndarray = field(repr=False)
    key: np.ndarray = field(repr=False)
    measured: np.ndarray = field(repr=False)
    recurring: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.ns)


@dataclass(frozen=True)
class TensorModel:
    """Sub-blocks, one row each, sorted by (block, start). ``block`` (block row), ``start``/``end``
    (byte offsets in the block, end exclusive), ``size`` (end - start), ``n_accesses`` (distinct ops),
    ``n_iterations`` (main iterations touching it), ``stable`` (bool), ``refined`` (bool: its block
    was split, i.e. its block-level class is persistent or arena), ``cls`` (int8 index into
    ``CLASSES``), ``iterative`` (stable, or for an unrefined block the block's own iterative flag),
    ``intervals`` (TensorIntervals)."""

    block: np.ndarray = field(repr=False)
    start: np.ndarray = field(repr=False)
    end: np.ndarray = field(repr=False)
    size: np.ndarray = field(repr=False)
    n_accesses: np.ndarray = field(repr=False)
    n_iterations: np.ndarray = field(repr=False)
    stable: np.ndarray = field(repr=False)
    refined: np.ndarray = field(repr=False)
    cls: np.ndarray = field(repr=False)
    iterative: np.ndarray = field(repr=False)
    intervals: TensorIntervals = field(repr=False)

    def __len__(self) -> int:
        return len(self.size)

    def of_block(self, row: int) -> np.ndarray:
        """Sub-block rows of block ``row``."""
        a, b = np.searchsorted(self.block, [row, row + 1])
        return np.arange(a, b)


def build_tensors(capture, it: IterationModel, bm: BlockModel) -> TensorModel:
    """The tensor-level model of ``capture`` (see the module docstring)."""
    acc, ops = capture.accesses, capture.ops
    nb = len(bm)
    bsize = bm.size
    ab = acc["block"].astype(np.int64)
    key = (ab << _OFF_BITS) | np.minimum(acc["offset"].astype(np.int64), (1 << _OFF_BITS) - 1)
    del ab
    ukey, sub = np.unique(key, return_inverse=True)
    sub = sub.ravel().astype(np.int64)
    del key
    s_block = ukey >> _OFF_BITS
    s_start = ukey & ((1 << _OFF_BITS) - 1)
    nxt_same = np.zeros(len(ukey), bool)
    nxt_same[:-1] = s_block[1:] == s_block[:-1]
    s_end = np.where(nxt_same, np.roll(s_start, -1), bsize[s_block] if len(ukey) else 0)
    s_end = np.maximum(s_end, s_start + 1)

    # Accesses per sub-block, one per (sub-block, op), in op order.
    order = np.argsort(sub, kind="stable")
    a_sub = sub[order]
    a_op = acc["op"][order].astype(np.int64)
    del order, sub
    keep = np.ones(len(a_sub), bool)
    keep[1:] = (a_sub[1:] != a_sub[:-1]) | (a_op[1:] != a_op[:-1])
    a_sub, a_op = a_sub[keep], a_op[keep]
    del keep
    ns_sub = len(ukey)
    n_acc = np.bincount(a_sub, minlength=ns_sub).astype(np.int64)

    # Iteration and position of each access (main regime).
    main = it.main_rows()
    nI = len(main)
    seq_rows = it.seq_rows
    in_seq = np.zeros(len(ops), bool)
    in_seq[seq_rows] = True
    seq_of_op = (np.cumsum(in_seq) - 1).astype(np.int64)
    del in_seq
    if nI:
        k = np.searchsorted(it.start_op[main], a_op, side="right") - 1
        kk = np.maximum(k, 0)
        inside = (k >= 0) & (a_op < it.end_op[main][kk])
        a_iter = np.where(inside, k, -1).astype(np.int32)
        a_pos = np.where(inside, seq_of_op[a_op] - it.start_seq[main][kk], -1).astype(np.int32)
        del k, kk, inside
    else:
        a_iter = np.full(len(a_op), -1, np.int32)
        a_pos = np.full(len(a_op), -1, np.int32)
    P = int(it.main_regime.period_ops) if nI else 1
    a_t = ops["ts_ns"][a_op].astype(np.int64)

    # Groups (sub-block, iteration) inside iterations: signature and span.
    gstart = np.ones(len(a_sub), bool)
    gstart[1:] = (a_sub[1:] != a_sub[:-1]) | (a_iter[1:] != a_iter[:-1])
    gidx = np.flatnonzero(gstart)
    gend = np.append(gidx[1:], len(a_sub)) - 1
    g_sub, g_iter = a_sub[gidx], a_iter[gidx]
    ing = g_iter >= 0
    n_iters = np.bincount(g_sub[ing], minlength=ns_sub).astype(np.int64)
    with np.errstate(over="ignore"):
        h = a_pos.astype(np.uint64) + np.uint64(1)
        h = (h * _MIX) ^ (h >> np.uint64(29))
        h = h * _MIX
        sig = np.add.reduceat(h, gidx) if len(gidx) else np.zeros(0, np.uint64)
    del h, seq_of_op
    stable = np.zeros(ns_sub, bool)
    span_med = np.zeros(ns_sub)
    if nI and np.any(ing):
        gs, gsig = g_sub[ing], sig[ing]
        # most common signature per sub-block: sort by (sub-block, signature), count equal runs
        o = np.lexsort((gsig, gs))
        ss, sh = gs[o], gsig[o]
        brk = np.ones(len(ss), bool)
        brk[1:] = (ss[1:] != ss[:-1]) | (sh[1:] != sh[:-1])
        st = np.flatnonzero(brk)
        run = np.diff(np.append(st, len(ss)))
        rs = ss[st]
        sb = np.ones(len(rs), bool)
        sb[1:] = rs[1:] != rs[:-1]
        best = np.zeros(ns_sub, np.int64)
        best[rs[sb]] = np.maximum.reduceat(run, np.flatnonzero(sb))
        del o, ss, sh, brk, st, run, rs, sb
        alive = bm.full_iterations[s_block]
        thr = np.maximum(2, np.floor(STABLE_SHARE * alive + 1e-9)).astype(np.int64)
        stable = best >= thr
        span = (a_t[gend] - a_t[gidx])[ing].astype(np.float64)
        # median per sub-block of the span of its accesses within each iteration
        o = np.lexsort((span, gs))
        cnt = np.bincount(gs, minlength=ns_sub)
        first = np.concatenate(([0], np.cumsum(cnt)[:-1]))
        mid = first + np.maximum(cnt - 1, 0) // 2
        has = cnt > 0
        span_med[has] = span[o][mid[has]]
        del span, o

    # Untouched sub-blocks: blocks never accessed, and the bytes before a block's first offset.
    first_off = np.full(nb, -1, np.int64)
    if len(ukey):
        fb = np.ones(len(ukey), bool)
        fb[1:] = s_block[1:] != s_block[:-1]
        first_off[s_block[fb]] = s_start[fb]
    pre_blocks = np.flatnonzero(first_off != 0)
    pre_end = np.where(first_off[pre_blocks] < 0, bsize[pre_blocks], first_off[pre_blocks])
    n_pre = len(pre_blocks)

    blk = np.concatenate((s_block, pre_blocks)).astype(np.int64)
    start = np.concatenate((s_start, np.zeros(n_pre, np.int64)))
    end = np.concatenate((s_end, pre_end)).astype(np.int64)
    o = np.lexsort((start, blk))
    inv = np.empty(len(o), np.int64)
    inv[o] = np.arange(len(o))  # old sub-block row -> new row

    # Classes.
    bcls = bm.cls[blk]
    touched = np.concatenate((n_acc > 0, np.zeros(n_pre, bool)))
    split = np.bincount(blk[touched], minlength=nb) >= 2  # blocks with two offsets or more seen
    refined = ((bcls == PERSISTENT) | (bcls == ARENA)) & split[blk]
    n_it = np.concatenate((n_iters, np.zeros(n_pre, np.int64)))
    stb = np.concatenate((stable, np.zeros(n_pre, bool)))
    smed = np.concatenate((span_med, np.zeros(n_pre)))
    cls = bcls.astype(np.int8).copy()
    iter_ns = it.iteration_ns
    if nI:
        r_cls = np.full(len(blk), OTHER, np.int8)
        r_cls[n_it > 0] = SCOPED
        r_cls[(n_it > 0) & (smed < TRANSIENT_ITER * (iter_ns or 0))] = TRANSIENT
        r_cls[stb] = PERSISTENT
        r_cls[~touched] = NEVER
        cls = np.where(refined, r_cls, cls).astype(np.int8)
    else:
        cls[~touched] = NEVER
    iterative = np.where(refined, stb, bm.iterative[blk] & touched)

    # Reuse intervals between consecutive accesses of one sub-block.
    nx = np.flatnonzero(a_sub[1:] == a_sub[:-1]) if len(a_sub) > 1 else np.zeros(0, np.int64)
    i1, i2 = a_iter[nx], a_iter[nx + 1]
    if nI:
        contiguous = np.zeros(nI, bool)
        contiguous[:-1] = it.end_op[main][:-1] == it.start_op[main][1:]
        same = (i1 >= 0) & (i2 == i1)
        wrap = (i1 >= 0) & (i2 == i1 + 1) & contiguous[np.clip(i1, 0, nI - 1)]
        measured = same | wrap
        ikey = np.where(measured, a_pos[nx].astype(np.int64) * (2 * P) + a_pos[nx + 1] + np.where(wrap, P, 0), -1)
        recurring = np.zeros(len(nx), bool)
        if np.any(measured):
            m = np.flatnonzero(measured)
            up = np.sort(ikey[m] * nI + i1[m].astype(np.int64))  # distinct (key, iteration), sorted
            up = up[np.r_[True, up[1:] != up[:-1]]] // nI
            first = np.flatnonzero(np.r_[True, up[1:] != up[:-1]])
            uk, ucnt = up[first], np.diff(np.append(first, len(up)))
            recurring[m] = ucnt[np.searchsorted(uk, ikey[m])] >= recur_threshold(nI)
    else:
        measured = np.zeros(len(nx), bool)
        ikey = np.full(len(nx), -1, np.int64)
        recurring = measured.copy()
    intervals = TensorIntervals(
        sub=inv[a_sub[nx]].astype(np.int32) if len(nx) else np.zeros(0, np.int32), start_op=a_op[nx], end_op=a_op[nx + 1],
        ns=a_t[nx + 1] - a_t[nx], iteration=i1.astype(np.int32), end_iteration=i2.astype(np.int32), key=ikey,
        measured=measured, recurring=recurring,
    )
    return TensorModel(
        block=blk[o], start=start[o], end=end[o], size=(end - start)[o],
        n_accesses=np.concatenate((n_acc, np.zeros(n_pre, np.int64)))[o], n_iterations=n_it[o], stable=stb[o],
        refined=refined[o], cls=cls[o], iterative=iterative[o], intervals=intervals,
    )
