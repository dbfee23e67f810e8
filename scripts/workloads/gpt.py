"""GPT-2 style decoder trained on random tokens in plain PyTorch (fp32, AdamW).

Token and position embeddings, pre-LayerNorm blocks with explicit causal softmax attention (no SDPA
or flash kernels, so ``--deterministic`` runs are bitwise reproducible), a GELU MLP and a head tied
to the token embedding.

    python3 scripts/workloads/gpt.py --size tiny --steps 20 --deterministic

The memory savers a user picks without pyobmem, for comparison with swap mode: ``--save-on-cpu``
(forward and loss under ``torch.autograd.graph.save_on_cpu(pin_memory=True)``) and ``--checkpoint``
(``torch.utils.checkpoint.checkpoint`` on each block, ``use_reentrant=False``).
"""

from __future__ import annotations

import math

import _common

SIZES = {
    # name: (layers, dim, heads, default seq)
    "tiny": (2, 128, 4, 128),
    "small": (12, 768, 12, 1024),  # 124M parameters
    "medium": (24, 1024, 16, 1024),  # 355M parameters
}
VOCAB = 50257


def build(torch, layers: int, dim: int, heads: int, seq: int, checkpoint: bool = False):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, 4 * dim)
            self.fc_proj = nn.Linear(4 * dim, dim)
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            hd = C // heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, heads, hd).transpose(1, 2)
            k = k.view(B, T, heads, hd).transpose(1, 2)
            v = v.view(B, T, heads, hd).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.proj(y)
            x = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return x

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, dim)
            self.wpe = nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, VOCAB, bias=False)
            self.head.weight = self.wte.weight  # tied
            for name, m in self.named_modules():
                if isinstance(m, (nn.Linear, nn.Embedding)) and m is not self.head:
                    scaled = name.endswith("proj")  # residual projections, as in GPT-2
                    std = 0.02 / math.sqrt(2 * layers) if scaled else 0.02
                    torch.nn.init.normal_(m.weight, mean=0.0, std=std)
                    if getattr(m, "bias", None) is not None:
                        torch.nn.init.zeros_(m.bias)

        def forward(self, idx, targets):
            B, T = idx.shape
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            if checkpoint:
                from torch.utils.checkpoint import checkpoint as ckpt

                for blk in self.blocks:
                    x = ckpt(blk, x, use_reentrant=False)
            else:
                for blk in self.blocks:
                    x = blk(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(B * T, VOCAB), targets.reshape(B * T))

    return GPT()


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 1024; tiny: 128)")
    p.add_argument("--save-on-cpu", action="store_true",
                   help="keep the tensors saved for backward in pinned host memory (torch.autograd.graph.save_on_cpu)")
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing: torch.utils.checkpoint on each block (use_reentrant=False)")
    args = p.parse_args()
    layers, dim, heads, seq_default = SIZES[args.size]
    seq = args.seq or seq_default

    torch = _common.import_torch(args.deterministic)
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    model = build(torch, layers, dim, heads, seq, checkpoint=args.checkpoint).to(dev)  # initialised on the CPU: same on any GPU
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, VOCAB, (args.steps, args.batch, seq + 1), generator=gen).to(dev)

    def step(i: int):
        x, y = tokens[i, :, :-1], tokens[i, :, 1:]
        if args.save_on_cpu:
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = model(x, y)
        else:
            loss = model(x, y)
        return _common.optimizer_step(opt, loss)

    rec = _common.Recorder()
    _common.torch_train(torch, rec, args.steps, step)
    n_params = sum(p.numel() for p in model.parameters())
    savers = {k: True for k, on in (("save_on_cpu", args.save_on_cpu), ("checkpoint", args.checkpoint)) if on}
    rec.write(args.json, "torch", args, model=f"gpt-{args.size}", parameters=n_params,
              batch=args.batch, seq=seq, **savers, **_common.torch_memory(torch))


if __name__ == "__main__":
    main()
