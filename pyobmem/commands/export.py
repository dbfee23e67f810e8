"""``pyobmem export FILE --format memory-viz|perfetto|csv [-o OUT] [-f]``."""

from __future__ import annotations

import sys

from ..capture import read_capture
from ..export import check_output, FORMATS, default_output, export

VIEWERS = {"memory-viz": "open it at pytorch.org/memory_viz, or: python -m torch.cuda._memory_viz stats",
           "perfetto": "open it at ui.perfetto.dev", "csv": "one row per event"}


def add_parser(subparsers):
    p = subparsers.add_parser("export", help="export a capture for other viewers (memory_viz, Perfetto, CSV)",
                              description="Export a capture: memory-viz (PyTorch memory snapshot pickle for "
                                          "pytorch.org/memory_viz), perfetto (Chrome trace JSON for "
                                          "ui.perfetto.dev), csv (one row per event).")
    p.add_argument("file", help="capture file (.pyobmem)")
    p.add_argument("--format", required=True, choices=FORMATS, help="output format")
    p.add_argument("-o", "--output", help="output file (default: FILE with .pickle, .json or .csv)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output if it exists")
    return p


def run(args) -> int:
    output = args.output or default_output(args.file, args.format)
    check_output(output, args.force)
    capture = read_capture(args.file)
    export(capture, args.format, output, force=args.force)
    print(f"wrote {output} ({VIEWERS[args.format]})", file=sys.stderr)
    return 0
