"""Iteration detection on synthetic kernel sequences: warm-up, an evaluation step in the middle,
gradient accumulation, a smaller last batch, a change of pattern; then on a capture."""

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.model.iterations import detect_in_sequence, detect_iterations, micro_step

from synth import Trace

# A GPT-like step: embedding, 12 layers forward (10 kernels each), loss, 12 layers backward
# (15 kernels each), 20 optimizer kernels: 325 kernels, the layers repeating inside the step.
FWD, BWD = list(range(10, 20)), list(range(20, 35))
STEP = [1, 2] + FWD * 12 + [3, 4] + BWD * 12 + [5] + list(range(40, 60))
P = len(STEP)
WARMUP = [1, 2, 99] + FWD * 12 + [3, 4] + BWD * 12 + [98] * 5  # cudnn tuning, optimizer state init
EVAL = [1, 2] + FWD * 12 + [7]


def regimes(seq):
    return [(r["period"], len(r["starts"])) for r in detect_in_sequence(np.array(seq))]


def test_plain_steps():
    (r,) = detect_in_sequence(np.array(STEP * 7))
    assert r["period"] == P and list(r["starts"]) == [i * P for i in range(7)] and min(r["scores"]) == 1.0


def test_warmup_and_eval_in_the_middle():
    seq = WARMUP + STEP * 5 + EVAL + STEP * 6
    (r,) = detect_in_sequence(np.array(seq))
    w = len(WARMUP)
    assert r["period"] == P and len(r["starts"]) == 11
    assert list(r["starts"][:5]) == [w + i * P for i in range(5)]
    after = w + 5 * P + len(EVAL)
    assert list(r["starts"][5:]) == [after + i * P for i in range(6)]


def test_short_eval_loop_is_an_aside():
    # 4 evaluation batches after step 5 (less than 3 steps' worth): part of that step's
    # iteration, which deviates; they are no regime of their own (a longer one is, see
    # test_model_iterations_layers.py).
    seq = STEP * 5 + EVAL * 4 + STEP * 5
    (r,) = detect_in_sequence(np.array(seq))
    assert r["period"] == P and len(r["starts"]) == 10
    assert list(r["ends"] - r["starts"]) == [P] * 4 + [P + 4 * len(EVAL)] + [P] * 5


def test_gradient_accumulation():
    micro = [1, 2] + list(range(10, 40)) + [3] + list(range(40, 70))  # 63 kernels
    step = micro * 4 + list(range(80, 100))  # then the optimizer
    (r,) = detect_in_sequence(np.array(WARMUP + step * 8))
    assert r["period"] == 4 * 63 + 20 and len(r["starts"]) == 8
    assert micro_step(r["template"]) == (63, 4)
    assert micro_step(np.array(STEP)) == (None, 1)  # layers are not micro-steps


def test_smaller_last_batch():
    last = list(STEP)
    for i in range(2, 2 + 12 * 10, 10):  # other GEMM kernels for the smaller shapes: 12 of 325 change
        last[i] = 200
    for i in range(P - 60, P - 40):
        last[i] = 201
    (r,) = detect_in_sequence(np.array(STEP * 6 + last))
    assert len(r["starts"]) == 7 and r["scores"][-1] == (P - 32) / P


def test_change_of_pattern():
    a = list(range(0, 40))
    b = list(range(0, 20)) + list(range(100, 136))  # e.g. layers frozen after some steps
    assert sorted(regimes(a * 10 + b * 10)) == [(40, 10), (56, 10)]


def test_no_iteration():
    assert regimes(list(range(50))) == []
    assert regimes(STEP * 2) == []  # fewer than 3 copies: no period


def test_long_stream_is_fast():
    import time

    seq = np.array(WARMUP + STEP * 3000)
    t = time.perf_counter()
    (r,) = detect_in_sequence(seq)
    assert r["period"] == P and len(r["starts"]) == 3000
    assert time.perf_counter() - t < 10


def test_capture_phase_follows_the_pause_and_the_main_process(tmp_path):
    tr = Trace(dt_ns=1000)
    b = tr.alloc(1 << 20)
    kernels = [0x10, 0x11, 0x12, 0x13, 0x14]
    for i in range(6):
        tr.t += 50_000  # the pause while the host waits (loss.item()) before the next step
        for k in kernels:
            tr.launch(k, [b])
        tr.add(abi.Ev.LAUNCH, pid=200, op=1000 + i, function=0x99)  # a second process, fewer launches
    tr.write(tmp_path / "c.pyobmem")
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    it = detect_iterations(cap)
    assert it.pid == 100 and it.count == 6 and it.main_regime.phase == "gap"
    assert [cap.kernel_name(int(r)) for r in it.start_op] == ["kernel 0x10"] * 6
    assert list(it.end_op[:-1]) == list(it.start_op[1:])  # contiguous, the other pid's op inside
    assert it.end_op[-1] == len(cap.ops)  # no launch of pid 100 after the last iteration


# A training loop without a per-step sync: input copy (id 8), forward and backward (10..69), the
# optimizer (70..77); every 10th step it reads the loss back after the optimizer (id 9, a
# device-to-host copy); the first step also initialises the optimizer state (id 98, 6 fills).
FWD_BWD, OPTIMIZER = [8] + list(range(10, 70)), list(range(70, 78))
TRAIN = FWD_BWD + OPTIMIZER
READ_BACK = 9
DTOH = np.zeros(100, bool)
DTOH[READ_BACK] = True


def training_loop(steps: int, log_every: int, step=TRAIN, first=None) -> list:
    seq = []
    for i in range(steps):
        seq += (first if i == 0 and first else step)
        if (i + 1) % log_every == 0 or i == steps - 1:
            seq.append(READ_BACK)
    return seq


@pytest.mark.parametrize("steps", [30, 200])
def test_logging_every_n_steps_is_an_aside(steps):
    # Before: period 10 steps + 1 (200 steps), or no period at all (30: fewer than 3 copies).
    first = FWD_BWD + [98] * 6 + OPTIMIZER
    (r,) = detect_in_sequence(np.array(training_loop(steps, 10, first=first)), dtoh_ids=DTOH)
    P = len(TRAIN)
    assert r["period"] == P and len(r["starts"]) == steps
    assert list(r["template"][:2]) == [8, 10]  # the iteration starts at the input copy, after the aside
    lengths = r["ends"] - r["starts"]
    logged = [i for i in range(steps) if (i + 1) % 10 == 0 or i == steps - 1]
    assert lengths[0] == P + 6 and all(lengths[logged] == P + 1)
    assert np.count_nonzero(lengths != P) == len(set(logged) | {0})


def test_accumulated_micro_steps_are_no_step():
    # 4 micro-steps (the first without the 8 gradient additions, ids 80..87), then the optimizer;
    # the loss read back every 10 optimizer steps. The micro-steps repeat most of the stream, but
    # between their runs the optimizer reads nothing back: it is the rest of the step.
    micro = FWD_BWD + list(range(80, 88))
    step = FWD_BWD + micro * 3 + OPTIMIZER
    (r,) = detect_in_sequence(np.array(training_loop(30, 10, step=step)), dtoh_ids=DTOH)
    assert r["period"] == len(step) and len(r["starts"]) == 30
    assert micro_step(r["template"]) == (len(micro), 4)
    # without the copy kinds nothing tells a logging aside from the optimizer: the steps and the
    # read-back make one iteration of 10 steps
    (r,) = detect_in_sequence(np.array(training_loop(200, 10, step=step)))
    assert r["period"] == 10 * len(step) + 1
