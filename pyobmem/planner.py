"""The swap planner: from the learned iteration and a device-memory budget to a plan the shim follows.

    learned = learn_iteration(capture)                 # LearnedIteration, or NoPlan (why not)
    plan = make_plan(learned, budget_bytes)            # Plan: template keys, actions, predictions
    plan.write(control)                                # into the control file (pyobmem.control)
    plan_capture(capture, "75%")                       # both, with the budget parsed

Positions count every op of the main process (launches, graph launches, copies, sets: what the
shim counts with its op seq) from the first op of the iteration. Two clocks, ns from the
iteration's start: ``times``, when the GPU runs an op (the model's execution clock,
``pyobmem.model.saving.execution_clock``), and ``issue``, when the host issued it (its launch
time: when the shim acts). Sizes bytes; bandwidth B/s.

Policy and cost model (docs/swap.md has the formulas):

- Candidates: blocks of the main process allocated with cuMemAlloc (kind DRIVER: the shim VMM-backs
  those in swap mode) of at least ``min_swap_bytes``, live over the whole iteration, accessed in
  it, never touched by an opaque launch nor named by an NCCL call, not an arena. Their idle
  windows are the cyclic gaps between consecutive accesses (the last access of the iteration
  wraps to the first of the next). The iteration is the model's training step (which does not
  take a repeating transformer layer, nor 10 steps and a logged loss, for it), taken from its
  iterations that follow the template (``IterationModel.main_rows()``: not one with an aside).
- Each window: SWAP_OUT after its last access (position s): the copy runs once the GPU has run s
  (first come first served on one device-to-host engine), and the shim's release thread frees the
  memory when the copy ends. PREFETCH before position q: the latest op the host
  issues early enough for the remap (150 us per 64 MiB) and the copy (size/B) to end before the
  GPU reaches the next access n, the prefetches of all windows scheduled as late as possible on
  one host-to-device engine. The memory is mapped again when the host issues q, while the GPU is
  still at an earlier position: the block is out, at the GPU's positions, from its release to
  that one; a window where that leaves no position is not used.
- Choice (``_cover``): while the simulated peak is over the budget, add the window whose block can
  be out at the peak position and that covers the most excess bytes per byte moved, when the
  simulation with the engine queues confirms it lowers that position.
- Predictions: peak = max over positions of (live bytes - absent bytes); stall = how late each
  prefetch finishes after its consumer's time, summed; time ratio = max(1 + stalls / T, copy time
  per direction / T). The saving (peak without swapping - predicted peak) never exceeds the
  model's bound at that ratio (tests/test_planner.py checks it on the real captures).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from . import abi
from .errors import PyobmemError
from .model.blocks import ARENA, NEVER, build_blocks
from .model.iterations import IterationModel, detect_iterations
from .model.queries import card_bytes
from .model.saving import TIME_RATIOS, bandwidth_of, execution_clock, saving_curve
from .model.tensors import build_tensors
from .units import format_bytes

DEFAULT_MIN_SWAP_BYTES = 4 << 20  # 2 MiB segments (PyTorch's small pool, one VMM granule) are never swapped
REMAP_NS = 150_000.0  # unmap+release+create+map+set-access of 64 MiB on the H200 (DESIGN.md)
REMAP_BYTES = 64 << 20
MIN_MATCHING = 2  # iterations whose op keys equal the template, at least
MIN_CONFIDENCE = 0.9  # model confidence (mean template match) of the main regime, at least
MAX_RATIO = 2.0  # the planner never predicts a slower iteration than this
GREEDY_MAX_RATIO = 1e6  # the greedy runs without a stall limit; the budget stops the planner

BARE_NUMBER = ("a number without a unit is a fraction of the card when at most 1 (0.75; 1 is the whole card), "
               "else whole bytes; give other sizes with a unit (1.5GiB) or as a percentage of the card (75%)")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")
_UNITS = {
    "": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
    "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40,
}


# --- budget --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """A device-memory budget: ``bytes`` (absolute) or ``fraction`` (of the card's total memory,
    0 < f <= 1, resolved once the card is known). ``text``: as the user wrote it."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, total_bytes: int | None) -> int | None:
        """Bytes of the budget; a fraction needs ``total_bytes`` (None while unknown)."""
        if self.bytes is not None:
            return self.bytes
        if not total_bytes:
            return None
        return int(self.fraction * int(total_bytes))


def parse_budget(text: str) -> Budget:
    """``16GiB``, ``16G`` (binary), ``16GB`` (decimal), ``500MiB``, ``75%`` (of the card's memory,
    the only size known at launch, not of the job's peak) or a number without a unit: a fraction
    of the card when at most 1 (``0.75``; ``1``: the whole card), else whole bytes (``123456``).
    Raises PyobmemError (exit 2) with one line."""
    m = _SIZE.match(str(text))
    if not m:
        raise PyobmemError(f"bad budget {text!r}: use a size (16GiB, 500MiB, bytes) or a share of the card (75%, 0.75)", 2)
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        if not 0 < value <= 100:
            raise PyobmemError(f"bad budget {text!r}: a percentage of the card must be in (0, 100]", 2)
        return Budget(text=text, fraction=value / 100)
    if unit == "":
        if value <= 0:
            raise PyobmemError(f"bad budget {text!r}: must be positive", 2)
        if value <= 1:
            return Budget(text=text, fraction=value)
        if value != int(value) or "." in m.group(1):
            raise PyobmemError(f"bad budget {text!r}: {BARE_NUMBER}", 2)
    if unit not in _UNITS:
        raise PyobmemError(f"bad budget {text!r}: unknown unit {m.group(2)!r} (B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB, %)", 2)
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise PyobmemError(f"bad budget {text!r}: must be positive", 2)
    return Budget(text=text, bytes=n)


def parse_size(text: str, what: str = "size") -> int:
    """A byte size (``4MiB``, ``4M``, ``4194304``); no fractions. Raises PyobmemError (exit 2)."""
    b = parse_budget(text) if _SIZE.match(str(text)) else None
    if b is None or b.bytes is None:
        raise PyobmemError(f"bad {what} {text!r}: use a size such as 4MiB or a number of bytes", 2)
    return b.bytes


# --- the learned iteration -----------------------------------------------------------------------


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
    rows = pid_rows[a:b]
    P = len(rows)
    if P > abi.PLAN_MAX_OPS:
        return NoPlan(f"an iteration of {P:,} ops exceeds the plan's limit of {abi.PLAN_MAX_OPS:,}")
    keys = keys_all[a:b]
    clock = execution_clock(capture, it, row)
    t0, t1 = clock.t0, clock.t1
    T = float(max(t1 - t0, 1))
    launch_t = ops["ts_ns"][rows].astype(np.int64)
    times = np.maximum.accumulate(clock(launch_t).astype(np.float64) - t0)
    times = np.clip(times, 0.0, T)
    issue = np.minimum(np.clip(np.maximum.accumulate(launch_t.astype(np.float64) - t0), 0.0, T), times)

    # Live device bytes of the process at each position (launch times, as the allocations are seen).
    blocks = capture.blocks
    mine = blocks["pid"] == pid
    on_device = mine & (blocks["kind"] != abi.AllocKind.HOST)  # pinned host memory is not device memory
    ta, tf = blocks["t_alloc"].astype(np.int64), blocks["t_free"].astype(np.int64)
    size = blocks["size"].astype(np.int64)
    alloc_sorted = np.sort(ta[on_device])
    ca = np.concatenate(([0], np.cumsum(size[on_device][np.argsort(ta[on_device], kind="stable")])))
    fr = on_device & (tf >= 0)
    of = np.argsort(tf[fr], kind="stable")
    cf = np.concatenate(([0], np.cumsum(size[fr][of])))
    live = ca[np.searchsorted(alloc_sorted, launch_t, side="right")] - cf[np.searchsorted(tf[fr][of], launch_t, side="right")]

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
    return LearnedIteration(
        pid=pid, keys=keys, op_rows=rows.astype(np.int64), times=times, issue=issue, iteration_ns=T, live=live.astype(np.int64),
        matching=matching, iterations=len(main), confidence=float(regime.confidence),
        bandwidth=bandwidth_of(capture, bandwidth), min_swap_bytes=int(min_swap_bytes),
        cand_block=cand.astype(np.int64), cand_addr=blocks["addr"][cand].astype(np.uint64),
        cand_size=size[cand], cand_pos=cand_pos, cand_site=site, excluded=excluded,
        win_cand=cat(wc), win_s=cat(ws), win_n=cat(wn), iteration_row=row, iteration_index=i,
        capture=capture, it=it, bm=bm, reason_of=reason_of,
    )


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


# --- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Swap:
    """One planned idle window: the block (capture row, address, size), SWAP_OUT after position
    ``out_at``, PREFETCH before ``prefetch_at`` once the GPU has run ``mark_at`` (positions mod
    P), next access at ``next_at``; ``absent`` positions per iteration; ``stall_ns`` predicted."""

    block: int
    addr: int
    size: int
    out_at: int
    prefetch_at: int
    next_at: int
    absent: int
    stall_ns: float
    mark_at: int = -1


@dataclass(frozen=True)
class Plan:
    """A swap plan for one iteration of process ``pid`` under ``budget_bytes``.

    ``template_keys`` (uint64 (P,)); ``actions`` (structured ``abi.ACTION_DTYPE`` array sorted by
    position, prefetches first at one position); ``swaps`` (list of Swap); ``peak_bytes`` (peak of
    live bytes without swapping), ``predicted_peak`` (with the plan), ``saved_bytes``;
    ``time_ratio`` (predicted iteration time over the unswapped one), ``stall_ns`` (per iteration);
    ``feasible`` (the predicted peak fits the budget); ``needed_bytes`` (the least any plan could
    reach on this iteration: at some position the blocks that cannot be out together) and
    ``needed_at`` (that position); ``reach_bytes`` / ``reach_at``: the least peak any plan can
    reach under the cost model (each window out as long as it can be alone, engines idle: a lower
    bound >= ``needed_bytes``; 0 when not computed: a plan that fits, made without ``bound``) and its
    position; ``bound_bytes`` (the model's saving bound at
    ``time_ratio``, None when not computed); ``iteration_ns``, ``bandwidth``, ``min_swap_bytes``;
    ``iteration_index`` (the planned iteration among the main regime's, from 0, as the model's
    saving curve counts it); ``candidates`` (count, bytes) and ``excluded`` (reason -> (count,
    bytes)) of the process's blocks, as ``LearnedIteration``.
    """

    pid: int
    budget_bytes: int
    template_keys: np.ndarray = field(repr=False)
    actions: np.ndarray = field(repr=False)
    swaps: list = field(repr=False)
    peak_bytes: int = 0
    peak_at: int = 0
    predicted_peak: int = 0
    time_ratio: float = 1.0
    stall_ns: float = 0.0
    feasible: bool = True
    needed_bytes: int = 0
    needed_at: int = 0
    needed_op_row: int = -1  # the capture op row at ``needed_at``
    bound_bytes: int | None = None
    iteration_ns: float = 0.0
    bandwidth: float = 0.0
    min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES
    period: int = 0
    matching: int = 0
    iterations: int = 0
    iteration_index: int = -1
    reach_bytes: int = 0
    reach_at: int = 0
    reach_op_row: int = -1  # the capture op row at ``reach_at``
    candidates: tuple = (0, 0)
    excluded: dict = field(default_factory=dict, repr=False)

    @property
    def saved_bytes(self) -> int:
        return int(self.peak_bytes - self.predicted_peak)

    @property
    def n_hints(self) -> int:
        """IDLE hints (the shim's eviction beyond the plan), not actions."""
        return int(np.count_nonzero(self.actions["kind"] == abi.ActionKind.IDLE))

    @property
    def n_actions(self) -> int:
        """Swap-outs, marks and prefetches per iteration."""
        return len(self.actions) - self.n_hints

    @property
    def swapped_bytes(self) -> int:
        """Bytes of distinct blocks the plan swaps."""
        return int(sum({s.block: s.size for s in self.swaps}.values()))

    def write(self, control, generation: int | None = None) -> int | None:
        """Write into the control file's inactive slot and make it active (pyobmem.control's
        protocol). Returns the generation written, or None when the shim has not adopted the
        plan in force yet (try again later)."""
        return control.write_plan(self, generation)

    def to_json(self) -> dict:
        return {
            "pid": self.pid, "budget_bytes": self.budget_bytes, "feasible": self.feasible,
            "period_ops": self.period, "iteration_ns": round(self.iteration_ns),
            "iterations_matching": self.matching, "iterations": self.iterations,
            "bandwidth_Bps": self.bandwidth, "min_swap_bytes": self.min_swap_bytes,
            "peak_bytes": self.peak_bytes, "peak_at": self.peak_at, "predicted_peak_bytes": self.predicted_peak,
            "saved_bytes": self.saved_bytes, "bound_bytes": self.bound_bytes,
            "time_ratio": round(self.time_ratio, 6), "stall_ns": round(self.stall_ns),
            "needed_bytes": self.needed_bytes, "needed_at": self.needed_at,
            "reach_bytes": self.reach_bytes, "reach_at": self.reach_at, "iteration": self.iteration_index,
            "candidates": {"blocks": self.candidates[0], "bytes": self.candidates[1]},
            "excluded": {why: {"blocks": n, "bytes": b} for why, (n, b) in self.excluded.items()},
            "swapped_blocks": len({s.block for s in self.swaps}), "swapped_bytes": self.swapped_bytes,
            "swaps": [
                {"row": s.block, "addr": hex(s.addr), "size": s.size, "out_after": s.out_at,
                 "prefetch_before": s.prefetch_at, "mark_after": s.mark_at, "next_access": s.next_at, "absent_ops": s.absent,
                 "stall_ns": round(s.stall_ns)}
                for s in self.swaps
            ],
            "actions": self.n_actions,
            "idle_hints": self.n_hints,
        }

    def hints_only(self) -> "Plan":
        """This plan without its swaps: only the IDLE hints (the shim's eviction beyond any plan
        then takes the block whose next access is farthest), predicting no saving."""
        import dataclasses

        return dataclasses.replace(self, swaps=[], actions=self.actions[self.actions["kind"] == abi.ActionKind.IDLE],
                                   predicted_peak=self.peak_bytes, time_ratio=1.0, stall_ns=0.0)


@dataclass
class _Sim:
    peak: int
    peak_at: int
    stall: np.ndarray  # per window (ns)
    useless: np.ndarray  # per window: the block would never be out
    q: np.ndarray  # prefetch position per window (unrolled, in iteration 1)
    mark: np.ndarray  # the prefetch's MARK position per window (unrolled, in iteration 1)
    absent: np.ndarray  # positions out per window
    ratio: float
    resident: np.ndarray
    wait_ns: float = 0.0  # per iteration: the GPU held at the budget for swap-outs to end


def _clocks(L: LearnedIteration, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """(GPU execution times, host issue times) of positions 0 .. iterations*P - 1 (ns)."""
    T = L.iteration_ns
    ext = np.concatenate([L.times + k * T for k in range(iterations)])
    hx = np.concatenate([L.issue + k * T for k in range(iterations)])
    return ext, hx


def _released(ext: np.ndarray, hx: np.ndarray, s: np.ndarray, out_done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(host position h, GPU position p_out) of a block whose copy out ends at ``out_done``: the
    shim's release thread frees the memory then (within its 100 us poll), so the block is out
    from the GPU op running at that time; h is the first op the host issues after that, the
    earliest a prefetch can find the block out (before, it would cancel the swap-out)."""
    h = np.minimum(np.maximum(np.searchsorted(hx, out_done, side="left"), s + 1), len(hx) - 1)
    p_out = np.maximum(np.searchsorted(ext, out_done, side="left"), s + 1)
    return h, p_out


def _simulate(L: LearnedIteration, w: np.ndarray, budget_bytes: int | None = None) -> _Sim:
    """The cost model on windows ``w`` (rows of L's windows), three iterations unrolled; figures
    of the middle one (the steady state). Two clocks: the shim acts when the host issues an op
    (``L.issue``), copies run and memory is used when the GPU executes it (``L.times``); the
    host runs ahead, so a prefetch issued at position q maps its memory while the GPU is still
    at an earlier position. Resident bytes are counted at the GPU's positions.

    With ``budget_bytes``, where the resident bytes would exceed the budget while swap-outs are
    still copying, the shim holds the op until enough of them end (``_hold``): the block is out
    from there, and the wait adds to the iteration's time (``wait_ns``)."""
    P, T = L.period, L.iteration_ns
    ext, hx = _clocks(L, 4)  # positions 0 .. 4P-1
    size = L.cand_size[L.win_cand[w]].astype(np.float64)
    d = size / L.bandwidth * 1e9
    r = REMAP_NS * size / REMAP_BYTES
    K = 3
    s = np.concatenate([L.win_s[w] + k * P for k in range(K)])
    n = np.minimum(np.concatenate([L.win_n[w] + k * P for k in range(K)]), len(ext) - 1)
    dd, rr, sz = np.tile(d, K), np.tile(r, K), np.tile(size, K)
    # Swap-outs: after the GPU ran op s, first come first served on the device-to-host engine.
    o = np.argsort(ext[s], kind="stable")
    out_done = np.empty(len(s))
    out_done[o] = _fifo(ext[s][o], dd[o])
    h, p_out = _released(ext, hx, s, out_done)
    # Prefetches: as late as possible on the host-to-device engine (latest deadline first),
    # issued by the host at q: the last position it issues early enough for the remap and copy.
    deadline = ext[n]
    o = np.argsort(-deadline, kind="stable")
    start_in = np.empty(len(s))
    start_in[o] = -_fifo(-deadline[o], dd[o])  # time reversed: the same queue backwards
    q = np.searchsorted(hx, start_in - rr, side="right") - 1
    # Never before the block is released (a window too short for both copies keeps it out for
    # one position and stalls its consumer instead), never after its use.
    q = np.minimum(np.maximum(q, h + 1), n)
    mark, t_map = _marks(ext, hx, s, q, start_in - rr)
    back = np.searchsorted(ext, t_map, side="left")  # the GPU position when the memory is mapped again
    # Forward: when each prefetch really finishes (mapped at t_map, remap, then the engine); a
    # host that waited for the mark starves the GPU if the ops queued behind it take less than
    # the remap.
    o = np.argsort(t_map, kind="stable")
    done = np.empty(len(s))
    done[o] = _fifo(t_map[o] + rr[o], dd[o])
    starve = np.where(hx[q] < t_map, np.maximum(t_map + rr - ext[q], 0.0), 0.0)
    stall = np.maximum(done - deadline, 0.0) + starve
    useless = (back <= p_out) | (h >= n)  # the block would never be out
    # Resident bytes over the middle iteration [P, 2P).
    okw = ~useless
    wait = 0.0
    if budget_bytes is not None and len(s):
        p_out, wait = _hold(L, ext, s, p_out, back, out_done, sz, okw, budget_bytes)
    diff = np.zeros(4 * P + 1)
    np.add.at(diff, p_out[okw], -sz[okw])
    np.add.at(diff, back[okw], sz[okw])
    out = np.cumsum(diff)[P : 2 * P]
    resident = L.live + out.astype(np.int64)
    k = int(np.argmax(resident)) if P else 0
    m = len(w)
    mid = slice(m, 2 * m)  # the windows of iteration 1: actions are taken from them
    in_iter = (n >= P) & (n < 2 * P)
    stalls = float(stall[in_iter].sum()) + wait
    copy = float(d.sum() + r.sum()) if m else 0.0
    ratio = max(1.0 + stalls / T, float(d.sum()) / T, copy / T) if m else 1.0
    useless_w = useless[mid] | useless[: m] | useless[2 * m :]
    return _Sim(peak=int(resident[k]) if P else 0, peak_at=k, stall=stall[mid], useless=useless_w, q=q[mid],
                mark=mark[mid], absent=np.maximum(back[mid] - p_out[mid], 0), ratio=ratio, resident=resident,
                wait_ns=wait)


def _hold(L: LearnedIteration, ext: np.ndarray, s: np.ndarray, p_out: np.ndarray, back: np.ndarray,
          out_done: np.ndarray, sz: np.ndarray, ok: np.ndarray, budget_bytes: int) -> tuple[np.ndarray, float]:
    """The shim's budget hold on the middle iteration: at each GPU position p (in order) whose
    resident bytes exceed the budget, the op waits for the swap-outs already issued there (last
    access before p) and still copying, earliest copy end first, until enough have ended; those
    blocks are out from p. Returns (p_out with the held blocks out from their position, the
    waiting in ns). Later positions run later by the waits so far (the copies do not: the
    engine keeps going while the GPU waits). A position where every issued swap-out is not
    enough waits for them all (the plan then does not fit there)."""
    P = L.period
    p_out = p_out.copy()
    delay = 0.0
    for _ in range(P):
        diff = np.zeros(4 * P + 1)
        np.add.at(diff, p_out[ok], -sz[ok])
        np.add.at(diff, back[ok], sz[ok])
        resident = L.live + np.cumsum(diff)[P : 2 * P].astype(np.int64)
        over = np.flatnonzero(resident > budget_bytes)
        p = -1
        for j in over:  # the first position over the budget that pending swap-outs can help
            pp = P + int(j)
            if np.any(ok & (s < pp) & (p_out > pp) & (back > pp)):
                p = pp
                break
        if p < 0:
            break
        pend = np.flatnonzero(ok & (s < p) & (p_out > p) & (back > p))
        pend = pend[np.argsort(out_done[pend], kind="stable")]
        need = int(resident[p - P]) - budget_bytes
        k = min(int(np.searchsorted(np.cumsum(sz[pend]), need, side="left")), len(pend) - 1)
        take = pend[: k + 1]
        delay += max(0.0, float(out_done[take].max()) - (float(ext[p]) + delay))
        p_out[take] = p
    return p_out, delay


def _marks(ext: np.ndarray, hx: np.ndarray, s: np.ndarray, q: np.ndarray, latest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mark position, map time) of prefetches issued by the host at q that should start their
    remap by ``latest``: the MARK is the last GPU position whose end (the next op's start) is
    not after ``latest`` (never before the window's last access s, always before q); the shim
    waits at q until the GPU has run it, so the memory is mapped at max(issue of q, that end)."""
    mark = np.minimum(np.maximum(np.searchsorted(ext, latest, side="right") - 2, s), q - 1)
    return mark, np.maximum(hx[q], ext[np.minimum(mark + 1, len(ext) - 1)])


def _fifo(ready: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Finish times of jobs on one engine, in the given order: f_j = max(ready_j, f_(j-1)) + dur_j
    (vectorised: f_j = C_j + max_(k<=j)(ready_k - C_(k-1)), C the running sum of durations)."""
    if not len(ready):
        return np.zeros(0)
    C = np.cumsum(dur)
    return C + np.maximum.accumulate(ready - (C - dur))


def _needed(L: LearnedIteration) -> tuple[int, int]:
    """(bytes, position): the least resident at one position with every candidate window out."""
    P = L.period
    if not P:
        return 0, 0
    diff = np.zeros(3 * P + 1)
    size = L.cand_size[L.win_cand].astype(np.float64)
    for k in range(2):
        np.add.at(diff, L.win_s + 1 + k * P, -size)
        np.add.at(diff, L.win_n + k * P, size)
    need = L.live + np.cumsum(diff)[P : 2 * P].astype(np.int64)
    j = int(np.argmax(need))
    return int(need[j]), j


def _nominal_absence(L: LearnedIteration, held: bool = False) -> np.ndarray:
    """bool (windows, P): the GPU positions (mod P) at which each window alone keeps its block
    out under the cost model with idle copy engines (``_simulate``'s clocks and release rule):
    from its release after the copy out to the remap of the latest prefetch the host can issue
    with the remap and copy done before the next access. ``held``: from the position after its
    last access, where the budget hold (``_hold``) can keep the GPU until the copy ends."""
    P = L.period
    W = len(L.win_s)
    cov = np.zeros((W, P), bool)
    if not W or not P:
        return cov
    ext, hx = _clocks(L, 3)
    size = L.cand_size[L.win_cand].astype(np.float64)
    d = size / L.bandwidth * 1e9
    r = REMAP_NS * size / REMAP_BYTES
    s, n = L.win_s, np.minimum(L.win_n, 3 * P - 1)
    h, p_out = _released(ext, hx, s, ext[s] + d)
    q = np.minimum(np.searchsorted(hx, ext[n] - d - r, side="right") - 1, n)
    back = np.searchsorted(ext, _marks(ext, hx, s, q, ext[n] - d - r)[1], side="left")
    if held:
        p_out = s + 1
    length = np.clip(back - p_out, 0, P)
    length[q <= h] = 0
    for w in np.flatnonzero(length > 0):
        cov[w, np.arange(p_out[w], p_out[w] + length[w]) % P] = True
    return cov


def make_plan(L: LearnedIteration, budget_bytes: int, *, bound: bool = False, max_ratio: float = MAX_RATIO) -> Plan:
    """The plan for ``budget_bytes`` (see the module docstring). ``bound``: also compute the
    model's saving bound at the predicted ratio (``saving_curve`` on the same iteration, tensor
    level; costs a tensor model)."""
    budget_bytes = int(budget_bytes)
    P = L.period
    peak_at = int(np.argmax(L.live)) if P else 0
    peak = int(L.live[peak_at]) if P else 0
    chosen: list[int] = []
    sim = _simulate(L, np.zeros(0, np.int64), budget_bytes)
    over = sim.peak > budget_bytes
    cov = _nominal_absence(L) if over or bound else None  # W x P: the daemon skips it for a plan that fits
    if over:
        chosen, sim = _cover(L, budget_bytes, max_ratio, sim, cov)
    reach_at, reach = _reach(L, cov) if cov is not None else (0, 0)
    w = np.array(chosen, np.int64)
    swaps, act = [], []
    for j, k in enumerate(w):
        c = int(L.win_cand[k])
        out_at, q, nxt = int(L.win_s[k]) % P, int(sim.q[j]) % P, int(L.win_n[k]) % P
        swaps.append(Swap(block=int(L.cand_block[c]), addr=int(L.cand_addr[c]), size=int(L.cand_size[c]), out_at=out_at,
                          prefetch_at=q, next_at=nxt, absent=int(sim.absent[j]), stall_ns=float(sim.stall[j]),
                          mark_at=int(sim.mark[j]) % P))
        act.append((out_at, int(abi.ActionKind.SWAP_OUT), 0, int(L.cand_addr[c]), int(L.cand_size[c])))
        act.append((q, int(abi.ActionKind.PREFETCH), 0, int(L.cand_addr[c]), int(L.cand_size[c])))
        act.append((int(sim.mark[j]) % P, int(abi.ActionKind.MARK), 0, int(L.cand_addr[c]), int(L.cand_size[c])))
    # Every candidate's idle windows, as hints: beyond the plan the shim evicts the block whose
    # next access is farthest (Belady's choice on the learned iteration) instead of the least
    # recently used, the worst choice on a cycle longer than the budget. Left out when they would
    # not fit in the plan.
    if (act or sim.peak > budget_bytes) and len(act) + len(L.win_s) <= abi.PLAN_MAX_ACTIONS:
        for k in range(len(L.win_s)):
            c = int(L.win_cand[k])
            act.append((int(L.win_s[k]) % P, int(abi.ActionKind.IDLE), int(L.win_n[k]) % P, int(L.cand_addr[c]),
                        int(L.cand_size[c])))
    actions = np.zeros(len(act), abi.ACTION_DTYPE)
    if act:
        a = np.array(act, dtype=np.uint64)
        o = np.lexsort((-a[:, 1].astype(np.int64), a[:, 0]))  # at one position: hints, marks, the prefetch, the swap-out
        for i, name in enumerate(("at", "kind", "until", "addr", "size")):
            actions[name] = a[o, i]
    needed, needed_at = _needed(L)
    bound_bytes, ratio = None, sim.ratio
    if bound and L.capture is not None:
        curve = model_curve(L)
        saved = peak - sim.peak
        if curve is not None and saved > 0:
            # The model's bound is the claim pyobmem makes about this iteration: the plan never
            # predicts a saving the bound does not allow at its slowdown, so its ratio is at least
            # the one at which the bound reaches the same saving.
            ratio = max(ratio, _ratio_for(curve, saved))
        bound_bytes = 0 if curve is None else curve.saved_at(ratio)
    return Plan(
        pid=L.pid, budget_bytes=budget_bytes, template_keys=L.keys, actions=actions, swaps=swaps, peak_bytes=peak,
        peak_at=peak_at, predicted_peak=sim.peak, time_ratio=ratio, stall_ns=float(sim.stall.sum()),
        feasible=sim.peak <= budget_bytes and len(actions) <= abi.PLAN_MAX_ACTIONS, needed_bytes=needed,
        needed_at=needed_at, needed_op_row=int(L.op_rows[needed_at]) if P else -1, bound_bytes=bound_bytes, iteration_ns=L.iteration_ns, bandwidth=L.bandwidth,
        min_swap_bytes=L.min_swap_bytes, period=P, matching=L.matching, iterations=L.iterations,
        iteration_index=L.iteration_index, reach_bytes=reach, reach_at=reach_at,
        reach_op_row=int(L.op_rows[reach_at]) if P else -1,
        candidates=(len(L.cand_block), int(L.cand_size.sum())), excluded=dict(L.excluded),
    )


def _reach(L: LearnedIteration, cov: np.ndarray) -> tuple[int, int]:
    """(position, bytes): the highest resident bytes with every window out as long as it can be
    alone (``_nominal_absence``): no plan's peak is lower under the cost model."""
    if not L.period:
        return 0, 0
    size = L.cand_size[L.win_cand].astype(np.int64)
    res = L.live - (cov * size[:, None]).sum(axis=0).astype(np.int64) if len(size) else L.live
    k = int(np.argmax(res))
    return k, int(res[k])


def _cover(L: LearnedIteration, budget_bytes: int, max_ratio: float, sim: _Sim, cov: np.ndarray) -> tuple[list, _Sim]:
    """Choose windows until the simulated peak fits ``budget_bytes`` (or none helps): at each
    step, among the unused windows whose block is out at the peak position (nominally), the one
    covering the most excess (resident bytes over the budget, capped at its size, summed over
    the positions it is out, per byte it moves: every byte costs the same copy time), kept only
    when the simulation (engine queues included) confirms it lowers the resident bytes at that
    position within ``max_ratio``. Returns (chosen windows, their simulation); when the budget
    cannot be met, the lowest peak reached. ``cov``: ``_nominal_absence(L)``."""
    nominal, held = cov, _nominal_absence(L, held=True)
    size = L.cand_size[L.win_cand].astype(np.float64)
    free = held.any(axis=1)
    chosen: list[int] = []
    best = (sim.peak, [], sim)
    while sim.peak > budget_bytes:
        p = sim.peak_at
        # Windows out at p with the engines idle first; then those the budget hold keeps out
        # there, at the cost of waiting for their copies.
        cov = nominal if np.any(free & nominal[:, p]) else held
        cand = np.flatnonzero(free & cov[:, p])
        if not len(cand):
            break
        excess = np.maximum(sim.resident - budget_bytes, 0).astype(np.float64)
        gain = (cov[cand] * np.minimum(excess[None, :], size[cand, None])).sum(axis=1) / size[cand]
        taken = False
        for k in cand[np.lexsort((size[cand], -gain))]:
            free[k] = False
            trial = chosen + [int(k)]
            t = _simulate(L, np.array(trial, np.int64), budget_bytes)
            if t.useless[-1] or t.resident[p] >= sim.resident[p] or t.ratio > max_ratio:
                continue
            chosen, sim, taken = trial, t, True
            break
        if not taken:
            break
        if sim.peak < best[0]:
            best = (sim.peak, list(chosen), sim)
    if sim.peak > budget_bytes and best[0] < sim.peak:
        return best[1], best[2]
    return chosen, sim


def model_curve(L: LearnedIteration):
    """The model's saving curve (``pyobmem.model.saving.saving_curve``, tensor level, as the report
    shows it) on the planner's iteration, with every greedy step (no stall limit)."""
    tm = build_tensors(L.capture, L.it, L.bm)
    ratios = tuple(sorted(set(TIME_RATIOS) | {GREEDY_MAX_RATIO}))
    return saving_curve(L.capture, L.it, L.bm, bandwidth=L.bandwidth, ratios=ratios, iteration=L.iteration_index, tm=tm)


def _ratio_for(curve, saved: int) -> float:
    """The least slowdown at which ``curve`` saves ``saved`` bytes (inf when it never does)."""
    if curve.saved_at(GREEDY_MAX_RATIO) < saved:
        return float("inf")
    lo, hi = 1.0, GREEDY_MAX_RATIO
    if curve.saved_at(lo) >= saved:
        return lo
    for _ in range(100):
        mid = (lo + hi) / 2
        if curve.saved_at(mid) >= saved:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-6:
            break
    return hi


def plan_capture(capture, budget, *, bandwidth: float | None = None, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES,
                 bound: bool = False) -> Plan | NoPlan:
    """Learn the iteration of ``capture`` and plan for ``budget`` (a Budget, its text, or bytes;
    a fraction resolves against the card's memory the shim noted, device0.total_bytes)."""
    if isinstance(budget, str):
        budget = parse_budget(budget)
    if isinstance(budget, Budget):
        total = card_bytes(capture)
        b = budget.resolve(total)
        if b is None:
            raise PyobmemError(f"budget {budget.text} is a fraction of the card, and the capture does not say the card's memory", 2)
        budget = b
    learned = learn_iteration(capture, min_swap_bytes=min_swap_bytes, bandwidth=bandwidth)
    if isinstance(learned, NoPlan):
        return learned
    return make_plan(learned, int(budget), bound=bound)


def plan_json_text(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=True)
