"""C01: PyTorch (pip build: every driver entry point through cuGetProcAddress_v2, before cuInit)
allocates tensors of known sizes through its caching allocator, frees a big segment back to the
driver, runs one elementwise kernel, and writes the allocator's own view to the JSON file argv[1]:
live segments (address, size) at a CLOCK_MONOTONIC instant, and the segment counters."""

import ctypes
import json
import os
import sys
import time

import torch

out_path = sys.argv[1]
dev = torch.device("cuda", 0)
MiB = 1 << 20
sizes = [4, 1000, 512 * 1024, MiB + 3, 3 * MiB, 25 * MiB, 100 * MiB + 5]
keep = [torch.empty(s, dtype=torch.uint8, device=dev) for s in sizes]

# A segment handed back to the driver: allocated, freed, cache emptied.
BIG = 200 * MiB
big = torch.empty(BIG, dtype=torch.uint8, device=dev)
big_ptr = big.data_ptr()
del big
torch.cuda.empty_cache()

x = torch.randn(4 * MiB, device=dev)  # 16 MiB of floats: a segment of its own (and z too)
z = x + 1.0
torch.cuda.synchronize()

t_snap = time.monotonic_ns()
snap = torch.cuda.memory._snapshot()
stats = torch.cuda.memory_stats(dev)
ver = ctypes.c_int(0)
ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(ver))
segments = [
    {"address": s["address"], "total_size": s["total_size"], "device": s["device"], "is_expandable": s.get("is_expandable", False)}
    for s in snap["segments"]
    if s["device"] == 0
]
json.dump(
    {
        "pid": os.getpid(),
        "t_snap": t_snap,
        "segments": segments,
        "segment_all_allocated": stats["segment.all.allocated"],
        "segment_all_freed": stats["segment.all.freed"],
        "big_ptr": big_ptr,
        "big_size": BIG,
        "x_ptr": x.data_ptr(),
        "z_ptr": z.data_ptr(),
        "tensors": [[t.data_ptr(), s] for t, s in zip(keep, sizes)],
        "driver_version": ver.value,
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    },
    open(out_path, "w"),
)
print("@ done=1")
