"""The periods of a stream of kernel ids (pyobmem.model.iterations' primitives): candidate lags
from the autocorrelation, runs of matches at a lag, the ranking of lags, where a repetition starts
(its phase), the alignment of a template along the stream, and what a repeating unit leaves out.
docs/model.md describes the method.
"""

from __future__ import annotations

import numpy as np
import scipy.fft

MIN_COPIES = 3  # a stretch is periodic with lag L when it holds at least 3 copies of L ops
MIN_PERIOD = 2  # an iteration has at least 2 ops: one kernel repeated back to back is no training step
MIN_MAIN_ITERATIONS = MIN_COPIES  # the main regime (and a training step) needs this many iterations
MATCH = 0.8  # fraction of template positions an iteration must match (start of a stretch)
MATCH_CONTIGUOUS = 0.6  # ... when it starts where the previous iteration ended
N_CANDIDATES = 24  # lags kept from the autocorrelation
EXACT_WORK = 30_000_000  # below n * max_lag, match counts are computed exactly (no FFT)


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
