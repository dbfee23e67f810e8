"""torchvision's ResNet-50 (``torchvision.models.resnet50(weights=None)``, unmodified) trained with SGD
(momentum 0.9, weight decay 1e-4, float32) on random 3x224x224 images and 1,000 classes.

The data is drawn on the host for all steps up front from one seeded generator and copied to the
device at each step, as a data loader would. ``--deterministic``: PyTorch's deterministic mode with
``warn_only``: the model's pooling is deterministic on CUDA (MaxPool2d's backward gathers, and
AdaptiveAvgPool2d to 1x1 is computed as a mean), and should a kernel of another PyTorch version
not be, the run warns on stderr ("... does not have a deterministic implementation", which the
swap bench reports) instead of stopping.

    python3 scripts/workloads/resnet50.py --steps 25 --batch 128 --deterministic
"""

from __future__ import annotations

import _common

CLASSES = 1000
SIDE = 224


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=25)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch = _common.import_torch(args.deterministic)
    try:
        import torchvision
    except ImportError as e:
        _common.fail(f"torchvision is not importable ({e})")
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    model = torchvision.models.resnet50(weights=None).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.steps, args.batch, 3, SIDE, SIDE, generator=gen)
    labels = torch.randint(0, CLASSES, (args.steps, args.batch), generator=gen)
    model.train()

    def step(i: int):
        x, y = images[i].to(dev), labels[i].to(dev)
        return _common.optimizer_step(opt, torch.nn.functional.cross_entropy(model(x), y))

    rec = _common.Recorder()
    _common.torch_train(torch, rec, args.steps, step)
    rec.write(args.json, "torch", args, model="torchvision resnet50", batch=args.batch,
              torchvision_version=torchvision.__version__, **_common.torch_memory(torch))


if __name__ == "__main__":
    main()
