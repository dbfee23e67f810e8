"""``pyobmem report FILE -o report.html [-f]``: the self-contained HTML report of a capture."""

from __future__ import annotations

import sys

from ..capture import read_capture
from ..export import check_output, open_output
from ..report import write


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="write a self-contained HTML report of a capture",
                              description="Write one HTML file (no network needed to view it): memory over "
                                          "time by block class, the access map of one iteration, idle "
                                          "intervals, the swap saving curve and candidates, the properties.")
    p.add_argument("file", help="capture file (.pyobmem)")
    p.add_argument("-o", "--output", help="output HTML (default: FILE with .html)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output if it exists")
    return p


def run(args) -> int:
    output = args.output or (args.file[: -len(".pyobmem")] if args.file.endswith(".pyobmem") else args.file) + ".html"
    check_output(output, args.force)
    capture = read_capture(args.file)
    with open_output(output, args.force) as f:
        write(capture, f)
    print(f"wrote {output}", file=sys.stderr)
    return 0
