"""The copy engines' frontier: the least slowdown any plan can have under a budget (issue 9).

At a position p whose live bytes exceed the budget by X, blocks of at least X bytes must be out,
each one's copy out made after its last access before p and its copy back before its next access.
One device-to-host and one host-to-device engine, each at the bandwidth B, bound how late that can
be: the X bytes released earliest (their last access, on the GPU clock) copied out one after the
other still end ``out_late`` after the GPU reaches p, and the X bytes needed latest, copied back
from p on in the order they are needed, still miss their next access by ``in_late``. Both are
stalls of the GPU (the first before p, the second after it), so no plan runs the iteration in
less than ``T + out_late + in_late`` at p; the frontier is the worst position. Relaxed (a block
may be out in part, the engines do nothing else, no host or remap costs), so it is a lower
bound for any plan that keeps the budget: the replay of such a plan (``Plan.predicted_time_ratio``)
is at or above it. On GPT medium (tests/data/gpt_medium_tensors.pyobmem) at 75 / 60 / 50 / 40% of
the driver peak: 1.000 / 1.118 / 1.253 / 1.473, against 1.041 / 1.155-1.208 / 1.40-1.42 / 1.73
measured on the H200 (sessions 21-23).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .learning import LearnedIteration


@dataclass(frozen=True)
class Frontier:
    """``time_ratio`` (>= 1: the least iteration time over the unswapped one); ``at`` (the position
    that sets it; -1 when the budget holds everywhere without swapping); ``bytes`` (the excess
    there: bytes that must be out); ``out_late_ns`` / ``in_late_ns`` (the stalls there, ns)."""

    time_ratio: float
    at: int
    bytes: int
    out_late_ns: float
    in_late_ns: float

    def to_json(self) -> dict:
        return {"time_ratio": round(self.time_ratio, 6), "at": self.at, "bytes": self.bytes,
                "out_late_ns": round(self.out_late_ns), "in_late_ns": round(self.in_late_ns)}


def _taken(sizes: np.ndarray, need: float) -> np.ndarray:
    """Bytes taken from each of ``sizes`` in order until ``need`` bytes are (the last one in part)."""
    before = np.cumsum(sizes) - sizes
    return np.clip(need - before, 0.0, sizes)


def frontier(L: LearnedIteration, budget_bytes: int) -> Frontier | None:
    """The frontier of ``L`` under ``budget_bytes`` (see the module); None where the candidates'
    windows cannot hold the excess at some position (the plan's ``needed_bytes`` is over the budget)."""
    P, T, B = L.period, float(L.iteration_ns), float(L.bandwidth)
    excess = L.live.astype(np.float64) - budget_bytes
    if not P or T <= 0 or not np.any(excess > 0):
        return Frontier(1.0, -1, 0, 0.0, 0.0)
    E = L.times
    s, n = L.win_s, L.win_n
    size = L.cand_size[L.win_cand].astype(np.float64)
    wraps = n >= P
    # Each window's release (its block's last access) and deadline (its next access), ns from the
    # iteration's start, for a position inside it and for one after the wrap (the window then began
    # in the previous iteration).
    rel_in, rel_wrap = E[s], E[s] - T
    due_in = np.where(wraps, E[np.where(wraps, n - P, 0)] + T, E[np.minimum(n, P - 1)])
    due_wrap = E[np.where(wraps, n - P, 0)]
    best = Frontier(1.0, -1, 0, 0.0, 0.0)
    for p in np.flatnonzero(excess > 0):
        inside, wrapped = (s < p) & (p < n), wraps & (p < n - P)
        m = inside | wrapped
        need = excess[p]
        if size[m].sum() < need:
            return None
        rel = np.where(inside, rel_in, rel_wrap)[m]
        due = np.where(inside, due_in, due_wrap)[m]
        sz = size[m]
        # Out: the earliest released first, copied in release order, each once released.
        o = np.argsort(rel, kind="stable")
        d = _taken(sz[o], need) / B * 1e9
        k = d > 0
        out_late = max(0.0, float(np.max(rel[o][k] + np.cumsum(d[k][::-1])[::-1]) - E[p]))
        # Back: the latest needed first, copied from p on in the order they are needed.
        o = np.argsort(-due, kind="stable")
        d = _taken(sz[o], need) / B * 1e9
        k = d > 0
        o2 = np.argsort(due[o][k], kind="stable")
        in_late = max(0.0, float(np.max(E[p] + np.cumsum(d[k][o2]) - due[o][k][o2])))
        r = 1.0 + (out_late + in_late) / T
        if (r, need) > (best.time_ratio, best.bytes):  # the worst position; without stalls, the most excess
            best = Frontier(r, int(p), int(need), out_late, in_late)
    return best
