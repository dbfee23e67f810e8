"""``pyobmem export FILE --format memory-viz|perfetto|csv [-o OUT] [-f]``."""

from __future__ import annotations

import shlex
import sys

from ..export import FORMATS, default_output, export
from ..export.perfetto import OP_SLICE_CAP_US
from ..output import check_output
from .common import load

VIEWERS = {"memory-viz": "open it at pytorch.org/memory_viz, or run: python -m torch.cuda._memory_viz stats {q}",
           "perfetto": "open it at ui.perfetto.dev", "csv": "one row per event"}


def add_parser(subparsers):
    p = subparsers.add_parser("export", help="export a capture for other viewers (memory_viz, Perfetto, CSV)",
                              description="Export a capture: memory-viz (PyTorch memory snapshot pickle for "
                                          "pytorch.org/memory_viz), perfetto (Chrome trace JSON for "
                                          "ui.perfetto.dev), csv (one row per event). Perfetto: t = 0 at the "
                                          "first CUDA event; op slices start at the host launch time and their "
                                          "length is invented (the gap to the next op on the stream, at most "
                                          f"{OP_SLICE_CAP_US:g} µs): the capture has no per-kernel run times, so "
                                          "the slices show order and density, not duration; with a GPU clock, a "
                                          "counter gives the host's lead over the GPU at each sample.")
    p.add_argument("file", metavar="FILE", help="a .pyobmem capture")
    p.add_argument("--format", required=True, choices=FORMATS, help="output format")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="output file (default: FILE with .pickle, .json or .csv; -: standard output)")
    p.add_argument("-f", "--force", action="store_true",
                   help="overwrite the output if it exists (never the capture itself)")
    return p


def run(args) -> int:
    output = args.output or default_output(args.file, args.format)
    if output != "-":
        check_output(output, args.force, source=args.file)
    capture = load(args.file, say_incomplete=True)
    export(capture, args.format, output, force=args.force)
    if output != "-":
        print(f"wrote {output} ({VIEWERS[args.format].format(q=shlex.quote(output))})", file=sys.stderr)
    return 0
