"""The host-clock replay of the shim's executor (``planner.replay``) on small synthetic iterations,
and its prediction on the H200's GPT-2 medium capture against the measured swap runs.

The synthetic iteration (``_learned``): P = 10 ops, op k runs on the GPU at k ms (1 ms each, T =
10 ms). Two tensors allocated in every iteration, both candidates, their figures by the shim's
rules at the shim's budget of 80 MiB:

- A, 64 MiB, allocated after op 0, used by ops 1 and 8, freed after op 8: one idle window (1, 8);
- B, allocated after op 3 (32 MiB, or 64 MiB: A's size), used by op 4, freed after op 5.

Copies at 64 MiB per ms unless a test says otherwise: A's copy out, after the GPU ends op 1 (at
2 ms), ends at 3 ms. In the middle iteration (from 10 ms) the host allocates B at about 10.03 ms:
A is still copying out, and A and B together pass the budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pyobmem import planner
from pyobmem.capture import read_capture
from pyobmem.planner import LearnedIteration, replay

MiB = 1 << 20
MS = 1e6
P = 10
BUDGET = 80 * MiB


def _learned(issue_ms, b_size=32 * MiB, bandwidth=64 * MiB / 1e-3) -> LearnedIteration:
    times = np.arange(P) * MS
    issue = np.minimum(np.asarray(issue_ms, float) * MS, times)
    sizes = np.array([64 * MiB, b_size], np.int64)
    return LearnedIteration(
        pid=1, keys=np.arange(P, dtype=np.uint64), op_rows=np.arange(P), times=times, issue=issue, iteration_ns=P * MS,
        live=np.zeros(P, np.int64), matching=4, iterations=4, steps=4, step=1, confidence=1.0, bandwidth=bandwidth,
        min_swap_bytes=4 * MiB, cand_block=np.arange(2), cand_addr=np.zeros(2, np.uint64), cand_size=sizes,
        cand_pos=[np.array([1, 8]), np.array([4])], cand_site=np.array([[0, 0], [3, 0]]), excluded={},
        win_cand=np.array([0]), win_s=np.array([1]), win_n=np.array([8]),
        blk_size=sizes, blk_alloc=np.array([0, 3]), blk_free=np.array([8, 5]),
        blk_t_alloc=issue[[0, 3]] + 1, blk_t_free=issue[[8, 5]] + 1, blk_served=np.ones(2, bool), blk_cand=np.arange(2),
    )


FAR_AHEAD = [0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09]  # the whole iteration issued in 0.1 ms
IN_STEP_LATE = [0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 7, 8, 9]  # ... until op 7, where it waits for the GPU


def test_far_ahead_host_waits_for_a_swap_out_of_another_size():
    """The plan swaps A out after op 1 and prefetches it before op 7. B (32 MiB) cannot take A's
    memory: the host waits for A's copy. The host begins the middle iteration at 10 ms (it waits
    for the GPU there) over the budget with the last iteration's A and B cached: it gives A's
    memory back first (the largest class, the GPU is done with it), so op 10 starts
    ``unmap_ns(64 MiB)`` late, and A's copy out ends 3 ms after that; A's allocation gives B's
    cached memory back and maps A; three ops of 10 us later the host allocates B and waits. The
    GPU does not wait for that: the host was that far ahead."""
    r = replay.replay(_learned(FAR_AHEAD), np.array([0]), np.array([6]), BUDGET)
    assert (r.drains, r.handoffs, r.evictions, r.planned_outs, r.prefetches, r.demand_ins) == (1, 0, 0, 1, 1, 0)
    late = replay.unmap_ns(64 * MiB)
    host = 10 * MS + late + replay.unmap_ns(32 * MiB) + replay.map_ns(64 * MiB) + 3 * 0.01 * MS
    assert r.host_wait_ns == pytest.approx(13 * MS + late - host)
    assert r.time_ratio == pytest.approx(1 + late / (10 * MS))


def test_a_swap_out_of_the_same_size_hands_its_memory_over():
    """B of A's size takes A's memory while A's copy still runs: no host wait. With copies of 3 ms
    B's first use waits for that copy on the GPU: op 4 of the middle iteration starts when A's
    copy out ends, 3 ms after op 1 ends (at 2 ms), not at 4 ms. The host (in step with the GPU
    from op 7) finds A's copy done when it prefetches A: no settle either."""
    L = _learned(IN_STEP_LATE, b_size=64 * MiB, bandwidth=64 * MiB / 3e-3)
    r = replay.replay(L, np.array([0]), np.array([6]), BUDGET)
    assert (r.handoffs, r.drains, r.host_wait_ns, r.evictions, r.planned_outs, r.prefetches) == (1, 0, 0.0, 0, 1, 1)
    assert r.gpu_ns[4] - r.gpu_ns[1] == pytest.approx(1 * MS + 3 * MS)
    assert r.time_ratio > 1.3  # and op 8 waits for A's copy back in
    fast = replay.replay(_learned(IN_STEP_LATE, b_size=64 * MiB), np.array([0]), np.array([6]), BUDGET)
    assert (fast.handoffs, fast.drains) == (1, 0)
    assert fast.gpu_ns[4] - fast.gpu_ns[1] == pytest.approx(3 * MS)  # A's copy ended at 3 ms, before op 4


def test_a_swap_out_needed_soon_keeps_its_memory():
    """leaving_of's needed-soon rule (min(64, P / 4) = 2 ops here): with A's next use at op 5
    instead of 8 (window (1, 5), its prefetch before op 5), B's allocation after op 13 of the middle
    iteration (the next op 14, A needed at 15: 1 op after it) does not take A's memory: the host
    waits for A's copy and maps new memory. With A's next use at op 6 (2 ops after op 14) B takes
    A's memory, as in test_a_swap_out_of_the_same_size_hands_its_memory_over."""
    def run(nxt):
        L = dataclasses.replace(_learned(IN_STEP_LATE, b_size=64 * MiB, bandwidth=64 * MiB / 3e-3),
                                cand_pos=[np.array([1, nxt]), np.array([4])], win_n=np.array([nxt]))
        replay.replay(L, np.array([0]), np.array([nxt - 2]), BUDGET, trace=(trace := []))
        return [(p, k) for p, k, _ in trace if p == 13]

    assert run(5) == [(13, "drains"), (13, "maps"), (13, "creates")]
    assert run(6) == [(13, "maps"), (13, "handoffs")]


def test_an_allocation_over_the_budget_with_nothing_pending_evicts_and_waits():
    """No plan: B's allocation finds A resident and nothing copying out. The shim evicts A beyond
    the plan (its IDLE hint: idle until op 8), waits on the host for its copy (sizes differ: no
    handoff), and op 8 brings A back on demand."""
    r = replay.replay(_learned(FAR_AHEAD), np.zeros(0, np.int64), np.zeros(0, np.int64), BUDGET)
    assert (r.evictions, r.drains, r.handoffs, r.demand_ins, r.planned_outs, r.prefetches) == (1, 1, 0, 1, 0, 0)
    assert r.host_wait_ns > 2 * MS  # the host at ~10.1 ms, A's copy ends after 13 ms


def test_an_op_that_may_touch_any_block_cancels_the_swap_out_in_flight():
    """Op 2 may touch any block (a launch naming more blocks than its records hold, as PyTorch's
    foreach optimizer kernels do): the shim makes every block usable before it, so A's planned
    swap-out, still copying (the host is far ahead), is cancelled at op 12 and A stays. B's
    allocation then finds A and B over the budget: A goes out beyond the plan (its IDLE hint) and
    the host waits for that copy, which queues behind the cancelled one still on the engine: 1 ms
    more than without op 2's rule (test_far_ahead_...). Marked at op 5 instead (A out by then,
    after B's allocation drained its copy), the rule is a demand swap-in of A at op 15."""
    every = np.zeros(P, bool)
    every[2] = True
    trace: list = []
    base = replay.replay(_learned(FAR_AHEAD), np.array([0]), np.array([6]), BUDGET)
    r = replay.replay(dataclasses.replace(_learned(FAR_AHEAD), op_all=every), np.array([0]), np.array([6]), BUDGET,
                      trace=trace)
    assert (r.planned_outs, r.cancels, r.evictions, r.drains, r.prefetches, r.demand_ins) == (1, 1, 1, 1, 1, 0)
    a = trace[[k for _, k, _ in trace].index("planned_outs")][2]
    assert [(p, k) for p, k, u in trace if u == a][:4] == [(11, "planned_outs"), (12, "cancels"), (13, "evictions"),
                                                          (13, "drains")]
    assert r.host_wait_ns == pytest.approx(base.host_wait_ns + 1 * MS)
    every[2], every[5] = False, True
    r = replay.replay(dataclasses.replace(_learned(IN_STEP_LATE), op_all=every), np.array([0]), np.array([6]), BUDGET,
                      trace=(trace := []))
    assert (r.cancels, r.demand_ins) == (0, 1) and (15, "demand_ins", a) in trace


def _cached(issue_ms) -> LearnedIteration:
    """A (32 MiB, live over the iteration, a candidate used by ops 1 and 9) and four tensors that
    are no candidates: X and Y (32 MiB) allocated after op 0 and freed after ops 1 and 6, Z (32
    MiB) allocated after op 7, W (64 MiB) after op 8, both freed after op 9."""
    times = np.arange(P) * MS
    issue = np.minimum(np.asarray(issue_ms, float) * MS, times)
    size = np.array([32, 32, 32, 32, 64], np.int64) * MiB
    return LearnedIteration(
        pid=1, keys=np.arange(P, dtype=np.uint64), op_rows=np.arange(P), times=times, issue=issue, iteration_ns=P * MS,
        live=np.zeros(P, np.int64), matching=4, iterations=4, steps=4, step=1, confidence=1.0, bandwidth=64 * MiB / 1e-3,
        min_swap_bytes=4 * MiB, cand_block=np.arange(1), cand_addr=np.zeros(1, np.uint64), cand_size=size[:1],
        cand_pos=[np.array([1, 9])], cand_site=np.array([[-1, -1]]), excluded={},
        win_cand=np.array([0, 0]), win_s=np.array([1, 9]), win_n=np.array([9, 11]),
        blk_size=size, blk_alloc=np.array([-1, 0, 0, 7, 8]), blk_free=np.array([P + 5, 1, 6, 9, 9]),
        blk_t_alloc=np.array([-1, issue[0], issue[0], issue[7], issue[8]]) + 1,
        blk_t_free=np.array([np.inf, issue[1], issue[6], issue[9], issue[9]]) + 2,
        blk_served=np.ones(5, bool), blk_cand=np.array([0, -1, -1, -1, -1]))


def test_a_cached_block_is_reused_oldest_first():
    """The shim reuses the oldest cached block of a size class (cache_take; the newest are put
    last). The host issues ops 0-7 at once and op 8 at 4 ms of the iteration, the GPU runs op k at
    k ms. Z, allocated after op 7, takes X's memory (freed after op 1), leaving Y's, whose free the
    GPU passes only at 7 ms. W, after op 8, then finds A, Z, Y's cached memory and W over the 128
    MiB budget with nothing cached the GPU is done with: A goes out beyond the plan (its IDLE
    hint), the host waits for its copy (0.5 ms: 32 MiB at 64 MiB/ms), and op 9 brings it back on
    demand. Had Z taken the newest (Y's), X's memory would have gone back instead: no eviction."""
    trace: list = []
    r = replay.replay(_cached(FAR_AHEAD[:8] + [4, 9]), np.zeros(0, np.int64), np.zeros(0, np.int64), 128 * MiB,
                      trace=trace)
    assert (r.evictions, r.drains, r.demand_ins, r.handoffs) == (1, 1, 1, 0)
    assert [(p, k) for p, k, u in trace if u == 0] == [(18, "evictions"), (18, "drains"), (19, "demand_ins")]
    assert r.host_wait_ns == pytest.approx(0.5 * MS)


# Measured on the H200 (bench/results/swap_gpt2_medium.json, tree 8df1fe4): the shim's budgets at
# 90 / 75 / 60 / 50% of the unmodified run's driver peak, and the time ratios measured there.
MEASURED = {33615878553: 1.094, 27894743040: 1.272, 22173607526: 1.425, 18359517184: 1.676}
# The replay's ratios on the committed unswapped capture (docs/swap.md, "Cost model": the table).
# 1.063 / 1.145 / 1.400 / 1.646: with the optimizer's launches that may touch any block
# (LearnedIteration.op_all) cancelling the plan's swap-outs in flight there, and cached blocks
# reused oldest first (1.022 / 1.056 / 1.193 / 1.401 with neither rule; 1.050 / 1.134 / 1.286 /
# 1.525 with the first only, 1.033 / 1.067 / 1.310 / 1.506 with the second only).
REPLAYED = {33615878553: (1.03, 1.09), 27894743040: (1.11, 1.18), 22173607526: (1.36, 1.44), 18359517184: (1.60, 1.69)}


def test_real_gpt_medium_plans_replayed_against_the_h200_runs():
    """GPT-2 medium (batch 8, seq 1024, per-tensor blocks; the unswapped capture of the H200): the
    cost model predicts 1.00 / 1.00 / 1.12 / 1.18 at the four budgets, the replay on the host's
    clock 1.06 / 1.15 / 1.40 / 1.65, where 1.094 / 1.272 / 1.425 / 1.676 were measured: within
    1.15x of the measured at every budget (1.03 / 1.11 / 1.02 / 1.02 under). The 42 launches of the
    optimizer (foreach kernels naming more than 64 blocks) may touch any block: at 50% they cancel
    183 of the plan's swap-outs, and those blocks go out beyond the plan at the loss instead (the
    H200's 50% run: ~188 cancelled, ~200 such evictions per step, docs/swap.md)."""
    from pathlib import Path

    cap = read_capture(str(Path(__file__).parent / "data" / "gpt_medium_tensors.pyobmem"))
    L = planner.learn_iteration(cap, by_site=True)
    assert int(L.op_all.sum()) == 42 and L.op_all[1553] and L.op_all[1639] and not L.op_all[:1553].any()
    got = {}
    for budget, (lo, hi) in REPLAYED.items():
        plan = planner.make_plan(L, budget, choose=False)  # the planner whose plans those runs followed
        r = plan.replay
        assert plan.predicted_time_ratio == r.time_ratio
        assert lo < r.time_ratio < hi, (budget, r.time_ratio)
        assert r.time_ratio >= plan.time_ratio - 1e-9  # on this capture above the cost model's at every budget
        assert r.planned_outs == len(plan.swaps)  # every planned swap-out finds its block resident
        got[budget] = r
    r50 = got[18359517184]
    assert 380 < r50.drains < 500 and 560e6 < r50.host_wait_ns < 720e6
    assert 90 < r50.handoffs < 180 and 220 < r50.evictions < 310 and 160 < r50.cancels < 210
    assert max(MEASURED[b] / got[b].time_ratio for b in MEASURED) < 1.15
    # Without a plan (the least recently used evicted): ~1.9x measured in the runs' first steps.
    bare = replay.replay(L, np.zeros(0, np.int64), np.zeros(0, np.int64), 18359517184, hints=False)
    assert 1.64 < bare.time_ratio < 1.74 and bare.planned_outs == 0 and 600 < bare.evictions < 720


# The session-7 capture (tests/data/gpt_medium_tensors_s7.pyobmem: H200, the shim naming every
# block of the optimizer's foreach launches, so no op may touch any block) at the shim's budgets of
# 75 / 60 / 50% of the unmodified run's driver peak: per budget, the cover alone (the planner the
# H200 ran that day) and the planner's choice, as (replayed ratio, host waits, evictions beyond the
# plan, handoffs, cost model fits).
S7 = {
    27894743040: ((1.155, 124, 13, 5, True), (1.036, 147, 3, 37, True)),
    22173607526: ((1.254, 151, 50, 123, True), (1.210, 147, 42, 126, True)),
    18359517184: ((1.470, 200, 50, 103, False), (1.418, 169, 37, 105, False)),
}


# Measured on the H200 in session 9 (bench/results/swap_gpt2_medium.json, tree fb51ded: pending
# frees waited for before a live block goes out), at shim budgets 0.3% under S7's (the same
# fractions of that run's own unmodified peak): 1.141 / 1.352 / 1.587 at 75 / 60 / 50%.
MEASURED_S9 = {27894743040: 1.141, 22173607526: 1.352, 18359517184: 1.587}


def test_s7_gpt_medium_plans_chosen_by_the_replay():
    """The cover alone replays 1.155 / 1.254 / 1.470 at 75 / 60 / 50%: its prefetches are timed on
    the capture's host lead (up to 295 ms), which the host's waits for swap-outs at the host's
    budget spend (~40 ms left in the backward pass at 75%), so they come late in the optimizer.
    The planner's choice among candidates by the replay (covers at the budget and 0.5 / 1 GiB
    under it; prefetches on the capture's lead, on none, on the lead the replay kept), then
    repaired where the replay's shim evicts beyond the plan, replays 1.036 / 1.210 / 1.418 (the
    shim's cache trimmed before the host waits for copies, hold_budget since session 13). 75%
    and 60% fit the cost model's budget, 50% does not (19.77 GiB at best). The choice comes within
    1.15x of session 9's H200 runs (MEASURED_S9: 1.12 / 1.11 / 1.12 under them), which planned on
    their own slowed iterations instead (bench_swap's ``predicted_time_ratio``: 1.70 / 2.06 / 2.33)."""
    from pathlib import Path

    cap = read_capture(str(Path(__file__).parent / "data" / "gpt_medium_tensors_s7.pyobmem"))
    L = planner.learn_iteration(cap, by_site=True)
    assert L.period == 1640 and not L.op_all.any()
    for budget, expect in S7.items():
        for choose, (ratio, drains, evictions, handoffs, fits) in zip((False, True), expect):
            plan = planner.make_plan(L, budget, choose=choose)
            r = plan.replay
            assert plan.predicted_time_ratio == r.time_ratio
            assert r.time_ratio == pytest.approx(ratio, abs=0.01), (budget, choose, r.time_ratio)
            assert abs(r.drains - drains) <= 15 and abs(r.evictions - evictions) <= 8, (budget, choose, r)
            assert abs(r.handoffs - handoffs) <= 15, (budget, choose, r)
            assert plan.feasible == fits and r.planned_outs == len(plan.swaps)
            assert (plan.predicted_peak <= budget) == fits
        if fits:
            assert plan.time_ratio < 1.15  # the cost model's figure for the chosen plan
        assert 1.0 <= MEASURED_S9[budget] / plan.predicted_time_ratio < 1.15, (budget, plan.predicted_time_ratio)


# Session 12's H200 bench (bench/results/swap_gpt2_medium.json, tree c4499bf): measured ratios at
# the shim budgets of 75 / 60 / 50%, of wall time per loop iteration. (Session 11's, 179ba4b, of
# the window between the step's syncs, which missed ~40 ms a step: 1.057 / 1.169 / 1.486.)
MEASURED_S12 = {27821342720: 1.111, 22100207206: 1.276, 18286116864: 1.566}


def test_s10_trace_predicts_the_measured_runs_within_1_15x():
    """The session-10 capture (tests/data/gpt_medium_tensors_s10.pyobmem: GPT medium traced with
    --tensor-blocks on the H200, its first 60% of records, three whole steps) is what bench_swap's
    `pyobmem plan` read. Its GPU clock puts no op before its own launch (the reference fix of
    a429ef8: session 7's capture had samples 52 ms early, so its forward pass looked as fast as the
    host issued it). The planner's choice predicts 1.003 / 1.162 / 1.424 at 75 / 60 / 50%: under
    every ratio session 12 measured, within 1.15x (1.11 / 1.10 / 1.10)."""
    from pathlib import Path

    cap = read_capture(str(Path(__file__).parent / "data" / "gpt_medium_tensors_s10.pyobmem"))
    g = cap.gpu_times[cap.gpu_times["op"] >= 0]
    lag = g["t_gpu"].astype(np.int64) - cap.ops["ts_ns"][g["op"]].astype(np.int64)
    assert len(g) > 200 and lag.min() >= 0
    L = planner.learn_iteration(cap, by_site=True)
    assert L.period == 1640 and L.iteration_ns == pytest.approx(510.36e6, rel=1e-3)
    for budget, measured in MEASURED_S12.items():
        plan = planner.make_plan(L, budget)
        assert 1.0 <= measured / plan.predicted_time_ratio < 1.15, (budget, plan.predicted_time_ratio)
