"""A training script written the way people write them: DataLoader workers, logging every N steps,
evaluation every M steps, gradient accumulation; a small CNN on random CIFAR-shaped images.

Unlike the other workloads it does not synchronise every step: the host reads the loss only when it
logs (``--log-every``), evaluates a few held-out batches under ``torch.no_grad()`` every
``--eval-every`` optimizer steps, and with ``--grad-accum K`` runs K forward/backward micro-steps
(loss / K) per optimizer step. The step lines (``step <i> loss <hex> time_ms <ms>``) are printed at
the logging steps only, ``time_ms`` being the mean per optimizer step since the previous one.

    python3 scripts/workloads/trainer.py --steps 200 --log-every 10 --deterministic
    python3 scripts/workloads/trainer.py --steps 200 --log-every 0 --count-ops   # ops per optimizer step

``--count-ops`` profiles optimizer steps 10-19 (no logging or evaluation among them) with
torch.profiler and writes ``ops_per_step`` (kernels and copies on the GPU, the ops pyobmem's
iteration detection counts) and ``sets_per_step`` into the JSON: the independent count of ops per
optimizer step. Use it on a run without pyobmem.
"""

from __future__ import annotations

import _common

CLASSES = 10
PROFILE_STEPS = range(10, 20)


def build(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, CLASSES),
    )


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N optimizer steps (0: only the last)")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N optimizer steps (0: never)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--count-ops", action="store_true", help="count GPU ops per optimizer step with torch.profiler")
    args = p.parse_args()
    if args.grad_accum < 1 or args.log_every < 0 or args.eval_every < 0:
        _common.fail("--grad-accum must be >= 1, --log-every and --eval-every >= 0")

    torch = _common.import_torch(args.deterministic)
    from torch.utils.data import DataLoader, TensorDataset

    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    model = build(torch).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed)
    n_train = args.steps * args.grad_accum * args.batch
    train = TensorDataset(torch.randn(n_train, 3, 32, 32, generator=gen),
                          torch.randint(0, CLASSES, (n_train,), generator=gen))
    val = TensorDataset(torch.randn(4 * args.batch, 3, 32, 32, generator=gen),
                        torch.randint(0, CLASSES, (4 * args.batch,), generator=gen))
    # shuffle=False: the batches are the same with and without pyobmem (losses compared bit for bit).
    loader = DataLoader(train, batch_size=args.batch, num_workers=args.workers, pin_memory=True,
                        persistent_workers=args.workers > 0)
    val_loader = DataLoader(val, batch_size=args.batch)

    def evaluate() -> float:
        model.eval()
        total = torch.zeros((), device=dev)
        with torch.no_grad():
            for x, y in val_loader:
                total += loss_fn(model(x.to(dev, non_blocking=True)), y.to(dev, non_blocking=True))
        model.train()
        return (total / len(val_loader)).item()

    rec = _common.Recorder()
    prof = None
    counts = {}
    step, micro = 0, 0
    torch.cuda.synchronize()
    t_log = _common.now()
    last_logged = 0
    opt.zero_grad(set_to_none=True)
    for x, y in loader:
        if args.count_ops and micro == 0 and step == PROFILE_STEPS.start:
            torch.cuda.synchronize()
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        loss = loss_fn(model(x.to(dev, non_blocking=True)), y.to(dev, non_blocking=True)) / args.grad_accum
        loss.backward()
        micro += 1
        if micro < args.grad_accum:
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
        micro = 0
        step += 1
        if prof is not None and step == PROFILE_STEPS.stop:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            counts = count_ops(prof, len(PROFILE_STEPS))
            prof = None
        if (args.log_every and step % args.log_every == 0) or step == args.steps:
            value = loss.item() * args.grad_accum
            ms = (_common.now() - t_log) * 1e3 / (step - last_logged)
            rec.step(step - 1, value, ms)
            t_log, last_logged = _common.now(), step
        if args.eval_every and step % args.eval_every == 0:
            print(f"eval {step} loss {float(evaluate()).hex()}", flush=True)
    torch.cuda.synchronize()
    rec.write(args.json, "torch", args, model="cnn-trainer", batch=args.batch, log_every=args.log_every,
              eval_every=args.eval_every, grad_accum=args.grad_accum, workers=args.workers,
              **counts, **_common.torch_memory(torch))


def count_ops(prof, steps: int) -> dict:
    """GPU kernels and copies (and, apart, sets) per optimizer step in a torch.profiler trace."""
    kernels = copies = sets = 0
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        name = e.name.lower()
        if name.startswith("memcpy"):
            copies += 1
        elif name.startswith("memset"):
            sets += 1
        else:
            kernels += 1
    return {"ops_per_step": (kernels + copies) / steps, "kernels_per_step": kernels / steps,
            "copies_per_step": copies / steps, "sets_per_step": sets / steps}


if __name__ == "__main__":
    main()
