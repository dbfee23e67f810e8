"""A transformer layer repeats inside the training step: the model never takes it for the
iteration (docs/model.md, Iterations, "Part of a longer iteration"). On the H200, GPT medium under
swap mode's slow first steps (3 steps captured) gave "33 ops per iteration, 69 iterations": one
backward layer of 24, not the step. Synthetic captures (tests/synth.py) of the same shape."""

from pathlib import Path

import numpy as np
import pytest

from pyobmem import planner
from pyobmem.capture import decode_records, read_capture, read_records
from pyobmem.model.iterations import detect_in_sequence, detect_iterations

from synth import Trace

DATA = Path(__file__).parent / "data"

# A GPT-like step: embedding, 12 layers forward (10 kernels each), loss, 12 layers backward (15
# kernels each), the optimizer (20 kernels): 325 kernels. The last kernel of a layer is its GEMM.
FWD, BWD, OPT = list(range(10, 20)), list(range(20, 35)), list(range(40, 60))
LAYERS = 12
FWD_LAYER, BWD_LAYER = len(FWD), len(BWD)


def step(gemm_fwd: int = FWD[-1], gemm_bwd: int = BWD[-1], init: int = 0) -> list:
    return ([1, 2] + (FWD[:-1] + [gemm_fwd]) * LAYERS + [3, 4] + (BWD[:-1] + [gemm_bwd]) * LAYERS
            + [5] + [98] * init + OPT)


P = len(step())
FIRST = step(init=40)  # the first step also initialises the optimizer state (40 fills)


def autotuning(i: int) -> list:
    """Step i of the warm-up while cuBLAS/cuDNN benchmark mode tries another GEMM each step."""
    return step(gemm_fwd=100 + i, gemm_bwd=200 + i)


def capture(tmp_path, steps: list):
    """A capture of ``steps`` (lists of kernel ids), the host pausing before each (loss.item());
    returns it and the op seq of each step's first launch."""
    tr = Trace(dt_ns=1000)
    w, a = tr.alloc(64 << 20), tr.alloc(32 << 20)  # weights, activations
    first = []
    for s in steps:
        tr.t += 200_000
        first.append(tr.seq + 1)
        for k in s:
            tr.launch(0x1000 + k, [w, a])
    tr.write(tmp_path / "layers.pyobmem")
    return read_capture(str(tmp_path / "layers.pyobmem")), first


def regimes(it) -> list:
    return [(r.period_ops, r.count) for r in it.regimes]


@pytest.mark.parametrize("with_first", [False, True])
def test_autotuned_warmup_the_step_wins_over_the_layer(tmp_path, with_first):
    # 6 warm-up steps, each with other GEMMs, then 3 identical steps (with_first: after the first
    # step, which initialises the optimizer state). The backward layer repeats 12 times in every
    # step and its runs in the warm-up cover more than the 3 identical steps: before the rule the
    # model reported 108 (120) iterations of 15 ops.
    steps = [FIRST] * with_first + [autotuning(i) for i in range(6)] + [step()] * 3
    cap, first = capture(tmp_path, steps)
    it = detect_iterations(cap)
    assert regimes(it) == [(P, len(steps))] and it.main_regime.phase == "gap" and it.partial is None
    assert list(cap.ops["seq"][it.start_op]) == first  # every step, from its first launch
    assert list(it.match) == [305 / P] * with_first + [(P - 2 * LAYERS) / P] * 6 + [1.0] * 3
    learned = planner.learn_iteration(cap, min_swap_bytes=1 << 20)
    assert isinstance(learned, planner.LearnedIteration) and learned.period == P


def test_autotuned_warmup_on_the_bare_sequence():
    # No pauses: the rotation differs (the last step is cut), not the period. The layer met
    # first leaves out the 9 forward kernels common to all steps (their GEMM varies).
    partial = []
    found = detect_in_sequence(np.array(sum([autotuning(i) for i in range(6)] + [step()] * 3, [])), partial=partial)
    assert [(r["period"], len(r["starts"])) for r in found] == [(P, 8)]
    assert partial == [{"period": BWD_LAYER, "count": 9 * LAYERS, "left_out": FWD_LAYER - 1, "depth": 0}]


@pytest.mark.parametrize("identical", [0, 1, 2])
def test_too_few_whole_steps_no_layer_is_the_iteration(tmp_path, identical):
    # The first step (it also initialises the optimizer state), `identical` steps, then a step
    # cut short after 8 of its 12 backward layers (the capture was stopped). identical = 0: fewer
    # than two whole steps; 2: the H200 capture's case. Fewer than 3 identical steps make no
    # period, and the backward layer is not an iteration: no iteration at all.
    cut = 2 + LAYERS * FWD_LAYER + 2 + 8 * BWD_LAYER
    cap, _ = capture(tmp_path, [FIRST] + [step()] * identical + [step()[:cut]])
    it = detect_iterations(cap)
    assert it.main == -1 and it.count == 0 and regimes(it) == []
    # Left out: the 10 forward kernels (once per layer) and the fill (40 in the first step).
    layers = (identical + 1) * LAYERS + 8
    assert (it.partial.period_ops, it.partial.count, it.partial.left_out) == (BWD_LAYER, layers, FWD_LAYER + 1)
    learned = planner.learn_iteration(cap)
    assert isinstance(learned, planner.NoPlan)
    assert learned.reason == ("no repeating iteration yet: the repeating unit of 15 launches and copies is part of an "
                              "iteration (11 recurring kernels are not in it); waiting for whole iterations")


def test_three_whole_steps_are_enough(tmp_path):
    # 3 identical steps make the period; the first step then matches it too (40 fills before
    # the optimizer: 305 of its first 325 kernels are the template's).
    cut = 2 + LAYERS * FWD_LAYER + 2 + 8 * BWD_LAYER
    cap, first = capture(tmp_path, [FIRST] + [step()] * 3 + [step()[:cut]])
    it = detect_iterations(cap)
    assert regimes(it) == [(P, 4)] and list(cap.ops["seq"][it.start_op]) == first[:4]
    assert list(it.match) == [305 / P, 1.0, 1.0, 1.0]


def test_one_step_alone_is_the_known_limit():
    # Only the first step: the backward layers are back to back and nothing after them repeats;
    # nothing tells them from 12 iterations (docs/model.md, limits).
    assert [(r["period"], len(r["starts"])) for r in detect_in_sequence(np.array(FIRST))][0] == (BWD_LAYER, LAYERS)


@pytest.mark.parametrize("share, unit, way", [(0.1, 20, "adds to"), (0.2, 33, "takes from")])
def test_a_layer_of_the_first_step_is_not_planned(share, unit, way):
    # The H200 trace of GPT medium (3 steps, tests/data/gpt_medium_tensors_s10.pyobmem) cut to its
    # first 10% / 20% of records, what the daemon sees during the first step: the model's
    # iteration is a forward (20 ops, 23 repeats) / backward (33 ops, 24) layer, nothing outside
    # the layers has recurred yet, and the planner made a 40-op plan of it (at 40% of the peak the
    # daemon adopted such plans 23 times and never planned the step). Each repeat adds to (takes
    # from) the live bytes, ~22 GiB in all against at most 2.1 GiB within one: no plan. The whole
    # trace still gives the 1,640-op step.
    meta, recs = read_records(str(DATA / "gpt_medium_tensors_s10.pyobmem"))
    cap = decode_records(recs[: int(len(recs) * share)], meta)
    assert detect_iterations(cap).main_regime.period_ops == unit
    learned = planner.learn_iteration(cap, by_site=True)
    assert isinstance(learned, planner.NoPlan)
    assert learned.reason.startswith(f"no repeating iteration yet: the repeating unit of {unit} launches and copies "
                                     f"{way} the live bytes at each of its "), learned.reason
    assert learned.reason.endswith("(a layer of a longer iteration); waiting for whole iterations")
    whole = planner.learn_iteration(decode_records(recs, meta), by_site=True)
    assert isinstance(whole, planner.LearnedIteration) and whole.period == 1640


@pytest.mark.parametrize("name, share", [("jax", 0.2), ("cupy", 0.25)])
def test_an_allocator_warming_up_is_no_layer(name, share):
    # The H200 captures of the JAX and CuPy workloads cut to their first 20% / 25%: 3-4 steps
    # of 10 ops, each adding to the live bytes while the pool warms up (12 MiB in all against a
    # 10 MiB swing; 521 KiB against 0 B), a small share of the peak: still planned.
    meta, recs = read_records(str(DATA / f"{name}.pyobmem"))
    learned = planner.learn_iteration(decode_records(recs[: int(len(recs) * share)], meta), by_site=True)
    assert isinstance(learned, planner.LearnedIteration) and learned.period == 10, learned


def test_stretches_between_iterations_that_split_nothing():
    s = step()
    # A checkpoint between steps (300 copies back to back): shorter than 3 iterations.
    found = detect_in_sequence(np.array(s * 4 + [99] * 300 + s * 4))
    assert [(r["period"], len(r["starts"])) for r in found] == [(P, 8)]
    # A long one-off stretch of other kernels, each seen once: less often than the iterations.
    found = detect_in_sequence(np.array(s * 4 + list(range(300, 1300)) + s * 4))
    assert [(r["period"], len(r["starts"])) for r in found] == [(P, 8)]
    # A long evaluation loop (8 batches of the forward pass, one kernel of its own each):
    # mostly the iteration's own kernels, so not the rest of a longer iteration.
    evaluation = [1, 2] + FWD * LAYERS + [7]
    found = detect_in_sequence(np.array(s * 5 + evaluation * 8 + s * 5))
    assert sorted((r["period"], len(r["starts"])) for r in found) == [(len(evaluation), 8), (P, 10)]
