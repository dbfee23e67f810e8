"""The per-block model, the properties and the saving bound on a synthetic training-like trace.

Every iteration (100 us, a 50 us pause before it) runs six kernels at fixed offsets:
  +0 fwd1(W1, A)  +10us fwd2(W2, X, WS, A)  +20us loss(X, A)  +30us bwd2(W2, X, A)
  +40us bwd1(W1, A)  +50us opt(W1, W2, M, A)
W1, W2, M: weights and optimizer state (persistent); A: an arena touched by every kernel; X: an
activation allocated at +5us and freed at +35us (iteration-scoped); WS: a workspace alive 3 us
(transient); N: never accessed; L: allocated in iteration 2, used once, never freed (a leak).
"""

import numpy as np
import pytest

from pyobmem.capture import read_capture
from pyobmem.model import CLASSES, analyse, patterns_json
from pyobmem.model.properties import gini, top_share
from pyobmem.model.saving import saving_bound

from synth import Trace

MiB = 1 << 20
BASE, STEP, N_ITERS = 1_000_000, 100_000, 6
K_FWD1, K_FWD2, K_LOSS, K_BWD2, K_BWD1, K_OPT = 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6


def at(tr: Trace, t: int) -> Trace:
    tr.t = t - tr.dt_ns  # the next record gets time t
    return tr


def training_trace() -> tuple[Trace, dict]:
    tr = Trace()
    b = {}
    at(tr, 100_000)
    b["W1"], b["W2"], b["M"] = tr.alloc(8 * MiB), tr.alloc(16 * MiB), tr.alloc(32 * MiB)
    b["A"], b["N"] = tr.alloc(64 * MiB), tr.alloc(2 * MiB)
    W1, W2, M, A = b["W1"], b["W2"], b["M"], b["A"]
    for i in range(N_ITERS):
        t0 = BASE + i * STEP
        at(tr, t0).launch(K_FWD1, [W1, A])
        x = at(tr, t0 + 5_000).alloc(4 * MiB)
        ws = at(tr, t0 + 9_000).alloc(1 * MiB)
        at(tr, t0 + 10_000).launch(K_FWD2, [W2, x, ws, A])
        at(tr, t0 + 12_000).free(ws)
        at(tr, t0 + 20_000).launch(K_LOSS, [x, A])
        if i == 2:
            b["L"] = at(tr, t0 + 25_000).alloc(3 * MiB)
        at(tr, t0 + 30_000).launch(K_BWD2, [W2, x, A] + ([b["L"]] if i == 2 else []))
        at(tr, t0 + 35_000).free(x)
        at(tr, t0 + 40_000).launch(K_BWD1, [W1, A])
        at(tr, t0 + 50_000).launch(K_OPT, [W1, W2, M, A])
        b.setdefault("X", x)
        b.setdefault("WS", ws)
    at(tr, BASE + N_ITERS * STEP + 10_000)
    for name in ("W1", "W2", "M", "A", "N"):
        tr.free(b[name])
    return tr, b


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tr, ids = training_trace()
    path = tmp_path_factory.mktemp("m") / "train.pyobmem"
    tr.write(path)
    cap = read_capture(str(path))
    row = {name: int(np.flatnonzero(cap.blocks["block_id"] == bid)[0]) for name, bid in ids.items()}
    return cap, analyse(cap, bandwidth=1e12, min_swap_bytes=0, progress=False), row


def test_iterations_of_the_training_trace(model):
    cap, a, _ = model
    it = a.iterations
    assert it.count == N_ITERS and it.main_regime.period_ops == 6 and it.main_regime.phase == "gap"
    assert list(it.t_start) == [BASE + i * STEP for i in range(N_ITERS)]
    assert list(it.t_end[:-1]) == [BASE + (i + 1) * STEP for i in range(N_ITERS - 1)]
    assert it.t_end[-1] == BASE + (N_ITERS - 1) * STEP + 50_000  # the stream ends at the last op
    assert it.main_regime.confidence == 1.0 and it.iteration_ns == STEP


def test_classes(model):
    cap, a, row = model
    bm = a.blocks
    got = {name: bm.class_name(r) for name, r in row.items()}
    assert got == {
        "W1": "persistent", "W2": "persistent", "M": "persistent", "A": "arena", "N": "never-accessed",
        "X": "iteration-scoped", "WS": "transient", "L": "persistent",
    }
    counts = patterns_json(a)["blocks_by_class"]
    assert counts["iteration-scoped"] == {"count": 6, "bytes": 6 * 4 * MiB}
    assert counts["transient"] == {"count": 6, "bytes": 6 * MiB}
    assert counts["persistent"] == {"count": 4, "bytes": (8 + 16 + 32 + 3) * MiB}
    assert counts["arena"] == {"count": 1, "bytes": 64 * MiB}
    assert counts["never-accessed"] == {"count": 1, "bytes": 2 * MiB}
    assert bm.lifetime_iters[row["WS"]] == pytest.approx(0.03)
    assert bm.full_iterations[row["W1"]] == N_ITERS
    # the activation of each iteration plays one role; its accesses sit at positions 1, 2, 3
    x_rows = np.flatnonzero(bm.size == 4 * MiB)
    assert len(set(bm.role[x_rows])) == 1 and bm.iterative[x_rows].all()
    assert list(bm.accesses(row["X"])["position"]) == [1, 2, 3]


def test_idle_intervals(model):
    cap, a, row = model
    iv = a.blocks.intervals
    w1 = iv.block == row["W1"]
    # W1: fwd1 -> bwd1 (40 us, 4 ops), bwd1 -> opt (10 us, 1 op), opt -> next fwd1 (50 us, 1 op)
    assert list(iv.ns[w1]) == [40_000, 10_000, 50_000] * (N_ITERS - 1) + [40_000, 10_000]
    assert list(iv.ops[w1]) == [4, 1, 1] * (N_ITERS - 1) + [4, 1]
    assert list(iv.wrap[w1]) == [False, False, True] * (N_ITERS - 1) + [False, False]
    m = iv.block == row["M"]
    assert list(iv.ns[m]) == [STEP] * (N_ITERS - 1) and iv.wrap[m].all()
    x = iv.block == row["X"]
    assert list(iv.ns[x]) == [10_000, 10_000] and list(iv.index[x]) == [0, 1]


def test_properties(model):
    _, a, _ = model
    p = a.properties
    # every block but the leak L (one iteration) repeats its signature; arena A is left out
    # touched outside A: W1 W2 M L + 6 X + 6 WS = 16 blocks, 89 MiB; only L (3 MiB) does not repeat
    assert (p.iterative_blocks, p.iterative_bytes) == (15 / 16, pytest.approx(86 / 89))
    assert p.regular == 1.0 and p.segment.regular_ops == 1.0 and p.segment.regular == 1.0
    # tensor level: every block holds one tensor (offset 0), so nothing is split and every reuse
    # interval recurs at the same positions
    assert p.level == "tensor" and p.iterative_intervals == 1.0 and p.regular_ops is None
    assert (p.segment.iterative_blocks, p.segment.iterative_bytes) == (p.iterative_blocks, p.iterative_bytes)
    # intervals per iteration: W1 40,10,50  W2 20,20,60  M 100  X 10,10 (L has none); the last
    # iteration has no wrap
    ns = np.array([40, 10, 50, 20, 20, 60, 100, 10, 10] * 5 + [40, 10, 20, 20, 10, 10], float)
    assert p.extremal_top == pytest.approx(top_share(ns)) and p.extremal_gini == pytest.approx(gini(ns))
    assert p.n_intervals == len(ns)


def test_gini_and_top_share():
    assert gini(np.array([1, 1, 1, 1])) == 0.0
    assert gini(np.array([0, 0, 0, 4])) == pytest.approx(0.75)
    assert top_share(np.array([1] * 9 + [91])) == pytest.approx(0.91)


def test_saving_bound_by_hand():
    # R = 700 B at t=0 and 900, 850 B in between; T = 1000 ns; 1 B/ns.
    # B1 (100 B, idle 0..1000): 2*100 ns of copies fit, out over [100, 900): free, peak 850 -> 750.
    # B2 (500 B, idle 50..950): covering [100, 900) leaves 50 ns each side of 500 ns copies:
    # stall 900 ns; the peak falls to 700 (t=0 and t=900), a saving of 150 B from ratio 1.9.
    g = np.arange(0, 1000, 100)
    R = np.array([700] + [850] * 8 + [700])
    r = saving_bound(g, R, np.array([0, 50]), np.array([1000, 950]), np.array([100, 500]), 1000, 1e9,
                     (1.0, 1.5, 1.89, 1.9, 2.0))
    assert r["points"] == [(1.0, 100), (1.5, 100), (1.89, 100), (1.9, 150), (2.0, 150)]
    assert r["out"].tolist() == [[100.0, 900.0], [100.0, 900.0]] and r["stall"].tolist() == [0.0, 900.0]


def test_saving_curve_of_the_trace(model):
    cap, a, row = model
    s = a.saving
    # iteration 3 of 6 at 1 TB/s: every copy takes <= 64 us; the resident peak is during fwd2
    # (+10 us .. +12 us: W1 W2 M A N L X WS = 130 MiB)
    assert s.iteration == 3 and s.peak_bytes == (8 + 16 + 32 + 64 + 2 + 3 + 4 + 1) * MiB
    ratios = [r for r, _ in s.points]
    saved = [b for _, b in s.points]
    assert ratios == sorted(ratios) and saved == sorted(saved) and saved[0] == s.free_bytes
    # Peak 130 MiB over +9..+12 us (WS live). Free at 1.00: M (32 MiB, idle a whole iteration:
    # 2x33.5 us of copies fit) is out over -16.4..+16.4 us. The peak is then X's plateau,
    # 129 MiB over +20..+35 us: W1 (idle 0..40 us, 8.39 us per copy) must be back by 35 us, so
    # it has 5 us for its copy-in: a stall of 3.39 us, 3.4% of the iteration. Then 125 MiB.
    assert s.free_bytes == 1 * MiB
    assert list(s.step_block[:2]) == [row["M"], row["W1"]]
    assert s.step_stall_ns[:2] == pytest.approx([0.0, 8 * MiB / 1000 - 5_000])
    assert s.saved_at(1.0338) == 1 * MiB and s.saved_at(1.034) == 5 * MiB == dict(s.points)[1.05]
    assert saved[-1] >= saved[0]


def test_no_iteration_capture(tmp_path):
    tr = Trace()
    b1 = tr.alloc(MiB)
    tr.launch(0x1, [b1])
    tr.launch(0x2, [b1])
    tr.write(tmp_path / "one.pyobmem")
    a = analyse(read_capture(str(tmp_path / "one.pyobmem")), progress=False)
    assert a.iterations.count == 0 and a.saving is None and a.properties.regular is None
    j = patterns_json(a)
    assert j["iterations_detected"] == 0 and j["period_launches"] is None and j["iterative"] is None
    assert j["saving_curve"] == [] and j["peak_live_bytes"] == MiB
    assert set(j) == {"iterations_detected", "period_launches", "iterative", "regular", "extremal",
                      "blocks_by_class", "saving_curve", "peak_live_bytes", "level", "segment_level"}
    assert j["blocks_by_class"]["arena"]["count"] == 1 and CLASSES[-1] == "other"  # touched by every op


def test_segment_subranges(tmp_path):
    from pyobmem.model.blocks import segment_subranges

    tr = Trace()
    seg = tr.alloc(2 * MiB)  # a caching-allocator segment holding three tensors
    tr.launch(0x1, [seg, seg], [0, 4096])
    tr.launch(0x2, [seg], [65536])
    tr.launch(0x3, [seg, seg], [4096, 65536])
    tr.write(tmp_path / "s.pyobmem")
    sub = segment_subranges(read_capture(str(tmp_path / "s.pyobmem")), 0)
    assert sub.tolist() == [(0, 4096, 1, 0, 0), (4096, 65536, 2, 0, 2), (65536, 2 * MiB, 2, 1, 2)]
