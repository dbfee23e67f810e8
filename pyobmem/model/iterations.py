"""Iteration detection from the launch stream alone (no framework hooks).

The stream is the main process's kernel launches, graph launches and copies (the process with the
most launches), each mapped to a small int "kernel id" (same type, handle and copy direction ->
same id). Training repeats one sequence of kernels per iteration, so the stream is periodic over
long stretches. ``detect_iterations`` finds those stretches (regimes), the period of each, its
phase and every iteration in it; docs/model.md describes the method and its limits. The main
regime is the training step (``_step``): the shortest period whose iterations span the stream with
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
import scipy.fft

from .. import abi

MIN_COPIES = 3  # a stretch is periodic with lag L when it holds at least 3 copies of L ops
MIN_ITERATIONS = 2  # a regime needs at least this many aligned iterations
MIN_MAIN_ITERATIONS = MIN_COPIES  # ... and the first (main) one this many
MIN_PERIOD = 2  # an iteration has at least 2 ops: one kernel repeated back to back is no training step
MATCH = 0.8  # fraction of template positions an iteration must match (start of a stretch)
MATCH_CONTIGUOUS = 0.6  # ... when it starts where the previous iteration ended
SUB_REGIME_MIN_RATIO = 0.125  # a regime found between iterations needs period >= this x main
SUB_REGIME_MIN_PERIOD = 2  # ... and at least 2 ops (a kernel repeated back to back is no iteration)
SUB_REGIME_MAX_SLOWDOWN = 10.0  # ... and ops no more than 10x slower than the main regime's
# (a repeat interleaved with compilation or autotuning, e.g. JAX initialising layer by layer
# while it compiles, runs at host speed: warm-up, not training)
MAX_DEPTH = 4  # recursion into the stretches no regime explained
N_CANDIDATES = 24  # lags kept from the autocorrelation
MICRO_SHARE = 0.6  # micro-steps of gradient accumulation cover at least this share of the iteration
STEP_COVERAGE = 0.75  # a step's iterations cover at least this share of the stretch they span
EXACT_WORK = 30_000_000  # below n * max_lag, match counts are computed exactly (no FFT)
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


def _step(s, ts, htod_ids, dtoh_ids, found, lags) -> tuple | None:
    """The training step: the shortest candidate period whose iterations, with asides between
    some of them, span the stream (``_is_step``); (period, template, starts, scores, phase) or
    None. ``lags``: the candidate periods (``_candidate_lags``). ``found``: the period of the
    largest coverage (``_process``), or None; the step's
    iterations cover at least STEP_COVERAGE of its ops (half of the stream when there is none).

    A loop that logs the loss every 10 steps repeats exactly every 10 steps and one copy; its
    steps are that period's iterations, the copy an aside of one of them. The template is rotated
    so that iterations start right after their asides (``_aside_phase``): users put logging,
    evaluation and checkpoints at the end of the loop body.
    """
    n = len(s)
    if found is not None:
        lags = np.union1d(lags, [found[0]])
    need = STEP_COVERAGE * found[0] * len(found[2]) if found is not None else 0.5 * n
    for S in (int(x) for x in lags):
        if S < MIN_PERIOD or S * MIN_MAIN_ITERATIONS > n:
            continue
        st, en = _runs(s, S)
        ok = en - st >= MIN_COPIES * S
        if not np.any(ok) or (en - st).sum() < need / 2:  # runs far from enough: no alignment (cost)
            continue
        run_start = int(st[ok][np.argmax((en - st)[ok])])
        phi, how = _phase(s, ts, run_start, S, htod_ids)
        template = np.roll(s[run_start : run_start + S], -phi)
        if found is not None and S == found[0] and np.array_equal(template, found[1]):
            starts, scores = found[2], found[3]
        else:
            starts, scores = _align(s, template)
        if len(starts) < MIN_MAIN_ITERATIONS or len(starts) * S < need:
            continue
        j = _aside_phase(s, template, starts, dtoh_ids)
        if j:
            # kept when it aligns as many iterations (an aside that starts like the template, an
            # evaluation's forward pass, would otherwise be taken for its beginning)
            t2 = np.roll(template, -j)
            st2, sc2 = _align(s, t2)
            if len(st2) >= len(starts):
                template, starts, scores, how = t2, st2, sc2, "aside"
        if len(starts) >= MIN_MAIN_ITERATIONS and _is_step(s, template, starts, dtoh_ids) \
                and not len(_left_out(s, template, starts)):
            return S, template, starts, scores, how
    return None


def _extra_reads(s, template, dtoh_ids, a, b) -> bool:
    """Whether s[a:b] holds more device-to-host copies than the template: the host reads a
    result back there (a logged loss, a metric, an evaluation's result, a checkpoint)."""
    if dtoh_ids is None or not len(dtoh_ids):
        return False
    return int(np.count_nonzero(dtoh_ids[s[a:b]])) > int(np.count_nonzero(dtoh_ids[template]))


def _is_step(s, template, starts, dtoh_ids) -> bool:
    """Whether the iterations at ``starts`` are training steps: they cover at least STEP_COVERAGE
    of the stretch from the first to the end of the last, and the stretches between two of them
    that hold more than one iteration (the asides) mostly read a result back to the host. A
    stretch that reads nothing back, recurring (in at least 2 and half of them), is the rest of
    the step: the optimizer update after accumulated micro-steps."""
    P = len(template)
    if len(starts) * P < STEP_COVERAGE * (starts[-1] + P - starts[0]):
        return False
    longer = np.flatnonzero(np.diff(starts) > P)
    quiet = sum(not _extra_reads(s, template, dtoh_ids, int(starts[i]), int(starts[i + 1])) for i in longer)
    return not (quiet >= 2 and 2 * quiet >= len(longer))


def _aside_phase(s, template, starts, dtoh_ids) -> int:
    """Offset into the template where most asides are inserted (0: at its end already, or no
    asides). Each stretch from one start to the next that holds more than an iteration, and the
    stretch from the last start to the end when it holds more and reads a result back (the last
    step's log), is compared with the template repeated: its first mismatch, modulo the period,
    is where its aside was inserted."""
    P = len(template)
    spans = [(int(starts[i]), int(starts[i + 1])) for i in np.flatnonzero(np.diff(starts) > P)]
    a, n = int(starts[-1]), len(s)
    if n - a > P and _extra_reads(s, template, dtoh_ids, a + P, n):
        spans.append((a, n))
    if not spans:
        return 0
    js = []
    for a, b in spans:
        miss = np.flatnonzero(s[a:b] != template[np.arange(b - a) % P])
        js.append(int(miss[0]) % P if len(miss) else 0)
    vals, cnt = np.unique(js, return_counts=True)
    j = int(vals[np.argmax(cnt)])
    return j if 2 * int(cnt.max()) > len(js) else 0


def _absorb(s, template, starts, dtoh_ids) -> np.ndarray:
    """Ends of the step's iterations: each runs to the next start when the ops between hold less
    than MIN_COPIES iterations' worth (an aside, not a stretch with a regime of its own); the
    last takes in what follows it on the same terms when that reads a result back (the last
    step's log or evaluation)."""
    P = len(template)
    ends = starts + P
    if len(starts) > 1:
        extra = starts[1:] - ends[:-1]
        take = (extra > 0) & (extra < MIN_COPIES * P)
        ends[:-1][take] = starts[1:][take]
    n = len(s)
    if 0 < n - ends[-1] < MIN_COPIES * P and _extra_reads(s, template, dtoh_ids, int(ends[-1]), n):
        ends[-1] = n
    return ends


def _left_out(s: np.ndarray, template: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Kernel ids (sorted) that the template leaves out but that recur between its iterations as
    often as the template does: a repeating unit that leaves them out is part of a longer iteration
    (one transformer layer of a training step), not an iteration. Empty when there are none.

    Between the iterations (sorted starts, P ops each), the gaps of at least MIN_COPIES x P ops
    (room for a repeat of their own) split them into g + 1 runs. When most ops of those gaps are
    kernels the template does not have (another part of the step, not an evaluation or a step of
    another shape, which run mostly the iteration's own kernels), the ids that occur there at
    least k * g / (g + 1) times, k the iterations, are returned: as often per gap as the
    iterations per run. Shorter gaps (a checkpoint's copies, an odd batch) split nothing.
    """
    P, k = len(template), len(starts)
    none = np.zeros(0, np.int32)
    if k < 2:
        return none
    ends = starts + P
    wide = np.flatnonzero(starts[1:] - ends[:-1] >= MIN_COPIES * P)
    if not len(wide):
        return none
    g = len(wide)
    between = np.concatenate([s[ends[i] : starts[i + 1]] for i in wide])
    other = between[~np.isin(between, template)]
    if 2 * len(other) <= len(between):
        return none
    cnt = np.bincount(other)
    return np.flatnonzero(cnt * (g + 1) >= k * g).astype(np.int32)


def _candidate_lags(s: np.ndarray) -> np.ndarray:
    """Lags worth testing: peaks of the match-rate autocorrelation and the commonest repeat
    distances of rare kernels (ints in [1, n // 2])."""
    n = len(s)
    max_lag = n // 2
    if max_lag < 1:
        return np.zeros(0, np.int64)
    lags = np.arange(max_lag + 1)
    if n * max_lag <= EXACT_WORK:
        matches = np.array([n] + [np.count_nonzero(s[:-L] == s[L:]) for L in range(1, max_lag + 1)], np.float64)
    else:
        # Random unit phase per id: E[z_i conj(z_j)] = [id_i == id_j], so the autocorrelation of z
        # estimates the number of matches at every lag at once (noise ~ sqrt(n)).
        rng = np.random.default_rng(0x5EED)
        z = np.exp(2j * np.pi * rng.random(int(s.max()) + 1)).astype(np.complex64)[s]
        nfft = scipy.fft.next_fast_len(2 * n)
        f = scipy.fft.fft(z, nfft)
        del z
        f = (f * np.conj(f)).astype(np.complex64)
        matches = scipy.fft.ifft(f)[: max_lag + 1].real.astype(np.float64)
        del f
    rate = matches / (n - lags)
    rate[0] = -1
    chosen: list = []
    top = np.argsort(-rate, kind="stable")[: N_CANDIDATES * 16]
    for L in top:
        if rate[L] < 0.05 or len(chosen) >= N_CANDIDATES:
            break
        if any(L % c == 0 and rate[c] >= rate[L] - 0.02 for c in chosen):
            continue
        chosen.append(int(L))
    # Repeat distances: each id's consecutive distances weigh 1 in total, so kernels seen once per
    # iteration (embedding, loss, optimizer) vote for the period.
    order = np.argsort(s, kind="stable")
    ss = s[order]
    same = ss[1:] == ss[:-1]
    d = np.diff(order)[same]
    if len(d):
        cnt = np.bincount(s)
        w = 1.0 / (cnt[ss[1:][same]] - 1)
        ok = d <= max_lag
        hist = np.bincount(d[ok], weights=w[ok], minlength=max_lag + 1)
        for L in np.argsort(-hist, kind="stable")[:8]:
            if hist[L] > 0 and int(L) not in chosen:
                chosen.append(int(L))
    return np.array(sorted(chosen), np.int64)


def _runs(s: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Stretches [start, end) made of at least two back-to-back copies of L ops."""
    m = s[:-L] == s[L:]
    e = np.diff(np.concatenate(([0], m.view(np.int8), [0])))
    st, en = np.flatnonzero(e == 1), np.flatnonzero(e == -1) + L
    keep = en - st >= 2 * L
    return st[keep], en[keep]


def _best_lag(ranked: list, min_lag: int, need: np.ndarray | None = None, s: np.ndarray | None = None):
    """The period of the largest periodic stretch: the first (period, start of its longest run)
    of ``ranked`` (``_ranked_lags``) with a period of at least ``min_lag``, or None. With ``need``
    (ids a shorter period left out), only a period whose ops s[start : start + period] hold most
    of them (more than half: kernels of the first step only, such as the optimizer state's
    initialisation, may be missing)."""
    for L, st in ranked:
        if L < min_lag:
            continue
        if need is not None and 2 * np.count_nonzero(np.isin(need, s[st : st + L])) <= len(need):
            continue
        return L, st
    return None


def _ranked_lags(s: np.ndarray, lags: np.ndarray) -> list:
    """(period, start of its longest run) of each lag that can be a period, largest total
    coverage first (ties: the shorter lag).

    A run of lag L inside one period of a larger lag L' (shorter than L'+L) is a local feature
    (transformer layers, repeated optimizer kernels) and does not count, even when L' repeats
    only twice; a run of lag L that spans L'+L ops of a run of L' > L explains it (L' is a
    multiple or a mix of periods). Only runs of MIN_COPIES copies or more count.
    """
    if not len(lags):
        return []
    runs = {int(L): _runs(s, int(L)) for L in lags}
    lags = [L for L in sorted(runs) if len(runs[L][0])]
    alive = {L: np.ones(len(runs[L][0]), bool) for L in lags}
    n = len(s)
    for bi, Lb in enumerate(lags):
        stb, enb = runs[Lb]
        cov = np.zeros(n + 1, np.int32)
        np.add.at(cov, stb, 1)
        np.add.at(cov, enb, -1)
        pref = np.concatenate(([0], np.cumsum(np.cumsum(cov)[:-1], dtype=np.int64)))
        for La in lags[:bi]:
            sta, ena = runs[La]
            ln = ena - sta
            ov = pref[ena] - pref[sta]
            alive[La] &= ~((ov >= 0.9 * ln) & (ln < Lb + La))
            strong = ov >= Lb + La
            if np.any(strong):
                lo = np.searchsorted(enb, sta[strong], side="right")
                hi = np.searchsorted(stb, ena[strong], side="left")
                mark = np.zeros(len(stb) + 1, np.int32)
                np.add.at(mark, lo, 1)
                np.add.at(mark, hi, -1)
                alive[Lb] &= np.cumsum(mark)[:-1] == 0
    ranked = []
    for L in lags:
        st, en = runs[L]
        a = alive[L] & (en - st >= MIN_COPIES * L)
        c = int((en[a] - st[a]).sum())
        if c > 0:
            longest = int(np.argmax(np.where(a, en - st, -1)))
            ranked.append((-c, L, int(st[longest])))
    return [(L, st) for _, L, st in sorted(ranked)]


def _phase(s, ts, run_start, period, htod_ids) -> tuple[int, str]:
    """Where an iteration starts, as an offset into s[run_start : run_start+period]."""
    copies = (len(s) - run_start) // period
    if copies >= 2 and period > 1:
        block = s[run_start : run_start + copies * period].reshape(copies, period)
        ok = np.all(block == block[0], axis=1)
        pos = run_start + np.arange(copies * period)
        g = np.where(pos > 0, ts[pos] - ts[np.maximum(pos - 1, 0)], -1).reshape(copies, period)[ok]
        if len(g) >= 2:
            med = np.median(g[1:] if len(g) > 2 else g, axis=0)
            j = int(np.argmax(med))
            if med[j] > 4 * max(np.median(med), 1) and np.count_nonzero(med >= med[j] * 0.999) == 1:
                return j, "gap"
    if htod_ids is not None and len(htod_ids):
        t0 = s[run_start : run_start + period]
        h = htod_ids[t0]
        first = np.flatnonzero(h & ~np.roll(h, 1))
        if len(first) == 1 and not np.all(h):
            return int(first[0]), "htod"
    return 0, "stream"


def _align(s: np.ndarray, template: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts of the iterations that match ``template`` (anchored on its first kernels)."""
    P = len(template)
    n = len(s)
    if n < P:
        return np.zeros(0, np.int64), np.zeros(0)
    q = min(P, 8)
    ext = np.concatenate((template, template[: min(P, 64)]))
    while q < min(P, 64):
        occ = sum(np.array_equal(ext[i : i + q], template[:q]) for i in range(P))
        if occ <= 1:
            break
        q = min(P, q * 2)
    last = n - P
    m = np.ones(last + 1, bool)
    for j in range(q):
        m &= s[j : last + 1 + j] == template[j]
    cands = np.flatnonzero(m)

    def score(c: int) -> float:
        return np.count_nonzero(s[c : c + P] == template) / P

    starts, scores = [], []
    pos, ptr = 0, 0
    while True:
        if starts and pos <= last:
            sc = score(pos)
            if sc >= MATCH_CONTIGUOUS:
                starts.append(pos)
                scores.append(sc)
                pos += P
                continue
        ptr = int(np.searchsorted(cands, pos))
        found = None
        while ptr < len(cands):
            c = int(cands[ptr])
            sc = score(c)
            if sc >= MATCH:
                hi = int(np.searchsorted(cands, c + max(P // 2, 1)))
                best_c, best_sc = c, sc
                for c2 in cands[ptr + 1 : hi]:
                    sc2 = score(int(c2))
                    if sc2 > best_sc:
                        best_c, best_sc = int(c2), sc2
                found = (best_c, best_sc)
                break
            ptr += 1
        if found is None:
            break
        starts.append(found[0])
        scores.append(found[1])
        pos = found[0] + P
    return np.array(starts, np.int64), np.array(scores, np.float64)


def micro_step(template: np.ndarray) -> tuple[int | None, int]:
    """(micro period, micro steps) when the iteration is k >= 2 copies of one micro-step followed
    by a shorter tail (gradient accumulation then the optimizer step), else (None, 1): the
    longest cyclic run of T[j] = T[j+p], plus one copy, covers 90% of (k-1)p, k = P // p, and
    MICRO_SHARE of P. The
    micro-steps are counted as the commonest count in the template of the kernels seen once in
    one micro-step: the first micro-step may differ from the others (PyTorch assigns the
    gradients there and adds to them in the next ones), so copies alone count one too few."""
    P = len(template)
    if P < 4:
        return None, 1
    for p in range(1, P // 2 + 1):
        k = P // p
        c = template == np.roll(template, -p)
        # the copies (the first may differ: one less) cover 90% of k - 1 of them, and 60% of P
        need = max(0.9 * (k - 1) * p, MICRO_SHARE * P) - p
        if np.count_nonzero(c) < need:
            continue
        run, at = _longest_cyclic_run(c)
        if run >= need and run >= p:
            unit = template[np.arange(at, at + p) % P]
            ids, cnt = np.unique(unit, return_counts=True)
            once = ids[cnt == 1]
            copies = int(round(run / p)) + 1
            if len(once):
                per = np.bincount(np.searchsorted(once, template[np.isin(template, once)]), minlength=len(once))
                vals, n = np.unique(per, return_counts=True)
                copies = max(copies, int(vals[np.flatnonzero(n == n.max())[-1]]))
            return p, copies
    return None, 1


def _longest_cyclic_run(c: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest cyclic run of True in c."""
    if np.all(c):
        return len(c), 0
    shift = int(np.argmin(c))
    c2 = np.roll(c, -shift)
    e = np.diff(np.concatenate(([0], c2.view(np.int8), [0])))
    st, en = np.flatnonzero(e == 1), np.flatnonzero(e == -1)
    if not len(st):
        return 0, 0
    i = int(np.argmax(en - st))
    return int(en[i] - st[i]), (int(st[i]) + shift) % len(c)


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
