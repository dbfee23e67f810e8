"""A stand-in for scripts/workloads/gpt_ddp.py in CPU tests of scripts/bench_multigpu.py: the rank
runs $FAKE_DRIVER (tests/fake_nccl/nccl_driver.c on the fake libcuda: allocations, launches, NCCL
calls) and writes the per-rank JSON gpt_ddp.py would, with made-up losses that depend on the rank
only (so runs agree bit for bit) and step times."""

import json
import os
import subprocess
import sys

rank = int(os.environ["RANK"])
path = sys.argv[sys.argv.index("--json") + 1]
stem, ext = os.path.splitext(path)
subprocess.run([os.environ["FAKE_DRIVER"], "calls"], check=True, stdout=subprocess.DEVNULL, timeout=60)
doc = {"losses": [float(rank + i / 8).hex() for i in range(6)], "step_ms": [5.0, 5.0, 5.0, 2.0, 2.0, 2.0],
       "pid": os.getpid(), "device_name": "fake", "torch_version": "none"}
with open(f"{stem}.rank{rank}{ext}", "w") as f:
    json.dump(doc, f)
