"""A stand-in for torchrun in CPU tests of scripts/bench_multigpu.py: ``fake_torchrun.py --standalone
--nproc-per-node N SCRIPT ARGS...`` starts N ``python SCRIPT ARGS`` with RANK, LOCAL_RANK and
WORLD_SIZE set, as torchrun's agent does, waits for them and exits with the worst status."""

import os
import subprocess
import sys

args = sys.argv[1:]
if args and args[0] == "--standalone":
    args = args[1:]
assert args[0] == "--nproc-per-node", args
n, script, rest = int(args[1]), args[2], args[3:]
procs = [subprocess.Popen([sys.executable, script, *rest],
                          env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n)})
         for r in range(n)]
sys.exit(max(p.wait() for p in procs))
