"""``pyobmem plan FILE --budget SIZE``: the swap plan for a capture, as a dry run.

Which blocks swap mode would move to host memory, when (after which op, prefetched before which),
the predicted peak and time ratio, or, when no plan fits, the size the job needs at one instant.
"""

from __future__ import annotations

import argparse
import json
import math

from ..errors import PyobmemError
from .. import planner
from ..units import format_bytes, format_duration
from .common import _demangle_all, budget_arg, load, short_name
from .summary import table

NAME = "plan"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME, help="dry-run the swap planner on a capture under a memory budget",
        description="Plan swap mode on a capture: which blocks would be swapped out and prefetched, when, "
        "the predicted peak and slowdown, or the size the job needs at one instant when no plan fits.",
        epilog="example: pyobmem plan train.pyobmem --budget 12GiB",
    )
    p.add_argument("capture", metavar="FILE", help="a .pyobmem capture")
    p.add_argument("--budget", required=True, metavar="SIZE",
                   help="device-memory budget: 16GiB, 500MiB, bytes, or a fraction of the card (0.75, 75%%)")
    p.add_argument("--bandwidth", type=float, metavar="B/s", help="host<->device copy bandwidth, bytes/s each way (default: the capture's, else 55e9)")
    p.add_argument("--min-swap-bytes", metavar="N", help="blocks smaller than this are never swapped (default 4MiB)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def run(args) -> int:
    budget = budget_arg(args.budget)
    if args.bandwidth is not None and not (args.bandwidth > 0 and math.isfinite(args.bandwidth)):
        raise PyobmemError(f"bad --bandwidth {args.bandwidth:g}: must be a positive number of bytes/s", 2)
    min_swap = (budget_arg(args.min_swap_bytes, "--min-swap-bytes") if args.min_swap_bytes
                else planner.DEFAULT_MIN_SWAP_BYTES)
    cap = load(args.capture, say_incomplete=True)
    plan = planner.plan_capture(cap, budget, bandwidth=args.bandwidth, min_swap_bytes=min_swap, bound=True)
    if isinstance(plan, planner.NoPlan):
        raise PyobmemError(f"{args.capture}: no plan: {plan.reason}", 1)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2, sort_keys=True))
    else:
        print(format_plan(plan, cap, args.capture, budget))
    if not plan.feasible:
        raise PyobmemError(infeasible_message(plan, cap), 1)
    return 0


def infeasible_message(plan, cap) -> str:
    """The one line for a budget no plan reaches."""
    if plan.needed_bytes > plan.budget_bytes:
        return (f"the budget {format_bytes(plan.budget_bytes)} is below what the job needs at one instant: "
                f"{format_bytes(plan.needed_bytes)} must be resident together at op "
                f"{plan.needed_at} of the iteration ({_op_name(cap, plan)})")
    # The job could fit (no op needs more than the budget); the planner found no plan that does.
    return (f"no plan fits the budget {format_bytes(plan.budget_bytes)}: the best plan found reaches "
            f"{format_bytes(plan.predicted_peak)} at {plan.time_ratio:.3f}x the iteration time, with copies at "
            f"{plan.bandwidth / 1e9:.1f} GB/s; no op needs more than {format_bytes(plan.needed_bytes)} resident, "
            f"so the limit is the planner's (docs/swap.md, \"Known limits\")")


def _op_name(cap, plan) -> str:
    if plan.needed_op_row < 0:
        return "-"
    name = cap.kernel_name(plan.needed_op_row)
    return short_name(name, 60, _demangle_all([name]))


def _budget_text(plan, budget) -> str:
    """The budget in bytes and, for a fraction of the card, of what."""
    text = format_bytes(plan.budget_bytes)
    if budget is not None and budget.fraction is not None:
        text += f" ({100 * budget.fraction:g}% of the card"
        if budget.fraction:
            text += f"'s {format_bytes(plan.budget_bytes / budget.fraction)}"
        text += ")"
    return text


def format_plan(plan, cap, path: str, budget=None) -> str:
    out = [
        f"Swap plan for {path} (pid {plan.pid})",
        f"  iteration   {plan.period:,} ops (launches, copies and sets), {format_duration(int(plan.iteration_ns))} "
        f"({plan.matching} of {plan.iterations} iterations issue exactly these ops)",
        f"  budget      {_budget_text(plan, budget)}; copies at {plan.bandwidth / 1e9:.1f} GB/s each way; "
        f"blocks under {format_bytes(plan.min_swap_bytes)} stay",
        f"  peak        {format_bytes(plan.peak_bytes)} without swapping, at op {plan.peak_at}",
        f"  predicted   {format_bytes(plan.predicted_peak)} peak ({'fits' if plan.feasible else 'does not fit'}), "
        f"saving {format_bytes(plan.saved_bytes)} (model bound at this slowdown: "
        f"{format_bytes(plan.bound_bytes)})",
        f"  time        {plan.time_ratio:.3f}x the iteration (stalls {format_duration(int(plan.stall_ns))} per iteration)",
        f"  needs       at least {format_bytes(plan.needed_bytes)} resident at op {plan.needed_at}, whatever the plan",
        f"  swapped     {len({s.block for s in plan.swaps})} blocks, {format_bytes(plan.swapped_bytes)}; "
        f"{plan.n_actions:,} actions per iteration, {plan.n_hints:,} idle hints for eviction",
    ]
    if plan.swaps:
        rows = [[s.block, hex(s.addr), format_bytes(s.size), s.out_at, s.prefetch_at, s.next_at, s.absent,
                 format_duration(int(s.stall_ns))] for s in plan.swaps]
        out += ["", table(rows, ["block", "address", "size", "out after op", "prefetch before op", "next use", "ops out", "stall"])]
    return "\n".join(out)
