"""Command line: ``pyobmem <verb> ...`` (``main``) and ``pyobmem-run ...`` (``run_main``).

Errors the user can act on are one line, ``pyobmem: error: <message>``, and an exit code; usage
errors exit 2 (argparse); Ctrl-C exits 130 without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .commands import COMMANDS
from .commands import run as run_command
from .errors import PyobmemError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyobmem",
        description="GPU memory tracer for DNN training: record a run, then look at the capture.",
        epilog="start with: pyobmem run python train.py   (the same as: pyobmem-run python train.py)",
    )
    parser.add_argument("--version", action="version", version=f"pyobmem {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="<command>", required=True)
    for module in COMMANDS:
        module.add_parser(subparsers).set_defaults(_run=module.run)
    return parser


def build_run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyobmem-run",
        usage="pyobmem-run [-o FILE] [-f] [--capacity N] [--cupti | --no-cupti] [--no-presets] [--tensor-blocks] [-q] [--swap --budget SIZE [--min-swap-bytes N]] [--live] [--] cmd ...",
        description=run_command.DESCRIPTION,
        epilog=run_command.epilog("pyobmem-run"),
    )
    parser.add_argument("--version", action="version", version=f"pyobmem {__version__}")
    run_command.add_arguments(parser)
    parser.set_defaults(_run=run_command.run)
    return parser


def _dispatch(parser: argparse.ArgumentParser, argv) -> int:
    try:
        args = parser.parse_args(argv)
        return args._run(args)
    except PyobmemError as e:
        print(f"pyobmem: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pyobmem summary x | head`: stop quietly (and keep Python from complaining at exit).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def main(argv=None) -> int:
    """``pyobmem``."""
    return _dispatch(build_parser(), argv)


def run_main(argv=None) -> int:
    """``pyobmem-run`` (the same as ``pyobmem run``)."""
    return _dispatch(build_run_parser(), argv)
