"""GPT-2 style decoder (gpt.py's model) trained with DistributedDataParallel, one process per rank.

Run it under torchrun, which sets RANK, LOCAL_RANK and WORLD_SIZE:

    torchrun --standalone --nproc-per-node 2 scripts/workloads/gpt_ddp.py --size tiny --steps 20 --deterministic

Rank r uses GPU ``LOCAL_RANK % device count`` (two ranks may share one GPU with ``--backend gloo``;
NCCL refuses two ranks on one GPU) and trains on its own slice of one random token set, so every
run with the same seed and world size sees the same data. Each rank prints its step lines with a
``rank <r>`` prefix and writes ``--json PATH`` as PATH with ``{rank}`` replaced (or ``.rank<r>``
added before the extension): its losses (before DDP's gradient averaging: the rank's own loss),
step times and memory statistics, as the other workloads do.
"""

from __future__ import annotations

import os

import _common
from gpt import SIZES, VOCAB, build


def rank_json(path: str | None, rank: int) -> str | None:
    """``out.json`` -> ``out.rank1.json``; ``out.{rank}.json`` -> ``out.1.json``."""
    if not path:
        return None
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


class RankRecorder(_common.Recorder):
    """Step lines prefixed with the rank (torchrun interleaves the ranks' output)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def step(self, i: int, loss: float, ms: float) -> None:
        h = float(loss).hex()
        self.losses.append(h)
        self.step_ms.append(round(ms, 4))
        print(f"rank {self.rank} step {i} loss {h} time_ms {ms:.3f}", flush=True)


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step (default 8)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 1024; tiny: 128)")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl", help="torch.distributed backend")
    args = p.parse_args()
    try:
        rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    except (KeyError, ValueError):
        _common.fail("RANK, LOCAL_RANK and WORLD_SIZE are not set: run this under torchrun")
    layers, dim, heads, seq_default = SIZES[args.size]
    seq = args.seq or seq_default

    torch = _common.import_torch(args.deterministic)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    dist.barrier()
    torch.manual_seed(args.seed)
    model = build(torch, layers, dim, heads, seq).to(dev)  # initialised on the CPU: the same on every rank
    ddp = DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, VOCAB, (args.steps, world, args.batch, seq + 1), generator=gen)[:, rank].to(dev)

    def step(i: int):
        x, y = tokens[i, :, :-1], tokens[i, :, 1:]
        loss = ddp(x, y)
        return _common.optimizer_step(opt, loss)

    rec = RankRecorder(rank)
    _common.torch_train(torch, rec, args.steps, step)
    n_params = sum(q.numel() for q in model.parameters())
    memory = _common.torch_memory(torch)
    memory["device_name"] = torch.cuda.get_device_name(dev)
    rec.write(rank_json(args.json, rank), "torch", args, model=f"gpt-{args.size}", parameters=n_params,
              batch=args.batch, seq=seq, rank=rank, local_rank=local_rank, world_size=world, backend=args.backend,
              device=dev.index, pid=os.getpid(), **memory)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
