"""C19: a cuDNN conv2d forward and backward. Writes to the JSON file argv[1]: sha256 of the output
and of every gradient, the cuDNN libraries mapped into the process (sub-libraries are dlopen'ed
by libcudnn at first use: an interposed dlopen breaks their RPATH lookup), and the live segments."""

import hashlib
import json
import os
import sys
import time

import torch

out_path = sys.argv[1]
torch.manual_seed(1234)
torch.backends.cudnn.enabled = True
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
dev = torch.device("cuda", 0)

conv = torch.nn.Conv2d(16, 32, kernel_size=3, padding=1).to(dev)
x = torch.randn(8, 16, 64, 64, device=dev, requires_grad=True)
out = torch.nn.functional.relu(conv(x))
loss = out.square().mean()
loss.backward()
torch.cuda.synchronize()


def digest(t):
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if "libcudnn" in os.path.basename(path):
            libs.add(os.path.basename(path))
t_snap = time.monotonic_ns()
snap = torch.cuda.memory._snapshot()
json.dump(
    {
        "pid": os.getpid(),
        "cudnn_version": torch.backends.cudnn.version(),
        "hashes": {
            "out": digest(out),
            "loss": digest(loss),
            "x.grad": digest(x.grad),
            "weight.grad": digest(conv.weight.grad),
            "bias.grad": digest(conv.bias.grad),
        },
        "cudnn_libs": sorted(libs),
        "t_snap": t_snap,
        "segments": [{"address": s["address"], "total_size": s["total_size"]} for s in snap["segments"] if s["device"] == 0],
    },
    open(out_path, "w"),
)
print("@ done=1")
