"""The training step among a stream's periods (pyobmem.model.iterations): the period of the
optimizer update, asides (logging, evaluation) as deviations of the iteration they follow, and the
micro-steps of gradient accumulation. docs/model.md, "The training step".
"""

from __future__ import annotations

import numpy as np

from .periods import MIN_COPIES, MIN_MAIN_ITERATIONS, MIN_PERIOD, _align, _left_out, _phase, _runs

MICRO_SHARE = 0.6  # micro-steps of gradient accumulation cover at least this share of the iteration
STEP_COVERAGE = 0.75  # a step's iterations cover at least this share of the stretch they span


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
