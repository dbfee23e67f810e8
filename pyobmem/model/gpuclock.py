"""The GPU clock: when each op ran on the GPU, from the shim's GPU_TIME samples (native/gpuclock.c).

A sample says that op ``seq`` of a process had run, with everything before it on its stream, at
GPU time t (CLOCK_MONOTONIC ns, the capture's time base). Between samples the GPU time of an op is
interpolated linearly in op order (per process, by op seq) between the samples around it. Before
the first sample and after the last one, ops keep the lag of the nearest sample behind their
launch. Each time is then bounded below by the op's launch time (an op never runs before it is
issued) and by the time of the previous op on its stream (a stream runs in order). docs/model.md,
"GPU clock".

Captures without samples (older shims, ``PYOBMEM_GPU_CLOCK_EVERY=0``, a process whose ops were
all captured into graphs) have no GPU clock; the model then uses its queue estimate
(``pyobmem.model.saving.execution_clock``).
"""

from __future__ import annotations

import numpy as np

from .. import abi

MIN_SAMPLES = 2  # a process needs this many samples on its ops to have a GPU clock


def has_gpu_clock(capture, pid: int | None = None) -> bool:
    """Whether the capture (or process ``pid`` in it) has at least MIN_SAMPLES samples naming ops."""
    g = capture.gpu_times
    g = g[g["op"] >= 0]
    if pid is not None:
        g = g[g["pid"] == pid]
    return len(g) >= MIN_SAMPLES


def gpu_op_times(capture) -> np.ndarray | None:
    """GPU time of every op row (int64 ns, shape (len(capture.ops),)), or None when no process has
    a GPU clock. Ops of processes without one keep their launch time. Computed once per capture.

    Method: the module docstring. Raises nothing; samples naming unknown ops are ignored.
    """
    cached = getattr(capture, "_gpu_op_times", False)
    if cached is not False:
        return cached
    ops = capture.ops
    g = capture.gpu_times
    g = g[g["op"] >= 0]
    out = None
    if len(g) >= MIN_SAMPLES:
        out = ops["ts_ns"].astype(np.int64).copy()
        any_clock = False
        for pid in np.unique(g["pid"]):
            mine = g[g["pid"] == pid]
            if len(mine) < MIN_SAMPLES:
                continue
            any_clock = True
            rows = np.flatnonzero(ops["pid"] == pid)
            rows = rows[np.argsort(ops["seq"][rows], kind="stable")]
            pos_of_row = np.full(len(ops), -1, np.int64)
            pos_of_row[rows] = np.arange(len(rows))
            out[rows] = _interpolate(ops[rows], pos_of_row[mine["op"]], mine["t_gpu"])
        out = out if any_clock else None
    capture._gpu_op_times = out
    return out


def _interpolate(ops: np.ndarray, pos: np.ndarray, t_gpu: np.ndarray) -> np.ndarray:
    """GPU times of one process's ops (``ops`` in seq order) from samples at positions ``pos``
    (indices into ``ops``) with GPU times ``t_gpu`` (ns)."""
    launch = ops["ts_ns"].astype(np.int64)
    order = np.argsort(pos, kind="stable")
    pos, t = pos[order], t_gpu[order].astype(np.int64)
    k = np.arange(len(ops), dtype=np.int64)
    inner = np.interp(k, pos, t.astype(np.float64))
    lag_first = t[0] - launch[pos[0]]
    lag_last = t[-1] - launch[pos[-1]]
    est = np.where(k < pos[0], launch + lag_first, np.where(k > pos[-1], launch + lag_last, np.round(inner)))
    est = np.maximum(est.astype(np.int64), launch)
    est[pos] = np.maximum(t, launch[pos])  # a sample is exact
    # Stream order: an op finishes no earlier than the op before it on its stream.
    streams = ops["stream"]
    for s in np.unique(streams):
        m = np.flatnonzero(streams == s)
        est[m] = np.maximum.accumulate(est[m])
    return est


def iteration_ns_gpu(capture, it) -> float | None:
    """Median GPU-clock length (ns) of the main regime's iterations of ``it`` (an IterationModel):
    the GPU time of each iteration's first op to that of the next one's (the iteration's end op);
    None without a GPU clock for the iteration's process or without iterations."""
    times = gpu_op_times(capture)
    main = it.main_rows()
    if times is None or not len(main) or not has_gpu_clock(capture, int(it.pid)):
        return None
    start, end = it.start_op[main], it.end_op[main]
    ok = end < len(times)
    if not np.any(ok):
        return None
    return float(np.median(times[end[ok]] - times[start[ok]]))


def clock_facts(capture, it=None) -> dict | None:
    """What the reports say about the GPU clock; None when the capture has none.

    ``samples`` (GPU_TIME records naming ops), ``every`` / ``skipped`` (from the shim's NOTE
    ``gpu_clock=...``, None if absent), ``lag_max_ns`` / ``lag_median_ns`` (how long after the host
    issued a sampled op the GPU had run it), and with an IterationModel ``it``:
    ``iteration_ns_host`` and ``iteration_ns_gpu`` (medians of the main regime, ns).
    """
    g = capture.gpu_times
    g = g[g["op"] >= 0]
    if len(g) < MIN_SAMPLES:
        return None
    lag = g["t_gpu"].astype(np.int64) - capture.ops["ts_ns"][g["op"]].astype(np.int64)
    every = skipped = None
    for notes in capture.notes.values():
        text = notes.get(abi.NOTE_GPU_CLOCK)
        if text:
            kv = dict(p.split("=", 1) for p in text.split() if "=" in p)
            every = int(kv["every"]) if kv.get("every", "").isdigit() else every
            skipped = (skipped or 0) + int(kv["skipped"]) if kv.get("skipped", "").isdigit() else skipped
    out = {"samples": int(len(g)), "every": every, "skipped": skipped, "lag_max_ns": int(lag.max()),
           "lag_median_ns": int(np.median(lag))}
    if it is not None:
        host = it.iteration_ns
        gpu = iteration_ns_gpu(capture, it)
        out["iteration_ns_host"] = None if host is None else int(round(host))
        out["iteration_ns_gpu"] = None if gpu is None else int(round(gpu))
    return out
