"""``pyobmem split FILE [-f]``: one capture per rank of a distributed job's capture."""

from __future__ import annotations

import shlex
import sys

from ..errors import PyobmemError
from ..ranks import split

NAME = "split"


def add_parser(subparsers):
    p = subparsers.add_parser(
        NAME, help="write one capture per rank of a distributed job (torchrun, mpirun, srun)",
        description="Write FILE's records of each rank (the rank's own process and those it started) to "
                    "<FILE without .pyobmem>.rank<R>.pyobmem next to it. pyobmem-run does this at the end of "
                    "a run whose processes were given ranks; FILE itself is left as it is.")
    p.add_argument("file", metavar="FILE", help="a .pyobmem capture of a distributed job")
    p.add_argument("-f", "--force", action="store_true", help="overwrite per-rank captures that exist")
    return p


def run(args) -> int:
    outs = split(args.file, force=args.force)
    if not outs:
        raise PyobmemError(f"{args.file}: no process of the capture was given a rank (RANK, OMPI_COMM_WORLD_RANK, "
                           "PMI_RANK, SLURM_PROCID of a multi-task job, or an NCCL communicator) and used CUDA")
    for rank, path in outs:
        print(f"{rank.label}: {path} (pids {', '.join(str(p) for p in rank.pids)})", file=sys.stderr)
    print(f"next: pyobmem summary {' '.join(shlex.quote(p) for _, p in outs)}", file=sys.stderr)
    return 0
