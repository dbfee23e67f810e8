"""What the live view shows, from a capture read so far: ``figures(capture) -> Figures``.

Every figure comes from the queries the other verbs use, so the screen of a finished capture
agrees with ``pyobmem summary`` and ``stats``: the iterations and block classes of the model
(pyobmem.model), live bytes and the time span (pyobmem.export), the swap facts and resident bytes
(pyobmem.report.swap), the card's size (pyobmem.planner). "Now" is the last CUDA event read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import abi
from ..model.blocks import CLASSES, build_blocks
from ..model.iterations import detect_iterations
from ..model.queries import card_bytes, cuda_span, live_bytes, live_bytes_peak, resident_bytes
from ..report.swap import swap_facts

TOP_BLOCKS = 8  # largest live blocks listed
HISTORY_POINTS = 40  # samples of live bytes over the run (the sparkline)


@dataclass(frozen=True)
class BlockRow:
    """A live block: ``label`` (pid:block id, as ``stats`` names it), ``size`` (B), ``cls`` (its
    class, CLASSES), ``kind`` (abi.AllocKind name), ``age_ns`` (since its allocation), ``idle_ns``
    (since its last access; None: never accessed), ``out`` (swapped out to host memory now)."""

    label: str
    size: int
    cls: str
    kind: str
    age_ns: int
    idle_ns: int | None
    out: bool


@dataclass(frozen=True)
class IterationFigures:
    """The main process's iterations (pyobmem.model.iterations): ``count`` found so far, ``pid``,
    ``period_ops`` (ops each), ``median_ns`` (their median length), ``last_ns`` (the length of the
    last one that is over, i.e. followed by ops; None: none is), and the stretch since: ``tail_ops``
    ops of the main sequence over ``tail_ns`` up to now, from the start of the last iteration when
    it reaches the end of the stream (``tail_in_iteration``), else from its end. While the run goes
    on, the tail is the iteration in progress; at the end of a run, the ops after the last."""

    count: int
    pid: int
    period_ops: int
    median_ns: int
    last_ns: int | None
    tail_ops: int
    tail_ns: int
    tail_in_iteration: bool


@dataclass(frozen=True)
class SwapFigures:
    """Swap mode: ``budget`` as given and ``budget_bytes`` (None: not known yet), the main
    process's device-resident bytes now and at peak (live blocks minus those swapped out),
    swap-outs and swap-ins (counts, bytes), swap-ins by cause (prefetch hits, late = not back when
    their op was issued, on demand), plans adopted and dropped, time over the budget (ns)."""

    budget: str | None
    budget_bytes: int | None
    resident_bytes: int | None
    peak_resident_bytes: int | None
    out_count: int
    out_bytes: int
    in_count: int
    in_bytes: int
    prefetch_hits: int
    late: int
    demand: int
    plans_adopted: int
    plans_dropped: int
    over_budget_ns: int | None


@dataclass(frozen=True)
class Figures:
    """One screen's figures (sizes B, times ns). ``classes``: (class, live blocks, live bytes)
    for every class of CLASSES; ``history``: live bytes at HISTORY_POINTS evenly spaced times from
    the first CUDA event to now (empty without blocks); ``card_bytes``: the card's memory (None:
    not noted)."""

    path: str
    command: str | None
    complete: bool
    exit_status: int | None
    duration_ns: int
    ops: int
    launches: int
    blocks: int
    live_bytes: int
    live_blocks: int
    peak_live_bytes: int
    card_bytes: int | None
    classes: tuple
    history: tuple
    largest: tuple
    iteration: IterationFigures | None
    dropped: int
    drop_records: int
    corrupt: int
    swap: SwapFigures | None


def figures(cap, corrupt: int = 0) -> Figures:
    """The figures of ``cap`` (a pyobmem.capture.Capture, sanitized; ``corrupt``: the records
    sanitize left out)."""
    blocks = cap.blocks
    it = detect_iterations(cap)
    bm = build_blocks(cap, it)
    first, now = cuda_span(cap)
    live = blocks["t_free"] < 0
    cls = bm.cls.astype(np.int64)
    count = np.bincount(cls[live], minlength=len(CLASSES))
    nbytes = np.bincount(cls[live], weights=bm.size[live].astype(np.float64), minlength=len(CLASSES))
    out_now = _out_now(cap)
    return Figures(
        path=cap.path,
        command=cap.meta.get("command"),
        complete=cap.complete,
        exit_status=cap.exit_status,
        duration_ns=now - first,
        ops=len(cap.ops),
        launches=int(np.count_nonzero(cap.ops["type"] == abi.Ev.LAUNCH)),
        blocks=len(blocks),
        live_bytes=int(blocks["size"][live].sum()),
        live_blocks=int(live.sum()),
        peak_live_bytes=live_bytes_peak(blocks)[0],
        card_bytes=card_bytes(cap),
        classes=tuple((c, int(count[i]), int(nbytes[i])) for i, c in enumerate(CLASSES)),
        history=_history(blocks, first, now),
        largest=_largest(cap, bm, live, now, out_now),
        iteration=_iteration(it, now),
        dropped=int(cap.dropped),
        drop_records=len(cap.drops),
        corrupt=corrupt,
        swap=_swap(cap, it.pid),
    )


def _history(blocks, first: int, now: int) -> tuple:
    """The highest live bytes in each of HISTORY_POINTS equal spans from ``first`` to ``now``."""
    times, values = live_bytes(blocks)
    if not len(times):
        return ()
    edges = np.linspace(first, now, HISTORY_POINTS + 1)[:-1].astype(np.int64)
    k = np.searchsorted(times, edges, side="right") - 1
    top = np.where(k >= 0, values[np.maximum(k, 0)], 0)  # live at the start of each span
    span = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, HISTORY_POINTS - 1)
    np.maximum.at(top, span, values)  # and every change inside it
    return tuple(int(v) for v in top)


def _out_now(cap) -> set:
    """Block rows whose last swap event is a swap-out: on the host now."""
    s = cap.swaps[cap.swaps["block"] >= 0]
    if not len(s):
        return set()
    order = np.lexsort((s["ts_ns"], s["block"]))
    blk, direction = s["block"][order], s["direction"][order]
    last = np.r_[blk[1:] != blk[:-1], True]
    return set(blk[last & (direction == 0)].tolist())


def _largest(cap, bm, live, now: int, out_now: set) -> tuple:
    rows = np.flatnonzero(live)
    rows = rows[np.lexsort((rows, -bm.size[rows]))][:TOP_BLOCKS]
    b = cap.blocks
    return tuple(
        BlockRow(
            label=f"{int(b['pid'][r])}:{int(b['block_id'][r])}",
            size=int(bm.size[r]),
            cls=CLASSES[int(bm.cls[r])],
            kind=_kind(int(b["kind"][r])),
            age_ns=now - int(bm.t_alloc[r]),
            idle_ns=None if bm.last_t[r] < 0 else now - int(bm.last_t[r]),
            out=int(r) in out_now,
        )
        for r in rows.tolist()
    )


def _kind(k: int) -> str:
    return abi.AllocKind(k).name.lower() if k in abi.AllocKind._value2member_map_ else str(k)


def _iteration(it, now: int) -> IterationFigures | None:
    main = it.main_regime
    if main is None:
        return None
    rows = it.main_rows()
    last = int(rows[-1])
    n_seq = len(it.seq_rows)
    open_ended = int(it.end_seq[last]) >= n_seq  # its end is the last op read: it may go on
    over = rows[:-1] if open_ended else rows
    start_seq, t0 = (it.start_seq[last], it.t_start[last]) if open_ended else (it.end_seq[last], it.t_end[last])
    return IterationFigures(
        count=int(main.count),
        pid=int(it.pid),
        period_ops=int(main.period_ops),
        median_ns=int(round(it.iteration_ns)),
        last_ns=int(it.t_end[over[-1]] - it.t_start[over[-1]]) if len(over) else None,
        tail_ops=int(n_seq - start_seq),
        tail_ns=max(now - int(t0), 0),
        tail_in_iteration=open_ended,
    )


def _swap(cap, pid: int | None) -> SwapFigures | None:
    w = swap_facts(cap)
    if w is None:
        return None
    resident = None
    if pid is None and len(cap.blocks):
        pid = int(cap.blocks["pid"][0])
    if pid is not None:
        values = resident_bytes(cap, pid)[1]
        resident = int(values[-1]) if len(values) else 0
    by_cause = w["swapped_in"]["by_cause"]
    return SwapFigures(
        budget=w["budget"],
        budget_bytes=w["budget_bytes"],
        resident_bytes=resident,
        peak_resident_bytes=w["peak_resident_bytes"],
        out_count=w["swapped_out"]["count"],
        out_bytes=w["swapped_out"]["bytes"],
        in_count=w["swapped_in"]["count"],
        in_bytes=w["swapped_in"]["bytes"],
        prefetch_hits=by_cause["prefetch"]["count"],
        late=by_cause["late"]["count"],
        demand=by_cause["demand"]["count"],
        plans_adopted=w["plans_adopted"],
        plans_dropped=w["plans_dropped"],
        over_budget_ns=w["over_budget_ns"],
    )
