"""The planner's policy: which idle windows the plan swaps.

Policy (docs/swap.md has the formulas):

- Choice (``_cover``): while the simulated peak is over the budget, add the window whose block can
  be out at the peak position and that covers the most excess bytes per byte moved, when the
  simulation with the engine queues confirms it lowers that position.
- Pruning (``_prune``): once the plan fits, drop each chosen window, earliest choice first (the cheap ones chosen before the big ones that made the plan fit), whose
  removal keeps the plan within the budget at no higher predicted ratio: every byte moved costs
  copy-engine time.
"""

from __future__ import annotations

import numpy as np

from .learning import LearnedIteration
from .simulation import _nominal_absence, _Sim, _simulate


def _cover(L: LearnedIteration, budget_bytes: int, max_ratio: float, sim: _Sim, nominal: np.ndarray,
           held: np.ndarray) -> tuple[list, _Sim]:
    """Choose windows until the simulated peak fits ``budget_bytes`` (or none helps): at each
    step, among the unused windows whose block is out at the peak position (nominally), the one
    covering the most excess (resident bytes over the budget, capped at its size, summed over
    the positions it is out, per byte it moves: every byte costs the same copy time), kept only
    when the simulation (engine queues included) confirms it lowers the resident bytes at that
    position within ``max_ratio``. Returns (chosen windows, their simulation); when the budget
    cannot be met, the lowest peak reached. ``nominal`` and ``held``: ``_nominal_absence(L)`` and
    ``_nominal_absence(L, held=True)``."""
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
    if chosen and sim.peak <= budget_bytes:
        return _prune(L, budget_bytes, chosen, sim)
    return chosen, sim


def _prune(L: LearnedIteration, budget_bytes: int, chosen: list, sim: _Sim) -> tuple[list, _Sim]:
    """``chosen`` (fitting ``budget_bytes``) less every window, earliest choice first, whose
    removal keeps the simulated peak within the budget at no higher ratio."""
    for k in list(chosen):
        trial = [w for w in chosen if w != k]
        t = _simulate(L, np.array(trial, np.int64), budget_bytes)
        if t.peak <= budget_bytes and t.ratio <= sim.ratio + 1e-9:
            chosen, sim = trial, t
    return chosen, sim

