"""The swap plan the shim follows: ``Swap``, ``Plan``, ``make_plan`` (from a LearnedIteration and a
budget), the model's saving bound on it, ``plan_capture`` (learn and plan in one)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import abi
from ..errors import PyobmemError
from ..model.queries import card_bytes
from ..model.saving import TIME_RATIOS, saving_curve
from ..model.tensors import build_tensors
from .budget import Budget, parse_budget
from .frontier import Frontier, frontier
from .learning import DEFAULT_MIN_SWAP_BYTES, LearnedIteration, NoPlan, learn_iteration
from .policy import _choose, _cover, _crosses_all
from .replay import Replay, replay
from .simulation import _needed, _nominal_absence, _reach, _simulate

MAX_RATIO = 2.0  # the planner never predicts a slower iteration than this
GREEDY_MAX_RATIO = 1e6  # the greedy runs without a stall limit; the budget stops the planner


@dataclass(frozen=True)
class Swap:
    """One planned idle window: the block (capture row, address, size), SWAP_OUT after position
    ``out_at``, PREFETCH before ``prefetch_at`` (positions mod P), next access at ``next_at``;
    ``mark_at``: the GPU position after which the model has the memory mapped again (its remap
    and copy start in time there; the shim maps when the host issues ``prefetch_at``, earlier
    when the host runs ahead: docs/swap.md "Cost model"); ``absent`` positions per iteration;
    ``stall_ns`` predicted;
    ``site``: the allocation site that names a tensor of the iteration in the shim (abi.h,
    struct pyobmem_action), None for a block named by its address; ``label``: the block as every
    verb names it (``Capture.block_label``, "pid:id": unlike the row, the same in any capture of
    the run)."""

    block: int
    addr: int
    size: int
    out_at: int
    prefetch_at: int
    next_at: int
    absent: int
    stall_ns: float
    mark_at: int = -1
    site: tuple | None = None  # (position, ordinal) of a tensor of the iteration; None: named by address
    label: str = ""


@dataclass(frozen=True)
class Plan:
    """A swap plan for one iteration of process ``pid`` under ``budget_bytes``.

    ``template_keys`` (uint64 (P,)); ``actions`` (structured ``abi.ACTION_DTYPE`` array sorted by
    position, prefetches first at one position); ``swaps`` (list of Swap); ``peak_bytes`` (peak of
    live bytes without swapping), ``predicted_peak`` (with the plan), ``saved_bytes``;
    ``time_ratio`` (the cost model's predicted iteration time over the unswapped one, memory at the
    GPU's time, prefetches timed on the capture's host lead; the plan's own, ``Swap.prefetch_at``,
    may be earlier: ``policy._choose``), ``stall_ns`` (per iteration, the same); ``predicted_time_ratio`` (the prediction: the shim's
    executor replayed on the host's clock, ``planner.replay``; None when not replayed) and ``replay``
    (its figures: waits, evictions, handoffs per iteration);
    ``feasible`` (the predicted peak fits the budget); ``needed_bytes`` (the least any plan could
    reach on this iteration: at some position the blocks that cannot be out together) and
    ``needed_at`` (that position); ``reach_bytes`` / ``reach_at``: the least peak any plan can
    reach under the cost model (each window out as long as it can be alone, engines idle, the budget
    hold waiting for its copy: a lower
    bound >= ``needed_bytes``; 0 when not computed: a plan that fits, made without ``bound``) and its
    position; ``bound_bytes`` (the model's saving bound at
    ``time_ratio``, None when not computed); ``frontier`` (``planner.frontier``: the least slowdown
    the copy engines allow any plan at this budget; None when not computed, made without ``bound``,
    or when the budget cannot be met); ``iteration_ns``, ``bandwidth``, ``min_swap_bytes``;
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
    frontier: Frontier | None = None
    iteration_ns: float = 0.0
    bandwidth: float = 0.0
    min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES
    period: int = 0
    matching: int = 0
    iterations: int = 0
    steps: int = 0  # training steps of the main regime (LearnedIteration.steps)
    step: int = -1  # the planned iteration's number among them, as every verb numbers it
    iteration_index: int = -1
    reach_bytes: int = 0
    reach_at: int = 0
    reach_op_row: int = -1  # the capture op row at ``reach_at``
    candidates: tuple = (0, 0)
    excluded: dict = field(default_factory=dict, repr=False)
    predicted_time_ratio: float | None = None
    replay: Replay | None = field(default=None, repr=False)

    @property
    def saved_bytes(self) -> int:
        return int(self.peak_bytes - self.predicted_peak)

    @property
    def n_hints(self) -> int:
        """IDLE hints (the shim's eviction beyond the plan), not actions."""
        return int(np.count_nonzero(self.actions["kind"] == abi.ActionKind.IDLE))

    @property
    def n_actions(self) -> int:
        """Swap-outs and prefetches per iteration."""
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
            "frontier": self.frontier.to_json() if self.frontier is not None else None,
            "time_ratio": round(self.time_ratio, 6), "stall_ns": round(self.stall_ns),
            "predicted_time_ratio": None if self.predicted_time_ratio is None else round(self.predicted_time_ratio, 6),
            "replay": self.replay.to_json() if self.replay is not None else None,
            "needed_bytes": self.needed_bytes, "needed_at": self.needed_at,
            "reach_bytes": self.reach_bytes, "reach_at": self.reach_at, "iteration": self.step,
            "candidates": {"blocks": self.candidates[0], "bytes": self.candidates[1]},
            "excluded": {why: {"blocks": n, "bytes": b} for why, (n, b) in self.excluded.items()},
            "swapped_blocks": len({s.block for s in self.swaps}), "swapped_bytes": self.swapped_bytes,
            "swaps": [
                {"row": s.block, "block": s.label, "addr": hex(s.addr), "size": s.size, "site": list(s.site) if s.site else None,
                 "out_after": s.out_at,
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
                                   predicted_peak=self.peak_bytes, time_ratio=1.0, stall_ns=0.0,
                                   predicted_time_ratio=None, replay=None)



def make_plan(L: LearnedIteration, budget_bytes: int, *, bound: bool = False, max_ratio: float = MAX_RATIO,
              replayed: bool = True, choose: bool = True, limit_s: float | None = None) -> Plan:
    """The plan for ``budget_bytes`` (the method: the docstrings of ``policy`` and ``simulation``).
    ``bound``: also compute the model's saving bound at the predicted ratio (``saving_curve`` on the
    same iteration, tensor level; costs a tensor model) and the copy engines' frontier
    (``planner.frontier``). ``replayed``: choose among candidate plans by the
    host-clock replay of the shim (``planner.replay``; ``policy._choose``: up to 3 covers and 9
    replays, ~10-20 s on GPT medium's 1,640-op iteration on one slow core) and predict the time by
    it: the chosen windows, with their IDLE hints when the plan carries them. ``choose=False``: the
    cost model's cover at the budget alone, its prefetches timed on the capture's lead (the
    planner of session 7 and before, whose plans the H200 ran), replayed when ``replayed``.
    ``limit_s``: the choice's time limit (``policy._choose``), None for none."""
    budget_bytes = int(budget_bytes)
    P = L.period
    peak_at = int(np.argmax(L.live)) if P else 0
    peak = int(L.live[peak_at]) if P else 0
    chosen: list[int] = []
    sim = _simulate(L, np.zeros(0, np.int64), budget_bytes)
    over = sim.peak > budget_bytes
    # W x P each, the windows out at each position alone (idle engines; with the budget hold): the
    # daemon skips them for a plan that fits.
    cov = (_nominal_absence(L), _nominal_absence(L, held=True)) if over or bound else None
    # The choice takes no window across an op that may touch any block: nor do its bounds.
    skip = _crosses_all(L) if choose else None
    if cov is not None and skip is not None:
        cov = tuple(c & ~skip[:, None] for c in cov)
    rep = None
    if over and replayed and choose and len(L.blk_size):
        chosen, sim, rep = _choose(L, budget_bytes, max_ratio, cov, limit_s)
    elif over:
        chosen, sim = _cover(L, budget_bytes, max_ratio, sim, *cov)
    reach_at, reach = _reach(L, cov[1]) if cov is not None else (0, 0)
    w = np.array(chosen, np.int64)
    swaps, act = [], []

    def named(c: int) -> tuple:
        """(addr, size, site_at, site_ord) of candidate c: a tensor of the iteration by its site
        (addr 0), a block live across iterations by its address."""
        at, ord_ = (int(v) for v in L.cand_site[c])
        if at >= 0:
            return 0, int(L.cand_size[c]), at, ord_
        return int(L.cand_addr[c]), int(L.cand_size[c]), int(abi.SITE_NONE), 0

    for j, k in enumerate(w):
        c = int(L.win_cand[k])
        out_at, q, nxt = int(L.win_s[k]) % P, int(sim.q[j]) % P, int(L.win_n[k]) % P
        name = named(c)
        swaps.append(Swap(block=int(L.cand_block[c]), addr=int(L.cand_addr[c]), size=int(L.cand_size[c]), out_at=out_at,
                          prefetch_at=q, next_at=nxt, absent=int(sim.absent[j]), stall_ns=float(sim.stall[j]),
                          mark_at=int(sim.mark[j]) % P, site=None if name[0] else name[2:],
                          label=L.capture.block_label(int(L.cand_block[c])) if L.capture is not None else ""))
        act.append((out_at, int(abi.ActionKind.SWAP_OUT), 0, *name))
        act.append((q, int(abi.ActionKind.PREFETCH), 0, *name))
    # Every candidate's idle windows, as hints: beyond the plan the shim evicts the block whose
    # next access is farthest (Belady's choice on the learned iteration) instead of the least
    # recently used, the worst choice on a cycle longer than the budget. Left out when they would
    # not fit in the plan.
    if (act or sim.peak > budget_bytes) and len(act) + len(L.win_s) <= abi.PLAN_MAX_ACTIONS:
        for k in range(len(L.win_s)):
            c = int(L.win_cand[k])
            act.append((int(L.win_s[k]) % P, int(abi.ActionKind.IDLE), int(L.win_n[k]) % P, *named(c)))
    actions = np.zeros(len(act), abi.ACTION_DTYPE)
    if act:
        a = np.array(act, dtype=np.uint64)
        o = np.lexsort((-a[:, 1].astype(np.int64), a[:, 0]))  # at one position: hints, the prefetch, the swap-out
        for i, name in enumerate(("at", "kind", "until", "addr", "size", "site_at", "site_ord")):
            actions[name] = a[o, i]
    needed, needed_at = _needed(L, skip)
    if rep is None and replayed and P and len(L.blk_size):
        hinted = int(np.count_nonzero(actions["kind"] == abi.ActionKind.IDLE)) > 0
        rep = replay(L, w, sim.q[: len(w)] - (L.win_s[w] + P), budget_bytes, hints=hinted)
    # The cost model's ratio and stalls with prefetches timed on the capture's lead (docs/swap.md
    # "Cost model"): timed earlier, its mark rule charges each prefetch a remap the shim no longer
    # waits for.
    timed = sim if rep is None or not len(w) else _simulate(L, w, budget_bytes)
    bound_bytes, ratio = None, timed.ratio
    if bound and L.capture is not None:
        curve = model_curve(L)
        saved = peak - sim.peak
        if curve is not None and saved > 0:
            # The model's bound is the claim pyobmem makes about this iteration: the plan never
            # predicts a saving the bound does not allow at its slowdown, so its ratio is at least
            # the one at which the bound reaches the same saving.
            ratio = max(ratio, _ratio_for(curve, saved))
        bound_bytes = 0 if curve is None else curve.saved_at(ratio)
    front = frontier(L, budget_bytes, _crosses_all(L) if skip is None else skip) if bound else None
    return Plan(
        pid=L.pid, budget_bytes=budget_bytes, template_keys=L.keys, actions=actions, swaps=swaps, peak_bytes=peak,
        peak_at=peak_at, predicted_peak=sim.peak, time_ratio=ratio, stall_ns=float(timed.stall.sum()),
        feasible=sim.peak <= budget_bytes and len(actions) <= abi.PLAN_MAX_ACTIONS, needed_bytes=needed,
        needed_at=needed_at, needed_op_row=int(L.op_rows[needed_at]) if P else -1, bound_bytes=bound_bytes, frontier=front,
        iteration_ns=L.iteration_ns, bandwidth=L.bandwidth,
        min_swap_bytes=L.min_swap_bytes, period=P, matching=L.matching, iterations=L.iterations,
        iteration_index=L.iteration_index, steps=L.steps, step=L.step, reach_bytes=reach, reach_at=reach_at,
        reach_op_row=int(L.op_rows[reach_at]) if P else -1,
        candidates=(len(L.cand_block), int(L.cand_size.sum())), excluded=dict(L.excluded),
        predicted_time_ratio=None if rep is None else rep.time_ratio, replay=rep,
    )



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
    learned = learn_iteration(capture, min_swap_bytes=min_swap_bytes, bandwidth=bandwidth, by_site=True)
    if isinstance(learned, NoPlan):
        return learned
    return make_plan(learned, int(budget), bound=bound)
