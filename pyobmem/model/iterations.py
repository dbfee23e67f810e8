"""Iteration detection from the launch stream alone (no framework hooks).

The stream is the main process's kernel launches, graph launches and copies (the process with the
most launches), each mapped to a small int "kernel id" (same type, handle and copy direction ->
same id). Training repeats one sequence of kernels per iteration, so the stream is periodic over
long stretches. ``detect_iterations`` finds those stretches (regimes), the period of each, its
phase and every iteration in it; docs/model.md describes the method and its limits. The main
regime is the training step (``steps._step``; the lag search and alignment are in ``periods``): the shortest period whose iterations span the stream with
asides between some of them that read a result back to the host (a loss logged every N steps, an
evaluation); those asides end the iteration they follow, which deviates from the template
(``IterationModel.deviating``), and accumulated micro-steps, between which the optimizer reads
nothing back, stay inside one step. A repeating
unit whose template leaves out kernels that recur between its repeats as often as it repeats (one
transformer layer of a training step) is part of a longer iteration, never an iteration itself
(``_left_out``): the longer period that holds those kernels is taken instead, or none. Everything
is O(n log n) in the stream length n (FFT autocorrelation, runs of matches, anchored alignment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import abi
from .periods import (MIN_COPIES, MIN_MAIN_ITERATIONS, MIN_PERIOD, _align, _best_lag, _candidate_lags, _left_out,
                      _phase, _ranked_lags)
from .steps import _absorb, _step, micro_step

MIN_ITERATIONS = 2  # a regime needs at least this many aligned iterations
SUB_REGIME_MIN_RATIO = 0.125  # a regime found between iterations needs period >= this x main
SUB_REGIME_MIN_PERIOD = 2  # ... and at least 2 ops (a kernel repeated back to back is no iteration)
SUB_REGIME_MAX_SLOWDOWN = 10.0  # ... and ops no more than 10x slower than the main regime's
# (a repeat interleaved with compilation or autotuning, e.g. JAX initialising layer by layer
# while it compiles, runs at host speed: warm-up, not training)
MAX_DEPTH = 4  # recursion into the stretches no regime explained
_SEQ_TYPES = (abi.Ev.LAUNCH, abi.Ev.GRAPH_LAUNCH, abi.Ev.MEMCPY)


@dataclass(frozen=True)
class Regime:
    """A stretch of the stream that repeats one template of ``period_ops`` kernels.

    ``period_ops``: ops (of the main sequence) per iteration. ``micro_period_ops`` and
    ``micro_steps``: the repeated micro-step inside the iteration (gradient accumulation), or None
    and 1. ``template``: the kernel ids of one iteration, shape (period_ops,), int32 (see
    ``IterationModel.kernel_rows``). ``first`` and ``count``: its iterations are rows
    ``first .. first+count-1`` of the IterationModel arrays. ``confidence``: mean over its
    iterations of the fraction of positions whose kernel equals the template's (0..1).
    ``phase``: how the start was chosen: "aside" (right after the ops that some iterations add at
    their end: a logged loss, an evaluation), "gap" (the longest pause between launches), "htod"
    (the input copy) or "stream" (where the repetition starts). ``deviating``: how many of its
    iterations do not follow the template (``IterationModel.deviating``).
    """

    period_ops: int
    micro_period_ops: int | None
    micro_steps: int
    template: np.ndarray = field(repr=False)
    first: int
    count: int
    confidence: float
    phase: str
    deviating: int = 0


@dataclass(frozen=True)
class PartialUnit:
    """A repeating unit left out as part of a longer iteration (see ``_left_out``).

    ``period_ops``: its ops (of the main sequence); ``count``: its aligned repeats; ``left_out``:
    how many kernel ids recur between its repeats as often as it repeats and are not in it.
    """

    period_ops: int
    count: int
    left_out: int


@dataclass(frozen=True)
class IterationModel:
    """Iterations found in a capture. Arrays have one row per iteration, sorted by start.

    ``pid``: the process analysed (None: no launches). ``seq_rows``: capture op rows of its
    sequence (launches, graph launches, copies), int64 (n_seq,). ``seq_ids``: their kernel ids,
    int32 (n_seq,). ``kernel_rows``: an example op row per kernel id (name it with
    ``capture.kernel_name``). ``start_seq``/``end_seq``: [start, end) positions in the sequence.
    ``start_op``/``end_op``: [start, end) capture op rows (end: the op row of the sequence op after
    the iteration, or len(ops)). ``t_start``/``t_end``: ns (t_end: the time of ``end_op``, or of
    the last op when the stream ends there). ``regime``: index into ``regimes`` (int32).
    ``match``: fraction of template positions matched (float64). ``deviating``: bool, the
    iteration does not follow its regime's template: it holds other than ``period_ops`` ops (an
    aside at its end: a logged loss, an evaluation, a checkpoint; the warm-up of the first step)
    or one of its first ``period_ops`` ops differs. ``main``: index of the regime
    covering the most ops, -1 when no iteration was found. ``partial``: when no iteration was
    found but a repeating unit was left out as part of a longer iteration (the longer one repeats
    too few times yet), that unit; else None.
    """

    pid: int | None
    seq_rows: np.ndarray = field(repr=False)
    seq_ids: np.ndarray = field(repr=False)
    kernel_rows: np.ndarray = field(repr=False)
    regimes: tuple
    main: int
    start_seq: np.ndarray = field(repr=False)
    end_seq: np.ndarray = field(repr=False)
    start_op: np.ndarray = field(repr=False)
    end_op: np.ndarray = field(repr=False)
    t_start: np.ndarray = field(repr=False)
    t_end: np.ndarray = field(repr=False)
    regime: np.ndarray = field(repr=False)
    match: np.ndarray = field(repr=False)
    deviating: np.ndarray = field(repr=False, default=None)
    partial: PartialUnit | None = None

    @property
    def count(self) -> int:
        """Iterations found in all regimes."""
        return len(self.start_seq)

    @property
    def main_regime(self) -> Regime | None:
        return self.regimes[self.main] if self.main >= 0 else None

    @property
    def n_deviating(self) -> int:
        """Iterations of the main regime that do not follow its template."""
        return int(np.count_nonzero(self.deviating[self.step_rows()])) if self.deviating is not None else 0

    def step_rows(self) -> np.ndarray:
        """Iteration rows of the main regime (int64), deviating ones included; empty when none."""
        if self.main < 0:
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.regime == self.main)

    def step_number(self, main_index: int) -> int:
        """The number every verb gives iteration ``main_index`` of ``main_rows()``: its index among
        ``step_rows()`` (the training steps, deviating ones included, from 0); -1 when out of range."""
        rows = self.main_rows()
        if not 0 <= main_index < len(rows):
            return -1
        return int(np.searchsorted(self.step_rows(), rows[main_index]))

    def main_rows(self) -> np.ndarray:
        """Iteration rows of the main regime that follow its template (int64), what the per-block
        model and the planner use; all of the main regime's when fewer than MIN_ITERATIONS do."""
        rows = self.step_rows()
        if self.deviating is None:
            return rows
        ok = rows[~self.deviating[rows]]
        return ok if len(ok) >= MIN_ITERATIONS else rows

    @property
    def iteration_ns(self) -> float | None:
        """Median duration (ns) of the main regime's iterations; None when none."""
        rows = self.main_rows()
        if not len(rows):
            return None
        return float(np.median(self.t_end[rows] - self.t_start[rows]))


def kernel_sequence(capture) -> tuple:
    """(pid, seq_rows, seq_ids, kernel_rows) of the process with the most launches."""
    ops = capture.ops
    is_launch = np.isin(ops["type"], [int(abi.Ev.LAUNCH), int(abi.Ev.GRAPH_LAUNCH)])
    if not np.any(is_launch):
        return None, np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
    pids, counts = np.unique(ops["pid"][is_launch], return_counts=True)
    pid = int(pids[np.argmax(counts)])
    sel = np.isin(ops["type"], [int(t) for t in _SEQ_TYPES]) & (ops["pid"] == pid)
    rows = np.flatnonzero(sel)
    o = ops[rows]
    key = (
        (o["handle"].astype(np.uint64) & np.uint64((1 << 48) - 1))
        | (o["type"].astype(np.uint64) << np.uint64(56))
        | ((o["copy_kind"].astype(np.uint64) & np.uint64(0xFF)) << np.uint64(48))
    )
    uniq, first, ids = np.unique(key, return_index=True, return_inverse=True)
    return pid, rows.astype(np.int64), ids.astype(np.int32).ravel(), rows[first].astype(np.int64)


def detect_iterations(capture) -> IterationModel:
    """Find the iterations of a capture from its launch stream (see the module docstring)."""
    pid, rows, ids, kernel_rows = kernel_sequence(capture)
    ts = capture.ops["ts_ns"][rows]
    htod = dtoh = np.zeros(len(kernel_rows), bool)
    if len(kernel_rows):
        ko = capture.ops[kernel_rows]
        copy = ko["type"] == abi.Ev.MEMCPY
        htod = copy & ((ko["copy_kind"] & 0xFF) == abi.CopyKind.HTOD)
        dtoh = copy & ((ko["copy_kind"] & 0xFF) == abi.CopyKind.DTOH)
    partial: list = []
    found = detect_in_sequence(ids, ts, htod, partial=partial, dtoh_ids=dtoh)
    return _model(capture, pid, rows, ids, kernel_rows, ts, found, partial)


def detect_in_sequence(ids: np.ndarray, ts: np.ndarray | None = None, htod_ids: np.ndarray | None = None,
                       partial: list | None = None, dtoh_ids: np.ndarray | None = None) -> list:
    """Regimes of an int sequence: a list of dicts with period, template, starts, ends, scores, phase.

    ``ts`` (ns per position) lets the phase follow the longest pause; ``htod_ids`` and
    ``dtoh_ids`` (bool per id) mark host-to-device and device-to-host copies. The regimes come
    in the order they were found (largest first); the first is the training step (``_step``),
    whose iterations run from one start to the next (``ends``: the asides between them included).
    ``partial``, when given, receives a dict (period, count, left_out, depth) per repeating unit
    left out as part of a longer iteration (``_left_out``), in the order they were met.
    """
    s = np.ascontiguousarray(ids, dtype=np.int32)
    if ts is None:
        ts = np.arange(len(s), dtype=np.int64)
    claimed = np.zeros(len(s), bool)
    out: list = []
    _process(s, ts, htod_ids, 0, len(s), 0, 1, claimed, out, partial=partial, dtoh_ids=dtoh_ids)
    return out


def _ns_per_op(ts, starts, period) -> float:
    """Median over iterations of (time of the last op - time of the first) / (period - 1)."""
    if period < 2 or not len(starts):
        return 0.0
    return float(np.median((ts[starts + period - 1] - ts[starts]) / (period - 1)))


def _process(s, ts, htod_ids, a, b, depth, min_period, claimed, out, main_ns=None, partial=None, dtoh_ids=None) -> None:
    if b - a < MIN_COPIES * max(min_period, 1) or depth > MAX_DEPTH:
        return
    loc = s[a:b]
    lags = _candidate_lags(loc)
    ranked = _ranked_lags(loc, lags)
    # At the top the period is the best lag of at least MIN_PERIOD (runs of shorter lags still
    # explain away the longer ones inside them); below, a too short best lag means no regime.
    pick = _best_lag(ranked, MIN_PERIOD if depth == 0 else 1)
    if pick is not None and pick[0] < min_period:
        pick = None  # a local feature (layers) in a stretch between iterations, not a regime
    found = None
    while pick is not None:
        period, run_start = pick
        t0 = loc[run_start : run_start + period]
        phi, how = _phase(loc, ts[a:b], run_start, period, htod_ids)
        template = np.roll(t0, -phi)
        starts, scores = _align(loc, template)
        slow = (
            depth > 0 and main_ns is not None and len(starts) >= MIN_ITERATIONS
            and (period < SUB_REGIME_MIN_PERIOD
                 or _ns_per_op(ts, starts + a, period) > SUB_REGIME_MAX_SLOWDOWN * max(main_ns, 1.0))
        )
        enough = len(starts) >= (MIN_MAIN_ITERATIONS if depth == 0 else MIN_ITERATIONS)
        if not enough or slow:
            break
        left = _left_out(loc, template, starts)
        if not len(left):
            found = (period, template, starts, scores, how)
            break
        # Part of a longer iteration (a layer of a training step): the longer period that holds
        # what it leaves out, if one repeats often enough; else no regime rather than a wrong one.
        if partial is not None:
            partial.append({"period": period, "count": len(starts), "left_out": len(left), "depth": depth})
        pick = _best_lag(ranked, period + 1, need=left, s=loc)
    if depth == 0:
        step = _step(loc, ts[a:b], htod_ids, dtoh_ids, found, lags)
        found = step if step is not None else found
    if found is None:
        if depth > 0:
            return
    else:
        period, template, starts, scores, how = found
        ends = _absorb(loc, template, starts, dtoh_ids) if depth == 0 else starts + period
        starts, ends = starts + a, ends + a
        out.append({"period": period, "template": template, "starts": starts, "ends": ends, "scores": scores,
                    "phase": how})
        for st, en in zip(starts, ends):
            claimed[st:en] = True
        if depth == 0:
            min_period = max(1, int(period * SUB_REGIME_MIN_RATIO))
            main_ns = _ns_per_op(ts, starts, period)
        # Recurse into the unexplained stretches of [a, b).
        free = ~claimed[a:b]
        edges = np.diff(np.concatenate(([0], free.view(np.int8), [0])))
        for ga, gb in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            _process(s, ts, htod_ids, a + ga, a + gb, depth + 1, min_period, claimed, out, main_ns, partial, dtoh_ids)


def _model(capture, pid, rows, ids, kernel_rows, ts, found, partial=()) -> IterationModel:
    n_ops = len(capture.ops)
    regimes, st_all, en_all, rg_all, sc_all, dv_all = [], [], [], [], [], []
    order = sorted(range(len(found)), key=lambda i: int(found[i]["starts"][0]))
    for ri, i in enumerate(order):
        f = found[i]
        k = len(f["starts"])
        mp, ms = micro_step(f["template"])
        regimes.append(
            Regime(
                period_ops=int(f["period"]), micro_period_ops=mp, micro_steps=ms, template=f["template"],
                first=0, count=k, confidence=float(np.mean(f["scores"])), phase=f["phase"],
            )
        )
        st_all.append(f["starts"])
        en_all.append(f["ends"])
        rg_all.append(np.full(k, ri, np.int32))
        sc_all.append(f["scores"])
        dv_all.append((f["ends"] - f["starts"] != f["period"]) | (np.asarray(f["scores"]) < 1.0))
    if regimes:
        start_seq = np.concatenate(st_all)
        end_seq = np.concatenate(en_all)
        regime = np.concatenate(rg_all)
        match = np.concatenate(sc_all)
        deviating = np.concatenate(dv_all)
        o = np.argsort(start_seq, kind="stable")
        start_seq, end_seq, regime, match, deviating = start_seq[o], end_seq[o], regime[o], match[o], deviating[o]
        fixed = []
        for ri, r in enumerate(regimes):
            w = np.flatnonzero(regime == ri)
            fixed.append(Regime(**{**r.__dict__, "first": int(w[0]), "count": len(w),
                                   "deviating": int(np.count_nonzero(deviating[w]))}))
        regimes = fixed
        ops_per = [r.period_ops * r.count for r in regimes]
        main = int(np.argmax(ops_per))
    else:
        start_seq = end_seq = np.zeros(0, np.int64)
        regime = np.zeros(0, np.int32)
        match = np.zeros(0)
        deviating = np.zeros(0, bool)
        main = -1
    top = [p for p in partial if p["depth"] == 0]  # the first unit left out at the top, if no iteration
    unit = PartialUnit(*(int(top[0][f]) for f in ("period", "count", "left_out"))) if main < 0 and top else None
    start_op = rows[start_seq] if len(start_seq) else np.zeros(0, np.int64)
    nxt = end_seq < len(rows)
    end_op = np.where(nxt, rows[np.minimum(end_seq, len(rows) - 1)], n_ops) if len(end_seq) else np.zeros(0, np.int64)
    op_ts = capture.ops["ts_ns"]
    t_start = op_ts[start_op] if len(start_op) else np.zeros(0, np.int64)
    t_end = (
        np.where(nxt, op_ts[np.minimum(end_op, n_ops - 1)], ts[np.maximum(end_seq - 1, 0)])
        if len(end_seq)
        else np.zeros(0, np.int64)
    )
    return IterationModel(
        pid=pid, seq_rows=rows, seq_ids=ids, kernel_rows=kernel_rows, regimes=tuple(regimes), main=main,
        start_seq=start_seq.astype(np.int64), end_seq=end_seq.astype(np.int64), start_op=np.asarray(start_op, np.int64),
        end_op=np.asarray(end_op, np.int64), t_start=np.asarray(t_start, np.int64), t_end=np.asarray(t_end, np.int64),
        regime=regime, match=match, deviating=deviating, partial=unit,
    )
