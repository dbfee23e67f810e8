"""Exports of a capture to viewers users already have.

One module per format, each with ``write(capture, path) -> None``:

- ``memory_viz``: PyTorch's memory snapshot pickle (pytorch.org/memory_viz,
  ``python -m torch.cuda._memory_viz stats|trace|segments``);
- ``perfetto``: Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing);
- ``csv``: one row per event.

``export(capture, fmt, path, force)`` picks the module and refuses an existing output without
``force``. The helpers here (output files, time span, live bytes) are shared by the exports and
the HTML report.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..errors import PyobmemError

FORMATS = ("memory-viz", "perfetto", "csv")
SUFFIXES = {"memory-viz": ".pickle", "perfetto": ".json", "csv": ".csv"}


def default_output(capture_path: str, fmt: str) -> str:
    """``run.pyobmem`` -> ``run.pickle`` / ``run.json`` / ``run.csv`` beside the capture."""
    stem = capture_path[: -len(".pyobmem")] if capture_path.endswith(".pyobmem") else capture_path
    return stem + SUFFIXES[fmt]


def check_output(path: str, force: bool, source: str | None = None) -> None:
    """Refuse (PyobmemError) an output that is a directory, the capture ``source`` itself (even
    with ``force``: -f never destroys the input), or an existing file unless ``force``. Called
    before any work."""
    if os.path.isdir(path):
        raise PyobmemError(f"{path} is a directory; give a file name (-o FILE)")
    if source is not None and os.path.exists(path):
        try:
            same = os.path.samefile(path, source)
        except OSError:
            same = False
        if same:
            raise PyobmemError(f"{path} is the capture being read; choose another output (-o FILE)")
    if os.path.lexists(path) and not force:
        raise PyobmemError(f"{path} exists; use -f/--force to overwrite it")


@contextlib.contextmanager
def open_output(path: str, force: bool, binary: bool = False, source: str | None = None):
    """Open ``path`` for writing; refused as ``check_output`` says (PyobmemError).

    Written to a temporary name beside it and renamed at the end, so an interrupted export never
    leaves a half file under the final name.
    """
    check_output(path, force, source)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        f = open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""}))
    except OSError as e:
        raise PyobmemError(f"cannot write {path}: {e.strerror}") from None
    try:
        with f:
            yield f
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise PyobmemError(f"cannot write {path}: {e.strerror}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def export(capture, fmt: str, path: str, force: bool = False) -> None:
    """Write ``capture`` (a pyobmem.capture.Capture) to ``path`` in format ``fmt`` (FORMATS); the
    capture's own file is never overwritten."""
    from . import csv, memory_viz, perfetto

    writers = {"memory-viz": memory_viz.write, "perfetto": perfetto.write, "csv": csv.write}
    if fmt not in writers:
        raise PyobmemError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    with open_output(path, force, binary=(fmt == "memory-viz"), source=getattr(capture, "path", None)) as f:
        writers[fmt](capture, f)


def time_span(capture) -> tuple[int, int]:
    """(first, last) CLOCK_MONOTONIC ns seen in the capture: allocations, frees, ops, processes."""
    times = [capture.blocks["t_alloc"], capture.blocks["t_free"][capture.blocks["t_free"] >= 0],
             capture.ops["ts_ns"], capture.processes["ts_ns"], capture.untracked["ts_ns"]]
    times = [np.asarray(t, np.int64) for t in times if len(t)]
    if not times:
        return 0, 0
    allt = np.concatenate(times)
    return int(allt.min()), int(allt.max())


def cuda_span(capture) -> tuple[int, int]:
    """(first, last) CLOCK_MONOTONIC ns of the capture's CUDA events (launches, copies, sets,
    allocations, frees): t = 0 of every verb is the first (the summary's duration is the span)."""
    b = capture.blocks
    times = [capture.ops["ts_ns"], b["t_alloc"], b["t_free"][b["t_free"] >= 0]]
    times = [np.asarray(t, np.int64) for t in times if len(t)]
    if not times:
        return time_span(capture)
    return int(min(t.min() for t in times)), int(max(t.max() for t in times))


def block_end_times(capture) -> np.ndarray:
    """Each block's free time, or the end of the capture for blocks never freed (int64 ns)."""
    end = time_span(capture)[1]
    t_free = capture.blocks["t_free"].astype(np.int64)
    return np.where(t_free >= 0, t_free, end)


def live_bytes(blocks: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Live bytes as a step function: (times, bytes after the change at each time), int64.

    Allocations add ``size`` at ``t_alloc``; frees subtract it at ``t_free``. Changes at one
    instant are merged, so ``times`` is strictly increasing. ``mask`` selects blocks.
    """
    b = blocks if mask is None else blocks[mask]
    freed = b["t_free"] >= 0
    t = np.concatenate([b["t_alloc"].astype(np.int64), b["t_free"][freed].astype(np.int64)])
    d = np.concatenate([b["size"].astype(np.int64), -b["size"][freed].astype(np.int64)])
    return step_function(t, d)


def step_function(t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of the changes ``d`` made at times ``t`` (int64) as a step function: (times, the sum
    after the changes at each time). Changes at one instant are merged, so ``times`` is strictly
    increasing; no change: two empty arrays.
    """
    if not len(t):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    times, first = np.unique(t, return_index=True)
    last = np.r_[first[1:], len(t)] - 1
    return times, np.cumsum(d)[last]


def op_names(capture) -> list[str]:
    """Readable name of every op row (``Capture.kernel_name``), computed once per distinct kind."""
    ops = capture.ops
    if not len(ops):
        return []
    keys = np.stack([ops["pid"].astype(np.uint64), ops["type"].astype(np.uint64), ops["handle"],
                     ops["copy_kind"].astype(np.uint64)], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    names = [capture.kernel_name(int(i)) for i in first]
    return [names[i] for i in inverse.reshape(-1)]


def drops_hint(meta: dict) -> str:
    """How to avoid dropped events next time, for the line that counts them: the ring was full (the
    daemon drains it more slowly than the job writes), so give the launcher a larger ring."""
    size = meta.get("ring_capacity") if isinstance(meta, dict) else None
    now = f" than its {size:,} records" if isinstance(size, int) and size > 0 else ""
    bigger = f" (e.g. --capacity {2 * size})" if now else ""
    return f"the event ring was full: run pyobmem-run again with a --capacity larger{now}{bigger}"
