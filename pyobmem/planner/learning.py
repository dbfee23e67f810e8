"""The learned iteration of the main process: its positions and two clocks, live bytes, the swap
candidates and their idle windows (``pyobmem.planner``'s docstring: positions and clocks).

Method (docs/swap.md has the formulas):

- Candidates: blocks of the main process allocated with cuMemAlloc (kind DRIVER: the shim VMM-backs
  those in swap mode) of at least ``min_swap_bytes``, live over the whole iteration, accessed in
  it, never touched by an opaque launch nor named by an NCCL call, not an arena. Their idle
  windows are the cyclic gaps between consecutive accesses (the last access of the iteration
  wraps to the first of the next). The iteration is the model's training step (which does not
  take a repeating transformer layer, nor 10 steps and a logged loss, for it), taken from its
  iterations that follow the template (``IterationModel.main_rows()``: not one with an aside).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import abi
from ..model.blocks import ARENA, NEVER, build_blocks
from ..model.iterations import IterationModel, detect_iterations
from ..model.saving import Clock, bandwidth_of, execution_clock
from ..units import format_bytes

DEFAULT_MIN_SWAP_BYTES = 4 << 20  # 2 MiB segments (PyTorch's small pool, one VMM granule) are never swapped
MIN_MATCHING = 2  # iterations whose op keys equal the template, at least
MIN_CONFIDENCE = 0.9  # model confidence (mean template match) of the main regime, at least
NEVER_FREED = 1 << 62  # LearnedIteration.blk_free of a block never freed
LAYER_MIN_REPEATS = 4  # _layer_drift: fewer repeats are an allocator's warm-up (CuPy, JAX: 3 steps, each adding)
LAYER_STEP_OF_SWING = 4  # _layer_drift: a layer's step at each repeat is at least 1/4 of its swing
LAYER_SHARE_OF_PEAK = 1 / 32  # _layer_drift: all the repeats' drift is at least this share of the peak


@dataclass(frozen=True)
class NoPlan:
    """Why no iteration could be learned (one line)."""

    reason: str


@dataclass(frozen=True)
class LearnedIteration:
    """One iteration of the main process as the planner sees it.

    ``pid``; ``keys`` (uint64 (P,): template key per position, ``op_key``); ``op_rows`` (capture op
    rows of the template iteration); ``times`` (float64 (P,): ns from the iteration's start on the
    execution clock, non-decreasing: when the GPU runs the op); ``issue`` (float64 (P,): when the
    host issued it, the shim's clock, <= times); ``iteration_ns`` (T); ``live`` (int64 (P,): bytes of the
    process's live blocks at each position, no swapping); ``matching`` / ``iterations`` (iterations
    of the main regime whose keys equal the template / all of them); ``confidence`` (the model's
    mean template match); ``bandwidth`` (B/s); ``min_swap_bytes``.
    Candidates, one row each: ``cand_block`` (capture block row), ``cand_addr``, ``cand_size``,
    ``cand_pos`` (list of int arrays: access positions in the iteration, sorted), ``cand_site``
    (int64 (C, 2): allocation site of a tensor of the iteration, see ``_sites``; (-1, -1) for a
    block live over the whole iteration, named by its address). ``excluded``:
    reason -> (count, bytes) for the process's blocks that are no candidates; ``reason_of``: block row
    -> that reason, for each of them.
    Windows (cyclic idle gaps of candidates), one row each: ``win_cand`` (candidate row), ``win_s``
    (last access position), ``win_n`` (next access position, + P when it wraps).
    ``iteration_row``: the row of the IterationModel; ``it``/``bm`` kept for the bound.
    The process's device blocks live in the iteration (what the shim's budget counts; the host
    replay, ``planner.replay``), one row each: ``blk_size`` (bytes), ``blk_alloc`` / ``blk_free``
    (position of the last op issued before the allocation / the free: < 0 before the iteration,
    >= P after it, ``NEVER_FREED`` when never freed), ``blk_t_alloc`` / ``blk_t_free`` (ns from the
    iteration's start on the host's clock, to order those between two ops), ``blk_served`` (the
    shim VMM-backs it: cuMemAlloc or stream-ordered, >= min_swap_bytes), ``blk_cand`` (its
    candidate row, -1 for none).
    ``op_all`` (bool (P,)): the op may touch any block, an opaque launch or one naming more blocks
    than its ACCESS records hold (``LaunchFlag.TRUNCATED``): the shim makes every swap block
    usable before it (swap_op_begin's ``how``), so no swap-out in flight survives it.
    """

    pid: int
    keys: np.ndarray = field(repr=False)
    op_rows: np.ndarray = field(repr=False)
    times: np.ndarray = field(repr=False)
    issue: np.ndarray = field(repr=False)
    iteration_ns: float
    live: np.ndarray = field(repr=False)
    matching: int
    iterations: int
    steps: int  # training steps of the main regime, deviating ones included
    step: int  # the template iteration's number among them (IterationModel.step_number)
    confidence: float
    bandwidth: float
    min_swap_bytes: int
    cand_block: np.ndarray = field(repr=False)
    cand_addr: np.ndarray = field(repr=False)
    cand_size: np.ndarray = field(repr=False)
    cand_pos: list = field(repr=False)
    cand_site: np.ndarray = field(repr=False)
    excluded: dict = field(repr=False)
    win_cand: np.ndarray = field(repr=False)
    win_s: np.ndarray = field(repr=False)
    win_n: np.ndarray = field(repr=False)
    iteration_row: int = -1
    iteration_index: int = -1
    capture: object = field(default=None, repr=False)
    it: object = field(default=None, repr=False)
    bm: object = field(default=None, repr=False)
    reason_of: dict = field(default_factory=dict, repr=False)
    blk_size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    blk_alloc: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    blk_free: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    blk_t_alloc: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64), repr=False)
    blk_t_free: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64), repr=False)
    blk_served: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), repr=False)
    blk_cand: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    op_all: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), repr=False)

    @property
    def period(self) -> int:
        return len(self.keys)


def op_keys(ops: np.ndarray) -> np.ndarray:
    """Template key of each op (``PYOBMEM_OP_KEY`` of abi.h): the handle for a launch or graph
    launch, ``op_key_copy(type, copy kind)`` for a copy (kind = low byte of the flags, the ASYNC
    bit left out) and ``op_key_copy(MEMSET, 0)`` for a set."""
    t = ops["type"].astype(np.uint64)
    kind = np.where(ops["type"] == abi.Ev.MEMCPY, ops["copy_kind"].astype(np.uint64) & np.uint64(0xFF), np.uint64(0))
    copy_key = (np.uint64(0xFF) << np.uint64(56)) | (t << np.uint64(16)) | kind
    launch = np.isin(ops["type"], [int(abi.Ev.LAUNCH), int(abi.Ev.GRAPH_LAUNCH)])
    return np.where(launch, ops["handle"].astype(np.uint64), copy_key).astype(np.uint64)


def learn_iteration(capture, *, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES, bandwidth: float | None = None,
                    it: IterationModel | None = None, bm=None, by_site: bool = False) -> LearnedIteration | NoPlan:
    """Learn the iteration of ``capture``'s main process (see LearnedIteration), or say why not.

    ``by_site``: stream-ordered blocks allocated inside the iteration (the tensors a per-tensor
    allocator preset gives, ``backend:cudaMallocAsync``) are candidates too, each identified by
    its allocation site (``cand_site``), with the idle windows between its accesses in its
    lifetime; otherwise only blocks live over the whole iteration are."""
    it = detect_iterations(capture) if it is None else it
    main = it.main_rows()
    if it.main < 0 and it.partial is not None:
        # The model left out a repeating unit (a transformer layer) as part of a longer iteration.
        u = it.partial
        return NoPlan(f"no repeating iteration yet: the repeating unit of {u.period_ops:,} launches and copies is "
                      f"part of an iteration ({u.left_out} recurring kernels are not in it); waiting for whole iterations")
    if it.main < 0 or len(main) < MIN_MATCHING:
        return NoPlan("no repeating iteration yet")
    regime = it.main_regime
    if regime.confidence < MIN_CONFIDENCE:
        return NoPlan(f"the iteration repeats with {100 * regime.confidence:.0f}% template match only")
    pid = int(it.pid)
    ops = capture.ops
    pid_rows = np.flatnonzero(ops["pid"] == pid)
    pid_rows = pid_rows[np.argsort(ops["seq"][pid_rows], kind="stable")]  # the shim's op order
    seqs = ops["seq"][pid_rows].astype(np.int64)
    keys_all = op_keys(ops[pid_rows])
    # Each main iteration as a range of the process's ops, by op seq.
    start_seq = ops["seq"][it.start_op[main]].astype(np.int64)
    end_seq = np.where(it.end_op[main] < len(ops), ops["seq"][np.minimum(it.end_op[main], len(ops) - 1)].astype(np.int64),
                       seqs[-1] + 1 if len(seqs) else 0)
    lo = np.searchsorted(seqs, start_seq)
    hi = np.searchsorted(seqs, end_seq)
    drift = _layer_drift(capture.blocks, pid, ops["ts_ns"][pid_rows].astype(np.int64), lo, hi)
    if drift:
        return NoPlan(f"no repeating iteration yet: the repeating unit of {regime.period_ops:,} launches and copies "
                      f"{drift} (a layer of a longer iteration); waiting for whole iterations")
    sigs = [keys_all[a:b].tobytes() for a, b in zip(lo, hi)]
    uniq = {}
    for s in sigs:
        uniq[s] = uniq.get(s, 0) + 1
    mode = max(uniq, key=lambda s: (uniq[s], -sigs.index(s)))
    matching = uniq[mode]
    if matching < MIN_MATCHING:
        return NoPlan("no two iterations issue the same ops")
    middle = len(main) // 2
    cands = [i for i, s in enumerate(sigs) if s == mode]
    i = min(cands, key=lambda k: (abs(k - middle), -k))
    row = int(main[i])
    a, b = int(lo[i]), int(hi[i])
    P = b - a
    if P > abi.PLAN_MAX_OPS:
        return NoPlan(f"an iteration of {P:,} ops exceeds the plan's limit of {abi.PLAN_MAX_OPS:,}")
    blocks = capture.blocks
    a, clock = _at_boundary(capture, it, main, i, lo, hi, keys_all, pid_rows,
                            _live_bytes(blocks, pid, ops["ts_ns"][pid_rows[a:b]].astype(np.int64)))
    b = a + P
    rows = pid_rows[a:b]
    keys = keys_all[a:b]
    t0, t1 = clock.t0, clock.t1
    T = float(max(t1 - t0, 1))
    launch_t = ops["ts_ns"][rows].astype(np.int64)
    times = np.maximum.accumulate(clock(launch_t).astype(np.float64) - t0)
    times = np.clip(times, 0.0, T)
    issue = np.minimum(np.clip(np.maximum.accumulate(launch_t.astype(np.float64) - t0), 0.0, T), times)

    live = _live_bytes(blocks, pid, launch_t)
    mine = blocks["pid"] == pid
    ta, tf = blocks["t_alloc"].astype(np.int64), blocks["t_free"].astype(np.int64)
    size = blocks["size"].astype(np.int64)

    # Candidates and why the others are not.
    bm = build_blocks(capture, it) if bm is None else bm
    it_t0, it_t1 = int(ops["ts_ns"][rows[0]]), int(ops["ts_ns"][rows[-1]])
    pos_of_row = np.full(len(ops), -1, np.int64)
    pos_of_row[rows] = np.arange(P)
    acc = capture.accesses
    acc = acc[pos_of_row[acc["op"]] >= 0] if len(acc) else acc
    acc_pos = pos_of_row[acc["op"]] if len(acc) else np.zeros(0, np.int64)
    accessed = np.zeros(len(blocks), bool)
    accessed[acc["block"]] = True
    t_next = int(ops["ts_ns"][pid_rows[b]]) if b < len(pid_rows) else np.iinfo(np.int64).max
    whole = (ta <= it_t0) & ((tf < 0) | (tf > it_t1))
    stream_ordered = blocks["kind"] == abi.AllocKind.ASYNC
    # A tensor of this iteration: allocated after its first op, before the next iteration's.
    in_iteration = stream_ordered & (ta >= it_t0) & (ta < t_next) if by_site else np.zeros(len(blocks), bool)
    backable = (blocks["kind"] == abi.AllocKind.DRIVER) | stream_ordered
    reasons = [
        ("not VMM-backable (not cuMemAlloc or stream-ordered)" if by_site else "not VMM-backable (not cuMemAlloc)",
         ~backable if by_site else blocks["kind"] != abi.AllocKind.DRIVER),
        (f"under {format_bytes(min_swap_bytes, digits=2)}", size < min_swap_bytes),
        ("touched by an opaque launch", bm.opaque),
        ("named by an NCCL call (pinned)", _nccl_named(capture)),
        ("arena", bm.cls == ARENA),
        ("never accessed", bm.cls == NEVER),
        ("not live over the whole iteration" + (" nor allocated in it" if by_site else ""), ~whole & ~in_iteration),
        ("not accessed in the iteration", ~accessed),
    ]
    excluded, reason_of, taken = {}, {}, ~mine
    for why, mask in reasons:
        m = mask & ~taken
        if np.any(m):
            excluded[why] = (int(np.count_nonzero(m)), int(size[m].sum()))
            reason_of.update(dict.fromkeys(np.flatnonzero(m).tolist(), why))
        taken |= m
    cand = np.flatnonzero(~taken)
    site = _sites(launch_t, ta, mine & in_iteration & (size >= min_swap_bytes), cand)
    order = np.lexsort((acc_pos, acc["block"]))
    ab, ap = acc["block"][order], acc_pos[order]
    cand_pos, wc, ws, wn = [], [], [], []
    for ci, blk in enumerate(cand):
        p = np.unique(ap[np.searchsorted(ab, blk, "left") : np.searchsorted(ab, blk, "right")])
        cand_pos.append(p)
        # A block live over the iteration is idle from its last access to its first in the next
        # iteration; a tensor of the iteration only between two of its accesses (it holds nothing
        # before the first, and is freed after the last).
        nxt = np.append(p[1:], p[0] + P) if site[ci, 0] < 0 else p[1:]
        p = p if site[ci, 0] < 0 else p[:-1]
        ok = nxt - p >= 2  # at least one position in between
        wc.append(np.full(np.count_nonzero(ok), ci))
        ws.append(p[ok])
        wn.append(nxt[ok])
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    blk = _iteration_blocks(blocks, pid, ops["ts_ns"][pid_rows].astype(np.int64), a, P, cand, min_swap_bytes)
    return LearnedIteration(
        pid=pid, keys=keys, op_rows=rows.astype(np.int64), times=times, issue=issue, iteration_ns=T, live=live.astype(np.int64),
        matching=matching, iterations=len(main), steps=len(it.step_rows()), step=it.step_number(i),
        confidence=float(regime.confidence),
        bandwidth=bandwidth_of(capture, bandwidth), min_swap_bytes=int(min_swap_bytes),
        cand_block=cand.astype(np.int64), cand_addr=blocks["addr"][cand].astype(np.uint64),
        cand_size=size[cand], cand_pos=cand_pos, cand_site=site, excluded=excluded,
        win_cand=cat(wc), win_s=cat(ws), win_n=cat(wn), iteration_row=row, iteration_index=i,
        capture=capture, it=it, bm=bm, reason_of=reason_of, op_all=_touches_all(ops[rows]), **blk,
    )


def _touches_all(ops: np.ndarray) -> np.ndarray:
    """LearnedIteration.op_all of these op rows: launches (kernel or graph) flagged OPAQUE or
    TRUNCATED, those the shim begins with SWAP_OP_OPAQUE / SWAP_OP_INCOMPLETE (native/launch.c,
    graph.c)."""
    launch = np.isin(ops["type"], (abi.Ev.LAUNCH, abi.Ev.GRAPH_LAUNCH))
    return launch & ((ops["flags"] & (abi.LaunchFlag.OPAQUE | abi.LaunchFlag.TRUNCATED)) != 0)


def _iteration_blocks(blocks, pid: int, launch_t: np.ndarray, a: int, P: int, cand: np.ndarray, min_swap_bytes: int) -> dict:
    """LearnedIteration's ``blk_*`` fields: process ``pid``'s device blocks live at some time of
    the iteration (ops ``a .. a+P-1`` of its ops issued at ``launch_t``, ns), with the positions
    of the ops issued last before their allocation and free (the shim acts on them then)."""
    t = np.maximum.accumulate(launch_t)
    t0 = int(t[a])
    t1 = int(t[a + P]) if a + P < len(t) else np.iinfo(np.int64).max
    ta, tf = blocks["t_alloc"].astype(np.int64), blocks["t_free"].astype(np.int64)
    rows = np.flatnonzero((blocks["pid"] == pid) & (blocks["kind"] != abi.AllocKind.HOST) & (ta < t1) & ((tf < 0) | (tf >= t0)))
    pos = lambda x: np.searchsorted(t, x, side="right") - 1 - a  # noqa: E731
    freed = tf[rows] >= 0
    size = blocks["size"][rows].astype(np.int64)
    kind = blocks["kind"][rows]
    served = ((kind == abi.AllocKind.DRIVER) | (kind == abi.AllocKind.ASYNC)) & (size >= min_swap_bytes)
    of = np.full(len(blocks), -1, np.int64)
    of[cand] = np.arange(len(cand))
    return dict(blk_size=size, blk_alloc=pos(ta[rows]).astype(np.int64),
                blk_free=np.where(freed, pos(tf[rows]), NEVER_FREED).astype(np.int64),
                blk_t_alloc=(ta[rows] - t0).astype(np.float64), blk_t_free=np.where(freed, tf[rows] - t0, np.inf).astype(np.float64),
                blk_served=served, blk_cand=of[rows])


def _layer_drift(blocks, pid: int, op_t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> str:
    """Why the repeats [lo, hi) of the process's ops (launch times ``op_t``, ns) look like the
    layers of a longer iteration, or "" when they do not. A training iteration ends with the live
    bytes it began with; a layer keeps what it saved for the backward pass, so the live bytes at
    its repeats' starts climb (forward) or fall (backward) at every one of at least 4 repeats, by
    more in all than one repeat's own swing, by at least a quarter of that swing at each (median),
    and by at least 1/32 of the peak in all (a pool allocator warming up or a small leak: not).
    The daemon plans on what it has seen so far: in the first step of GPT medium on the H200
    (tests/data/gpt_medium_tensors_s10.pyobmem cut to its first 10-30%) the model's iteration was
    a 20-op forward or 33-op backward layer, 23-24 times, and the planner made a plan of it; at 40%
    of the peak (session 15) the daemon adopted such plans 23 times, dropped 21, and never planned
    the step."""
    n = len(lo)
    if n < LAYER_MIN_REPEATS or not len(op_t):
        return ""
    live = _live_bytes(blocks, pid, op_t)
    at_start = live[lo]  # lo < len(op_t): each repeat starts at one of the process's ops
    step = np.diff(at_start)
    if not (np.all(step > 0) or np.all(step < 0)):
        return ""
    # Each repeat's range of live bytes, vectorised (100k one-op repeats: 10 ms, not 1 s). The
    # repeats need not be contiguous (main_rows() leaves out the ones with an aside), hence the
    # pairs (lo, hi); ``hi`` may be len(live) (the last repeat runs to the end of the records).
    ext = np.append(live, live[-1])
    idx = np.column_stack([lo, np.maximum(hi, lo + 1)]).ravel()
    swing = float(np.median(np.maximum.reduceat(ext, idx)[::2] - np.minimum.reduceat(ext, idx)[::2]))
    total = int(at_start[-1] - at_start[0])
    # A layer adds (takes) about as much at each repeat as it swings within one (GPT medium: 1 GiB
    # a forward layer against 0.5 GiB, 0.95 against 2.1 backward) and, all layers together, a good
    # share of the peak (57-84%); a leak (a loss kept on the GPU) adds little against the step's
    # swing, and a pool allocator's warm-up (swing 0) little against the peak.
    if abs(total) <= swing or np.median(np.abs(step)) * LAYER_STEP_OF_SWING < swing \
            or abs(total) < LAYER_SHARE_OF_PEAK * live.max():
        return ""
    return (f"{'adds to' if total > 0 else 'takes from'} the live bytes at each of its {n:,} repeats "
            f"({format_bytes(abs(total))} in all, {format_bytes(int(swing))} within one)")


def _live_bytes(blocks, pid: int, t: np.ndarray) -> np.ndarray:
    """int64 (len(t),): bytes of process ``pid``'s live device blocks at each time ``t`` (ns, the
    shim's clock: launch times, as the allocations are seen). Pinned host memory is not counted."""
    on_device = (blocks["pid"] == pid) & (blocks["kind"] != abi.AllocKind.HOST)
    ta, tf = blocks["t_alloc"].astype(np.int64), blocks["t_free"].astype(np.int64)
    size = blocks["size"].astype(np.int64)
    alloc_sorted = np.sort(ta[on_device])
    ca = np.concatenate(([0], np.cumsum(size[on_device][np.argsort(ta[on_device], kind="stable")])))
    fr = on_device & (tf >= 0)
    of = np.argsort(tf[fr], kind="stable")
    cf = np.concatenate(([0], np.cumsum(size[fr][of])))
    return ca[np.searchsorted(alloc_sorted, t, side="right")] - cf[np.searchsorted(tf[fr][of], t, side="right")]


def _at_boundary(capture, it, main, i, lo, hi, keys_all, pid_rows, live) -> tuple:
    """(first op, Clock): the planned iteration, template iteration ``i`` of ``main`` (op ranges
    ``lo``/``hi`` into ``pid_rows``) rotated to start at its position of least live bytes ``live``.

    Why: a tensor that lives across the planned iteration's boundary belongs to neither side, so
    it can be no candidate. The model's phase comes from the host's timing (its longest pause),
    and swap mode's own stalls move that pause (on GPT medium at 75% it moved to the loss, so the
    saved activations crossed the boundary and 28.8 GiB were out of reach). At the least live
    bytes, the step boundary, only blocks live over the whole iteration cross it. The rotated
    window takes ops of the neighbouring iteration (the next, else the previous), used only when
    they issue the same ops; its clock is stitched from the two iterations' execution clocks."""
    a, b = int(lo[i]), int(hi[i])
    P, r = b - a, int(np.argmin(live)) if len(live) else 0
    here = execution_clock(capture, it, int(main[i]))
    rolled = np.roll(keys_all[a:b], -r)
    for j, start in ((i + 1, a + r), (i - 1, a + r - P)):
        if r == 0 or not 0 <= j < len(main) or start < 0 or start + P > len(keys_all):
            continue
        if (hi[min(i, j)] != lo[max(i, j)]) or not np.array_equal(keys_all[start : start + P], rolled):
            continue
        other = execution_clock(capture, it, int(main[j]))
        first, second = (here, other) if j > i else (other, here)

        def fn(t, first=first, second=second):
            # The GPU clock maps the whole capture; the queue estimate maps one iteration each.
            return first(t) if first.source == "gpu" else np.where(np.asarray(t) < second.t0, first(t), second(t))

        ts = capture.ops["ts_ns"]
        t_end = ts[pid_rows[start + P]] if start + P < len(pid_rows) else it.t_end[int(main[max(i, j)])]
        return start, Clock(fn, int(fn(np.int64(ts[pid_rows[start]]))), int(fn(np.int64(t_end))), first.source)
    return a, here


def _sites(launch_t: np.ndarray, t_alloc: np.ndarray, counted: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """int64 (len(cand), 2): the allocation site of each candidate block (rows of the capture's
    blocks) that is one of ``counted`` (bool per block: the allocations the shim counts, the
    process's stream-ordered ones of at least min_swap_bytes made in the iteration): (position of
    the last op issued before its allocation, its ordinal among the counted allocations since that
    op); (-1, -1) for the others. With its size the site names one tensor of every iteration."""
    site = np.full((len(cand), 2), -1, np.int64)
    rows = np.flatnonzero(counted)
    if not len(rows):
        return site
    rows = rows[np.argsort(t_alloc[rows], kind="stable")]
    pos = np.searchsorted(launch_t, t_alloc[rows].astype(np.int64), side="right") - 1
    start = np.r_[0, np.flatnonzero(np.diff(pos)) + 1]  # runs of one position (pos is sorted)
    ordinal = np.arange(len(pos)) - np.repeat(start, np.diff(np.r_[start, len(pos)]))
    of = np.full(len(t_alloc), -1, np.int64)
    of[rows] = np.arange(len(rows))
    k = of[cand]
    hit = k >= 0
    site[hit, 0], site[hit, 1] = pos[k[hit]], ordinal[k[hit]]
    return site


def _nccl_named(capture) -> np.ndarray:
    """bool per block: an NCCL call named it (the shim pins those in swap mode, native/nccl.c)."""
    named = np.zeros(len(capture.blocks), bool)
    for side in ("send_block", "recv_block"):
        rows = capture.nccl[side]
        named[rows[rows >= 0]] = True
    return named
