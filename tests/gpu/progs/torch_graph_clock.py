"""GPU clock under CUDA graph capture (C11): 200 small ops on the default (legacy) stream, then a
graph of 50 ops captured on a side stream (global capture mode, as torch.cuda.graph does) and
replayed 3 times, then 200 ops on another side stream. Prints the result's checksum
(identical with and without pyobmem) and the capture's stream."""

import torch

x = torch.ones(1 << 16, device="cuda")
for _ in range(200):
    x.mul_(1.0001)
g = torch.cuda.CUDAGraph()
static = torch.ones(1 << 16, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):  # warm-up on the side stream
        static.add_(1.0)
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    for _ in range(50):
        static.mul_(1.0001)
for _ in range(3):
    g.replay()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    y = x.clone()
    for _ in range(200):
        y.add_(0.5)
torch.cuda.synchronize()
print(f"@ checksum={float(x.sum()):.6f},{float(static.sum()):.6f},{float(y.sum()):.6f}", flush=True)
print("@ done=1", flush=True)
