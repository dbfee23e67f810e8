"""Exit codes and signals: allocate a 64 MiB tensor, run a kernel on it, then leave by
`exit7` (sys.exit(7)), `sigkill` or `sigterm` (the process signals itself). Prints its pid and
the tensor's address first (flushed)."""

import os
import signal
import sys

import torch

mode = sys.argv[1]
t = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
t += 1
torch.cuda.synchronize()
print(f"@ pid={os.getpid()}\n@ ptr={t.data_ptr():#x}\n@ size={64 << 20}", flush=True)
if mode == "exit7":
    sys.exit(7)
if mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
raise SystemExit(f"unknown mode {mode}")
