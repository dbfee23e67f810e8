"""The live view's screen: ``render(status, figures, console, log_lines) -> rich renderable``.

Panels, top to bottom: the capture and its state; device memory by block class beside the
iteration and drops; the largest live blocks; in swap mode the budget line, swaps and late swap-ins; the
last lines of the command's log (``pyobmem-run --live``); the keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..units import format_bytes, format_duration
from .figures import Figures

CLASS_STYLE = {"persistent": "blue", "iteration-scoped": "green", "transient": "yellow", "arena": "magenta",
               "never-accessed": "red", "other": "white"}
SPARK = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 20
WIDE = 100  # columns from which memory and iteration stand side by side
QUIET_S = 5.0  # an incomplete capture with nothing new for this long may have been cut short


@dataclass(frozen=True)
class Status:
    """The state of the reading, beside the figures: ``path``; ``waiting`` (no whole header yet);
    ``records`` and ``size`` (B) read so far; ``behind`` (bytes in the file not read yet);
    ``quiet_s`` (seconds since new records last arrived; None: none yet); ``log`` (the command's
    log file, or None); ``updating`` (records arrived that the figures do not show yet);
    ``error`` (one line: the model failed on the records read)."""

    path: str
    waiting: bool = False
    records: int = 0
    size: int = 0
    behind: int = 0
    quiet_s: float | None = None
    log: str | None = None
    updating: bool = False
    error: str | None = None



def render(st: Status, f: Figures | None, console, log_lines: list[str] = (), interactive: bool = True):
    """The whole screen for ``console`` (a rich Console). ``interactive``: the list of blocks gives
    way to the terminal's height, and the keys are shown."""
    parts = [_header(st, f)]
    if f is not None:
        parts.append(_memory_and_iteration(f, side_by_side=console.width >= WIDE))
        if f.swap is not None:
            parts.append(_swap(f))
    if st.log is not None:
        parts.append(_log(st.log, log_lines))
    if f is not None:
        room = len(f.largest)
        if interactive:  # what is left of the screen below the keys' line, less borders and headings
            room = console.height - len(console.render_lines(Group(*parts), console.options, pad=False)) - 5
        if room >= 1:
            parts.insert(2, _largest(f, room, expand=console.width >= WIDE))
    if interactive:
        keys = Text.assemble(("q", "bold"), " quit", style="dim")
        if st.updating:
            keys.append("   updating the figures…", style="dim")
        parts.append(keys)
    return Group(*parts)


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n:,} " + (noun if n == 1 else plural or noun + "s")


def _grid() -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    return t


def _state(st: Status, f: Figures | None) -> Text:
    if st.waiting:
        return Text(f"waiting for {st.path} (the run has not written its capture yet)", style="yellow")
    read = f"{st.records:,} records ({format_bytes(st.size)}) read"
    if st.behind:
        done = st.size / max(st.size + st.behind, 1)
        return Text(f"reading: {read}, {100 * done:.0f}%", style="yellow")
    if f is not None and f.complete:
        end = "exit status unknown" if f.exit_status is None else (
            f"command killed by signal {-f.exit_status}" if f.exit_status < 0 else f"exit status {f.exit_status}")
        return Text(f"finished: {end}; {read}", style="bold green")
    if st.quiet_s is not None and st.quiet_s >= QUIET_S:
        return Text(f"no end record, nothing new for {st.quiet_s:.0f} s (the run may have been cut short); {read}",
                    style="yellow")
    return Text(f"running: {read}", style="bold cyan")


def _header(st: Status, f: Figures | None) -> Panel:
    t = _grid()
    t.add_row("capture", st.path)
    if f is not None and f.command:
        t.add_row("command", Text(f.command, overflow="ellipsis", no_wrap=True))
    t.add_row("state", _state(st, f))
    if st.log is not None:
        t.add_row("output", f"the command's output goes to {st.log}")
    if f is not None:
        t.add_row("run", f"{format_duration(f.duration_ns)} since the first CUDA event; {f.ops:,} ops "
                         f"({f.launches:,} kernel launches), {f.blocks:,} blocks allocated")
    if st.error:
        t.add_row("error", Text(st.error, style="red"))
    return Panel(t, title="[bold]pyobmem live[/]", title_align="left", box=box.ROUNDED)


def _bar(value: int, total: int, style: str, width: int = BAR_WIDTH) -> Text:
    n = 0 if total <= 0 else min(width, round(width * value / total))
    return Text.assemble(("█" * n, style), ("░" * (width - n), "dim"))


def _spark(values: tuple) -> Text:
    top = max(values) if values else 0
    if top <= 0:
        return Text("")
    return Text("".join(SPARK[min(len(SPARK) - 1, int(len(SPARK) * v / top))] if v else " " for v in values),
                style="cyan")


def _memory_and_iteration(f: Figures, side_by_side: bool):
    mem = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    mem.add_column("class", no_wrap=True)
    mem.add_column("blocks", justify="right", no_wrap=True)
    mem.add_column("live", justify="right", no_wrap=True)
    mem.add_column("share of live", no_wrap=True, overflow="crop")
    for name, count, nbytes in f.classes:
        style = CLASS_STYLE[name] if count else "dim"
        mem.add_row(Text(name, style=style), f"{count:,}", format_bytes(nbytes), _bar(nbytes, f.live_bytes, style))
    live = _grid()
    card = f" ({100 * f.live_bytes / f.card_bytes:.1f}% of the card's {format_bytes(f.card_bytes)})" if f.card_bytes else ""
    live.add_row("live at end" if f.complete else "live now",
                 f"{format_bytes(f.live_bytes)} in {_count(f.live_blocks, 'block')}{card}")
    live.add_row("peak", format_bytes(f.peak_live_bytes))
    live.add_row("over time", _spark(f.history))
    left = Panel(Group(live, Text(""), mem), title="device memory (live blocks by class)", title_align="left")

    right = _grid()
    it = f.iteration
    if it is None:
        right.add_row("iterations", Text("none repeats yet", style="dim"))
    else:
        so_far = "" if f.complete else " so far"
        right.add_row("iterations", f"{it.count:,}{so_far}, {it.period_ops:,} ops each")
        right.add_row("process", f"pid {it.pid} (the most launches)")
        right.add_row("length", f"median {format_duration(it.median_ns)}, the last {format_duration(it.last_ns)}")
        if not f.complete:
            right.add_row("current", f"{it.tail_ops:,} of {it.period_ops:,} ops, {format_duration(it.tail_ns)} so far")
        elif not it.tail_in_iteration:
            right.add_row("after it", f"{it.tail_ops:,} ops to the end of the run")
    right.add_row("", "")
    if f.dropped:
        right.add_row("drops", Text(f"{f.dropped:,} events lost ({f.drop_records:,} times the ring was full; "
                                    "a larger --capacity avoids it)", style="red"))
    else:
        right.add_row("drops", Text("none", style="green"))
    if f.corrupt:
        right.add_row("corrupt", Text(f"{f.corrupt:,} records left out", style="red"))
    right = Panel(right, title="iteration", title_align="left")
    if not side_by_side:
        return Group(left, right)
    row = Table.grid(expand=True)
    row.add_column(ratio=3)
    row.add_column(ratio=2)
    row.add_row(left, right)
    return row


def _largest(f: Figures, rows: int, expand: bool) -> Panel:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, expand=expand)
    for name, just in (("block", "left"), ("size", "right"), ("class", "left"), ("kind", "left"),
                       ("age", "right"), ("idle", "right"), ("on", "left")):
        t.add_column(name, justify=just, no_wrap=True)
    for b in f.largest[:rows]:
        t.add_row(b.label, format_bytes(b.size), Text(b.cls, style=CLASS_STYLE[b.cls]), b.kind,
                  format_duration(b.age_ns), "never used" if b.idle_ns is None else format_duration(b.idle_ns),
                  Text("host", style="magenta") if b.out else "device")
    return Panel(t, title="largest live blocks", title_align="left")


def _swap(f: Figures) -> Panel:
    w = f.swap
    t = _grid()
    budget = w.budget or "-"
    if w.budget_bytes is not None and w.resident_bytes is not None:
        over = w.resident_bytes > w.budget_bytes
        style = "red" if over else "green"
        line = Text.assemble(_bar(w.resident_bytes, w.budget_bytes, style), " ",
                             (f"{format_bytes(w.resident_bytes)} resident of {format_bytes(w.budget_bytes)}", style),
                             f" (budget {budget}; peak {format_bytes(w.peak_resident_bytes)}")
        line.append(f", over it for {format_duration(w.over_budget_ns)})" if w.over_budget_ns else ")")
        t.add_row("budget", line)
    else:
        t.add_row("budget", f"{budget} (its size in bytes is not known yet)")
    t.add_row("swaps", f"{w.out_count:,} out ({format_bytes(w.out_bytes)}), {w.in_count:,} in "
                       f"({format_bytes(w.in_bytes)}): {w.prefetch_hits:,} prefetch hits")
    # A late prefetch makes its stream wait, which costs GPU time only where the GPU got there first.
    t.add_row("late", Text(f"{_count(w.late, 'late prefetch', 'late prefetches')}, "
                           f"{_count(w.demand, 'swap-in')} on demand",
                           style="yellow" if w.late or w.demand else "green"))
    t.add_row("plans", f"{w.plans_adopted:,} adopted, {w.plans_dropped:,} dropped")
    return Panel(t, title="swap mode", title_align="left")


def _log(path: str, lines: list[str]) -> Panel:
    body = Text("\n").join(Text(line, no_wrap=True, overflow="ellipsis") for line in lines) if lines else Text(
        "(nothing yet)", style="dim")
    return Panel(body, title=f"last lines of {path}", title_align="left")
