"""The copy engines' frontier (pyobmem.planner.frontier): a hand-computed synthetic iteration, and
the committed H200 capture of GPT medium against the replayed predictions."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import Trace

from pyobmem.capture import read_capture
from pyobmem.planner import learn_iteration, make_plan
from pyobmem.planner.frontier import frontier, stalls_at

MiB = 1 << 20
P = 100
DATA = Path(__file__).parent / "data"


def _three_blocks(tmp_path):
    """Iterations of P launches 1 us apart on the GPU (GPU time samples), each naming B; op 0 names
    A and op 50 names C (64 MiB each, live over the run). Copies at a bandwidth that takes 0.8 of
    the iteration to move 64 MiB."""
    tr = Trace(dt_ns=10_000)
    A, B, C = (tr.alloc(64 * MiB) for _ in range(3))
    for _ in range(6):
        for p in range(P):
            tr.launch(0x1000 + p, [B] + ([A] if p == 0 else []) + ([C] if p == 50 else []))
    last = tr.launch(0x1000, [B])
    for seq in range(1, last + 1):
        tr.gpu_time(seq, 1_000_000_000 + seq * 1000)
    tr.write(tmp_path / "f.pyobmem")
    L = learn_iteration(read_capture(str(tmp_path / "f.pyobmem")), min_swap_bytes=MiB, bandwidth=64 * MiB / (0.8 * P * 1e-6))
    assert L.period == P and L.iteration_ns == pytest.approx(P * 1000, rel=0.02)
    return L


def test_frontier_by_hand(tmp_path):
    """Under 128 MiB one of A and C is out at every op (192 MiB live). At op 0 (A in use) C must be
    out: released at its access at 50 of the iteration before (E(50) - T), its copy out (0.8 T)
    ends 0.3 T after E(0) and its copy back, started at E(0), is 0.3 T late for its use at 50.
    Op 50 is the same for A. Everywhere else the earliest released block is out in time, or the one
    needed latest back in time, by less: the frontier is 1 + 0.6 (the first of the worst)."""
    L = _three_blocks(tmp_path)
    T, E = L.iteration_ns, L.times
    d = 0.8 * T
    f = frontier(L, 128 * MiB)
    assert f.at == 0 and f.excess_bytes == 64 * MiB
    assert f.out_late_ns == pytest.approx(E[50] - T + d - E[0])
    assert f.in_late_ns == pytest.approx(E[0] + d - E[50])
    assert f.time_ratio == pytest.approx(1 + (f.out_late_ns + f.in_late_ns) / T)
    assert f.time_ratio == pytest.approx(1.6, abs=0.03)
    # 32 MiB over the budget: half a block's copy (0.4 T) out and back; at op 0, C's copy out ends
    # at E(50) - T + 0.4 T, before E(0); back by E(0) + 0.4 T, before E(50): no stall anywhere
    f = frontier(L, 160 * MiB)
    assert (f.time_ratio, f.out_late_ns, f.in_late_ns, f.excess_bytes) == (1.0, 0.0, 0.0, 32 * MiB)
    # a budget the job fits: nothing to move
    assert frontier(L, 192 * MiB).at == -1
    # 32 MiB: at op 1 A and C out together leave 64 MiB (B, in use at every op) over it: unmet
    assert frontier(L, 32 * MiB) is None


def test_stalls_of_two_blocks_and_one_stall_serving_both(tmp_path):
    """Under 96 MiB both A and C must be out at op 1 (96 MiB over). Out: C (released at 50 of the
    iteration before) whole, then half of A (released at 0), in release order; back: A (needed
    latest, at 0 of the next iteration) whole and half of C, C's half first (needed at 50). The
    release and the deadline that set the two stalls are 1.5 iterations apart: in the steady state
    one stall a period serves both, so the iteration grows by the larger, not the sum."""
    L = _three_blocks(tmp_path)
    T, E = L.iteration_ns, L.times
    D = 0.8 * T  # one block's copy
    out_late = max(E[50] - T + 1.5 * D, E[0] + 0.5 * D) - E[1]
    in_late = max(E[1] + 0.5 * D - E[50], E[1] + 1.5 * D - (E[0] + T))
    got = stalls_at(L, 96 * MiB, 1)
    assert got == pytest.approx((out_late, in_late, max(out_late, in_late)))
    assert out_late > in_late > 0.15 * T  # both stall: the sum would be another 0.2 T
    assert frontier(L, 96 * MiB) is None  # at op 0 (A in use) C alone cannot hold 96 MiB
    assert stalls_at(L, 96 * MiB, 0) is None and stalls_at(L, 192 * MiB, 1) == (0.0, 0.0, 0.0)


def test_frontier_of_gpt_medium_under_the_replay():
    """On the committed H200 capture of GPT medium (no swapping), at the shim's budgets of 75 / 60
    / 50% of the driver peak: the frontier (pinned) is at or under the replay's prediction, and the
    plan's JSON carries it (``pyobmem plan --json``'s ``frontier``)."""
    L = learn_iteration(read_capture(str(DATA / "gpt_medium_tensors.pyobmem")), by_site=True)
    got = {}
    for budget in (27821342720, 22100207206, 18286116864):
        plan = make_plan(L, budget, bound=True, choose=False)
        f = plan.frontier
        got[budget] = round(f.time_ratio, 3)
        assert plan.to_json()["frontier"] == f.to_json()
        assert plan.predicted_time_ratio >= f.time_ratio
    assert got == {27821342720: 1.0, 22100207206: 1.129, 18286116864: 1.264}
    assert make_plan(L, 18286116864, choose=False).frontier is None  # the daemon's plans skip it
    # under what the job needs at one op (7.1 GiB, windows across an op that may touch any block
    # left out, as the plan's needed_bytes leaves them): no bound
    plan = make_plan(L, 7 << 30, bound=True)
    assert plan.needed_bytes > 7 << 30 and plan.frontier is None
