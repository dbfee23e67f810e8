"""A small PyTorch MLP whose training steps run inside torch.profiler.profile(activities=[CPU, CUDA]),
as a user profiling their script does; the JSON says how many GPU kernel events the trace got.

The first ``--warmup`` steps run unprofiled (cuBLAS handles, the allocator's first segments), then
``--steps`` steps run under the profiler. ``profiler_kernels`` counts the trace's CUDA-device events
that are not copies or sets (0 when the profiler lost its CUPTI subscription, as it did under
pyobmem-run's old CUPTI default), ``profiler_copies`` and ``profiler_sets`` the others.

    python3 scripts/workloads/torch_profiled.py --steps 5 --json out.json
"""

from __future__ import annotations

import _common

WIDTH, DEPTH, CLASSES = 1024, 4, 10


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (default 2)")
    args = p.parse_args()
    torch = _common.import_torch(args.deterministic)
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    nn = torch.nn
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    total = args.warmup + args.steps
    xs = torch.randn(total, args.batch, WIDTH, generator=g).to(dev)
    ys = torch.randint(0, CLASSES, (total, args.batch), generator=g).to(dev)
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        return _common.optimizer_step(opt, loss_fn(model(xs[i]), ys[i]))

    def timed(i):
        torch.cuda.synchronize()
        t0 = _common.now()
        loss = step(i)
        torch.cuda.synchronize()
        rec.step(i, loss.item(), (_common.now() - t0) * 1e3)

    rec = _common.Recorder()
    for i in range(args.warmup):
        timed(i)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.warmup, total):
            timed(i)
    counts = {"profiler_kernels": 0, "profiler_copies": 0, "profiler_sets": 0}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        name = e.name.lower()
        key = "profiler_copies" if name.startswith("memcpy") else "profiler_sets" if name.startswith("memset") else "profiler_kernels"
        counts[key] += 1
    print(f"profiler: {counts['profiler_kernels']} GPU kernel events in {args.steps} steps", flush=True)
    rec.write(args.json, "torch", args, model=f"mlp-{DEPTH}x{WIDTH}", batch=args.batch, warmup=args.warmup,
              **counts, **_common.torch_memory(torch))


if __name__ == "__main__":
    main()
