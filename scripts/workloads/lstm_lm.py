"""LSTM language model: PyTorch's word-language-model example on random tokens (launch-bound).

Embedding 200, a 2-layer cuDNN LSTM (torch.nn.LSTM) of hidden size 200, dropout 0.2, a linear
decoder over 33,278 tokens (WikiText-2's vocabulary), batch 20, bptt 35; truncated
backpropagation (the hidden state is detached between batches), gradients clipped to norm 0.25
and plain SGD at lr 20 written out per parameter, as the example does (``--optimizer adam`` for
torch.optim.Adam). About 6 ms and ~380 kernel launches and copies per batch on the H200: the
workload on which the tracer's per-op cost shows most. One step is one batch.

    python3 scripts/workloads/lstm_lm.py --steps 400
"""

from __future__ import annotations

import _common

VOCAB = 33278  # WikiText-2
EMBED = 200
HIDDEN = 200
LAYERS = 2
DROPOUT = 0.2
BPTT = 35
LR = 20.0
ADAM_LR = 1e-3
CLIP = 0.25


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=400)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                   help="sgd: the example's update written out per parameter (default); adam: torch.optim.Adam")
    args = p.parse_args()

    torch = _common.import_torch(args.deterministic)
    nn = torch.nn
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)

    class RNNModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(DROPOUT)
            self.encoder = nn.Embedding(VOCAB, EMBED)
            self.rnn = nn.LSTM(EMBED, HIDDEN, LAYERS, dropout=DROPOUT)
            self.decoder = nn.Linear(HIDDEN, VOCAB)
            nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

        def forward(self, x, hidden):
            emb = self.drop(self.encoder(x))
            out, hidden = self.rnn(emb, hidden)
            out = self.decoder(self.drop(out)).view(-1, VOCAB)
            return torch.nn.functional.log_softmax(out, dim=1), hidden

    model = RNNModel().to(dev)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=ADAM_LR) if args.optimizer == "adam" else None
    gen = torch.Generator().manual_seed(args.seed)
    # Token stream laid out as the example's batchify does: (length, batch), one column per stream.
    data = torch.randint(VOCAB, (args.steps * BPTT + 1, args.batch), generator=gen).to(dev)
    zeros = torch.zeros(LAYERS, args.batch, HIDDEN, device=dev)
    hidden = (zeros, zeros.clone())

    def step(i: int):
        nonlocal hidden
        x = data[i * BPTT:(i + 1) * BPTT]
        y = data[i * BPTT + 1:(i + 1) * BPTT + 1].reshape(-1)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(x, hidden)
        loss = torch.nn.functional.nll_loss(out, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                for prm in params:
                    prm.add_(prm.grad, alpha=-LR)
        return loss.detach()

    rec = _common.Recorder()
    _common.torch_train(torch, rec, args.steps, step)
    rec.write(args.json, "torch", args, model=f"lstm-lm-{LAYERS}x{HIDDEN}", batch=args.batch, bptt=BPTT,
              optimizer=args.optimizer, **_common.torch_memory(torch))


if __name__ == "__main__":
    main()
