"""The swap planner on synthetic traces with hand-computed plans, and on the real captures.

The trace (``_trace``): every op is a LAUNCH and one ACCESS record, 10 us apart, so op p of an
iteration launches at 20 us * p and an iteration of 100 ops lasts T = 2 ms (launches spread over
the iteration: the execution clock is the launch clock). Blocks:

- A, 64 MiB, cuMemAlloc: touched by op 0 only -> one idle window from op 0 to op 0 of the next
  iteration: the candidate.
- B, 64 MiB: touched by every op but op 10 -> an arena (never swapped).
- S, 1 MiB at op 0 (under min_swap_bytes); X, 8 MiB allocated with cuMemAllocAsync at op 0 (not
  VMM-backable); O, 8 MiB touched at op 10 by an opaque launch.
- C, 64 MiB, allocated at op 40 and freed at op 60 of every iteration, touched at op 50: the peak.

Live bytes: 145 MiB, 209 MiB over ops 40..59. With a bandwidth of 64 MiB per 100 us, d = 100 us
for A each way and the remap cost r = 150 us (150 us per 64 MiB):
- SWAP_OUT after op 0; the copy is done at 100 us, so A is out from op 5 (the first at >= 100 us);
- PREFETCH before op 87: the copy must finish by T = 2000 us, so it starts by 1900 us and is
  issued by 1900 - 150 = 1750 us; op 87 launches at 1740 us, op 88 at 1760 us;
- A is out over ops 5..86 (82 ops), no stall: ratio 1.000; the peak falls to 145 MiB.
"""

from __future__ import annotations

import numpy as np
import pytest
from synth import Trace

from pyobmem import abi, planner
from pyobmem.capture import read_capture
from pyobmem.errors import PyobmemError
from pyobmem.planner import policy, simulation

MiB = 1 << 20
BW = 64 * MiB / 100e-6  # 64 MiB in 100 us
P = 100


def _trace(tmp_path, iterations: int = 6, nccl: bool = False, gpu_ns_per_op: int | None = None, opaque: bool = True):
    """The trace of the module's docstring; ``opaque=False``: op 10 an ordinary launch (O then a
    candidate, and no op that may touch any block lies in A's window)."""
    tr = Trace(dt_ns=10_000)
    A = tr.alloc(64 * MiB)
    if nccl:  # an all-reduce names A: the shim pins it
        w = A << abi.ACCESS_OFFSET_BITS  # PYOBMEM_ACCESS_WORD(A, 0)
        tr.add(abi.Ev.NCCL, flags=int(abi.NcclCall.ALL_REDUCE), send=w, recv=w, bytes=64 * MiB)
    B = tr.alloc(64 * MiB)
    S = tr.alloc(1 * MiB)
    X = tr.alloc(8 * MiB, kind=abi.AllocKind.ASYNC)
    O = tr.alloc(8 * MiB)
    ids = {"A": A, "B": B, "S": S, "X": X, "O": O}
    for _ in range(iterations):
        C = None
        for p in range(P):
            if p == 40:
                C = tr.alloc(64 * MiB)
                tr.t -= tr.dt_ns  # at the launch time of op 40
            if p == 60:
                tr.free(C)
                tr.t -= tr.dt_ns
            blocks = [B]
            flags = 0
            if p == 0:
                blocks += [A, S, X]
            if p == 10:
                blocks = [O]  # B stays clear of the opaque launch
                flags = abi.LaunchFlag.OPAQUE if opaque else 0
            if p == 50:
                blocks += [C]
            tr.launch(0x1000 + p, blocks, flags=flags)
    last = tr.launch(0x1000, [B])  # the start of one more iteration closes the last one
    if gpu_ns_per_op:  # GPU time samples: op k (1-based) ran at 1 s + k * gpu_ns_per_op
        for seq in range(1, last + 1):
            tr.gpu_time(seq, 1_000_000_000 + seq * gpu_ns_per_op)
    path = tmp_path / "synth.pyobmem"
    tr.write(path)
    return read_capture(str(path)), ids


@pytest.fixture
def learned(tmp_path):
    cap, ids = _trace(tmp_path)
    L = planner.learn_iteration(cap, bandwidth=BW)
    assert isinstance(L, planner.LearnedIteration)
    return cap, ids, L


def test_learned_iteration(learned):
    cap, ids, L = learned
    assert L.period == P and L.iteration_ns == 2_000_000
    assert L.times.tolist() == [20_000.0 * p for p in range(P)]
    assert L.keys.tolist() == [0x1000 + p for p in range(P)]
    assert L.live.max() == 209 * MiB and L.live.min() == 145 * MiB
    assert [int(p) for p in np.flatnonzero(L.live == 209 * MiB)] == list(range(40, 60))
    # Only A is a candidate; the others are excluded, each for its reason.
    assert [int(cap.blocks["block_id"][b]) for b in L.cand_block] == [ids["A"]]
    assert L.win_s.tolist() == [0] and L.win_n.tolist() == [P]
    ex = L.excluded
    assert ex["not VMM-backable (not cuMemAlloc)"] == (1, 8 * MiB)
    assert ex["under 4.00 MiB"] == (1, 1 * MiB)
    assert ex["touched by an opaque launch"] == (1, 8 * MiB)
    assert ex["arena"] == (1, 64 * MiB)
    assert ex["not live over the whole iteration"][0] >= 1  # the C of every iteration


def test_learned_iteration_on_the_gpu_clock(tmp_path):
    """With GPU time samples the planner times the iteration on the GPU clock: 30 us per op there,
    against 20 us between launches."""
    cap, _ = _trace(tmp_path, gpu_ns_per_op=30_000)
    L = planner.learn_iteration(cap, bandwidth=BW)
    assert L.iteration_ns == 3_000_000
    assert L.times.tolist() == [30_000.0 * p for p in range(P)]
    assert L.issue.max() == 0.0  # the host issued every op before the GPU reached the iteration


# The hand-computed cost model: the cover alone (``choose=False``). A's window crosses the opaque
# launch at op 10, which the planner's replay-judged choice never takes (test_no_window_across_...).
def test_plan_hand_computed(learned):
    cap, ids, L = learned
    plan = planner.make_plan(L, 160 * MiB, bound=True, choose=False)
    assert plan.feasible
    assert [(s.out_at, s.prefetch_at, s.next_at, s.absent, s.stall_ns) for s in plan.swaps] == [(0, 87, 0, 82, 0.0)]
    addr_a = int(cap.blocks["addr"][cap.blocks["block_id"] == ids["A"]][0])
    N = int(abi.SITE_NONE)  # A lives across iterations: named by its address, no site
    assert plan.actions.tolist() == [  # (at, kind, until, addr, size, site_at, site_ord)
        (0, int(abi.ActionKind.IDLE), 0, addr_a, 64 * MiB, N, 0),  # hint: A idle from op 0 to op 0 of the next iteration
        (0, int(abi.ActionKind.SWAP_OUT), 0, addr_a, 64 * MiB, N, 0),
        (87, int(abi.ActionKind.PREFETCH), 0, addr_a, 64 * MiB, N, 0),
    ]
    assert plan.peak_bytes == 209 * MiB and plan.predicted_peak == 145 * MiB and plan.saved_bytes == 64 * MiB
    assert plan.time_ratio == 1.0 and plan.stall_ns == 0.0
    assert plan.bound_bytes is not None and plan.saved_bytes <= plan.bound_bytes
    assert plan.needed_bytes == 145 * MiB  # with A out wherever it can be


def test_budget_respected_at_every_position(learned):
    _, _, L = learned
    plan = planner.make_plan(L, 160 * MiB, choose=False)
    sim = simulation._simulate(L, np.array([0]))  # the one window, A
    assert sim.resident.max() == plan.predicted_peak <= plan.budget_bytes
    resident = L.live.copy()
    for s in plan.swaps:  # out over [out_at + 5, prefetch_at): A's copy takes 5 ops
        resident[s.out_at + 5 : s.prefetch_at] -= s.size
    assert np.all(resident <= 160 * MiB)
    assert resident.tolist() == sim.resident.tolist()


def test_no_window_across_an_op_that_may_touch_any_block(learned):
    """The opaque launch at op 10 may touch any block: the shim makes every block usable before it,
    so A, out after op 0, would be back at op 10 (its swap-out cancelled or undone), saving nothing
    over ops 10..99 where the budget is passed. The planner never takes a window across such an op
    (LearnedIteration.op_all): A's one window (0, 100) crosses it, so no plan fits 160 MiB and none
    swaps anything, while the cost model's cover alone (test_plan_hand_computed) takes it."""
    _, _, L = learned
    assert np.flatnonzero(L.op_all).tolist() == [10]
    assert policy._crosses_all(L).tolist() == [True]
    plan = planner.make_plan(L, 160 * MiB)
    assert not plan.feasible and not plan.swaps and plan.predicted_peak == 209 * MiB
    assert len(planner.make_plan(L, 160 * MiB, choose=False).swaps) == 1


def test_budget_already_met_needs_no_swap(learned):
    _, _, L = learned
    plan = planner.make_plan(L, 209 * MiB)
    assert plan.feasible and not plan.swaps and len(plan.actions) == 0 and plan.time_ratio == 1.0


def test_below_what_the_job_needs_at_one_instant(learned):
    _, _, L = learned
    plan = planner.make_plan(L, 100 * MiB, choose=False)
    assert not plan.feasible
    assert plan.needed_bytes == 145 * MiB and plan.predicted_peak == 145 * MiB


def test_slow_copies_stall(learned, tmp_path):
    """At a tenth of the bandwidth A's copies take 1 ms each way: out at op 50 (1000 us), the
    prefetch (1000 + 150 us before 2000 us) at op 42 would precede it, so A is out over one op
    only (op 50; q = 51) and its consumer stalls: done = 1020 + 150 + 1000 = 2170 us, 170 us late."""
    cap, _, _ = learned
    L = planner.learn_iteration(cap, bandwidth=BW / 10)
    sim = simulation._simulate(L, np.array([0]))
    assert (sim.q % P).tolist() == [51] and sim.absent.tolist() == [1]
    assert sim.stall.tolist() == [pytest.approx(170_000.0)]
    assert sim.ratio == pytest.approx(max(1 + 170_000 / 2e6, (1e6 + 150_000) / 2e6))


def test_min_swap_bytes_excludes(tmp_path):
    cap, _ = _trace(tmp_path)
    L = planner.learn_iteration(cap, bandwidth=BW, min_swap_bytes=128 * MiB)
    assert len(L.cand_block) == 0
    plan = planner.make_plan(L, 160 * MiB)
    assert not plan.feasible and plan.needed_bytes == 209 * MiB


@pytest.mark.parametrize("text,expect", [
    ("16GiB", (16 << 30, None)), ("16G", (16 << 30, None)), ("16GB", (16 * 10**9, None)), ("500MiB", (500 << 20, None)),
    ("500m", (500 << 20, None)), ("123456", (123456, None)), ("1.5GiB", (3 << 29, None)), ("0.75", (None, 0.75)),
    ("75%", (None, 0.75)), ("100%", (None, 1.0)), ("1", (None, 1.0)), ("1.0", (None, 1.0)), ("1e3", (1000, None)),
])
def test_parse_budget(text, expect):
    b = planner.parse_budget(text)
    assert (b.bytes, b.fraction) == expect


@pytest.mark.parametrize("text", ["", "abc", "-1G", "0", "0.0", "12XB", "150%", "0%", "1.5", "2.0"])
def test_parse_budget_errors(text):
    with pytest.raises(PyobmemError) as e:
        planner.parse_budget(text)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_budget_fraction_resolves_against_the_card():
    b = planner.parse_budget("75%")
    assert b.resolve(None) is None and b.resolve(1000) == 750


REAL = ["tests/data/gpt_tiny.pyobmem", "tests/data/jax.pyobmem", "tests/data/cupy.pyobmem"]


@pytest.mark.parametrize("path", REAL)
@pytest.mark.parametrize("frac", [0.9, 0.75, 0.6, 0.5, 0.4])
def test_real_captures_never_beyond_the_bound(path, frac):
    cap = read_capture(path)
    L = planner.learn_iteration(cap)
    assert isinstance(L, planner.LearnedIteration)
    plan = planner.make_plan(L, int(L.live.max() * frac), bound=True)
    assert plan.saved_bytes <= plan.bound_bytes
    assert plan.predicted_peak <= plan.peak_bytes and plan.needed_bytes <= plan.peak_bytes
    assert plan.feasible == (plan.predicted_peak <= plan.budget_bytes)
    assert list(plan.actions["at"]) == sorted(plan.actions["at"]) and np.all(plan.actions["at"] < L.period)


def test_real_capture_figures():
    """What the planner learns from the committed H200 captures (exact)."""
    got = {}
    for path in REAL:
        L = planner.learn_iteration(read_capture(path))
        got[path.split("/")[-1]] = (L.period, L.matching, L.iterations, len(L.cand_block), len(L.win_s), int(L.live.max()))
    assert got == {
        "gpt_tiny.pyobmem": (160, 9, 9, 6, 43, 998246400),
        "jax.pyobmem": (11, 19, 19, 0, 0, 170052104),
        "cupy.pyobmem": (10, 30, 30, 2, 3, 303778304),
    }


def test_host_running_ahead_is_modelled_at_the_mark(learned):
    """The shim acts when the host issues an op, the GPU runs it later. With the host 1 ms ahead
    (op p issued at max(0, 20 us * p - 1000 us) of its iteration: ops 0..50 all at its start),
    A's copy out (done at 100 us) is seen at the first op issued after that, op 55 (issued at
    100 us, while the GPU runs op 5): out from op 5. The last op the host issues in time for the
    prefetch is op 99 (980 us; op 0 of the next iteration is issued at 2000 us, too late for the
    150 us remap and 100 us copy). The model counts A back from the GPU's position at its mark,
    op 86 (1740 us: the latest its remap can start), not from op 49 where the GPU is when the host
    issues op 99: A is out over ops 5..86 as with equal clocks, the copy ends at 1990 us, and
    nothing starves. (The shim maps at op 99's issue: the model's peak is the GPU's view, and
    the shim keeps the budget at the host's by its eviction; docs/swap.md "Cost model".)"""
    import dataclasses

    _, _, L = learned
    ahead = dataclasses.replace(L, issue=np.maximum(L.times - 1_000_000, 0.0))
    sim = simulation._simulate(ahead, np.array([0]))
    assert (sim.q % P).tolist() == [99] and (sim.mark % P).tolist() == [86]
    assert sim.absent.tolist() == [82] and sim.stall.tolist() == [0.0]
    assert sim.resident[40:60].tolist() == [145 * MiB] * 20
    plan = planner.make_plan(ahead, 160 * MiB, choose=False)
    assert plan.feasible and plan.predicted_peak == 145 * MiB
    assert [(s.out_at, s.mark_at, s.prefetch_at) for s in plan.swaps] == [(0, 86, 99)]


def test_blocks_named_by_nccl_are_no_candidates(tmp_path):
    cap, ids = _trace(tmp_path, nccl=True)
    L = planner.learn_iteration(cap, bandwidth=BW)
    assert len(cap.nccl) == 1 and len(L.cand_block) == 0
    assert L.excluded["named by an NCCL call (pinned)"] == (1, 64 * MiB)
