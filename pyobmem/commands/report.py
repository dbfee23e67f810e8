"""``pyobmem report FILE -o report.html [-f]``: the self-contained HTML report of a capture."""

from __future__ import annotations

import sys

from ..export import check_output, open_output
from ..report import write
from .common import load


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="write a self-contained HTML report of a capture",
                              description="Write one HTML file (no network needed to view it): memory over "
                                          "time by block class, the access map of one iteration, idle "
                                          "intervals, the swap saving curve and candidates, the properties. "
                                          "Times: t = 0 at the first CUDA event of the capture.")
    p.add_argument("file", metavar="FILE", help="a .pyobmem capture")
    p.add_argument("-o", "--output", metavar="OUT", help="output HTML (default: FILE with .html)")
    p.add_argument("-f", "--force", action="store_true",
                   help="overwrite the output if it exists (never the capture itself)")
    return p


def run(args) -> int:
    output = args.output or (args.file[: -len(".pyobmem")] if args.file.endswith(".pyobmem") else args.file) + ".html"
    check_output(output, args.force, source=args.file)
    capture = load(args.file, say_incomplete=True)
    with open_output(output, args.force, source=args.file) as f:
        write(capture, f)
    print(f"wrote {output}", file=sys.stderr)
    return 0
