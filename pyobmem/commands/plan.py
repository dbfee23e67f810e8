"""``pyobmem plan FILE --budget SIZE``: the swap plan for a capture, as a dry run.

Which blocks swap mode would move to host memory, when (after which op, prefetched before which),
the predicted peak and time ratio, or, when no plan fits, the size the job needs at one instant.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from ..errors import PyobmemError
from ..progress import Progress
from .. import abi, planner
from ..units import format_bytes, format_duration, format_iteration
from .common import _demangle_all, budget_arg, count, load, short_name, warn
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
                   help="device-memory budget: 16GiB or 16G (binary), 16GB (decimal), 500MiB, bytes, or a share of the card's memory, not of the "
                   "job's peak: 75%%, or a number up to 1 (0.75; 1: the whole card)")
    p.add_argument("--bandwidth", type=float, metavar="B/s", help="host<->device copy bandwidth, bytes/s each way (default: the capture's, else 55e9)")
    p.add_argument("--min-swap-bytes", metavar="N", help="blocks smaller than this are never swapped (default 4MiB)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--limit", type=count, default=40, metavar="N",
                   help="swapped blocks to list as text, in the order they go out (default 40; 0: all)")
    return p


def run(args) -> int:
    budget = budget_arg(args.budget)
    if args.bandwidth is not None and not (args.bandwidth > 0 and math.isfinite(args.bandwidth)):
        raise PyobmemError(f"bad --bandwidth {args.bandwidth:g}: must be a positive number of bytes/s", 2)
    min_swap = (budget_arg(args.min_swap_bytes, "--min-swap-bytes") if args.min_swap_bytes
                else planner.DEFAULT_MIN_SWAP_BYTES)
    cap = load(args.capture, say_incomplete=True)
    # The replay of candidate plans takes seconds (10-20 s on GPT medium's 1,640-op iteration): a
    # line on a terminal says what is running.
    with Progress("planning: the iteration, then candidate plans replayed on the host's clock", total=1) as p:
        plan = planner.plan_capture(cap, budget, bandwidth=args.bandwidth, min_swap_bytes=min_swap, bound=True)
        p.step()
    if isinstance(plan, planner.NoPlan):
        raise PyobmemError(f"{args.capture}: no plan: {plan.reason}", 1)
    shown = useful(plan)
    if args.json:
        print(json.dumps(plan_json(shown, cap, plan), indent=2, sort_keys=True))
    else:
        print(format_plan(shown, cap, args.capture, budget, best=plan, limit=args.limit))
    if kept_by_eviction(shown, cap):
        warn(f"no plan fits the budget {format_bytes(plan.budget_bytes)} by itself (the best reaches "
             f"{format_bytes(plan.predicted_peak)}); swap mode keeps the budget by evicting beyond it, at "
             f"{shown.predicted_time_ratio:.3f}x by the replay, which counts those evictions")
    elif not plan.feasible:
        raise PyobmemError(infeasible_message(plan, cap), 1)
    return 0


def kept_by_eviction(plan, cap) -> bool:
    """A plan over the budget by itself that swap mode still runs under it: the capture's blocks are
    tensors (what swap mode serves), no op needs more than the budget, and the shim's evictions
    beyond the plan (IDLE hints, the budget hold) are in the replay's prediction (on GPT medium at
    50% and 40% of the driver peak the runs stayed under their budgets at 1.41x and 1.73x against
    1.43x and 1.70x predicted, session 21)."""
    return (not plan.feasible and bool(plan.swaps) and plan.needed_bytes <= plan.budget_bytes
            and plan.predicted_time_ratio is not None and len(plan.actions) <= abi.PLAN_MAX_ACTIONS
            and not _tensors_hint(cap))


def useful(plan):
    """The plan to show: a plan whose swaps save nothing is worse than none (slower, no lower
    peak): its IDLE hints alone, as the daemon writes it (``Plan.hints_only``)."""
    return plan.hints_only() if plan.swaps and plan.saved_bytes <= 0 else plan


def plan_json(plan, cap, best=None) -> dict:
    """``Plan.to_json``, ``"kept_by_eviction"`` (``kept_by_eviction``) and, when the best plan found
    saved nothing, what it was (``"rejected"``: its blocks, saving and time ratio)."""
    d = plan.to_json()
    d["kept_by_eviction"] = kept_by_eviction(plan, cap)
    if best is not None and best is not plan:
        d["rejected"] = {"blocks": _swapped(best, cap), "saved_bytes": best.saved_bytes,
                         "time_ratio": round(best.time_ratio, 6), "why": "saves nothing: worse than no plan"}
    return d


def _replay_lines(plan) -> list:
    """The host-clock replay's prediction (``planner.replay``), when the plan has one."""
    r = plan.replay
    if r is None:
        return []
    return [f"              predicted {r.time_ratio:.3f}x: the shim's executor replayed on the host's clock (per "
            f"iteration: {r.drains:,} host waits for swap-outs, {format_duration(int(r.host_wait_ns))}; "
            f"{r.evictions:,} evictions beyond the plan, {r.handoffs:,} handoffs, {r.demand_ins:,} swap-ins on demand)"]


def _frontier_lines(plan) -> list:
    """The copy engines' frontier (``planner.frontier``) beside the prediction, when computed: a
    lower bound on the slowdown of any plan that keeps the budget."""
    f = plan.frontier
    if f is None:
        return []
    if f.at < 0:
        return ["  frontier    1.000x: nothing needs to go out"]
    if f.time_ratio <= 1.0:
        return [f"  frontier    1.000x: the copy engines can have every excess byte out and back in time "
                f"(at most {format_bytes(f.excess_bytes)} over the budget, at op {f.at})"]
    waits = [f"{format_duration(int(f.out_late_ns))} before it for the copies out"] if f.out_late_ns > 0 else []
    waits += [f"{format_duration(int(f.in_late_ns))} after it for the copies back"] if f.in_late_ns > 0 else []
    lines = [f"  frontier    {f.time_ratio:.3f}x at least, for any plan that keeps the budget: at op {f.at} "
             f"{format_bytes(f.excess_bytes)} must be out, and at {plan.bandwidth / 1e9:.1f} GB/s each way the GPU "
             f"waits {' and '.join(waits)} (a bound: blocks out in part, the engines doing nothing else)"]
    if plan.time_ratio < f.time_ratio:
        lines.append("              (the cost model's time above is under it: its plan does not keep the budget by itself)")
    return lines


# A capture traced without the per-tensor presets: its blocks are the frameworks' own allocations
# (segments, arenas, XLA's VMM mappings), most of which swap mode would not swap either.
NOT_TENSORS = ("; this capture's blocks are the allocators' own, not tensors: for PyTorch, JAX or TensorFlow, "
               "trace with `pyobmem run --tensor-blocks` (what swap mode does) to plan their tensors")


def _tensors_hint(cap) -> str:
    """NOT_TENSORS for a capture whose blocks are the allocators' own, else ""."""
    tensors = cap.meta.get("blocks") == "tensor" or bool(np.any(cap.blocks["kind"] == abi.AllocKind.ASYNC))
    return "" if tensors else NOT_TENSORS


def infeasible_message(plan, cap) -> str:
    """The one line for a budget no plan reaches."""
    hint = _tensors_hint(cap)
    if plan.needed_bytes > plan.budget_bytes:
        return (f"the budget {format_bytes(plan.budget_bytes)} is below what the job needs at one instant: "
                f"{format_bytes(plan.needed_bytes)} must be resident together at op "
                f"{plan.needed_at} of the iteration ({_op_name(cap, plan.needed_op_row)})" + hint)
    if plan.reach_bytes > plan.budget_bytes:
        return (f"no plan fits the budget {format_bytes(plan.budget_bytes)}: {_reach_text(plan, cap)}" + hint)
    # The job could fit (no op needs more than the budget); the planner found no plan that does.
    return (f"no plan fits the budget {format_bytes(plan.budget_bytes)}: the best plan found reaches "
            f"{format_bytes(plan.predicted_peak)} at {plan.time_ratio:.3f}x the iteration time, with copies at "
            f"{plan.bandwidth / 1e9:.1f} GB/s; its cost model allows {format_bytes(plan.reach_bytes)}, "
            f"so the limit is the planner's (docs/swap.md, \"Known limits\")")


def _reach_text(plan, cap) -> str:
    """Why no plan gets under ``reach_bytes``: what stays resident at ``reach_at``."""
    at = f"op {plan.reach_at} ({_op_name(cap, plan.reach_op_row)})"
    if plan.reach_bytes >= plan.peak_bytes:
        return (f"no plan lowers the peak of {format_bytes(plan.peak_bytes)}: at {at} no candidate block can be "
                f"off the device (each is in use there, or idle for less than its copy out and back in at "
                f"{plan.bandwidth / 1e9:.1f} GB/s)")
    return (f"no plan gets under {format_bytes(plan.reach_bytes)}: at {at} the other blocks cannot be off the "
            f"device (in use, or idle for less than a copy out and back in at {plan.bandwidth / 1e9:.1f} GB/s)")


def _op_name(cap, row: int) -> str:
    if row < 0 or row >= len(cap.ops):
        return "-"
    name = cap.kernel_name(row)
    return short_name(name, 60, _demangle_all([name]))


def _budget_text(plan, budget) -> str:
    """The budget in bytes and, for a fraction of the card, of what (the card, never the peak)."""
    text = format_bytes(plan.budget_bytes)
    if budget is not None and budget.fraction is not None:
        text += f" ({100 * budget.fraction:g}% of the card"
        if budget.fraction:
            text += f"'s {format_bytes(plan.budget_bytes / budget.fraction)}"
        text += ", not of the peak)"
    return text


def _predicted(plan, best, cap) -> list[str]:
    """The predicted lines: already fits, no plan helps (and why), or the plan's peak and saving."""
    peak = format_bytes(plan.peak_bytes)
    if not best.swaps and plan.peak_bytes <= plan.budget_bytes:
        lines = [f"already fits (peak {peak}): nothing to swap"]
        if plan.reach_bytes < plan.peak_bytes:
            lines.append(f"a budget under {peak} makes it swap, e.g. --budget {_mib(0.9 * plan.peak_bytes)} "
                         f"(90% of the peak); none under {format_bytes(plan.needed_bytes)} can be kept (what op "
                         f"{plan.needed_at} needs at once)")
        else:
            lines.append(f"a budget under {peak} makes it swap, but {_reach_text(plan, cap)}")
        return lines
    if not plan.swaps:
        if plan.needed_bytes > plan.budget_bytes:
            why = f"the budget is below the {format_bytes(plan.needed_bytes)} the job needs at op {plan.needed_at}"
        elif plan.reach_bytes > plan.budget_bytes:
            why = _reach_text(plan, cap)
        else:
            why = f"the planner found none that lowers the peak (its cost model allows {format_bytes(plan.reach_bytes)})"
        lines = [f"none: {why}"]
        if best is not plan:
            blocks = _swapped(best, cap)
            lines.append(f"the best one found swaps {len(blocks)} blocks ({', '.join(blocks)}) and saves 0 B at "
                         f"{best.time_ratio:.3f}x: worse than none, so none is shown")
        return lines
    fit = "fits" if plan.feasible else ("over the budget by itself: the shim evicts beyond it"
                                        if kept_by_eviction(plan, cap) else "does not fit")
    return [f"{format_bytes(plan.predicted_peak)} peak ({fit}), "
            f"saving {format_bytes(plan.saved_bytes)} (model bound at this slowdown: {format_bytes(plan.bound_bytes)})"]


def _swapped(plan, cap) -> list[str]:
    """The blocks a plan swaps, as every verb names them, in the plan's order."""
    return list(dict.fromkeys(cap.block_label(s.block) for s in plan.swaps))


def _blocks(n: int) -> str:
    return f"{n:,} block{'' if n == 1 else 's'}"


def _mib(n: float) -> str:
    return f"{int(n) >> 20}MiB"


def format_plan(plan, cap, path: str, budget=None, best=None, limit: int = 0) -> str:
    """The plan as text; ``best``: the plan the planner found when ``plan`` is what is shown
    instead (``useful``)."""
    best = plan if best is None else best
    pred = _predicted(plan, best, cap)
    excluded = [f"{_blocks(n)}: {why} ({format_bytes(b)})" for why, (n, b) in plan.excluded.items()] or ["none"]
    n_it = plan.iterations
    out = [
        f"Swap plan for {path} (pid {plan.pid})",
        f"  planned     {format_iteration(plan.step, plan.steps)}: {plan.period:,} ops (launches, copies and "
        f"sets), {format_duration(int(plan.iteration_ns))} ({plan.matching} of {n_it} iterations issue exactly these ops)",
        f"  budget      {_budget_text(plan, budget)}; copies at {plan.bandwidth / 1e9:.1f} GB/s each way; "
        f"blocks under {format_bytes(plan.min_swap_bytes)} stay",
        f"  peak        {format_bytes(plan.peak_bytes)} without swapping, at op {plan.peak_at}",
        f"  candidates  {_blocks(plan.candidates[0])}, {format_bytes(plan.candidates[1])}",
        f"  excluded    {excluded[0]}",
        *[f"              {e}" for e in excluded[1:]],
        f"  needs       at least {format_bytes(plan.needed_bytes)} resident at op {plan.needed_at}, whatever the plan "
        f"(every idle window out, copies free)",
        f"  reachable   at best {format_bytes(plan.reach_bytes)} at op {plan.reach_at} (each idle window out as long "
        f"as its copies allow, the budget hold waiting for swap-outs)",
        f"  predicted   {pred[0]}",
        *[f"              {p}" for p in pred[1:]],
        f"  time        {plan.time_ratio:.3f}x the iteration by the cost model (GPU time, memory at the GPU's time; "
        f"prefetch stalls {format_duration(int(plan.stall_ns))} per iteration)"
        + ("" if plan.replay is not None else "; the prediction"),
        *_replay_lines(plan),
        *_frontier_lines(best),
        f"  swapped     {len({s.block for s in plan.swaps})} blocks, {format_bytes(plan.swapped_bytes)}; "
        f"{plan.n_actions:,} actions per iteration, {plan.n_hints:,} idle hints for eviction",
    ]
    if plan.swaps:
        swaps = sorted(plan.swaps, key=lambda s: (s.out_at, s.block))
        listed = swaps if limit <= 0 else swaps[:limit]
        rows = [[cap.block_label(s.block), hex(s.addr), format_bytes(s.size), s.out_at, s.prefetch_at, s.next_at,
                 s.absent, format_duration(int(s.stall_ns))] for s in listed]
        out += ["", table(rows, ["block", "address", "size", "out after op", "prefetch before op", "next use", "ops out", "stall"])]
        if len(listed) < len(swaps):
            out.append(f"  ... {len(swaps) - len(listed)} more swaps (--limit 0, --json)")
    return "\n".join(out)
