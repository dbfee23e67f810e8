"""Exports of a capture to viewers users already have.

One module per format, each with ``write(capture, path) -> None``:

- ``memory_viz``: PyTorch's memory snapshot pickle (pytorch.org/memory_viz,
  ``python -m torch.cuda._memory_viz stats|trace|segments``);
- ``perfetto``: Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing);
- ``csv``: one row per event.

``export(capture, fmt, path, force)`` picks the module and refuses an existing output without
``force`` (pyobmem.output). The exports read the capture through pyobmem.model (its queries and
its cached Analysis), as the HTML report does.
"""

from __future__ import annotations

import sys

from ..errors import PyobmemError
from ..output import open_output
from . import csv, memory_viz, perfetto

FORMATS = ("memory-viz", "perfetto", "csv")
SUFFIXES = {"memory-viz": ".pickle", "perfetto": ".json", "csv": ".csv"}
WRITERS = {"memory-viz": memory_viz.write, "perfetto": perfetto.write, "csv": csv.write}


def default_output(capture_path: str, fmt: str) -> str:
    """``run.pyobmem`` -> ``run.pickle`` / ``run.json`` / ``run.csv`` beside the capture."""
    stem = capture_path[: -len(".pyobmem")] if capture_path.endswith(".pyobmem") else capture_path
    return stem + SUFFIXES[fmt]


def export(capture, fmt: str, path: str, force: bool = False) -> None:
    """Write ``capture`` (a pyobmem.capture.Capture) to ``path`` in format ``fmt`` (FORMATS); ``-``:
    standard output. The capture's own file is never overwritten."""
    if fmt not in WRITERS:
        raise PyobmemError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    binary = fmt == "memory-viz"
    if path == "-":
        out = sys.stdout.buffer if binary else sys.stdout
        WRITERS[fmt](capture, out)
        out.flush()
        return
    with open_output(path, force, binary=binary, source=getattr(capture, "path", None)) as f:
        WRITERS[fmt](capture, f)
