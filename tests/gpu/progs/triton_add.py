"""C03 (Triton): a Triton kernel launched three times on torch tensors of 16 MiB each (each one
is a caching-allocator segment of its own, at offset 0). Writes pointers and segments to the JSON
file argv[1]."""

import json
import os
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


n = 4 << 20
dev = torch.device("cuda", 0)
torch.manual_seed(0)
x = torch.randn(n, device=dev)
y = torch.randn(n, device=dev)
out = torch.empty(n, device=dev)
LAUNCHES = 3
for _ in range(LAUNCHES):
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
torch.cuda.synchronize()
ok = bool(torch.equal(out, x + y))
t_snap = time.monotonic_ns()
snap = torch.cuda.memory._snapshot()
json.dump(
    {
        "pid": os.getpid(),
        "launches": LAUNCHES,
        "ok": ok,
        "x": x.data_ptr(),
        "y": y.data_ptr(),
        "out": out.data_ptr(),
        "t_snap": t_snap,
        "triton": triton.__version__,
        "segments": [{"address": s["address"], "total_size": s["total_size"]} for s in snap["segments"] if s["device"] == 0],
    },
    open(sys.argv[1], "w"),
)
print("@ done=1")
