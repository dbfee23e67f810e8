"""What the report shows of the model's Analysis (pyobmem.model) beyond drawing it: the property
rows with their definitions and the thresholds at which the report says a property holds
(``property_rows``), and the swap candidates table (``candidates``). Definitions and formulas are
the model's (docs/model.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import planner
from ..model import CLASSES, Analysis
from ..units import format_bytes

DEFINITIONS = {
    "iterative": "Memory is accessed the same way in every iteration. Value (tensor level): share of the "
                 "reuse intervals (two consecutive accesses of one sub-block: the (segment, offset) a kernel "
                 "argument points at) that recur between the same two positions of the iteration in 90% of "
                 "the iterations, wherever the allocator put the tensor. Holds at 0.9 or more.",
    "regular": "The idle intervals have the same length every iteration. Value: mean over the recurring "
               "reuse intervals of 1 - min(CV, 1), CV the coefficient of variation of its length in ns "
               "across iterations (launch times, so host jitter counts). Holds at 0.9 or more.",
    "extremal": "A few long idle intervals hold most of the idle time (while most intervals are short), so "
                "swapping in those few windows saves nearly all there is. Value: share of all idle time in "
                "the longest 10% of the intervals. Holds at 0.5 or more.",
}
THRESHOLD = {"iterative": 0.9, "regular": 0.9, "extremal": 0.5}


@dataclass(frozen=True)
class Property:
    """One property of the access pattern: whether it holds, its measured value, its definition."""

    name: str
    holds: bool | None  # None: not measurable (no iteration found)
    value: float | None
    definition: str
    detail: str = ""


def property_rows(pr) -> list[Property]:
    """The model's Properties as the report's rows (None values: not measurable)."""
    seg = pr.segment
    sl = (lambda v: "-" if seg is None else _f(v(seg)))  # noqa: E731
    values = {
        "iterative": (pr.iterative_intervals if pr.iterative_intervals is not None else pr.iterative_bytes,
                      f"address-stable sub-blocks: {_f(pr.iterative_blocks)} of them, {_f(pr.iterative_bytes)} "
                      f"of their bytes; block level: {sl(lambda p: p.iterative_bytes)} of bytes"),
        "regular": (pr.regular, f"{pr.n_groups} interval groups; block level: {sl(lambda p: p.regular)}"),
        "extremal": (pr.extremal_top, f"Gini of idle interval lengths: {_f(pr.extremal_gini)}; "
                                      f"{pr.n_intervals} intervals; block level: {sl(lambda p: p.extremal_top)}"),
    }
    out = []
    for name, (v, detail) in values.items():
        holds = None if v is None else bool(v >= THRESHOLD[name])
        out.append(Property(name, holds, None if v is None else float(v), DEFINITIONS[name], detail))
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def candidates(a: Analysis, top: int = 15) -> list[dict]:
    """The blocks the saving bound swaps, in the order its greedy takes them (the first ones give
    the most peak per stall): size, class, accesses in the iteration, longest idle interval there,
    ``windows`` (greedy steps that took it: a window across the iteration's end is taken on each
    side), ``sub`` (a sub-block, at ``offset``, not the whole block), ``plan`` (what ``pyobmem plan`` may
    do with the block), ``out_ns`` (time out within the analysed iteration), copy time out + in, total stall,
    ``from_ratio`` (the slowdown from which the bound takes it: 1 + stalls so far / T, or the copy
    time so far / T). ``a``: the model's Analysis; no candidates without a saving bound."""
    capture, sav = a.capture, a.saving
    if sav is None:
        return []
    blocks = capture.blocks
    w0, w1 = a.window
    out: dict[int, dict] = {}
    subs = sav.step_sub.tolist() if sav.step_sub is not None else [-1] * len(sav.step_block)
    sizes = sav.step_size.tolist() if sav.step_size is not None else [None] * len(sav.step_block)
    T = max(float(sav.iteration_ns), 1.0)
    ratio = np.maximum(1 + np.cumsum(sav.step_stall_ns) / T, np.cumsum(sav.step_copy_ns) / T).tolist()
    tm = a.tensors
    for b, sub, size, copy, stall, (s, e), r in zip(sav.step_block.tolist(), subs, sizes, sav.step_copy_ns.tolist(),
                                                    sav.step_stall_ns.tolist(), sav.step_out.tolist(), ratio):
        c = out.get((b, sub))
        if c is None:
            if len(out) >= top:
                continue
            t = a.accesses_of(b)
            inside = t[(t >= w0) & (t < w1)]
            gaps = np.diff(np.r_[t[(t < w0)][-1:], inside, t[t >= w1][:1]])
            cls = str(a.block_class[b]) if sub < 0 or tm is None else CLASSES[int(tm.cls[sub])]
            c = out[(b, sub)] = {"row": b, "block": capture.block_label(b), "block_id": int(blocks["block_id"][b]),
                                 "size": int(blocks["size"][b]) if size is None else int(size),
                                 "offset": 0 if sub < 0 or tm is None else int(tm.start[sub]),
                                 "class": cls, "accesses": int(len(inside)),
                                 "longest_idle_ns": int(gaps.max()) if len(gaps) else 0, "copy_ns": 0, "stall_ns": 0,
                                 "out_ns": 0, "windows": 0, "from_ratio": round(max(r, 1.0), 3)}
        c["copy_ns"] += int(2 * copy)
        c["stall_ns"] += int(stall)
        c["out_ns"] += max(int(min(e, w1) - max(s, w0)), 0)
        c["windows"] += 1
    in_plan = _plan_view(capture, a)
    for c in out.values():
        c["fits"] = c["stall_ns"] == 0
        c["sub"] = c["offset"] > 0 or c["size"] < int(blocks["size"][c["row"]])
        c["plan"] = in_plan(c["row"], c["sub"])
    return list(out.values())


def _plan_view(capture, a: Analysis):
    """A function (block row, is a sub-block) -> what ``pyobmem plan`` may do with that block:
    the planner's candidates and, for the others, its reason (``LearnedIteration.reason_of``)."""
    L = planner.learn_iteration(capture, it=a.iterations, bm=a.blocks)
    if isinstance(L, planner.NoPlan):
        return lambda row, sub: f"no plan: {L.reason}"
    cands = set(L.cand_block.tolist())

    def view(row: int, sub: bool) -> str:
        if row in cands:
            return f"may swap the whole {format_bytes(int(capture.blocks['size'][row]))} block" if sub else "may swap it"
        return f"no: {L.reason_of.get(row, 'not of the planned process')}"

    return view
