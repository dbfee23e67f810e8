"""``pyobmem patterns FILE``: memory inefficiencies per block, largest first: early allocation,
late free, long idle, never accessed, leaked (never freed and unused at the end) (``--json``: the same as a list of dicts).

``patterns_dict(analysis, ...)`` does the computation; ``format_patterns`` the text.
"""

from __future__ import annotations

import argparse
import json
import textwrap

from ..model import analyse
from ..model.inefficiency import IDLE_PCT, KINDS, SLACK_PCT
from ..units import format_bytes, format_duration
from .common import _demangle_all, count, load, percent, short_name, terminal_width
from .stats import NO_ITERATION, drops_dict, table

NAME = "patterns"
EXPLAIN = {
    "early-allocation": "allocated long before its first access",
    "late-free": "freed long after its last access",
    "long-idle": "idle for a long part of the iteration (a swap candidate)",
    "never-accessed": "allocated and never touched by a kernel or copy",
    "leaked": "never freed and no longer used at the end (not in the last two iterations)",
}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="memory inefficiencies per block: early allocation, late free, long idle, never accessed, leaks",
        description="List memory inefficiencies per block, largest first: allocated long before the "
        "first access, freed long after the last, idle for a long part of the iteration, never "
        "accessed, never freed and no longer used at the end of the run (a block still used in the last "
        "iterations is held on purpose: PyTorch's caching allocator keeps its segments to exit). Blocks "
        "allocated afresh every iteration at the same place are listed once with their count.",
    )
    p.add_argument("capture", metavar="FILE", help="a .pyobmem capture")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--slack-pct", type=percent, default=SLACK_PCT, metavar="PCT",
                   help=f"early allocation / late free: more than PCT%% of an iteration (default {SLACK_PCT:g})")
    p.add_argument("--idle-pct", type=percent, default=IDLE_PCT, metavar="PCT",
                   help=f"long idle: an idle interval over PCT%% of an iteration (default {IDLE_PCT:g})")
    p.add_argument("--kind", choices=KINDS, action="append", help="only these kinds (repeatable)")
    p.add_argument("--limit", type=count, default=50, metavar="N",
                   help="findings to print as text (default 50; 0: all)")
    return p


def run(args) -> int:
    a = analyse(load(args.capture))
    d = patterns_dict(a, slack_pct=args.slack_pct, idle_pct=args.idle_pct, kinds=args.kind)
    print(json.dumps(d, indent=2, sort_keys=True) if args.json else format_patterns(d, limit=args.limit))
    return 0


def patterns_dict(a, slack_pct: float = SLACK_PCT, idle_pct: float = IDLE_PCT, kinds=None) -> dict:
    """Findings as JSON values: sizes B, times ns, positions % of the iteration; ``block``: the
    block as every verb names it (``pid:id``, the first instance), ``row``: its capture row."""
    cap = a.capture
    found = a.findings(slack_pct=slack_pct, idle_pct=idle_pct)
    if kinds:
        found = [f for f in found if f.kind in kinds]
    rows = []
    for f in found:
        d = f.as_dict()
        d["row"] = d.pop("block")  # the capture's block row; "block" is the id every verb shows
        d["block"] = cap.block_label(f.block)
        d["block_id"] = int(cap.blocks["block_id"][f.block])
        d["pid"] = int(cap.blocks["pid"][f.block])
        d["kernel_before"] = cap.kernel_name(f.kernel_before) if f.kernel_before >= 0 else None
        d["kernel_after"] = cap.kernel_name(f.kernel_after) if f.kernel_after >= 0 else None
        rows.append(d)
    return {
        "capture": cap.path,
        "iteration_ns": a.iterations.iteration_ns,
        "message": None if a.iterations.main >= 0 else NO_ITERATION,
        "drops": drops_dict(cap),
        "complete": cap.complete,
        "thresholds": {"slack_pct": slack_pct, "idle_pct": idle_pct},
        "findings": rows,
    }


def _where(f) -> str:
    if f["start_pct"] is None and f["end_pct"] is None:
        return "-"
    s = "?" if f["start_pct"] is None else f"{f['start_pct']:.0f}%"
    e = "?" if f["end_pct"] is None else f"{f['end_pct']:.0f}%"
    return f"{s}..{e}"


def _for(x) -> str:
    """How long the waste lasts, with its share of an iteration (or iterations, past one)."""
    text = format_duration(x["wasted_ns"], digits=3)
    share = x["iteration_share"]
    if share is None:
        return text
    if share < 1:
        return f"{text} ({100 * share:.0f}% it)"
    return f"{text} ({share:.1f} it)" if share < 10 else f"{text} ({share:.0f} it)"


def format_patterns(d: dict, limit: int = 50, width: int | None = None) -> str:
    """The findings as text; ``limit`` rows (0: all), kernel names cut to fit ``width`` columns
    (default: the terminal's)."""
    out = [f"capture {d['capture']}"]
    if d["message"]:
        out.append(f"{d['message']}: thresholds are relative to the capture's span, positions n/a")
    else:
        out.append(f"iteration {format_duration(d['iteration_ns'], digits=3)}; positions are % of the iteration")
    if d["drops"]["dropped"]:
        out.append(f"warning: {d['drops']['dropped']} events were dropped; findings may be wrong near "
                   f"ops {d['drops'].get('first_op', '?')}..{d['drops'].get('last_op', '?')} ({d['drops']['hint']})")
    if not d["complete"]:
        out.append("note: the capture was cut short, so 'leaked' means 'unused and not freed before the cut'")
    f = d["findings"]
    if not f:
        out.append("no inefficiency found")
        return "\n".join(out)
    shown = f if limit <= 0 else f[:limit]
    width = terminal_width() if width is None else width
    head = ["kind", "block", "bytes", "instances", "class", "for", "where"]
    cells = [[x["kind"], x["block"], format_bytes(x["bytes"], digits=2), x["instances"], x["cls"], _for(x), _where(x)]
             for x in shown]
    used = sum(max(len(str(h)), *(len(str(r[i])) for r in cells)) + 2 for i, h in enumerate(head)) + 2
    room = max(width - used, 24)
    names = [n for x in shown for n in (x["kernel_before"], x["kernel_after"]) if n]
    dem = _demangle_all(names)
    for r, x in zip(cells, shown):
        b, a = x["kernel_before"], x["kernel_after"]
        if b and a:
            half = (room - 4) // 2
            r.append(f"{short_name(b, half, dem)} -> {short_name(a, room - 4 - half, dem)}")
        else:
            r.append(short_name(b or a or "", room, dem))
    out.append("")
    out.append(table(head + ["after / before kernel"], cells))
    if len(f) > len(shown):
        out.append(f"  ... {len(f) - len(shown)} more (--limit, --json)")
    out += [""] + textwrap.wrap("block: pid:block id, as in every verb (the first instance when there are several); "
                                "kinds: " + "; ".join(f"{k}: {v}" for k, v in EXPLAIN.items()), width)
    return "\n".join(out)
