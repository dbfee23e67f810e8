"""The planner's policy: which idle windows the plan swaps.

Policy (docs/swap.md has the formulas):

- Choice (``_cover``): while the simulated peak is over the budget, add the window whose block can
  be out at the peak position and that covers the most excess bytes per byte moved, when the
  simulation with the engine queues confirms it lowers that position.
- Pruning (``_prune``): once the plan fits, drop each chosen window, earliest choice first (the cheap ones chosen before the big ones that made the plan fit), whose
  removal keeps the plan within the budget at no higher predicted ratio: every byte moved costs
  copy-engine time.
- Candidates judged by the replay (``_choose``, what ``make_plan`` does by default): the cover at
  the budget and at MARGINS under it, none with a window across an op that may touch any block
  (``_crosses_all``), each with its prefetches timed on the capture's host lead, on no lead (in
  step with the GPU), and on the lead the replay found; the best is the candidate that fits the
  cost model's budget with the least replayed time (with none that fits, the least replayed
  time). The cost model counts memory at the GPU's time and the shim keeps its budget at the
  host's: its host waits spend the host's lead, and prefetches timed on the unswapped lead come
  late (docs/swap.md).
- Repair (``_repair``): windows added to the best where the replay's shim evicted beyond the plan,
  kept while the replayed time falls.

On the session-7 GPT medium capture (tests/test_planner_replay.py) the cover alone replays 1.150 /
1.264 / 1.532 at 75 / 60 / 50% of the driver peak, the choice 1.107 / 1.223 / 1.419, the repair
1.017 / 1.220 / 1.419.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import abi
from .learning import LearnedIteration
from .replay import ITERATIONS, Replay, _units, replay
from .simulation import REMAP_BYTES, REMAP_NS, _nominal_absence, _Sim, _simulate

# Bytes under the budget the cover also aims at (one candidate each): a plan with more out at the
# GPU's time leaves the host's view of the budget more room (GPT medium at 75%: replayed 1.123 at
# the budget, 1.107 at 1 GiB under it, both with prefetches on no lead).
MARGINS = (0, 512 << 20, 1 << 30)
REPAIR_EVENTS = ("evictions",)  # the replay's events the repair adds windows for (its drains are mostly the forward pass's, where no window is out at the host's time)
REPAIR_BATCHES = (4, 16, 48)  # windows added per trial
REPAIR_ROUNDS = 10


def _cover(L: LearnedIteration, budget_bytes: int, max_ratio: float, sim: _Sim, nominal: np.ndarray,
           held: np.ndarray, skip: np.ndarray | None = None) -> tuple[list, _Sim]:
    """Choose windows until the simulated peak fits ``budget_bytes`` (or none helps): at each
    step, among the unused windows whose block is out at the peak position (nominally), the one
    covering the most excess (resident bytes over the budget, capped at its size, summed over
    the positions it is out, per byte it moves: every byte costs the same copy time), kept only
    when the simulation (engine queues included) confirms it lowers the resident bytes at that
    position within ``max_ratio``. Returns (chosen windows, their simulation); when the budget
    cannot be met, the lowest peak reached. ``nominal`` and ``held``: ``_nominal_absence(L)`` and
    ``_nominal_absence(L, held=True)``. ``skip``: bool per window, never chosen."""
    size = L.cand_size[L.win_cand].astype(np.float64)
    free = held.any(axis=1) & ~(skip if skip is not None else np.zeros(len(L.win_s), bool))
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
    if chosen and sim.peak <= budget_bytes:
        return _prune(L, budget_bytes, chosen, sim)
    return chosen, sim


def _crosses_all(L: LearnedIteration) -> np.ndarray:
    """bool per window: an op that may touch any block (``LearnedIteration.op_all``) lies strictly
    inside it. The shim makes every block usable before such an op, so the window's swap-out is
    cancelled there (or its block brought back): it saves nothing and costs its copies (the
    optimizer's foreach launches on the session-6 captures; none on session 7's)."""
    if not len(L.op_all) or not L.op_all.any():
        return np.zeros(len(L.win_s), bool)
    P = L.period
    every = np.cumsum(np.concatenate([L.op_all, L.op_all, L.op_all]).astype(np.int64))  # ops 0 .. 3P-1
    s, n = L.win_s, np.minimum(L.win_n, 3 * P - 1)
    return every[n - 1] - every[s] > 0


def _prune(L: LearnedIteration, budget_bytes: int, chosen: list, sim: _Sim) -> tuple[list, _Sim]:
    """``chosen`` (fitting ``budget_bytes``) less every window, earliest choice first, whose
    removal keeps the simulated peak within the budget at no higher ratio."""
    for k in list(chosen):
        trial = [w for w in chosen if w != k]
        t = _simulate(L, np.array(trial, np.int64), budget_bytes)
        if t.peak <= budget_bytes and t.ratio <= sim.ratio + 1e-9:
            chosen, sim = trial, t
    return chosen, sim



def _choose(L: LearnedIteration, budget_bytes: int, max_ratio: float, cov: tuple,
            limit_s: float | None = None) -> tuple[list, _Sim, Replay]:
    """The plan among the candidates, then repaired (the module's docstring), each trial replayed
    on the host's clock (``replay``, ~0.2-0.5 s each on GPT medium's 1,640 ops). Returns
    (windows, their simulation with the chosen prefetch timing, its replay). ``cov``:
    ``_cover``'s nominal and held absence. ``limit_s``: no new cover or repair round starts after
    that many seconds (the first cover is always made): the best so far is the plan. When the
    cover at the budget lowers nothing, it is the answer (no plan helps; make_plan writes its
    hints)."""
    P = L.period
    skip = _crosses_all(L)
    deadline = None if limit_s is None else time.monotonic() + limit_s
    best, seen = None, set()
    for margin in MARGINS:
        if best is not None and _late(deadline):
            break
        target = budget_bytes - margin
        w, _ = _cover(L, target, max_ratio, _simulate(L, np.zeros(0, np.int64), target), *cov, skip=skip)
        if tuple(sorted(w)) in seen:
            continue
        seen.add(tuple(sorted(w)))
        first = _trial(L, w, budget_bytes, None)
        if best is None and first.sim.peak >= int(L.live.max()):
            return first.w, first.sim, first.rep  # it lowers nothing: the plan is its hints alone
        for t in (first, _trial(L, w, budget_bytes, np.zeros(P)), _trial(L, w, budget_bytes, _kept_lead(first.rep))):
            if best is None or t.score < best.score:
                best = t
    best = min((_repair(L, budget_bytes, best, skip, victims, deadline) for victims in (False, True)), key=lambda t: t.score)
    return best.w, best.sim, best.rep


def _late(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


@dataclass
class _Trial:
    w: list  # windows (rows of L's)
    lead: np.ndarray | None  # the host lead its prefetches are timed against (``_simulate``)
    sim: _Sim
    rep: Replay
    trace: list
    score: tuple  # (over the budget in the cost model, replayed ratio, windows): least is best


def _trial(L: LearnedIteration, w: list, budget_bytes: int, lead: np.ndarray | None) -> _Trial:
    """Windows ``w`` with their prefetches timed on ``lead``, simulated and replayed with the IDLE
    hints when make_plan writes them (they fit in the plan)."""
    wa = np.array(w, np.int64)
    sim = _simulate(L, wa, budget_bytes, lead=lead)
    trace: list = []
    rep = replay(L, wa, sim.q[: len(wa)] - (L.win_s[wa] + L.period), budget_bytes,
                 hints=2 * len(wa) + len(L.win_s) <= abi.PLAN_MAX_ACTIONS, trace=trace)
    return _Trial([int(k) for k in w], lead, sim, rep, trace, (sim.peak > budget_bytes, rep.time_ratio, len(w)))


def _kept_lead(rep: Replay) -> np.ndarray:
    """ns (P,): the host's lead over the GPU in the replay."""
    return np.maximum(rep.gpu_ns - rep.host_ns, 0.0)


def _repair(L: LearnedIteration, budget_bytes: int, t: _Trial, skip: np.ndarray, victims: bool,
            deadline: float | None = None) -> _Trial:
    """Windows added where the replay's shim evicted beyond the plan or waited for copies: at each
    round, the unused windows whose block alone is out at the host's time (``_host_absence``, on
    the replay's clocks) at the most such events (counted by position), best per square root of
    their size first, added REPAIR_BATCHES at a time, prefetches timed on the trial's lead and
    on the lead the new replay kept; a trial is kept when its replayed ratio is lower, its cost
    model's peak no higher. Up to REPAIR_ROUNDS rounds, until none is kept. ``skip``: bool per
    window, never added. ``victims``: the windows of the blocks evicted there first
    (``_victim_windows``: their prefetch then brings them back in time, not a demand swap-in);
    which order helps more differs by budget (GPT medium: 75% better without, 60% with)."""
    P = L.period
    size = L.cand_size[L.win_cand].astype(np.float64)
    for _ in range(REPAIR_ROUNDS):
        if _late(deadline):
            break
        events = [(p - P) % P for p, key, _ in t.trace if key in REPAIR_EVENTS]
        if not events:
            break
        at, count = np.unique(np.array(events, np.int64), return_counts=True)
        gain = (_host_absence(L, t.rep)[:, at] * count).sum(axis=1).astype(np.float64)
        gain[t.w] = 0.0
        gain[skip] = 0.0
        order = np.flatnonzero(gain > 0)
        order = order[np.argsort(-gain[order] / np.sqrt(size[order]), kind="stable")]
        if victims:
            vict = [k for k in _victim_windows(L, t) if k not in set(t.w) and not skip[k]]
            order = np.array(list(dict.fromkeys(vict + order.tolist())), np.int64)
        kept = None
        for nb in REPAIR_BATCHES:
            if nb > len(order) and nb != REPAIR_BATCHES[0]:
                break
            w = t.w + [int(k) for k in order[:nb]]
            first = _trial(L, w, budget_bytes, t.lead)
            for u in (first, _trial(L, w, budget_bytes, _kept_lead(first.rep))):
                if u.rep.time_ratio < (kept or t).rep.time_ratio - 1e-4 and u.sim.peak <= max(t.sim.peak, budget_bytes):
                    kept = u
            if kept is not None:
                break
        if kept is None:
            break
        t = kept
    return t


def _victim_windows(L: LearnedIteration, t: _Trial) -> list:
    """The windows (rows of L's) of the blocks the replay's shim evicted beyond the plan, at the
    positions it evicted them, most evicted first."""
    P = L.period
    cand_row = _units(L, ITERATIONS)[0]["cand_row"]
    hits: dict = {}
    for p, key, u in t.trace:
        if key != "evictions" or u < 0 or cand_row[u] < 0:
            continue
        c, at = int(cand_row[u]), (p - P) % P
        rows = np.flatnonzero(L.win_cand == c)
        inside = rows[((L.win_s[rows] < at) & (L.win_n[rows] > at)) | ((L.win_s[rows] < at + P) & (L.win_n[rows] > at + P))]
        for k in inside[:1]:
            hits[int(k)] = hits.get(int(k), 0) + 1
    return sorted(hits, key=lambda k: -hits[k])


def _host_absence(L: LearnedIteration, rep: Replay) -> np.ndarray:
    """bool (windows, P): the host positions at which each window alone has its block out on the
    replay's clocks (``rep.gpu_ns`` / ``host_ns``): from the first op the host issues after its
    copy out ends (the engine idle) to the last op the host issues early enough for the remap and
    the copy back before the next access."""
    P, T = L.period, rep.iteration_ns
    ext = np.concatenate([rep.gpu_ns + k * T for k in range(3)])
    hx = np.maximum.accumulate(np.concatenate([rep.host_ns + k * T for k in range(3)]))
    size = L.cand_size[L.win_cand].astype(np.float64)
    d = size / L.bandwidth * 1e9
    s, n = L.win_s, np.minimum(L.win_n, 3 * P - 1)
    h = np.maximum(np.searchsorted(hx, ext[s] + d, side="left"), s + 1)
    q = np.searchsorted(hx, ext[n] - d - REMAP_NS * size / REMAP_BYTES, side="right") - 1
    q = np.minimum(np.maximum(q, s + 1), n)
    cov = np.zeros((len(s), P), bool)
    length = np.clip(q - h, 0, P)
    for k in np.flatnonzero(length > 0):
        cov[k, np.arange(h[k], h[k] + length[k]) % P] = True
    return cov
