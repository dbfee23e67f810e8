"""Where a swap-mode run's time goes, against an unswapped trace of the same workload.

    python3 scripts/swap_anatomy.py TRACE SWAP [--iteration K] [--section gpu,gaps,handoffs,touches,engine,buckets,host]
                                    [--from POS] [--to POS] [--json]

TRACE is a capture of the job without swapping (``pyobmem run --tensor-blocks``), SWAP one of the
same job under ``pyobmem run --swap``; both need GPU clock samples (the shim's default: one every
32 ops). Units: times in ms, sizes in GiB (MiB for single blocks), positions in ops of the main
process's sequence (launches, graph launches, copies: ``detect_iterations(capture).seq_rows``)
counted from the start of the iteration.

Method (the one that found the handoff bug of session 11):

- Iterations: each step ends with a device-to-host copy (``loss.item()``); an iteration runs from
  one such copy (position 0) to the next, in both captures. Iteration K of SWAP (default: its
  third-to-last) is compared with iteration R of TRACE (default: the middle one); both must hold
  the same number of ops.
- gpu: the GPU clock samples themselves (``capture.gpu_times``), not per-op interpolated times.
  The trace's samples around iteration R make a curve of GPU time against position; SWAP's
  samples of iteration K (and the first of K+1, which closes it) are aligned to it at the first
  sample. Extra GPU time at each sample = its GPU time since the first sample minus the curve's
  (``np.interp``) at its position, cumulative; a segment's extra is the change since the sample
  before. With it, the host's lead over the GPU (``t_gpu`` minus the op's issue time) in both.
- gaps: host gaps longer than ``--min-gap-ms`` (1 ms) between consecutive ops of iteration K, with
  the allocations made in each (ms into the gap, size), the frees, the swap-outs recorded and the
  swap-ins recorded in it; with ``--slow-log`` (the shim's ``PYOBMEM_SLOW_LOG`` file of the SWAP
  run, native/swap_slow.c) each gap's executor calls and stretches outside them that began in it
  (an op's record is written after its launch, so the gap before op pos + 1 holds op pos's end,
  the allocations and frees between, and op pos + 1's begin and launch), each with its waits by
  kind.
- handoffs: a SWAP_OUT record followed within 50 us by an allocation of the same mapped size
  (2 MiB granules) is a handoff (swap_vmm.c records the swap-out when it hands the block's memory
  to the new allocation, which must be of its size): each with the position of the handed-over
  block's next access and how it came back (prefetch, late, demand). One needed within ``--soon``
  (64) ops is a plan error: the copy back is on the critical path. The whole run's count is shown
  next to the shim's own (NOTE swap.waits handoffs=N) as a check of the rule.
- engine: the copy engines. Swap-outs: issued at ``ts - duration_ns``, ended by ``ts``; the time
  the device-to-host engine stood idle in the forward pass (up to the trace's peak of live bytes)
  is estimated at ``--bandwidth`` (55e9 B/s) as the gaps between one copy's end and the latest
  start of the next (its end minus bytes / bandwidth). Swap-ins, by their consumer's position
  (per ``--bucket`` ops): count, GiB, causes, and the end of a FIFO copy queue at the bandwidth
  against the consumer's GPU time (negative: the copy was done before the consumer ran).
- touches: the blocks the ops of iteration K name that the same op names in neither iteration
  around it (those of K's length): a launch whose parameters hold a word left over from an
  earlier launch pointing into a live block (PyTorch's OffsetCalculator leaves its unused
  dimensions uninitialised; session 22). A tensor is known across iterations by where it was
  allocated and its size, an older block by itself. The shim brings such a block back if it is
  out: the demand swap-ins of iteration K are counted by whether they are of such a block.
- buckets: swap events per ``--bucket`` (50) ops of host position: swap-outs and swap-ins (count,
  GiB) and the swap-ins' causes.
- host: the whole run's host time in the executor from the shim's exit notes (NOTE swap.waits and
  swap.host): the allocation path, waits for copies and frees, the VMM calls by kind (count, ms,
  us each), the lock; totals of the run, not of iteration K.

Known limits: a SWAP_OUT is recorded when the block's memory is released or handed over, after its
copy ended (not when it ended), and a SWAP_IN when its consumer's finish_in handed it back, so the
copy-engine view is an estimate at the given bandwidth, not a measurement. Between samples the GPU
clock says nothing: a 32-op segment's extra time may belong to any op in it, and where a few ops
hold most of a segment's GPU time (the loss at the forward/backward boundary) the trace's curve,
linear between its samples, misplaces it when the two iterations' samples fall on other
positions: a large extra at one sample and its opposite at the next (the unswapped fixture
against itself, iteration 0 against 1: +27.5 ms at position 498, -25.9 ms at 525, 0.5 ms in all). A workload that copies
to the host more than once per step is cut at every such copy (then iterations differ in length,
and the two captures may share no anchor). Errors (a file that is not a capture, no GPU clock, an
iteration out of range, no common anchor) are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import sys
from dataclasses import dataclass

import numpy as np

from pyobmem import abi
from pyobmem.capture import SWAP_IN, SWAP_OUT, Capture
from pyobmem.commands.common import count, load, positive_float, short_name
from pyobmem.errors import PyobmemError
from pyobmem.model import detect_iterations
from pyobmem.model.queries import live_bytes

PROG = "swap_anatomy"
SECTIONS = ("gpu", "gaps", "handoffs", "touches", "engine", "buckets", "host")
HANDOFF_NS = 50_000  # a SWAP_OUT this close before an allocation of its size is a handoff
VMM_GRANULE = 2 << 20  # the H200's VMM granularity: a handoff maps memory of one rounded size
LOOKBACK_NS = 50_000_000  # copies recorded this long before the iteration still occupy its engine
MS, MIB, GIB = 1e6, float(1 << 20), float(1 << 30)
CAUSES = {int(c): c.name.lower() for c in abi.SwapInCause}
OUT_CAUSES = {int(c): c.name.lower() for c in abi.SwapOutCause}
NAME_WIDTH = 44


def _ms(ns) -> float:
    """ns as ms (a float, 3 decimals)."""
    return round(float(ns) / MS, 3)


def _gib(nbytes) -> float:
    """Bytes as GiB (a float, 3 decimals)."""
    return round(float(nbytes) / GIB, 3)


class AnatomyError(PyobmemError):
    """A pair of captures (or an option) this tool cannot compare; ``str()`` is the one line."""


@dataclass(frozen=True)
class Run:
    """One capture cut into iterations at its device-to-host copies.

    ``pid``: the main process; ``seq_rows``: op rows of its sequence (int64, (n,)); ``ts``: their
    issue times (int64 ns, (n,)); ``anchors``: sequence positions of its device-to-host copies
    (int64, ascending; iteration k is [anchors[k], anchors[k+1])); ``sample_pos`` / ``sample_gpu``:
    GPU clock samples on sequence ops, their positions and GPU times (int64 ns), by position;
    ``pos_of_row``: sequence position of every op row of the capture (an op off the sequence: the
    next sequence op's; len(seq_rows) past its end).
    """

    capture: Capture
    path: str
    pid: int
    seq_rows: np.ndarray
    ts: np.ndarray
    anchors: np.ndarray
    sample_pos: np.ndarray
    sample_gpu: np.ndarray
    pos_of_row: np.ndarray

    @property
    def n_iterations(self) -> int:
        """Iterations between consecutive anchors."""
        return max(len(self.anchors) - 1, 0)

    def window(self, k: int) -> tuple[int, int]:
        """[start, end) sequence positions of iteration ``k``."""
        return int(self.anchors[k]), int(self.anchors[k + 1])

    def op_name(self, pos: int) -> str:
        """Readable name of the op at sequence position ``pos``."""
        return self.capture.kernel_name(int(self.seq_rows[pos]))


def make_run(capture: Capture, path: str | None = None) -> Run:
    """A Run of ``capture``. Raises AnatomyError when its main sequence holds fewer than two
    device-to-host copies (no iteration to anchor)."""
    path = path or capture.path
    it = detect_iterations(capture)
    rows = it.seq_rows
    ops = capture.ops[rows]
    dtoh = (ops["type"] == abi.Ev.MEMCPY) & ((ops["copy_kind"] & 0xFF) == abi.CopyKind.DTOH)
    anchors = np.flatnonzero(dtoh).astype(np.int64)
    if len(anchors) < 2:
        raise AnatomyError(f"{path}: no iteration anchor: its main process copies to the host {len(anchors)} "
                           "time(s), an iteration needs one device-to-host copy (loss.item()) at each end")
    # An op off the sequence (a memset) takes the position of the next sequence op.
    pos_of_row = np.searchsorted(rows, np.arange(len(capture.ops))).astype(np.int64)
    g = capture.gpu_times
    g = g[g["op"] >= 0]
    sp = pos_of_row[g["op"]]
    keep = sp < len(rows)
    keep[keep] = rows[sp[keep]] == g["op"][keep]  # samples on sequence ops only
    order = np.argsort(sp[keep], kind="stable")
    return Run(capture=capture, path=path, pid=int(it.pid), seq_rows=rows, ts=ops["ts_ns"].astype(np.int64),
               anchors=anchors, sample_pos=sp[keep][order], sample_gpu=g["t_gpu"][keep][order].astype(np.int64),
               pos_of_row=pos_of_row)


def load_run(path: str) -> Run:
    """Read the capture at ``path`` (pyobmem.commands.common.load) and make its Run. Raises
    CaptureError for a file that is not a readable capture, AnatomyError as ``make_run``."""
    return make_run(load(path), path)


def check_pair(trace: Run, ref: int, swap: Run, k: int) -> None:
    """Raise AnatomyError unless iteration ``ref`` of ``trace`` and ``k`` of ``swap`` exist and hold
    the same number of ops (the common anchor)."""
    for run, i, what in ((trace, ref, "--trace-iteration"), (swap, k, "--iteration")):
        if not 0 <= i < run.n_iterations:
            raise AnatomyError(f"{what} {i} out of range: {run.path} has {run.n_iterations} iterations "
                               f"(0-{run.n_iterations - 1})")
    n_ref, n = np.diff(trace.window(ref))[0], np.diff(swap.window(k))[0]
    if n_ref != n:
        raise AnatomyError(f"no common anchor: iteration {ref} of {trace.path} holds {n_ref} ops between its "
                           f"device-to-host copies, iteration {k} of {swap.path} {n} (not the same workload?)")


def require_clock(run: Run, k: int) -> None:
    """Raise AnatomyError unless iteration ``k`` of ``run`` has at least two GPU clock samples."""
    a, b = run.window(k)
    n = int(np.count_nonzero((run.sample_pos >= a) & (run.sample_pos < b)))
    if n < 2:
        why = "no GPU clock (record with the shim's GPU clock on: PYOBMEM_GPU_CLOCK_EVERY, default 32)" \
            if not len(run.sample_pos) else f"{n} GPU clock sample(s) in iteration {k}, needs 2"
        raise AnatomyError(f"{run.path}: {why}")


def samples(run: Run, k: int, before: int = 0, after: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU clock samples of iteration ``k``: (positions from its start, GPU ns, issue ns), int64.
    ``before`` / ``after``: also the last ``before`` samples ahead of it and the first ``after``
    past its end (positions negative or >= its length)."""
    a, b = run.window(k)
    lo = max(int(np.searchsorted(run.sample_pos, a)) - before, 0)
    hi = int(np.searchsorted(run.sample_pos, b)) + after
    pos = run.sample_pos[lo:hi]
    return pos - a, run.sample_gpu[lo:hi], run.ts[pos]


def iteration_gpu_ms(run: Run) -> list:
    """GPU ms of each iteration but the last: first sample of the next minus its own first sample
    (None where an iteration has no sample)."""
    first = [samples(run, k)[1] for k in range(run.n_iterations)]
    return [_ms(first[k + 1][0] - first[k][0]) if len(first[k]) and len(first[k + 1])
            else None for k in range(run.n_iterations - 1)]


def gpu_extra(trace: Run, ref: int, swap: Run, k: int, lo: int = 0, hi: int | None = None,
              min_segment_ms: float = 1.5) -> dict:
    """Extra GPU time of iteration ``k`` of ``swap`` against iteration ``ref`` of ``trace`` at each
    GPU clock sample (method: module docstring). Samples past the trace's curve are left out.

    Returns {"samples": [{pos, extra_ms, cum_ms, lead_ms, trace_lead_ms, op, next_iteration}], one
    per sample in [lo, hi), "segments": the samples whose extra exceeds ``min_segment_ms`` either
    way, "total_extra_ms": cumulative at the first sample of iteration k+1 (its last own sample
    when there is none), "extra_in_iteration_ms": at its last own sample, "iteration_gpu_ms":
    {"trace", "swap"} (``iteration_gpu_ms``)}. Raises AnatomyError without GPU clock samples.
    """
    require_clock(trace, ref)
    require_clock(swap, k)
    n = swap.window(k)[1] - swap.window(k)[0]
    rp, rt, rh = samples(trace, ref, before=1, after=1 << 30)
    keep = rp < 2 * n  # the reference iteration and the next: enough to close iteration k
    rp, rt, rh = rp[keep], rt[keep], rh[keep]
    p, t, h = samples(swap, k, after=1)
    keep = (p >= rp[0]) & (p <= rp[-1])
    p, t, h = p[keep], t[keep], h[keep]
    curve = (rt - rt[0]).astype(np.float64)
    start = t[0] - np.interp(p[0], rp, curve)
    cum = (t - start) - np.interp(p, rp, curve)
    seg = np.diff(cum, prepend=cum[0])
    lead = t - h
    trace_lead = np.interp(p, rp, (rt - rh).astype(np.float64))
    a = swap.window(k)[0]
    end = n if hi is None else hi
    shown = (p >= lo) & ((p < end) | ((p >= n) & (end >= n)))  # the closing sample with the iteration's end
    rows = []
    for i in np.flatnonzero(shown):
        pos = int(p[i])
        rows.append({"pos": pos, "extra_ms": _ms(seg[i]), "cum_ms": _ms(cum[i]),
                     "lead_ms": _ms(lead[i]), "trace_lead_ms": _ms(trace_lead[i]),
                     "op": swap.op_name(a + pos), "next_iteration": pos >= n})
    inside = p < n
    return {
        "samples": rows,
        "segments": [r for r in rows if abs(r["extra_ms"]) > min_segment_ms],
        "total_extra_ms": _ms(cum[-1]),
        "extra_in_iteration_ms": _ms(cum[inside][-1]),
        "iteration_gpu_ms": {"trace": iteration_gpu_ms(trace), "swap": iteration_gpu_ms(swap)},
    }


def _mine(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the main process's blocks, its swap events sorted by time)."""
    blocks = np.flatnonzero(run.capture.blocks["pid"] == run.pid)
    s = run.capture.swaps
    s = s[s["pid"] == run.pid]
    return blocks, s[np.argsort(s["ts_ns"], kind="stable")]


def _causes(swaps: np.ndarray, names: dict = CAUSES, recorded_only: bool = False) -> dict:
    """Cause name -> count: of swap-ins (abi.SwapInCause, lower case), or with ``OUT_CAUSES`` of
    swap-outs (abi.SwapOutCause). ``recorded_only``: leave out cause 0 (a swap-out of a capture
    before session 13, which did not record why)."""
    if recorded_only:
        swaps = swaps[swaps["cause"] != 0]
    causes, counts = np.unique(swaps["cause"], return_counts=True)
    return {names.get(int(c), str(int(c))): int(n) for c, n in zip(causes, counts)}


def _bounds(run: Run, k: int, lo: int, hi: int | None) -> tuple[int, int]:
    """[lo, hi) clipped to iteration ``k`` (hi None: its end)."""
    a, b = run.window(k)
    return max(lo, 0), b - a if hi is None else min(hi, b - a)


# The slow-call log's columns (native/swap_slow.c HEADER): waits by kind, in us.
SLOW_PARTS = ("free_wait", "drain", "map", "access", "create", "unmap", "release", "demand", "hold", "lock")
SLOW_COLUMNS = ("pid", "t_ns", "call", "pos", "us", "after", *(f"{p}_us" for p in SLOW_PARTS),
                "evictions", "planned_outs", "bytes", "ops_since")


def read_slow_log(path: str, pid: int) -> list:
    """The lines of process ``pid`` in the shim's slow-call log (``PYOBMEM_SLOW_LOG``,
    native/swap_slow.c; gzip-compressed if its name ends in .gz), by time: each a dict of t_ns
    (int, CLOCK_MONOTONIC as the capture's), call, pos (the plan position, -1: none), ms, after
    (the call before an "outside" stretch; a block's state for "named_out"), parts ({kind: ms}, the
    waits that are not 0), evictions, planned_outs, bytes, ops_since. Raises AnatomyError for a
    file that cannot be read or is not such a log."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as e:
        raise AnatomyError(f"{path}: cannot read the slow-call log ({e})") from None
    if not rows or tuple(rows[0]) != SLOW_COLUMNS:
        raise AnatomyError(f"{path}: not a slow-call log (PYOBMEM_SLOW_LOG): its header is not the shim's")
    out, pids = [], set()
    for line, r in enumerate(rows[1:], 2):
        if len(r) != len(SLOW_COLUMNS) or not r[0].isdigit():
            continue  # a line cut off when its process died, or another process's header
        pids.add(int(r[0]))
        if int(r[0]) != pid:
            continue
        v = dict(zip(SLOW_COLUMNS, r))
        try:
            parts = {p: round(int(v[f"{p}_us"]) / 1000, 3) for p in SLOW_PARTS if v[f"{p}_us"] != "0"}
            out.append({"t_ns": int(v["t_ns"]), "call": v["call"], "pos": int(v["pos"]),
                        "ms": round(int(v["us"]) / 1000, 3), "after": v["after"], "parts": parts,
                        "evictions": int(v["evictions"]), "planned_outs": int(v["planned_outs"]),
                        "bytes": int(v["bytes"]), "ops_since": int(v["ops_since"])})
        except ValueError:
            raise AnatomyError(f"{path}:{line}: not a slow-call log line (a field is not a number)") from None
    if not out:
        raise AnatomyError(f"{path}: no line of process {pid} (the SWAP capture's main process); "
                           f"it holds those of {', '.join(map(str, sorted(pids))) or 'none'}")
    out.sort(key=lambda x: x["t_ns"])
    return out


def host_gaps(run: Run, k: int, lo: int = 0, hi: int | None = None, min_gap_ms: float = 1.0,
              slow: list | None = None) -> list:
    """Host gaps of iteration ``k`` longer than ``min_gap_ms``: between op ``pos`` and ``pos + 1``
    for pos in [lo, hi) (the last op's gap ends at the next iteration's anchor).

    Each a dict: pos, gap_ms, allocs ([ms into the gap, bytes] per allocation of the main process
    in (issue of pos, issue of pos + 1]), frees, swap_outs and swap_out_bytes (SWAP_OUT records in
    the gap), swap_ins and swap_in_causes, next_op (the name of op pos + 1); with ``slow``
    (``read_slow_log``'s lines) also calls: those that began in the gap, each with ms_into.
    """
    a, _ = run.window(k)
    lo, hi = _bounds(run, k, lo, hi)
    ts = run.ts
    idx = np.arange(a + lo, a + hi)
    idx = idx[idx + 1 < len(ts)]
    idx = idx[ts[idx + 1] - ts[idx] > min_gap_ms * MS]
    rows, s = _mine(run)
    b = run.capture.blocks[rows]
    t_alloc, t_free = b["t_alloc"].astype(np.int64), b["t_free"].astype(np.int64)
    slow_t = np.array([c["t_ns"] for c in slow or ()], dtype=np.int64)
    out = []
    for i in idx.tolist():
        t0, t1 = int(ts[i]), int(ts[i + 1])
        new = (t_alloc > t0) & (t_alloc <= t1)
        ev = s[(s["ts_ns"] > t0) & (s["ts_ns"] <= t1)]
        outs, ins = ev[ev["direction"] == SWAP_OUT], ev[ev["direction"] == SWAP_IN]
        gap = {
            "pos": i - a, "gap_ms": _ms(t1 - t0),
            "allocs": [[_ms(int(t) - t0), int(n)] for t, n in zip(t_alloc[new], b["size"][new])],
            "frees": int(np.count_nonzero((t_free > t0) & (t_free <= t1))),
            "swap_outs": len(outs), "swap_out_bytes": int(outs["bytes"].sum()),
            "swap_ins": len(ins), "swap_in_causes": _causes(ins), "next_op": run.op_name(i + 1),
        }
        if slow is not None:
            j = np.searchsorted(slow_t, [t0, t1])
            gap["calls"] = [dict(c, ms_into=_ms(c["t_ns"] - t0)) for c in slow[j[0]:j[1]]]
        out.append(gap)
    return out


def _mapped(nbytes) -> np.ndarray:
    """Bytes a VMM mapping of ``nbytes`` takes (rounded up to VMM_GRANULE), int64."""
    n = np.asarray(nbytes, np.int64)
    return (n + VMM_GRANULE - 1) // VMM_GRANULE * VMM_GRANULE


def find_handoffs(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """The handoffs of the main process over the whole capture: (its SWAP_OUT records that are
    handoffs, sorted by time; for each, the row in ``capture.blocks`` of the allocation that took
    the memory). A handoff is a SWAP_OUT followed within HANDOFF_NS by an allocation of the same
    mapped size (swap_vmm.c hands memory only to a block of the same size)."""
    cap = run.capture
    rows, s = _mine(run)
    rows = rows[np.argsort(cap.blocks["t_alloc"][rows], kind="stable")]
    alloc_t = cap.blocks["t_alloc"][rows].astype(np.int64)
    alloc_size = _mapped(cap.blocks["size"][rows])
    outs = s[s["direction"] == SWAP_OUT]
    t = outs["ts_ns"].astype(np.int64)
    first, last = np.searchsorted(alloc_t, t), np.searchsorted(alloc_t, t + HANDOFF_NS)
    size = _mapped(outs["bytes"])
    to = np.full(len(outs), -1, np.int64)
    for q in np.flatnonzero(last > first).tolist():
        same = np.flatnonzero(alloc_size[first[q]:last[q]] == size[q])
        if len(same):
            to[q] = rows[first[q] + same[0]]
    return outs[to >= 0], to[to >= 0]


def shim_handoffs(run: Run) -> int | None:
    """The handoffs the shim counted in the whole run (NOTE swap.waits ``handoffs=N``), or None."""
    m = re.search(r"\bhandoffs=(\d+)", run.capture.notes.get(run.pid, {}).get("swap.waits", ""))
    return int(m.group(1)) if m else None


# What NOTE swap.waits and swap.host hold (native/swap.c note_waits), each value "count/us":
# (key, note, what).
HOST_COSTS = (
    ("ops", "swap.waits", "executor: ops begun and ended"),
    ("allocs", "swap.host", "allocation path, its waits included"),
    ("frees", "swap.host", "free path"),
    ("drains", "swap.waits", "waits for swap-outs' copies"),
    ("free_waits", "swap.waits", "waits for pending frees"),
    ("maps", "swap.waits", "maps (create + map + access)"),
    ("create", "swap.host", "  cuMemCreate"),
    ("access", "swap.host", "  cuMemSetAccess"),
    ("unmaps", "swap.waits", "unmaps (and releases)"),
    ("release", "swap.host", "  cuMemRelease"),
    ("lock_waits", "swap.host", "waits for the lock (allocs, frees, ops)"),
    ("releaser", "swap.host", "release thread's polls, the lock held"),
)


def host_costs(run: Run) -> dict | None:
    """The whole run's host time in the executor, from the shim's exit notes (NOTE swap.waits and,
    from session 14, swap.host): {"rows": [{what, count, ms, us_each}], "notes": which were found},
    or None when the run has neither (a trace, or a run killed before its exit). Totals of the
    run: the steps before the first plan are in them."""
    notes = run.capture.notes.get(run.pid, {})
    kv = {}
    found = [n for n in ("swap.waits", "swap.host") if n in notes]
    if not found:
        return None
    for n in found:
        for item in notes[n].split():
            key, _, value = item.partition("=")
            kv[(n, key)] = value
    rows = []
    for key, note, what in HOST_COSTS:
        m = re.fullmatch(r"(\d+)/(\d+)us", kv.get((note, key), ""))
        if not m:  # absent, or cut off at the ring's note limit
            continue
        count, us = int(m.group(1)), int(m.group(2))
        rows.append({"what": what, "count": count, "ms": round(us / 1e3, 1),
                     "us_each": round(us / count, 1) if count else None})
    return {"rows": rows, "notes": found}


def handoffs(run: Run, k: int, lo: int = 0, hi: int | None = None, soon: int = 64) -> dict:
    """The handoffs (``find_handoffs``) recorded in iteration ``k`` at positions [lo, hi).

    Returns {"handoffs": [{pos (the first op issued after the record), bytes, block, to_block,
    to_bytes (the allocation that took the memory), next_use (position of the block's next access,
    None if none), ops_to_use, back_cause (how it came back: prefetch / late / demand, None if it did
    not), back_pos}], "count", "needed_soon" (ops_to_use <= ``soon``), "needed_next_op"
    (ops_to_use == 0), "back_on_demand", "soon", "run_count" (in the whole capture),
    "shim_count" (``shim_handoffs``)}.
    """
    a, b = run.window(k)
    lo, hi = _bounds(run, k, lo, hi)
    cap, ts = run.capture, run.ts
    outs, to = find_handoffs(run)
    _, s = _mine(run)
    ins = s[s["direction"] == SWAP_IN]
    acc = cap.accesses[np.argsort(cap.accesses["block"], kind="stable")]
    acc_pos = run.pos_of_row[acc["op"]] - a
    found = []
    for x, dst in zip(outs, to.tolist()):
        t = int(x["ts_ns"])
        pos = int(np.searchsorted(ts[a:b], t))
        if not ts[a] <= t < ts[b] or not lo <= pos < hi:
            continue
        blk = int(x["block"])
        uses = np.zeros(0, np.int64)
        if blk >= 0:
            e = np.searchsorted(acc["block"], [blk, blk + 1])
            uses = acc_pos[e[0]:e[1]]
        uses = uses[uses >= pos]
        nxt = int(uses.min()) if len(uses) else None
        back = ins[(ins["block"] == blk) & (ins["ts_ns"] > t)][:1] if blk >= 0 else ins[:0]
        found.append({
            "pos": pos, "bytes": int(x["bytes"]), "block": f"{int(x['pid'])}:{int(x['block_id'])}",
            "to_block": cap.block_label(dst), "to_bytes": int(cap.blocks["size"][dst]), "next_use": nxt,
            "ops_to_use": None if nxt is None else nxt - pos,
            "back_cause": CAUSES.get(int(back["cause"][0])) if len(back) else None,
            "back_pos": int(np.searchsorted(ts, back["ts_ns"][0])) - a if len(back) else None,
        })
    near = [h for h in found if h["ops_to_use"] is not None]
    return {"handoffs": found, "count": len(found), "soon": soon,
            "needed_soon": sum(h["ops_to_use"] <= soon for h in near),
            "needed_next_op": sum(h["ops_to_use"] == 0 for h in near),
            "back_on_demand": sum(h["back_cause"] == "demand" for h in found),
            "run_count": len(outs), "shim_count": shim_handoffs(run)}


def _identity(run: Run, k: int, rows: np.ndarray) -> list:
    """The identity of blocks (capture rows) in iteration ``k``, the same for the same tensor in
    every iteration: one allocated in it or in the iteration's length before it and freed within
    the iteration's length after it ("made", its allocation's position from the iteration's
    start, its size: two of one size made between the same two ops are one), any other (live
    longer: parameters, optimizer state) its row ("row", row)."""
    a, b = run.window(k)
    n = b - a
    blocks = run.capture.blocks
    t, tf = blocks["t_alloc"][rows].astype(np.int64), blocks["t_free"][rows].astype(np.int64)
    recent = (t >= run.ts[max(a - n, 0)]) & (tf >= 0) & (tf < run.ts[min(b + n, len(run.ts) - 1)])
    at = np.searchsorted(run.ts, t) - a
    size = blocks["size"][rows]
    return [("made", int(x), int(z)) if y else ("row", int(r))
            for r, x, y, z in zip(rows.tolist(), at.tolist(), recent.tolist(), size.tolist())]


def _touches(run: Run, k: int) -> set:
    """{(position, block identity)} of the main process's ops in iteration ``k`` and the blocks they
    name (ACCESS records; ``_identity``)."""
    a, b = run.window(k)
    cap = run.capture
    acc = cap.accesses
    pos = run.pos_of_row[acc["op"]]
    m = (pos >= a) & (pos < b) & (cap.ops["pid"][acc["op"]] == run.pid)
    return set(zip((pos[m] - a).tolist(), _identity(run, k, acc["block"][m])))


def stray_touches(run: Run, k: int, lo: int = 0, hi: int | None = None) -> dict:
    """The (op, block) pairs of iteration ``k`` at positions [lo, hi) that the same position has in
    no neighbouring iteration of its length (module docstring, touches), and its demand swap-ins by
    whether their block is one of those at their consumer (the first op issued after the record).

    Returns {"neighbours" (iterations compared; none: "why"), "touches" (such pairs), "ops" (their
    positions, ascending, each once), "demand_ins", "demand_at_stray", "demand": [{pos, block,
    bytes, op}] for those}."""
    a, b = run.window(k)
    lo, hi = _bounds(run, k, lo, hi)
    near = [j for j in (k - 1, k + 1) if 0 <= j < run.n_iterations and np.diff(run.window(j))[0] == b - a]
    out = {"neighbours": near, "touches": 0, "ops": [], "demand_ins": 0, "demand_at_stray": 0, "demand": []}
    if not near:
        out["why"] = f"no iteration next to {k} holds its {b - a} ops"
        return out
    seen = set().union(*(_touches(run, j) for j in near))
    stray = {(p, i) for p, i in _touches(run, k) - seen if lo <= p < hi}
    _, s = _mine(run)
    ins = s[(s["direction"] == SWAP_IN) & (s["cause"] == int(abi.SwapInCause.DEMAND))]
    ins = ins[(ins["ts_ns"] >= run.ts[a]) & (ins["ts_ns"] < run.ts[b])]
    pos = np.searchsorted(run.ts[a:b], ins["ts_ns"].astype(np.int64))
    ins, pos = ins[(pos >= lo) & (pos < hi)], pos[(pos >= lo) & (pos < hi)]
    for x, p, ident in zip(ins, pos.tolist(), _identity(run, k, ins["block"].astype(np.int64))):
        if (p, ident) in stray:
            out["demand"].append({"pos": p, "block": run.capture.block_label(int(x["block"])), "bytes": int(x["bytes"]),
                                  "op": run.op_name(a + p)})
    out.update(touches=len(stray), ops=sorted({p for p, _ in stray}), demand_ins=len(ins),
               demand_at_stray=len(out["demand"]))
    return out


def forward_end(trace: Run, ref: int) -> int:
    """Position in iteration ``ref`` of ``trace`` of the first op issued at its peak of live bytes
    (the main process's device blocks): where the forward pass ends."""
    a, b = trace.window(ref)
    rows, _ = _mine(trace)
    times, live = live_bytes(trace.capture.blocks[rows])
    if not len(times):
        return b - a
    at = np.searchsorted(times, trace.ts[a:b], side="right") - 1
    return int(np.argmax(np.where(at >= 0, live[np.maximum(at, 0)], 0)))


def _engine_idle(end: np.ndarray, nbytes: np.ndarray, bandwidth: float) -> np.ndarray:
    """Idle ns of one copy engine before each copy but the first (copies sorted by end, int64 ns):
    the latest start of copy j (its end minus its bytes at ``bandwidth``) minus the end of j-1."""
    need = nbytes.astype(np.float64) / bandwidth * 1e9
    return np.maximum(end[1:] - need[1:] - end[:-1], 0.0)


def copy_engine(run: Run, k: int, bandwidth: float = 55e9, fwd_end: int | None = None, bucket: int = 50,
                lo: int = 0, hi: int | None = None, top: int = 12) -> dict:
    """The copy engines in iteration ``k`` (an estimate at ``bandwidth`` B/s: module docstring).

    Returns {"out": {count, gib, copy_ms (at the bandwidth), span_ms (first issue to last end),
    forward_idle_ms (device-to-host idle before positions ``fwd_end``), forward_end, idle_gaps
    (the ``top`` largest: idle_ms, pos of the swap-out's record, bytes, issued_ms_before)},
    "in": {count, gib, copy_ms, span_ms, by_consumer: [{lo, hi, count, gib, causes,
    ready_ms: [min, max] (FIFO copy end at the bandwidth minus the consumer's GPU time),
    queue_ms (most from issue to FIFO end)}] per ``bucket`` ops of consumer position in [lo, hi)}}.
    Raises AnatomyError without GPU clock samples in the iteration.
    """
    require_clock(run, k)
    a, b = run.window(k)
    n = b - a
    lo, hi = _bounds(run, k, lo, hi)
    ts = run.ts
    t0, t1 = int(ts[a]), int(ts[b])
    fwd_end = n - 1 if fwd_end is None else min(fwd_end, n - 1)
    _, s = _mine(run)
    s = s[(s["ts_ns"] >= t0 - LOOKBACK_NS) & (s["ts_ns"] < t1)]
    ts_rec = s["ts_ns"].astype(np.int64)
    issue = ts_rec - s["duration_ns"].astype(np.int64)
    result = {}
    for d, name in ((SWAP_OUT, "out"), (SWAP_IN, "in")):
        m = s["direction"] == d
        now = m & (ts_rec >= t0)
        result[name] = {
            "count": int(now.sum()), "gib": _gib(s["bytes"][now].sum()),
            "copy_ms": _ms(s["bytes"][now].sum() / bandwidth * 1e9),
            "span_ms": _ms(ts_rec[now].max() - issue[now].min()) if now.any() else 0.0,
        }
    # Swap-outs: SWAP_OUT's ts is (no earlier than) the copy's end.
    o = np.flatnonzero(s["direction"] == SWAP_OUT)
    o = o[np.argsort(ts_rec[o], kind="stable")]
    end, nbytes = ts_rec[o], s["bytes"][o]
    idle = _engine_idle(end, nbytes, bandwidth)
    fwd = (end[1:] >= t0) & (end[1:] < ts[a + fwd_end])
    big = np.flatnonzero(fwd)[np.argsort(-idle[fwd], kind="stable")][:top]
    result["out"].update({
        "forward_end": fwd_end, "forward_idle_ms": _ms(idle[fwd].sum()),
        "idle_gaps": [{"idle_ms": _ms(idle[j]), "pos": int(np.searchsorted(ts[a:b], end[j + 1])),
                       "bytes": int(nbytes[j + 1]), "issued_ms_before": _ms(end[j + 1] - issue[o][j + 1])}
                      for j in sorted(big.tolist())],
    })
    # Swap-ins: one FIFO queue at the bandwidth, in order of issue; the consumer is the first op
    # issued after the SWAP_IN record (its finish_in).
    i = np.flatnonzero(s["direction"] == SWAP_IN)
    i = i[np.argsort(issue[i], kind="stable")]
    fifo = np.zeros(len(i))
    prev = 0.0
    for q, row in enumerate(i.tolist()):
        prev = fifo[q] = max(float(issue[row]), prev) + float(s["bytes"][row]) / bandwidth * 1e9
    consumer = np.searchsorted(ts, ts_rec[i]) - a
    p, tg, _ = samples(run, k, before=1, after=1)
    ready = fifo - np.interp(consumer, p, tg.astype(np.float64))
    rows = []
    for first, last in _spans(lo, hi, bucket):
        m = (consumer >= first) & (consumer < last)
        if not m.any():
            continue
        sel = s[i[m]]
        rows.append({"lo": first, "hi": last, "count": int(m.sum()),
                     "gib": _gib(sel["bytes"].sum()), "causes": _causes(sel),
                     "ready_ms": [_ms(ready[m].min()), _ms(ready[m].max())],
                     "queue_ms": _ms((fifo[m] - issue[i[m]]).max())})
    result["in"]["by_consumer"] = rows
    return result


def _spans(lo: int, end: int, width: int) -> list[tuple[int, int]]:
    """[first, last) positions of the ``width``-op buckets (aligned to multiples of width) that
    cover [lo, end), cut to it."""
    return [(max(start, lo), min(start + width, end)) for start in range(lo - lo % width, end, width)]


def swap_buckets(run: Run, k: int, width: int = 50, lo: int = 0, hi: int | None = None) -> dict:
    """Swap events recorded in iteration ``k`` per ``width`` ops of host position (the first op
    issued after the record; the last bucket may hold position len, the next anchor).

    Returns {"host_ms" (the iteration's host time), "out": {count, gib, causes}, "in": {count, gib,
    causes}, "buckets": [{lo, hi, host_ms, out, out_gib, out_mean_ms (mean duration_ns), out_causes,
    in, in_gib, causes}] for the buckets in [lo, hi) that hold events}; out causes are empty for
    captures before session 13, which did not record them.
    """
    a, b = run.window(k)
    n = b - a
    lo, end = max(lo, 0), n + 1 if hi is None or hi >= n else hi  # position n: after the last op
    ts = run.ts
    _, s = _mine(run)
    s = s[(s["ts_ns"] >= ts[a]) & (s["ts_ns"] < ts[b])]
    pos = np.searchsorted(ts[a:b], s["ts_ns"])
    outs, ins = s["direction"] == SWAP_OUT, s["direction"] == SWAP_IN
    rows = []
    for first, last in _spans(lo, end, width):
        m = (pos >= first) & (pos < last)
        if not m.any():
            continue
        o, i = s[m & outs], s[m & ins]
        rows.append({"lo": first, "hi": last, "host_ms": _ms(ts[a + min(last, n)] - ts[a + first]),
                     "out": len(o), "out_gib": _gib(o["bytes"].sum()),
                     "out_mean_ms": _ms(o["duration_ns"].mean()) if len(o) else 0.0,
                     "out_causes": _causes(o, OUT_CAUSES, recorded_only=True),
                     "in": len(i), "in_gib": _gib(i["bytes"].sum()), "causes": _causes(i)})
    return {"host_ms": _ms(ts[b] - ts[a]),
            "out": {"count": int(outs.sum()), "gib": _gib(s["bytes"][outs].sum()), "causes": _causes(s[outs], OUT_CAUSES, recorded_only=True)},
            "in": {"count": int(ins.sum()), "gib": _gib(s["bytes"][ins].sum()),
                   "causes": _causes(s[ins])},
            "buckets": rows}


# --- text -----------------------------------------------------------------------------------------


def _name(op: str) -> str:
    return short_name(op, NAME_WIDTH)


def _pairs(causes: dict) -> str:
    return " ".join(f"{k} {v}" for k, v in causes.items())


def _causes_text(causes: dict, out: dict | None = None) -> str:
    """'planned 3 budget 1 / late 2': swap-out causes (when given), then swap-in causes."""
    ins = _pairs(causes) or "-"
    return f"{_pairs(out) or '-'} / {ins}" if out is not None else ins


def format_gpu(g: dict, min_segment_ms: float) -> list:
    """Lines of the gpu section (``gpu_extra``'s dict)."""
    def ms(values: list) -> str:
        return " ".join("-" if v is None else f"{v:.1f}" for v in values)

    it = g["iteration_gpu_ms"]
    lines = ["GPU ms per iteration (first sample to the next's first sample)", f"  trace {ms(it['trace'])}",
             f"  swap  {ms(it['swap'])}",
             f"segments of more than {min_segment_ms:g} ms extra GPU time (cum: since the iteration's first sample)",
             f"{'pos':>7} {'extra':>7} {'cum':>7} {'lead swap':>10} {'lead trace':>10}  op"]
    for r in g["segments"]:
        tag = "  (next iteration)" if r["next_iteration"] else ""
        lines.append(f"{r['pos']:>7} {r['extra_ms']:>+7.1f} {r['cum_ms']:>7.1f} {r['lead_ms']:>10.1f} "
                     f"{r['trace_lead_ms']:>10.1f}  {_name(r['op'])}{tag}")
    lines.append(f"total extra GPU time {g['total_extra_ms']:.1f} ms ({g['extra_in_iteration_ms']:.1f} ms to the "
                 "iteration's last sample)")
    return lines


def format_gaps(gaps: list, min_gap_ms: float, top: int | None) -> list:
    """Lines of the gaps section (``host_gaps``'s list); ``top``: only the longest, longest first."""
    total = sum(g["gap_ms"] for g in gaps)
    shown = sorted(gaps, key=lambda g: -g["gap_ms"])[:top] if top else gaps
    lines = [f"{len(gaps)} host gaps of more than {min_gap_ms:g} ms, {total:.1f} ms in all"
             + (f"; the {len(shown)} longest" if top else ""),
             f"{'pos':>7} {'gap ms':>8} {'frees':>6} {'outs':>5} {'MiB':>6} {'ins':>4}  {'next op':<{NAME_WIDTH}}  "
             "allocs (ms into the gap: MiB)"]
    for g in shown:
        allocs = " ".join(f"{t:.2f}:{n / MIB:.0f}" for t, n in g["allocs"][:6])
        more = f" +{len(g['allocs']) - 6}" if len(g["allocs"]) > 6 else ""
        lines.append(f"{g['pos']:>7} {g['gap_ms']:>8.2f} {g['frees']:>6} {g['swap_outs']:>5} "
                     f"{g['swap_out_bytes'] / MIB:>6.0f} {g['swap_ins']:>4}  {_name(g['next_op']):<{NAME_WIDTH}}  "
                     f"{allocs or '-'}{more}")
        lines += [f"{'':>9}{_slow_text(c)}" for c in g.get("calls", ())]
    return lines


def _slow_text(c: dict) -> str:
    """One slow-call log line of a gap: ms into it, the call, its time and its waits, longest first
    (they nest: demand holds its drain and map, map its create and access, unmap its release)."""
    size = f" {c['bytes'] / MIB:.0f} MiB" if c["bytes"] else ""
    if c["call"] == "named_out":
        return f"+{c['ms_into']:.2f} named_out ({c['after']}){size}: last named {c['ops_since']} ops before"
    what = {"outside": f"outside the executor after {c['after']}"}
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(c["parts"].items(), key=lambda kv: -kv[1]))
    counts = "".join(f", {n} {k.replace('_', ' ')}" for k in ("evictions", "planned_outs") if (n := c[k]))
    return (f"+{c['ms_into']:.2f} {what.get(c['call'], c['call'])}{size}: {c['ms']:.2f} ms"
            + (f" ({parts}{counts})" if parts or counts else ""))


def format_handoffs(h: dict) -> list:
    """Lines of the handoffs section (``handoffs``' dict); '*' marks a block needed soon."""
    shim = "-" if h["shim_count"] is None else h["shim_count"]
    lines = [f"{h['count']} handoffs; {h['needed_soon']} of blocks needed within {h['soon']} ops "
             f"({h['needed_next_op']} by the very next op); {h['back_on_demand']} came back on demand; "
             f"whole run {h['run_count']} (the shim counted {shim})",
             f"  {'pos':>7} {'MiB':>6}  {'block':<12} {'to block':<12} {'MiB':>6} {'next use':>9} {'ops':>6}  back"]
    for r in h["handoffs"]:
        mark = "*" if r["ops_to_use"] is not None and r["ops_to_use"] <= h["soon"] else " "
        back = f"{r['back_cause']} at {r['back_pos']}" if r["back_cause"] else "-"
        nxt = "-" if r["next_use"] is None else r["next_use"]
        ops = "-" if r["ops_to_use"] is None else r["ops_to_use"]
        lines.append(f"{mark} {r['pos']:>7} {r['bytes'] / MIB:>6.0f}  {r['block']:<12} {r['to_block']:<12} "
                     f"{r['to_bytes'] / MIB:>6.0f} {nxt:>9} {ops:>6}  {back}")
    return lines


def format_touches(t: dict) -> list:
    """Lines of the touches section (``stray_touches``' dict)."""
    if not t["neighbours"]:
        return [f"none compared: {t['why']}"]
    lines = [f"{t['touches']} (op, block) pairs at {len(t['ops'])} ops that iterations "
             f"{', '.join(map(str, t['neighbours']))} do not have there (stale parameter words?); "
             f"{t['demand_at_stray']} of {t['demand_ins']} demand swap-ins are of such a block"]
    if t["demand"]:
        lines.append("      pos    MiB  block         op")
        lines += [f"    {d['pos']:>5} {d['bytes'] / MIB:>6.0f}  {d['block']:<13} {_name(d['op'])}" for d in t["demand"]]
    return lines


def format_engine(e: dict, bandwidth: float) -> list:
    """Lines of the engine section (``copy_engine``'s dict)."""
    o, i = e["out"], e["in"]
    lines = [f"estimate at {bandwidth / 1e9:g} GB/s",
             f"swap-outs {o['count']}, {o['gib']:.2f} GiB, {o['copy_ms']:.1f} ms of copying; first issue to last "
             f"end {o['span_ms']:.1f} ms; device-to-host engine idle in the forward pass (pos < {o['forward_end']}) "
             f"{o['forward_idle_ms']:.1f} ms",
             f"  largest idle gaps: {'idle ms':>8} {'before the swap-out at pos':>27} {'MiB':>6} "
             f"{'issued ms before':>17}"]
    for g in o["idle_gaps"]:
        lines.append(f"  {'':<19}{g['idle_ms']:>8.1f} {g['pos']:>27} {g['bytes'] / MIB:>6.0f} "
                     f"{g['issued_ms_before']:>17.1f}")
    lines += [f"swap-ins {i['count']}, {i['gib']:.2f} GiB, {i['copy_ms']:.1f} ms of copying; first issue to last "
              f"record {i['span_ms']:.1f} ms",
              f"  {'consumer pos':>13} {'ins':>5} {'GiB':>6}  {'copy end - consumer on GPU ms':>30} "
              f"{'queue ms':>9}  causes"]
    for r in i["by_consumer"]:
        lines.append(f"  {r['lo']:>6}-{r['hi']:<6} {r['count']:>5} {r['gib']:>6.2f}  "
                     f"{r['ready_ms'][0]:>14.1f} .. {r['ready_ms'][1]:>12.1f} {r['queue_ms']:>9.1f}  "
                     f"{_causes_text(r['causes'])}")
    return lines


def format_buckets(bk: dict, width: int) -> list:
    """Lines of the buckets section (``swap_buckets``' dict)."""
    lines = [f"iteration host time {bk['host_ms']:.1f} ms; swap-outs {bk['out']['count']} "
             f"({bk['out']['gib']:.2f} GiB{': ' + _pairs(bk['out']['causes']) if bk['out']['causes'] else ''}), "
             f"swap-ins {bk['in']['count']} ({bk['in']['gib']:.2f} GiB): {_causes_text(bk['in']['causes'])}; "
             f"per {width} ops",
             f"{'pos':>13} {'host ms':>8} {'outs':>5} {'GiB':>6} {'mean ms':>8} {'ins':>5} {'GiB':>6}  causes"
             + (" (outs / ins)" if bk["out"]["causes"] else "")]
    for r in bk["buckets"]:
        lines.append(f"{r['lo']:>6}-{r['hi']:<6} {r['host_ms']:>8.1f} {r['out']:>5} {r['out_gib']:>6.2f} "
                     f"{r['out_mean_ms']:>8.1f} {r['in']:>5} {r['in_gib']:>6.2f}  "
                     f"{_causes_text(r['causes'], r['out_causes'] if bk['out']['causes'] else None)}")
    return lines


# --- command line ---------------------------------------------------------------------------------


def format_host(h: dict | None) -> list:
    if h is None:
        return ["no NOTE swap.waits or swap.host in the swap run (a trace, or a run that did not exit)"]
    lines = [f"the whole run's host time in the executor ({', '.join('NOTE ' + n for n in h['notes'])}; "
             "the steps before the plan included)",
             f"  {'':44}{'count':>8}{'ms':>10}{'us each':>10}"]
    for r in h["rows"]:
        each = "-" if r["us_each"] is None else f"{r['us_each']:.1f}"
        lines.append(f"  {r['what']:44}{r['count']:>8}{r['ms']:>10.1f}{each:>10}")
    return lines


def _sections(text: str) -> list:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: sections are {','.join(SECTIONS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Where a swap-mode run's time goes, against an unswapped trace of the same "
        "workload: extra GPU time per GPU clock sample, host gaps, handoffs, the copy engines, swap events.",
        epilog="example: python3 scripts/swap_anatomy.py trace.pyobmem swap.pyobmem --iteration 16 "
        "--section gpu,handoffs")
    p.add_argument("trace", metavar="TRACE", help="capture of the job without swapping (pyobmem run --tensor-blocks)")
    p.add_argument("swap", metavar="SWAP", help="capture of the same job under pyobmem run --swap")
    p.add_argument("--iteration", "-k", type=count, help="iteration of SWAP (default: its third-to-last)")
    p.add_argument("--trace-iteration", type=count, help="iteration of TRACE to compare with (default: the middle one)")
    p.add_argument("--section", type=_sections, default=list(SECTIONS),
                   help=f"comma-separated sections to show (default: all of {','.join(SECTIONS)})")
    p.add_argument("--from", dest="lo", type=count, default=0, metavar="POS", help="first position shown (ops)")
    p.add_argument("--to", dest="hi", type=count, metavar="POS", help="end of the positions shown (ops, exclusive)")
    p.add_argument("--min-gap-ms", type=positive_float, default=1.0, help="host gaps longer than this (default 1)")
    p.add_argument("--top", type=count, help="gaps: only the TOP longest, longest first")
    p.add_argument("--slow-log", metavar="FILE",
                   help="gaps: the SWAP run's slow-call log (PYOBMEM_SLOW_LOG; .gz read as such): each gap's calls")
    p.add_argument("--min-segment-ms", type=positive_float, default=1.5,
                   help="gpu: segments whose extra GPU time exceeds this either way (default 1.5)")
    p.add_argument("--soon", type=count, default=64, help="handoffs: a block needed within this many ops (default 64)")
    p.add_argument("--bandwidth", type=positive_float, default=55e9,
                   help="engine: copy bandwidth in B/s (default 55e9)")
    p.add_argument("--forward-end", type=count, metavar="POS",
                   help="engine: where the forward pass ends (default: the trace's peak of live bytes)")
    p.add_argument("--bucket", type=count, default=50, help="ops per bucket (default 50)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


def analyse(args) -> dict:
    """Every selected section of the pair the parsed ``args`` name, as one JSON-serialisable dict.
    Raises CaptureError or AnatomyError (module docstring)."""
    if args.hi is not None and args.hi <= args.lo:
        raise AnatomyError(f"--to {args.hi} is not past --from {args.lo}")
    if args.bucket == 0:
        raise AnatomyError("--bucket must be at least 1")
    if args.slow_log and "gaps" not in args.section:
        raise AnatomyError("--slow-log is shown in the gaps section: add gaps to --section")
    trace, swap = load_run(args.trace), load_run(args.swap)
    k = max(swap.n_iterations - 3, 0) if args.iteration is None else args.iteration
    ref = trace.n_iterations // 2 if args.trace_iteration is None else args.trace_iteration
    check_pair(trace, ref, swap, k)
    a, b = swap.window(k)
    out = {"trace": args.trace, "swap": args.swap, "trace_iteration": ref, "iteration": k, "ops": b - a,
           "trace_iterations": trace.n_iterations, "swap_iterations": swap.n_iterations,
           "from": args.lo, "to": args.hi}
    rng = {"lo": args.lo, "hi": args.hi}
    for name in args.section:
        if name == "gpu":
            out[name] = gpu_extra(trace, ref, swap, k, min_segment_ms=args.min_segment_ms, **rng)
        elif name == "gaps":
            slow = read_slow_log(args.slow_log, swap.pid) if args.slow_log else None
            out[name] = host_gaps(swap, k, min_gap_ms=args.min_gap_ms, slow=slow, **rng)
        elif name == "handoffs":
            out[name] = handoffs(swap, k, soon=args.soon, **rng)
        elif name == "touches":
            out[name] = stray_touches(swap, k, **rng)
        elif name == "engine":
            fwd = forward_end(trace, ref) if args.forward_end is None else args.forward_end
            out[name] = copy_engine(swap, k, args.bandwidth, fwd, args.bucket, **rng)
        elif name == "host":
            out[name] = host_costs(swap)
        else:
            out[name] = swap_buckets(swap, k, args.bucket, **rng)
    return out


def format_text(res: dict, args) -> str:
    """The text report of ``analyse``'s dict."""
    to = res["ops"] if res["to"] is None else res["to"]
    lines = [f"trace {res['trace']}: {res['trace_iterations']} iterations, iteration {res['trace_iteration']}; "
             f"swap {res['swap']}: {res['swap_iterations']} iterations, iteration {res['iteration']} "
             f"({res['ops']} ops; positions {res['from']}-{to})"]
    render = {"gpu": lambda d: format_gpu(d, args.min_segment_ms),
              "gaps": lambda d: format_gaps(d, args.min_gap_ms, args.top),
              "handoffs": format_handoffs, "touches": format_touches,
              "engine": lambda d: format_engine(d, args.bandwidth),
              "buckets": lambda d: format_buckets(d, args.bucket), "host": format_host}
    for name in args.section:
        lines += ["", f"== {name}"] + render[name](res[name])
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the tool; returns the exit status (errors: one line on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        res = analyse(args)
        print(json.dumps(res, indent=1) if args.json else format_text(res, args))
    except PyobmemError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
