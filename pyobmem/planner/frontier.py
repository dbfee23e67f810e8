"""The copy engines' frontier: the least slowdown any plan can have under a budget (issue 9).

At a position p whose live bytes exceed the budget by X, blocks of at least X bytes must be out,
each one's copy out made after its last access before p and its copy back before its next access.
One device-to-host and one host-to-device engine, each at the bandwidth B, bound how late that can
be: the X bytes released earliest (their last access, on the GPU clock) copied out one after the
other still end ``out_late`` after the GPU reaches p, and the X bytes needed latest, copied back
from p on in the order they are needed, still miss their next access by ``in_late``. Both are
stalls of the GPU (the first before p, the second after it), so no plan runs the iteration in
less than ``T + out_late + in_late`` at p (only the larger of the two when the release and the
deadline that set them are more than an iteration apart: in the steady state one stall a period
could then serve both); the frontier is the worst position. Relaxed (a block
may be out in part, the engines do nothing else, no host or remap costs), so it is a lower
bound for any plan that keeps the budget: the replay of such a plan (``Plan.predicted_time_ratio``)
is at or above it. On GPT medium (tests/data/gpt_medium_tensors.pyobmem) at 75 / 60 / 50 / 40% of
the driver peak: 1.000 / 1.129 / 1.264 / 1.490, against 1.041 / 1.155-1.208 / 1.40-1.42 / 1.73
measured on the H200 (sessions 21-23).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .learning import LearnedIteration


@dataclass(frozen=True)
class Frontier:
    """``time_ratio`` (>= 1: the least iteration time over the unswapped one); ``at`` (the position
    that sets it; -1 when the budget holds everywhere without swapping); ``excess_bytes`` (live
    bytes there over the budget: what must be out); ``out_late_ns`` / ``in_late_ns`` (the GPU's
    least waits there, ns: for the copies out before the op, for the copies back after it)."""

    time_ratio: float
    at: int
    excess_bytes: int
    out_late_ns: float
    in_late_ns: float

    def to_json(self) -> dict:
        return {"time_ratio": round(self.time_ratio, 6), "at": self.at, "excess_bytes": self.excess_bytes,
                "out_late_ns": round(self.out_late_ns), "in_late_ns": round(self.in_late_ns)}


def _taken(sizes: np.ndarray, need: float) -> np.ndarray:
    """Bytes taken from each of ``sizes`` in order until ``need`` bytes are (the last one in part)."""
    before = np.cumsum(sizes) - sizes
    return np.clip(need - before, 0.0, sizes)


def _windows(L: LearnedIteration, skip: np.ndarray | None = None) -> dict:
    """Each candidate window's size, and its release (its block's last access) and deadline (its
    next access) in ns from the iteration's start, for a position inside it and for one after the
    wrap (the window then began in the previous iteration). ``skip``: bool per window, those left
    out (``policy._crosses_all``: across an op that may touch any block, where the shim brings
    every block back, a window saves nothing)."""
    P, T, E = L.period, float(L.iteration_ns), L.times
    keep = np.ones(len(L.win_s), bool) if skip is None else ~skip
    s, n = L.win_s[keep], L.win_n[keep]
    wraps = n >= P
    at_wrap = np.where(wraps, n - P, 0)
    return {"s": s, "n": n, "wraps": wraps, "size": L.cand_size[L.win_cand[keep]].astype(np.float64),
            "rel_in": E[s], "rel_wrap": E[s] - T, "due_in": np.where(wraps, E[at_wrap] + T, E[np.minimum(n, P - 1)]),
            "due_wrap": E[at_wrap]}


def stalls_at(L: LearnedIteration, budget_bytes: int, p: int, w: dict | None = None, skip: np.ndarray | None = None) -> tuple | None:
    """(out_late_ns, in_late_ns, stall_ns) at position ``p`` (see the module): the GPU's least wait
    for the copies out before p and for the copies back after it, and what they add to the
    iteration: their sum, or only the larger when the critical release and the critical deadline
    are more than an iteration apart (one stall a period could then serve both). (0, 0, 0) when p
    is within the budget; None when the windows across p cannot hold its excess. ``w``: _windows(L,
    skip), made here when None."""
    P, T, B, E = L.period, float(L.iteration_ns), float(L.bandwidth), L.times
    need = float(L.live[p]) - budget_bytes
    if need <= 0:
        return 0.0, 0.0, 0.0
    w = _windows(L, skip) if w is None else w
    s, n = w["s"], w["n"]
    inside, wrapped = (s < p) & (p < n), w["wraps"] & (p < n - P)
    m = inside | wrapped
    sz = w["size"][m]
    if sz.sum() < need:
        return None
    rel = np.where(inside, w["rel_in"], w["rel_wrap"])[m]
    due = np.where(inside, w["due_in"], w["due_wrap"])[m]
    # Out: the earliest released first, copied in release order, each once released.
    o = np.argsort(rel, kind="stable")
    d = _taken(sz[o], need) / B * 1e9
    k = d > 0
    ends = rel[o][k] + np.cumsum(d[k][::-1])[::-1]
    i = int(np.argmax(ends))
    out_late, r_crit = max(0.0, float(ends[i] - E[p])), float(rel[o][k][i])
    # Back: the latest needed first, copied from p on in the order they are needed.
    o = np.argsort(-due, kind="stable")
    d = _taken(sz[o], need) / B * 1e9
    k = d > 0
    o2 = np.argsort(due[o][k], kind="stable")
    late = E[p] + np.cumsum(d[k][o2]) - due[o][k][o2]
    j = int(np.argmax(late))
    in_late, d_crit = max(0.0, float(late[j])), float(due[o][k][o2][j])
    stall = max(out_late, in_late) if d_crit - r_crit > T else out_late + in_late
    return out_late, in_late, stall


def frontier(L: LearnedIteration, budget_bytes: int, skip: np.ndarray | None = None) -> Frontier | None:
    """The frontier of ``L`` under ``budget_bytes`` (see the module), over the windows ``skip``
    (bool per window) leaves in; None where they cannot hold the excess at some position (with the
    same ``skip``, ``simulation._needed`` is over the budget)."""
    P, T = L.period, float(L.iteration_ns)
    excess = L.live.astype(np.float64) - budget_bytes
    best = Frontier(1.0, -1, 0, 0.0, 0.0)
    if not P or T <= 0 or not np.any(excess > 0):
        return best
    w = _windows(L, skip)
    for p in np.flatnonzero(excess > 0):
        got = stalls_at(L, budget_bytes, int(p), w)
        if got is None:
            return None
        r = 1.0 + got[2] / T
        if (r, excess[p]) > (best.time_ratio, best.excess_bytes):  # the worst position; without stalls, the most excess
            best = Frontier(r, int(p), int(excess[p]), got[0], got[1])
    return best
