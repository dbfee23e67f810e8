"""The swap planner: from the learned iteration and a device-memory budget to a plan the shim follows.

    learned = learn_iteration(capture)                 # LearnedIteration, or NoPlan (why not)
    plan = make_plan(learned, budget_bytes)            # Plan: template keys, actions, predictions
    plan.write(control)                                # into the control file (pyobmem.control)
    plan_capture(capture, "75%")                       # both, with the budget parsed

Positions count every op of the main process (launches, graph launches, copies, sets: what the
shim counts with its op seq) from the first op of the iteration. Two clocks, ns from the
iteration's start: ``times``, when the GPU runs an op (the model's execution clock,
``pyobmem.model.saving.execution_clock``), and ``issue``, when the host issued it (its launch
time: when the shim acts). Sizes bytes; bandwidth B/s.

By concern: ``budget`` (the budget and byte sizes as the user writes them), ``learning`` (the
learned iteration: positions, clocks, live bytes, candidates and their idle windows),
``simulation`` (the cost model: copy engines, release, prefetch timing, the budget hold, the
predictions), ``policy`` (which windows the plan swaps), ``replay`` (the shim's executor replayed
on the host's clock: the plan's predicted time), ``frontier`` (the least slowdown the copy
engines allow any plan), ``plan`` (the plan the shim follows and the
model's bound on it). docs/swap.md has the formulas.
"""

from .budget import BARE_NUMBER, Budget, parse_budget, parse_size
from .learning import DEFAULT_MIN_SWAP_BYTES, LearnedIteration, NoPlan, learn_iteration, op_keys
from .plan import Plan, Swap, make_plan, plan_capture

__all__ = [
    "BARE_NUMBER", "DEFAULT_MIN_SWAP_BYTES", "Budget", "LearnedIteration", "NoPlan", "Plan", "Swap",
    "learn_iteration", "make_plan", "op_keys", "parse_budget", "parse_size", "plan_capture",
]
