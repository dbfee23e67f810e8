"""``pyobmem report FILE [FILE ...] -o report.html [-f] [--rank R]``: the self-contained HTML report
of a capture; of a distributed job (a merged capture, or one capture per rank), a Ranks section
comparing every rank and the analysis of one rank."""

from __future__ import annotations

import sys

from ..output import check_output, open_output
from ..ranks import pick, rank_views
from ..report import write
from ..report.ranks import section
from .common import distinct, load


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="write a self-contained HTML report of a capture",
                              description="Write one HTML file (no network needed to view it): memory over "
                                          "time by block class, the access map of one iteration, idle "
                                          "intervals, the swap saving curve and candidates, the properties. "
                                          "A distributed job (a capture holding several ranks, or one capture "
                                          "per rank): a Ranks section compares them, the rest analyses one "
                                          "rank. Times: t = 0 at the first CUDA event of the capture.")
    p.add_argument("file", nargs="+", metavar="FILE", help="a .pyobmem capture; several: e.g. one per rank")
    p.add_argument("-o", "--output", metavar="OUT", help="output HTML (default: the first FILE with .html)")
    p.add_argument("-f", "--force", action="store_true",
                   help="overwrite the output if it exists (never a capture itself)")
    p.add_argument("--rank", type=int, metavar="R", help="the rank analysed in detail (default: the lowest)")
    return p


def run(args) -> int:
    first = args.file[0]
    output = args.output or (first[: -len(".pyobmem")] if first.endswith(".pyobmem") else first) + ".html"
    for source in args.file:
        check_output(output, args.force, source=source)
    captures = [load(path, say_incomplete=True) for path in distinct(args.file)]
    detail, rank = pick(captures, args.rank)
    ranks_html, subject = None, None
    if rank is not None or len(captures) > 1:
        views = rank_views(captures)
        subject = rank.label if rank is not None else None
        ranks_html = section(views, f"{subject} ({detail.path})" if subject else detail.path)
    with open_output(output, args.force, source=first) as f:
        write(detail, f, ranks=ranks_html, subject=subject)
    print(f"wrote {output}", file=sys.stderr)
    return 0
