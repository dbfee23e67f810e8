"""``pyobmem run [options] [--] cmd ...`` (also ``pyobmem-run``): trace a command into a capture."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys

from .. import launcher
from ..capture import read_capture
from ..daemon import plans_path, read_plans
from ..errors import PyobmemError
from . import live, summary
from .common import budget_arg

NAME = "run"
DESCRIPTION = (
    "Run a command with the pyobmem shim preloaded and record its device allocations, kernel "
    "launches and copies into a capture file. Processes the command starts are traced too. "
    "The command's exit code is kept."
)


def epilog(prog: str) -> str:
    """The help's example, in the program's own name (``pyobmem run`` or ``pyobmem-run``)."""
    return f"example: {prog} -o train.pyobmem python train.py --epochs 1   (then: pyobmem summary train.pyobmem)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The run options, shared by ``pyobmem run`` and ``pyobmem-run``."""
    p.add_argument("-o", "--output", metavar="FILE", help="capture file (default: pyobmem-<script or cmd>-<pid>.pyobmem)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite the capture file if it exists")
    p.add_argument(
        "--capacity", type=_positive_int, default=launcher.DEFAULT_CAPACITY, metavar="N",
        help=f"event ring size in records of 64 bytes (default {launcher.DEFAULT_CAPACITY})",
    )
    cupti = p.add_mutually_exclusive_group()
    cupti.add_argument(
        "--cupti", action="store_true",
        help="trace launches from CUPTI callbacks instead of the shim's hooks; takes the process's one CUPTI "
        "subscription from profilers (torch.profiler, Nsight); PYOBMEM_CUPTI may name the libcupti",
    )
    cupti.add_argument("--no-cupti", action="store_true",
                       help="the default, said explicitly: launches traced from the shim's hooks, CUPTI left alone")
    p.add_argument(
        "--no-presets", action="store_true",
        help="do not set allocator presets (trace mode: XLA_PYTHON_CLIENT_ALLOCATOR=platform for JAX; swap mode "
             "and --tensor-blocks: the per-tensor ones)",
    )
    p.add_argument(
        "--tensor-blocks", action="store_true",
        help="blocks are tensors: the per-tensor presets of swap mode in a trace (PyTorch backend:cudaMallocAsync, "
             "JAX cuda_async, TensorFlow cuda_malloc_async)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing after the run except errors")
    p.add_argument(
        "--swap", action="store_true",
        help="swap mode: keep device memory under --budget by moving idle blocks to pinned host memory (docs/swap.md)",
    )
    p.add_argument(
        "--budget", metavar="SIZE",
        help="swap mode's device-memory budget: 16GiB or 16G (binary), 16GB (decimal), 500MiB, bytes, or a share of the card's memory, not "
        "of the job's peak: 75%%, or a number up to 1 (0.75; 1: the whole card)",
    )
    p.add_argument(
        "--min-swap-bytes", metavar="N",
        help="swap mode: blocks smaller than this are never VMM-backed nor swapped (default 4MiB)",
    )
    p.add_argument(
        "--live", action="store_true",
        help="watch the run in this terminal with pyobmem live (q closes the view, the run goes on); "
        "the command's output goes to FILE's .log beside it",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="cmd ...", help="the command to trace")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME, help="trace a command into a capture file", description=DESCRIPTION, epilog=epilog("pyobmem run")
    )
    add_arguments(p)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def run(args) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise PyobmemError("no command given (usage: pyobmem run [options] [--] cmd ...)", 2)
    budget = budget_arg(args.budget) if args.budget is not None else None
    min_swap = budget_arg(args.min_swap_bytes, "--min-swap-bytes") if args.min_swap_bytes is not None else None
    if budget is not None and not args.swap:
        raise PyobmemError("--budget needs --swap", 2)
    if min_swap is not None and not args.swap:
        raise PyobmemError("--min-swap-bytes needs --swap", 2)
    if args.swap and budget is None:
        raise PyobmemError("--swap needs --budget SIZE (e.g. 16GiB, or 0.75 / 75% of the card)", 2)
    if args.live:
        _check_live()
    opts = launcher.Options(
        command=command, output=args.output, force=args.force, capacity=args.capacity,
        cupti=args.cupti, presets=not args.no_presets, quiet=args.quiet,
        swap=args.swap, budget=budget, min_swap_bytes=min_swap, tensor_blocks=args.tensor_blocks, live=args.live,
    )
    outcome = launcher.launch(opts)
    try:
        if outcome.daemon_failed:
            _say(outcome.daemon_failed)
        if outcome.rank_error:
            _say(f"error: {outcome.rank_error}")
        if not opts.quiet:
            _report(outcome.output, [path for _, path in outcome.rank_outputs], swap=opts.swap)
            if outcome.log:
                _say(f"the command's output is in {outcome.log}")
    except BrokenPipeError:
        # `pyobmem-run cmd 2>&1 | head`: the reader is gone. What we had to say is lost, the
        # command's exit code is not: quiet the stream so Python's exit flush does not fail too.
        _silence(sys.stderr)
    if outcome.status < 0:
        _die_like(-outcome.status)
    return outcome.exit_code


def _check_live() -> None:
    """--live needs a terminal to draw in and read keys from, and rich (before anything runs)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise PyobmemError("--live needs a terminal (stdin and stdout); watch from another one with: pyobmem live FILE", 2)
    live.view()


def _die_like(signo: int) -> None:
    """End by the signal that killed the command, so that our parent (a shell loop, a job
    runner, subprocess) sees the same death as without pyobmem. Returns if the signal does
    not end the process (then the caller exits 128 + N)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        signal.signal(signo, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signo})
        os.kill(os.getpid(), signo)
    except (OSError, ValueError):
        pass


def _say(line: str) -> None:
    print(f"pyobmem: {line}", file=sys.stderr, flush=True)


def _silence(stream) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _driver_present() -> bool:
    """Whether this process can load the CUDA driver library, as the shim would (dlopen)."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


def trial_lines(plans_file: str) -> list[str]:
    """One line per trial of the replay's choice in the daemon's plans file (pyobmem.daemon: the
    choice stays only when the steps under it ran faster than under the plan it replaced); none
    for a file that cannot be read."""
    out = []
    for k in read_plans(plans_file) or []:
        t = k.get("trial")
        if not isinstance(t, dict):
            continue
        what = "kept" if t.get("kept") else "undone, the plan before it restored"
        if "iteration_ms" in t:
            out.append(f"swap plan {k.get('generation')} (the replay's choice) ran {t['iteration_ms']:.1f} ms a step "
                       f"against {t['previous_iteration_ms']:.1f} before it: {what}")
        else:
            out.append(f"swap plan {k.get('generation')} (the replay's choice) {what}: {t.get('why', 'no verdict')}")
    return out


def _report(path: str, rank_paths: list[str] = (), swap: bool = False) -> None:
    """The short summary, the capture path(s) and what to run next, unless there is nothing to look
    at (no CUDA activity) (stderr: stdout is the command's)."""
    active = False
    try:
        s = summary.summarize(read_capture(path))
        text, active = summary.format_short(s), s["cuda_activity"]
    except PyobmemError as e:
        text = f"error: {e}"
    for line in text.splitlines():
        _say(line)
    _say(f"capture written to {path}")
    if swap and os.path.exists(plans_path(path)):  # the daemon removed an earlier run's at its start
        _say(f"swap plans written to {plans_path(path)}")
        for line in trial_lines(plans_path(path)):
            _say(line)
    if not active:
        if not _driver_present():
            _say("no CUDA driver here (libcuda.so.1 cannot be loaded): the command could not use the GPU")
        return
    q = shlex.quote(path)
    if rank_paths:
        _say(f"per-rank captures: {' '.join(rank_paths)}")
        ranks = " ".join(shlex.quote(p) for p in rank_paths)
        _say(f"next: pyobmem summary {ranks}   or   pyobmem report {q} -o report.html")
        return
    _say(f"next: pyobmem stats {q}   or   pyobmem report {q} -o report.html")
