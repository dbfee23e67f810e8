"""Launch-bound MLP: 16 Linear+ReLU layers of width 256, batch 32, MSE to random targets, SGD.

About 4 ms and ~100 kernel launches per step on the H200: the workload that shows the tracer's
per-launch cost.

    python3 scripts/workloads/mlp.py --steps 200 --deterministic
"""

from __future__ import annotations

import _common

LAYERS = 16
WIDTH = 256


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=200)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    torch = _common.import_torch(args.deterministic)
    nn = torch.nn
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(args.steps, args.batch, WIDTH, generator=gen).to(dev)
    targets = torch.rand(args.steps, args.batch, WIDTH, generator=gen).to(dev)

    def step(i: int):
        loss = torch.nn.functional.mse_loss(model(inputs[i]), targets[i])
        return _common.optimizer_step(opt, loss)

    rec = _common.Recorder()
    _common.torch_train(torch, rec, args.steps, step)
    rec.write(args.json, "torch", args, model=f"mlp-{LAYERS}x{WIDTH}", batch=args.batch,
              **_common.torch_memory(torch))


if __name__ == "__main__":
    main()
