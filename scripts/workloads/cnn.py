"""ResNet-like CNN (residual stages, BatchNorm, ReLU) on random 3x64x64 images, 100 classes, SGD.

Global average pooling is written as a mean (AdaptiveAvgPool2d has no deterministic CUDA backward)
and the stem is a strided convolution (no max pooling), so ``--deterministic`` runs are bitwise
reproducible.

    python3 scripts/workloads/cnn.py --steps 20 --deterministic
"""

from __future__ import annotations

import _common

CLASSES = 100
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)
BLOCKS_PER_STAGE = 2


def build(torch):
    nn = torch.nn
    F = torch.nn.functional

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = None
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
            layers, cin = [], 64
            for cout, stride in STAGES:
                for b in range(BLOCKS_PER_STAGE):
                    layers.append(BasicBlock(cin, cout, stride if b == 0 else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, CLASSES)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(x.mean(dim=(2, 3)))

    return ResNet()


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    torch = _common.import_torch(args.deterministic)
    if not args.deterministic:
        torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    model = build(torch).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.steps, args.batch, 3, 64, 64, generator=gen).to(dev)
    labels = torch.randint(0, CLASSES, (args.steps, args.batch), generator=gen).to(dev)
    model.train()

    def step(i: int):
        loss = torch.nn.functional.cross_entropy(model(images[i]), labels[i])
        return _common.optimizer_step(opt, loss)

    rec = _common.Recorder()
    _common.torch_train(torch, rec, args.steps, step)
    rec.write(args.json, "torch", args, model="resnet-like", batch=args.batch, **_common.torch_memory(torch))


if __name__ == "__main__":
    main()
