"""``pyobmem live FILE``: watch a capture while it is written (or a finished one), in the terminal."""

from __future__ import annotations

import argparse

from ..errors import PyobmemError

NAME = "live"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="watch a capture as it is written: memory by class, iterations, largest blocks, drops, swaps",
        description="Watch a capture while pyobmem-run writes it (from a second terminal), or a finished one: "
        "live device memory by block class, the iterations, the largest live blocks, drops and, in swap mode, "
        "the budget, swaps and stalls, refreshed in place. A capture that does not exist yet is waited for. "
        "q or Ctrl-C quits. Without a terminal, prints the current state once.",
        epilog="example: pyobmem live train.pyobmem   (or run and watch at once: pyobmem-run --live python train.py)",
    )
    p.add_argument("capture", metavar="FILE", help="a .pyobmem capture, being written or finished")
    p.add_argument("--log", metavar="LOG", help="a log file to name and show the last lines of (the command's output)")
    return p


def run(args) -> int:
    return view()(args.capture, log=args.log)


def view():
    """The view's entry point (pyobmem.live.view.run); rich, which draws it, is only needed here."""
    try:
        from ..live.view import run as run_view  # deferred: rich only when the view runs
    except ModuleNotFoundError as e:
        if e.name != "rich":
            raise
        raise PyobmemError("pyobmem live needs the rich package: pip install rich") from None
    return run_view
