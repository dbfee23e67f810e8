"""Swap-mode PyTorch workload (tests/gpu/test_swap_c10/c13/c14): a deterministic MLP trained with SGD
(momentum), eagerly or captured once in a CUDA graph and replayed (``--graph``), with ``--pressure N``
tensors of 64 MiB each moved forward after every step, so that a tight ``--budget`` has to swap.
The allocator is whatever PYTORCH_CUDA_ALLOC_CONF says (read by torch at start).

    python swap_torch_train.py OUT.json [--steps 12] [--graph] [--pressure 6]

OUT.json: losses (float.hex), sha256 of the final parameters and of the pressure tensors, pid,
the allocator setting, how many graph replays ran.
"""

import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the CUDA context: bitwise reproducible

import torch  # noqa: E402

WIDTH, BATCH = 1024, 512  # weights of 4 MiB, activations of 2 MiB
PRESSURE_ELEMS = 16 << 20  # 64 MiB of float32

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--graph", action="store_true", help="capture one training step in a CUDA graph and replay it")
p.add_argument("--pressure", type=int, default=0, help="64 MiB tensors touched after every step")
a = p.parse_args()

if not torch.cuda.is_available():
    print("swap_torch_train.py: error: no CUDA GPU", file=sys.stderr)
    sys.exit(2)
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
dev = torch.device("cuda", 0)

model = torch.nn.Sequential(
    torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
    torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
    torch.nn.Linear(WIDTH, WIDTH),
).to(dev)  # initialised on the CPU by the seed: the same in every run
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
gen = torch.Generator().manual_seed(1)
xs = torch.randn(a.steps + 3, BATCH, WIDTH, generator=gen).to(dev)
ys = torch.randn(a.steps + 3, BATCH, WIDTH, generator=gen).to(dev)
pressure = [torch.full((PRESSURE_ELEMS,), float(i + 1), device=dev) for i in range(a.pressure)]


def train_step(x, y):
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def push_pressure():
    for t in pressure:
        t.mul_(1.0009765625).add_(0.5)


losses = []
replays = 0
if a.graph:
    static_x, static_y = xs[0].clone(), ys[0].clone()
    # Warm-up on a side stream (torch's recipe): creates the momentum buffers and the gradients.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            static_x.copy_(xs[i])
            static_y.copy_(ys[i])
            train_step(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = train_step(static_x, static_y)
    for i in range(a.steps):
        static_x.copy_(xs[i + 3])
        static_y.copy_(ys[i + 3])
        graph.replay()
        replays += 1
        losses.append(float(static_loss.item()).hex())
        push_pressure()
else:
    for i in range(a.steps):
        loss = train_step(xs[i], ys[i])
        losses.append(float(loss.item()).hex())
        push_pressure()
torch.cuda.synchronize()


def sha(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


doc = {
    "pid": os.getpid(),
    "losses": losses,
    "params_sha256": sha(model.parameters()),
    "pressure_sha256": sha(pressure),
    "graph_replays": replays,
    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    "allocator_backend": torch.cuda.get_allocator_backend(),
    "torch_version": torch.__version__,
}
with open(a.out + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
os.replace(a.out + ".tmp", a.out)
print(f"@ pid={os.getpid()}\n@ steps={a.steps}\n@ replays={replays}", flush=True)
