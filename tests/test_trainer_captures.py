"""The iteration is the training step, on real captures recorded on the H200 (tests/data/trainer_*):
scripts/workloads/trainer.py (a CNN, DataLoader workers, AdamW, no per-step sync), 30 optimizer
steps each, run with ``--deterministic`` and

    log_every_10   --log-every 10                  reads the loss back at steps 10, 20, 30
    eval_every_25  --log-every 10 --eval-every 25  ... and evaluates 4 batches after step 25
    grad_accum_4   --grad-accum 4 --log-every 10   4 forward/backward micro-steps per optimizer step
    plain          --log-every 0                   reads the loss back after the last step only

Before issue 10 these gave "no repeating pattern", 89 x 26 with the evaluation as a regime of its
own, a 97-op micro-step x 90, and 89 x 29. The true ops per optimizer step come from torch.profiler
on an untraced run of the same command with ``--count-ops`` (trainer_*.count.json: GPU kernels and
copies, memsets apart). Step 0 deviates in every variant: it initialises the optimizer state (32
more ops)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pyobmem import planner
from pyobmem.capture import read_capture
from pyobmem.cli import main
from pyobmem.model import analyse

DATA = os.path.join(os.path.dirname(__file__), "data")
VARIANTS = ("log_every_10", "eval_every_25", "grad_accum_4", "plain")
# variant: (ops per step, micro-step (ops, count) or None, deviating iterations, their ops)
EXPECTED = {
    "log_every_10": (89, None, [0, 9, 19, 29], [121, 90, 90, 90]),
    "eval_every_25": (89, None, [0, 9, 19, 24, 29], [121, 90, 90, 208, 90]),
    "grad_accum_4": (380, (97, 4), [0, 9, 19, 29], [412, 381, 381, 381]),
    "plain": (89, None, [0, 29], [121, 90]),
}


def _load(name: str, ext: str) -> dict:
    with open(os.path.join(DATA, f"trainer_{name}.{ext}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def analyses():
    return {v: analyse(read_capture(os.path.join(DATA, f"trainer_{v}.pyobmem")), progress=False) for v in VARIANTS}


def _asides(w: dict) -> list:
    """Iterations (0-based optimizer steps) after which the workload reads a result back: the
    logged steps and the evaluations, from its arguments (trainer.py's loop)."""
    steps, log, ev = w["steps"], w["log_every"], w["eval_every"]
    return [i for i in range(steps)
            if (log and (i + 1) % log == 0) or i == steps - 1 or (ev and (i + 1) % ev == 0)]


@pytest.mark.parametrize("name", VARIANTS)
def test_iteration_is_the_optimizer_step(analyses, name):
    it = analyses[name].iterations
    ops, micro, deviating, lengths = EXPECTED[name]
    w, counted = _load(name, "workload"), _load(name, "count")
    assert len(it.regimes) == 1
    r = it.main_regime
    # detected ops per step = ops per optimizer step counted by torch.profiler without pyobmem
    assert r.period_ops == ops == counted["ops_per_step"]
    assert (r.micro_period_ops, r.micro_steps) == (micro if micro else (None, 1))
    assert r.count == w["steps"] == 30 and r.phase == "aside"
    rows = it.step_rows()
    assert np.flatnonzero(it.deviating[rows]).tolist() == deviating
    assert (it.end_seq - it.start_seq)[rows][deviating].tolist() == lengths
    assert it.n_deviating == r.deviating == len(deviating)
    # the deviating iterations are the warm-up step and the steps that read a result back
    assert deviating == [0] + _asides(w)
    # the iterations tile the stream from the first step on; the others hold exactly one step
    assert np.all(it.end_seq[rows][:-1] == it.start_seq[rows][1:])
    ok = np.setdiff1d(np.arange(len(rows)), deviating)
    assert np.all(it.end_seq[rows][ok] - it.start_seq[rows][ok] == ops) and np.all(it.match[rows][ok] == 1.0)


def test_micro_steps_of_gradient_accumulation(analyses):
    # 4 micro-steps of 97 ops each but the first (81: PyTorch assigns the gradients there, then
    # adds to them), then the optimizer (8 foreach kernels): 81 + 3 * 97 + 8 = 380.
    r = analyses["grad_accum_4"].iterations.main_regime
    assert (r.period_ops, r.micro_period_ops, r.micro_steps) == (380, 97, 4)
    assert 380 - 3 * 97 == 89 == EXPECTED["plain"][0]  # the first micro-step and the optimizer: a plain step


@pytest.mark.parametrize("name", VARIANTS)
def test_model_and_planner_use_the_template_iterations(analyses, name):
    a = analyses[name]
    it, bm = a.iterations, a.blocks
    dev = np.flatnonzero(it.deviating)
    main = it.main_rows()
    assert len(main) == 30 - len(EXPECTED[name][2]) and not np.any(np.isin(main, dev))
    # accesses inside a deviating iteration (its aside, the warm-up) belong to no iteration
    acc_ops = bm.acc_op[bm.acc_iter >= 0]
    k = np.searchsorted(it.start_op, acc_ops, side="right") - 1
    assert not np.any(it.deviating[k])
    assert a.saving is not None and int(main[a.saving.iteration]) not in dev
    learned = planner.learn_iteration(a.capture, it=it, bm=bm)
    assert isinstance(learned, planner.LearnedIteration)
    assert learned.iteration_row in main and len(learned.keys) >= EXPECTED[name][0]
    assert learned.iterations == len(main)


@pytest.mark.parametrize("name", VARIANTS)
def test_stats_and_summary_show_the_step(name, capsys):
    p = os.path.join(DATA, f"trainer_{name}.pyobmem")
    ops, micro, deviating, _ = EXPECTED[name]
    assert main(["stats", "--json", p]) == 0
    out = capsys.readouterr().out
    d = json.loads(out[out.index("{"):])
    assert (d["period_ops"], d["iterations_found"], d["deviating_iterations"]) == (ops, 30, len(deviating))
    assert [i["deviating"] for i in d["iterations"]].count(True) == len(deviating)
    assert main(["summary", p]) == 0
    out = capsys.readouterr().out
    micro_text = f" ({micro[1]} micro-steps of {micro[0]})" if micro else ""
    assert f"{ops} ops per iteration{micro_text}," in out
    assert f"(30 iterations, {len(deviating)} deviating," in out
