"""The planner's policy: which idle windows the plan swaps.

Policy (docs/swap.md has the formulas):

- Choice (``_cover``): while the simulated peak is over the budget, add the window whose block can
  be out at the peak position and that covers the most excess bytes per byte moved, when the
  simulation with the engine queues confirms it lowers that position.
- Pruning (``_prune``): once the plan fits, drop each chosen window, earliest choice first (the cheap ones chosen before the big ones that made the plan fit), whose
  removal keeps the plan within the budget at no higher predicted ratio: every byte moved costs
  copy-engine time.
- Candidates judged by the replay (``_choose``): the cover at the budget and at MARGINS under it,
  each with its prefetches timed on the capture's host lead, on no lead (in step with the GPU),
  and on the lead the replay found; the plan is the candidate that fits the cost model's budget
  with the least replayed time (with none that fits, the least replayed time). The cost model
  counts memory at the GPU's time and the shim keeps its budget at the host's: its host waits
  spend the host's lead, and prefetches timed on the unswapped lead come late (docs/swap.md).
"""

from __future__ import annotations

import numpy as np

from .. import abi
from .learning import LearnedIteration
from .replay import Replay, replay
from .simulation import _nominal_absence, _Sim, _simulate

# Bytes under the budget the cover also aims at (one candidate each): a plan with more out at the
# GPU's time leaves the host's view of the budget more room (GPT medium at 75%: replayed 1.123 at
# the budget, 1.107 at 1 GiB under it, both with prefetches on no lead).
MARGINS = (0, 512 << 20, 1 << 30)


def _cover(L: LearnedIteration, budget_bytes: int, max_ratio: float, sim: _Sim, nominal: np.ndarray,
           held: np.ndarray, init: list | None = None, **view) -> tuple[list, _Sim]:
    """Choose windows until the simulated peak fits ``budget_bytes`` (or none helps): at each
    step, among the unused windows whose block is out at the peak position (nominally), the one
    covering the most excess (resident bytes over the budget, capped at its size, summed over
    the positions it is out, per byte it moves: every byte costs the same copy time), kept only
    when the simulation (engine queues included) confirms it lowers the resident bytes at that
    position within ``max_ratio``. Returns (chosen windows, their simulation); when the budget
    cannot be met, the lowest peak reached. ``nominal`` and ``held``: ``_nominal_absence(L)`` and
    ``_nominal_absence(L, held=True)``. ``view``: ``_simulate``'s keywords (``host``, ``lead``),
    which ``sim`` was made with. ``init``: windows already chosen (``sim`` is theirs), kept."""
    size = L.cand_size[L.win_cand].astype(np.float64)
    free = held.any(axis=1)
    chosen: list[int] = list(init or [])
    free[chosen] = False
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
            t = _simulate(L, np.array(trial, np.int64), budget_bytes, **view)
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
        return _prune(L, budget_bytes, chosen, sim, **view)
    return chosen, sim


def _prune(L: LearnedIteration, budget_bytes: int, chosen: list, sim: _Sim, **view) -> tuple[list, _Sim]:
    """``chosen`` (fitting ``budget_bytes``) less every window, earliest choice first, whose
    removal keeps the simulated peak within the budget at no higher ratio."""
    for k in list(chosen):
        trial = [w for w in chosen if w != k]
        t = _simulate(L, np.array(trial, np.int64), budget_bytes, **view)
        if t.peak <= budget_bytes and t.ratio <= sim.ratio + 1e-9:
            chosen, sim = trial, t
    return chosen, sim



def _choose(L: LearnedIteration, budget_bytes: int, max_ratio: float, cov: tuple) -> tuple[list, _Sim, Replay]:
    """The plan among the candidates (the module's docstring), each replayed on the host's clock
    (``replay``, ~0.2-0.5 s each on GPT medium's 1,640 ops). Returns (windows, their simulation
    with the chosen prefetch timing, its replay). ``cov``: ``_cover``'s nominal and held
    absence."""
    P = L.period
    best, seen = None, set()
    for margin in MARGINS:
        target = budget_bytes - margin
        w, _ = _cover(L, target, max_ratio, _simulate(L, np.zeros(0, np.int64), target), *cov)
        key = tuple(sorted(w))
        if key in seen:
            continue
        seen.add(key)
        w = np.array(w, np.int64)
        leads, found = [None, np.zeros(P)], None
        while leads:
            lead = leads.pop(0)
            sim = _simulate(L, w, budget_bytes, lead=lead)
            rep = replay(L, w, sim.q[: len(w)] - (L.win_s[w] + P), budget_bytes,
                         hints=2 * len(w) + len(L.win_s) <= abi.PLAN_MAX_ACTIONS)  # as make_plan writes them
            if found is None:  # then on the lead this replay's host kept
                found = np.maximum(rep.gpu_ns - rep.host_ns, 0.0)
                leads.append(found)
            score = (sim.peak > budget_bytes, rep.time_ratio, len(w))
            if best is None or score < best[0]:
                best = (score, [int(k) for k in w], sim, rep)
    return best[1], best[2], best[3]
