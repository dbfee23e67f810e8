"""The verbs of ``pyobmem``: one module per verb, registered in ``COMMANDS`` (help lists them in
this order).

Each module has ``add_parser(subparsers) -> argparse.ArgumentParser`` (adds its subparser and
returns it) and ``run(args) -> int`` (the exit code). User errors raise
``pyobmem.errors.PyobmemError``; the CLI turns them into one line and the exit code.
"""

from . import export, live, patterns, plan, report, run, split, stats, summary

COMMANDS = [run, summary, stats, patterns, report, export, plan, split, live]
