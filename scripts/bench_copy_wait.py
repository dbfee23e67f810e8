#!/usr/bin/env python3
"""Does an application's small synchronous D2H copy (loss.item()) wait behind
the shim's large swap-out copies on another stream, and does chunking them let it through?

Run: python3 scripts/bench_copy_wait.py OUT.json (a GPU, torch). Session 10's result:
bench/results/swap_logs/session10/call3_copy_wait.json (loss.item() waited 48 ms behind a 2.8 GB
copy out, 42 ms behind it in 4 MiB pieces; 0.07 ms alone).
"""
import json, sys, time
import torch

MIB = 1 << 20
N = 2816 * MIB  # GPT medium's optimizer state, ~2.8 GB
dev = torch.empty(N, dtype=torch.uint8, device="cuda")
host = torch.empty(N, dtype=torch.uint8, pin_memory=True)
hsrc = torch.empty(N, dtype=torch.uint8, pin_memory=True)
loss = torch.ones(1, device="cuda")
batch_h = torch.empty(8 * 1024 * 8, dtype=torch.uint8, pin_memory=True)
batch_d = torch.empty_like(batch_h, device="cuda")
s = torch.cuda.Stream()
res = []

def trial(direction, chunk):
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        e0.record(s)
        step = chunk or N
        for off in range(0, N, step):
            if direction == "d2h":
                host[off:off + step].copy_(dev[off:off + step], non_blocking=True)
            else:
                dev[off:off + step].copy_(hsrc[off:off + step], non_blocking=True)
        e1.record(s)
    time.sleep(0.005)  # the copies are running
    t0 = time.perf_counter()
    if direction == "d2h":
        loss.item()  # a synchronous 4-byte D2H copy on the current (default) stream
    else:
        batch_d.copy_(batch_h, non_blocking=False)  # the next batch's upload
        torch.cuda.current_stream().synchronize()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    total_ms = e0.elapsed_time(e1)
    r = {"direction": direction, "chunk_mib": (chunk or N) // MIB, "small_copy_ms": round((t1 - t0) * 1e3, 3),
         "big_copy_ms": round(total_ms, 2), "gb_s": round(N / total_ms / 1e6, 1)}
    print(json.dumps(r), flush=True)
    return r

for d in ("d2h", "h2d"):
    trial(d, 0)
    for chunk in (0, 64 * MIB, 16 * MIB, 4 * MIB, 0):
        res.append(trial(d, chunk))
# idle: the small copies alone
torch.cuda.synchronize(); t0 = time.perf_counter(); loss.item(); res.append({"idle_item_ms": round((time.perf_counter() - t0) * 1e3, 3)})
print(json.dumps(res[-1]))
json.dump(res, open(sys.argv[1], "w"), indent=1)
