"""The swap opportunity: how much device memory swapping idle blocks could save at a slowdown.

Shared by the report and the swap planner. ``saving_bound`` is the pure computation (times ns,
sizes B, bandwidth B/s); ``saving_curve`` feeds it one iteration of a capture's model.

Model (docs/model.md, "Swap saving bound"):

- One iteration [t0, t1) of length T, on the execution clock (``execution_clock``): the GPU clock
  when the capture has GPU time samples (``pyobmem.model.gpuclock``), else an estimate (one queue
  of equal-duration ops ending at t1 when the host runs ahead), since launch times run ahead of
  the GPU.
  Resident bytes R(t) = sizes of the live blocks at t, evaluated at every op time and
  allocation/free time in the iteration (the grid).
- A block may leave the device during an idle window (a, b) between two accesses (the launch
  times of its two kernels). Copying it out or in takes d = size / bandwidth each way. Out over
  [a+u, b-v) needs u, v of copy time overlapped with compute and stalls (d-u) + (d-v): the window
  is free (stall 0) when it can hold both copies, u = v = d <= W/2.
- Greedy peak shaving: while the peak R(t*) can be lowered, take the plateau of grid points
  around t* at the peak level; among the windows containing t*, pick the one whose cover of
  (its part of) that plateau costs the least stall per byte (ties: the larger block), and take
  it out over the largest span that costs that stall; R drops by its size there. The stalls add up to the extra
  time; a slowdown s allows (s-1)*T of stalls, and each copy direction (one copy engine each
  way) must fit its total copy time in s*T.
- It is an estimate under ideal copies (full bandwidth, copies of different blocks do not slow
  each other beyond the per-direction total, VMM remap cost ignored) on an estimated clock, so it
  bounds what a planner on this capture can reach; greedy, so not a proven optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import math

import numpy as np

from .. import abi
from .blocks import NEVER, BlockModel
from .gpuclock import gpu_op_times, has_gpu_clock
from .iterations import IterationModel

DEFAULT_BANDWIDTH = 55e9  # B/s, pinned host<->device each way on the H200 (measured 55.3e9)
TIME_RATIOS = (1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
MIN_SWAP_BYTES = 1 << 20  # smaller blocks are not worth a copy (VMM granularity is 2 MiB)
MAX_STEPS = 200_000
HOST_AHEAD = 0.5  # launches all done in the first half of the iteration: the host runs ahead
META_BANDWIDTH_KEYS = ("copy_bandwidth", "copy_bandwidth_Bps", "bandwidth_Bps")


@dataclass(frozen=True)
class SavingCurve:
    """Device memory swapping could save in one iteration, as a function of the slowdown.

    ``points``: tuple of (time_ratio, bytes_saved), time_ratio >= 1.0 ascending, bytes_saved
    non-decreasing. ``bandwidth``: B/s each way. ``iteration``: index into the main regime's
    iterations (``IterationModel.main_rows()``), ``t_start``/``t_end``/``iteration_ns``: its span
    (ns). ``peak_bytes``: peak resident bytes in it without swapping. ``free_bytes``: the saving at
    ratio 1.00. The greedy steps, in order, as arrays: ``step_block`` (block row),
    ``step_window`` (row of ``BlockModel.intervals``, or of ``TensorModel.intervals`` when
    ``step_sub`` >= 0), ``step_sub`` (sub-block row of the tensor model, -1: the whole block),
    ``step_size`` (bytes taken out),
    ``step_out`` (int64 (k, 2): ns span the block is out), ``step_stall_ns`` (stall of the step),
    ``step_copy_ns`` (copy time of the step, each way), ``step_peak`` (peak resident bytes after
    the step).
    """

    points: tuple
    bandwidth: float
    iteration: int
    t_start: int
    t_end: int
    iteration_ns: int
    peak_bytes: int
    free_bytes: int
    step_block: np.ndarray = field(repr=False)
    step_window: np.ndarray = field(repr=False)
    step_out: np.ndarray = field(repr=False)
    step_stall_ns: np.ndarray = field(repr=False)
    step_copy_ns: np.ndarray = field(repr=False)
    step_peak: np.ndarray = field(repr=False)
    step_sub: np.ndarray = field(default=None, repr=False)
    step_size: np.ndarray = field(default=None, repr=False)
    clock: str = "queue"

    def saved_at(self, ratio: float) -> int:
        """Bytes saved at a slowdown ``ratio`` (>= 1; ratios above the curve's last are capped
        by the steps the greedy took for it)."""
        return int(round(_saved(self.step_stall_ns, self.step_copy_ns, self.step_peak, self.peak_bytes,
                                self.iteration_ns, ratio)))


def bandwidth_of(capture, override: float | None = None) -> float:
    """The copy bandwidth (B/s): ``override``, else the capture metadata, else 55e9."""
    if override:  # None or 0: not given
        if not (math.isfinite(override) and override > 0):
            raise ValueError(f"copy bandwidth must be a positive finite number, not {override!r}")
        return float(override)
    for k in META_BANDWIDTH_KEYS:
        v = capture.meta.get(k) if isinstance(capture.meta, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            return float(v)
    return DEFAULT_BANDWIDTH


def saving_bound(
    grid: np.ndarray, resident: np.ndarray, win_a: np.ndarray, win_b: np.ndarray, win_size: np.ndarray,
    iteration_ns: float, bandwidth: float, ratios=TIME_RATIOS,
) -> dict:
    """The greedy bound on one iteration (see the module docstring).

    ``grid`` (ns, sorted) and ``resident`` (B) sample R(t); windows are (a, b) ns with the block
    size in B. Returns a dict: ``points`` [(ratio, bytes_saved)], ``peak`` (B), ``order`` (window
    indices taken, in order), ``out`` (k, 2) ns, ``stall`` (ns per step), ``copy`` (ns per
    step, one direction), ``peaks`` (B after each step).
    """
    R = np.asarray(resident, np.float64).copy()
    g = np.asarray(grid, np.float64)
    a = np.asarray(win_a, np.float64)
    b = np.asarray(win_b, np.float64)
    size = np.asarray(win_size, np.float64)
    d = size / (bandwidth / 1e9)
    peak0 = float(R.max()) if len(R) else 0.0
    budget = (max(ratios) - 1.0) * iteration_ns
    used = np.zeros(len(a), bool)
    order, out, stall, copy, peaks = [], [], [], [], []
    total = 0.0
    for _ in range(min(MAX_STEPS, len(a))):
        if not len(R):
            break
        j = int(np.argmax(R))
        t = g[j]
        cov = np.flatnonzero(~used & (a < t) & (t < b) & (size > 0))
        if not len(cov):
            break
        # The plateau around t* at the peak level: every point of it must go down.
        low = np.flatnonzero(R < R[j] - 0.5)
        pl = int(low[np.searchsorted(low, j) - 1] + 1) if np.searchsorted(low, j) > 0 else 0
        pr = int(low[np.searchsorted(low, j)] - 1) if np.searchsorted(low, j) < len(low) else len(R) - 1
        lo_i = np.maximum(pl, np.searchsorted(g, a[cov], side="right"))
        hi_i = np.minimum(pr, np.searchsorted(g, b[cov], side="left") - 1)
        lo_t = g[lo_i]
        hi_t = np.where(hi_i + 1 < len(g), g[np.minimum(hi_i + 1, len(g) - 1)], b[cov])
        hi_t = np.minimum(hi_t, b[cov])
        u = np.minimum(d[cov], lo_t - a[cov])
        v = np.minimum(d[cov], b[cov] - hi_t)
        cost = np.maximum(2 * d[cov] - u - v, 0.0)
        rel = cost / size[cov]
        best = rel.min()
        cand = np.flatnonzero(rel <= best * (1 + 1e-12) + 1e-18)
        pick = cand[np.argmax(size[cov][cand])]
        k = int(cov[pick])
        if total + cost[pick] > budget + 1e-9:
            break
        lo, hi = a[k] + u[pick], b[k] - v[pick]
        R[(g >= lo) & (g < hi)] -= size[k]
        used[k] = True
        total += float(cost[pick])
        order.append(k)
        out.append((lo, hi))
        stall.append(float(cost[pick]))
        copy.append(float(d[k]))
        peaks.append(float(R.max()))
    stall_a, copy_a, peaks_a = np.array(stall), np.array(copy), np.array(peaks)
    points = [(float(r), int(round(_saved(stall_a, copy_a, peaks_a, peak0, iteration_ns, r)))) for r in sorted(ratios)]
    return {
        "points": points, "peak": peak0, "order": np.array(order, np.int64),
        "out": np.array(out, np.float64).reshape(-1, 2), "stall": stall_a, "copy": copy_a, "peaks": peaks_a,
    }


def _saved(stall, copy, peaks, peak0, iteration_ns, ratio) -> float:
    """Saving of the longest prefix of steps whose stalls fit (ratio-1)*T and copies fit ratio*T."""
    if not len(stall):
        return 0.0
    cs = np.cumsum(stall)
    cc = np.cumsum(copy)
    ok = (cs <= (ratio - 1.0) * iteration_ns + 1e-6) & (cc <= ratio * iteration_ns + 1e-6)
    n = int(np.argmin(ok)) if not np.all(ok) else len(ok)
    return 0.0 if n == 0 else float(peak0 - peaks[n - 1])


def tm_refined_block(tm, nb: int) -> np.ndarray:
    """Bool per block row: the tensor model split it (its sub-blocks are the swap units)."""
    out = np.zeros(nb, bool)
    out[tm.block[tm.refined]] = True
    return out


class Clock:
    """Launch times -> execution times (int64 ns) for one iteration: call it on an array of times.

    ``t0``/``t1``: the iteration's span on this clock (ns); ``source``: "gpu" (the shim's GPU time
    samples, ``pyobmem.model.gpuclock``) or "queue" (the estimate of ``execution_clock``)."""

    def __init__(self, fn, t0: int, t1: int, source: str):
        self._fn, self.t0, self.t1, self.source = fn, int(t0), int(t1), source

    def __call__(self, t):
        return self._fn(t)


def execution_clock(capture, it, row: int) -> Clock:
    """The execution clock of iteration ``row`` of ``it`` (an IterationModel): a ``Clock``.

    With GPU time samples for the iteration's process (``pyobmem.model.gpuclock``), every time is
    mapped onto the GPU clock: interpolated between the launch times and GPU times of the
    process's ops (made non-decreasing), so allocations and frees move with the ops around them;
    the iteration spans the GPU times of its first op and of the next iteration's first op.

    Without samples, the estimate: the host launches ahead of the GPU (PyTorch enqueues most of a
    GPT-2 step early, then blocks on a full launch queue or on loss.item()), so launch times squeeze
    the idle windows into the start of the iteration. When the host runs ahead (its last launch in
    the first HOST_AHEAD of the iteration, or the iteration begins or ends with a device-to-host
    copy: the host waits for a result there, so the GPU was busy until then), the GPU is modelled
    as one queue of ops of equal duration c: E_k = max(L_k, E_(k-1) + c) (an op never runs before
    its launch nor before the previous op ends), with c chosen so that the last op ends at the
    iteration's end (bisection). Otherwise the launch times are the best clock there is (the GPU
    keeps up; a pause of the host is a pause of the GPU). Times outside the iteration are returned
    unchanged. The swap planner uses the same clock.
    """
    t0, t1 = int(it.t_start[row]), int(it.t_end[row])
    gpu = _gpu_clock(capture, it, row)
    if gpu is not None:
        return gpu
    T = max(t1 - t0, 1)
    seq = it.seq_rows[it.start_seq[row] : it.end_seq[row]]
    L = np.append(capture.ops["ts_ns"][seq].astype(np.int64), t1).astype(np.float64)
    if len(seq) and (L[-2] - t0 < HOST_AHEAD * T or _synced_at_boundary(capture.ops[seq])):
        E = np.append(_queue_times(L[:-1], float(t1)), float(t1))
    else:
        E = L.copy()

    def clock(t):
        t = np.asarray(t, np.int64)
        inside = (t >= t0) & (t < t1)
        return np.where(inside, np.round(np.interp(t, L, E)).astype(np.int64), t)

    return Clock(clock, t0, t1, "queue")


def _gpu_clock(capture, it, row: int) -> Clock | None:
    """The GPU clock of the iteration's process, or None without samples for it."""
    times = gpu_op_times(capture)
    pid = it.pid
    if times is None or pid is None or not has_gpu_clock(capture, int(pid)):
        return None
    ops = capture.ops
    mine = np.flatnonzero(ops["pid"] == pid)  # time order
    L = ops["ts_ns"][mine].astype(np.float64)
    E = np.maximum.accumulate(times[mine]).astype(np.float64)
    s, e = int(it.start_op[row]), int(it.end_op[row])
    g0 = int(times[s])
    g1 = int(times[e]) if e < len(ops) else int(np.interp(float(it.t_end[row]), L, E))

    def mapped(t):
        t = np.asarray(t, np.int64)
        m = np.interp(t, L, E)
        # Before the process's first op or after its last one: that op's lag behind its launch.
        m = np.where(t < L[0], t + (E[0] - L[0]), np.where(t > L[-1], t + (E[-1] - L[-1]), m))
        return np.round(m).astype(np.int64)

    return Clock(mapped, g0, max(g1, g0 + 1), "gpu")


def _synced_at_boundary(ops: np.ndarray) -> bool:
    """One of the first or last two ops is a device-to-host copy (loss.item(), a sync point)."""
    ends = np.concatenate((ops[:2], ops[-2:]))
    return bool(np.any((ends["type"] == abi.Ev.MEMCPY) & ((ends["copy_kind"] & 0xFF) == abi.CopyKind.DTOH)))


def _queue_times(L: np.ndarray, t1: float) -> np.ndarray:
    """Start times of ops launched at ``L`` (sorted, ns) on one in-order queue of ops of equal
    duration c, with c such that the last op ends at ``t1``: E_k = max_(j<=k)(L_j + (k - j) c)."""
    k = np.arange(len(L), dtype=np.float64)

    def starts(c: float) -> np.ndarray:
        return k * c + np.maximum.accumulate(L - k * c)

    lo, hi = 0.0, max(t1 - L[0], 1.0)
    for _ in range(60):  # the end time grows with c; 60 halvings reach well below 1 ns
        mid = (lo + hi) / 2
        if starts(mid)[-1] + mid < t1:
            lo = mid
        else:
            hi = mid
    return np.minimum(starts(lo), t1)


def saving_curve(
    capture, it: IterationModel, bm: BlockModel, *, bandwidth: float | None = None, ratios=TIME_RATIOS,
    iteration: int | None = None, min_bytes: int = MIN_SWAP_BYTES, tm=None,
) -> SavingCurve | None:
    """The saving curve of one iteration of the main regime (default: the middle one); None when
    the capture has no iteration. Blocks touched by opaque launches, managed blocks and blocks
    under ``min_bytes`` are never swapped."""
    main = it.main_rows()
    if not len(main):
        return None
    bw = bandwidth_of(capture, bandwidth)
    i = len(main) // 2 if iteration is None else int(iteration)
    row = main[i]
    clock = execution_clock(capture, it, row)
    t0, t1 = clock.t0, clock.t1
    T = max(t1 - t0, 1)
    launch_ts = capture.ops["ts_ns"].astype(np.int64)
    ops_ts = clock(launch_ts) if len(launch_ts) else launch_ts
    grid = [ops_ts[it.start_op[row] : it.end_op[row]], np.array([t0])]
    b_alloc, b_free = clock(bm.t_alloc), np.where(bm.t_free >= 0, clock(bm.t_free), -1)
    for t in (b_alloc, b_free):
        grid.append(t[(t >= t0) & (t < t1)])
    grid = np.unique(np.concatenate(grid).astype(np.int64))
    # Resident bytes: blocks live over [t_alloc, t_end).
    oa = np.argsort(b_alloc, kind="stable")
    ca = np.concatenate(([0], np.cumsum(bm.size[oa])))
    freed = bm.t_free >= 0
    fr_t = b_free[freed]
    of = np.argsort(fr_t, kind="stable")
    cf = np.concatenate(([0], np.cumsum(bm.size[freed][of])))
    res = ca[np.searchsorted(b_alloc[oa], grid, side="right")] - cf[np.searchsorted(fr_t[of], grid, side="right")]

    iv = bm.intervals
    blk = iv.block.astype(np.int64)
    a = ops_ts[iv.start_op] if len(blk) else np.zeros(0, np.int64)
    b = ops_ts[iv.end_op] if len(blk) else np.zeros(0, np.int64)
    wsize = bm.size[blk]
    wsub = np.full(len(blk), -1, np.int64)
    win_row = np.arange(len(blk), dtype=np.int64)
    if tm is not None:
        # Refined blocks (segments) leave through their sub-blocks' reuse intervals; the others
        # through their own idle intervals.
        tv = tm.intervals
        keep_b = ~tm_refined_block(tm, len(bm))[blk]
        t_ok = tm.refined[tv.sub] if len(tv) else np.zeros(0, bool)
        blk = np.concatenate((blk[keep_b], tm.block[tv.sub[t_ok]]))
        a = np.concatenate((a[keep_b], ops_ts[tv.start_op[t_ok]]))
        b = np.concatenate((b[keep_b], ops_ts[tv.end_op[t_ok]]))
        wsize = np.concatenate((wsize[keep_b], tm.size[tv.sub[t_ok]]))
        wsub = np.concatenate((wsub[keep_b], tv.sub[t_ok]))
        win_row = np.concatenate((win_row[keep_b], np.flatnonzero(t_ok)))
    kind = capture.blocks["kind"][blk] if len(blk) else np.zeros(0)
    ok = (
        (a < t1) & (b > t0) & (b > a) & ~bm.opaque[blk] & (kind != abi.AllocKind.MANAGED) & (kind != abi.AllocKind.HOST)
        & (wsize >= min_bytes) & (bm.cls[blk] != NEVER)
    )
    w = np.flatnonzero(ok)
    r = saving_bound(grid, res, a[w], b[w], wsize[w], T, bw, ratios)
    steps = w[r["order"]] if len(r["order"]) else np.zeros(0, np.int64)
    return SavingCurve(
        points=tuple(tuple(p) for p in r["points"]), bandwidth=bw, iteration=i, t_start=t0, t_end=t1,
        iteration_ns=T, peak_bytes=int(r["peak"]), free_bytes=int(r["points"][0][1]) if r["points"] and r["points"][0][0] == 1.0 else 0,
        step_block=blk[steps].astype(np.int64), step_window=win_row[steps].astype(np.int64),
        step_sub=wsub[steps].astype(np.int64), step_size=wsize[steps].astype(np.int64),
        step_out=np.round(r["out"]).astype(np.int64), step_stall_ns=r["stall"], step_copy_ns=r["copy"],
        step_peak=r["peaks"], clock=clock.source,
    )
