"""Multi-process jobs on one GPU: DDP GPT tiny (scripts/workloads/gpt_ddp.py) under
``pyobmem run -- torchrun --standalone --nproc-per-node N``.

- one rank, NCCL: the merged capture and exactly one per-rank capture, the rank table, the NCCL
  all-reduces recorded with the gradient buckets they name, losses bit-identical to the run without
  pyobmem; in swap mode at 60% of the rank's peak, the same losses, blocks swapped, and no block an
  NCCL call named ever swapped out afterwards;
- two ranks sharing the GPU: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so
  these use the gloo backend (DDP reduces through host memory, no NCCL call): two per-rank captures,
  nothing for the torchrun agent, both ranks in summary's table and the report's Ranks section,
  losses bit-identical to the run without pyobmem.

Every run has a timeout and is ended with its whole process tree when it overruns
(scripts/bench_multigpu.run_bounded). The jobs of 2+ GPUs are scripts/bench_multigpu.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu_util import REPO, child_env, record_figure
from pyobmem.abi import NcclCall
from pyobmem.capture import read_capture
from pyobmem.ranks import ranks, rank_rows

sys.path.insert(0, str(REPO / "scripts"))
import bench_multigpu as bench  # noqa: E402

STEPS = 8
TIMEOUT = 600
WORKLOAD = ["--size", "tiny", "--steps", str(STEPS), "--deterministic", "--seed", "0"]
RANK_ENV = {k: None for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


def torchrun(d: Path, name: str, nproc: int, backend: str, pre: list[str] = ()) -> tuple[bench.Bounded, dict]:
    """Run the job (under ``pre``: the pyobmem launcher) and read each rank's workload JSON."""
    cmd = [*pre, *bench.torchrun(), "--standalone", "--nproc-per-node", str(nproc), str(bench.WORKLOAD), *WORKLOAD,
           "--backend", backend, "--json", str(d / f"{name}.json")]
    r = bench.run_bounded(cmd, TIMEOUT, env=child_env(RANK_ENV), cwd=d)
    assert not r.timed_out, f"{name} timed out\n{r.stderr[-3000:]}"
    assert r.rc == 0, f"{name}: rc {r.rc}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    docs = {k: json.loads((d / f"{name}.rank{k}.json").read_text()) for k in range(nproc)}
    return r, docs


def pyobmem_run(cap: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "pyobmem", "run", *options, "-f", "-o", str(cap), "--"]


def pyobmem(d: Path, *args: str) -> bench.Bounded:
    r = bench.run_bounded([sys.executable, "-m", "pyobmem", *args], 300, env=child_env(), cwd=d)
    assert r.rc == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def one_rank(shim, need_torch, tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp1")
    _, base = torchrun(d, "untraced", 1, "nccl")
    run, traced = torchrun(d, "traced", 1, "nccl", pyobmem_run(d / "job.pyobmem"))
    return d, base, traced, run


@pytest.mark.gpu
def test_one_rank_nccl_traced(one_rank):
    d, base, traced, run = one_rank
    assert sorted(p.name for p in d.glob("*.pyobmem")) == ["job.pyobmem", "job.rank0.pyobmem"], run.stderr[-2000:]
    assert f"pyobmem: per-rank captures: {d / 'job.rank0.pyobmem'}" in run.stderr.splitlines()
    assert traced[0]["losses"] == base[0]["losses"]  # bit for bit
    cap = read_capture(str(d / "job.rank0.pyobmem"))
    assert cap.complete and cap.exit_status == 0
    found = ranks(cap)
    assert [(r.rank, r.local_rank, r.world_size, r.source) for r in found] == [(0, 0, 1, "RANK")]
    assert traced[0]["pid"] == found[0].pids[0]
    row = rank_rows([cap])[0]
    n = cap.nccl
    allreduce = n[n["call"] == NcclCall.ALL_REDUCE]
    record_figure("multigpu_one_rank", {k: row[k] for k in ("peak_live_bytes", "blocks", "launches",
                                                            "attributed_fraction", "nccl_calls", "nccl_bytes",
                                                            "nccl_blocks", "iteration_ns")})
    assert row["launches"] > 50 * STEPS and row["attributed_fraction"] > 0.9, row
    # the barrier, then DDP's bucket all-reduces in every step: each names the bucket, in place
    assert len(allreduce) >= STEPS + 1, n
    grads = allreduce[allreduce["bytes"] > 4096]
    assert len(grads) >= STEPS
    assert np.all(grads["send_block"] >= 0) and np.array_equal(grads["send_block"], grads["recv_block"])
    assert np.array_equal(grads["send_offset"], grads["recv_offset"])
    comm = cap.notes[found[0].pids[0]].get("nccl.comm0")
    assert comm is not None and comm.startswith("rank=0 nranks=1 "), cap.notes
    # the merged capture: the same rank, and nothing else used CUDA (the torchrun agent)
    merged = read_capture(str(d / "job.pyobmem"))
    users = set(np.unique(merged.blocks["pid"]).tolist()) | set(np.unique(merged.ops["pid"]).tolist())
    assert users <= set(found[0].pids)
    text = pyobmem(d, "summary", str(d / "job.pyobmem")).stdout
    assert "Ranks (each rank's processes alone; the figures above are of all together)" in text


@pytest.mark.gpu
def test_one_rank_nccl_swap_never_swaps_nccl_buffers(one_rank):
    d, base, _, _ = one_rank
    peak = rank_rows([read_capture(str(d / "job.rank0.pyobmem"))], iteration=False)[0]["peak_live_bytes"]
    budget = int(0.6 * peak)
    _, swapped = torchrun(d, "swap", 1, "nccl", pyobmem_run(d / "swap.pyobmem", "--swap", "--budget", str(budget)))
    assert swapped[0]["losses"] == base[0]["losses"]  # bit for bit
    f = bench.capture_figures(d / "swap.pyobmem")
    row = f["ranks"][0]
    record_figure("multigpu_one_rank_swap", {"budget_bytes": budget, "peak_bytes": peak, **row["swap"],
                                             "nccl_blocks": row["nccl_blocks"]})
    assert row["nccl_blocks"] >= 1
    assert row["nccl_blocks_swapped_after_named"] == 0, row
    assert row["swap"]["out_count"] > 0, row  # the budget made it swap


@pytest.mark.gpu
def test_two_ranks_share_one_gpu_gloo(shim, need_torch, tmp_path):
    d = tmp_path
    _, base = torchrun(d, "untraced", 2, "gloo")
    run, traced = torchrun(d, "traced", 2, "gloo", pyobmem_run(d / "job.pyobmem"))
    assert sorted(p.name for p in d.glob("*.pyobmem")) == ["job.pyobmem", "job.rank0.pyobmem", "job.rank1.pyobmem"]
    for k in (0, 1):
        assert traced[k]["losses"] == base[k]["losses"], k
    caps = [read_capture(str(d / f"job.rank{k}.pyobmem")) for k in (0, 1)]
    rows = rank_rows(caps)
    assert [(r["rank"], r["local_rank"], r["world_size"]) for r in rows] == [(0, 0, 2), (1, 1, 2)]
    assert [r["pids"][0] for r in rows] == [traced[0]["pid"], traced[1]["pid"]]
    for r in rows:
        assert r["launches"] > 50 * STEPS and r["attributed_fraction"] > 0.9, r
        assert r["nccl_calls"] == 0  # gloo
    text = pyobmem(d, "summary", str(d / "job.rank0.pyobmem"), str(d / "job.rank1.pyobmem")).stdout
    assert text.splitlines()[0] == "2 captures, 2 ranks"
    pyobmem(d, "report", str(d / "job.pyobmem"), "-o", str(d / "job.html"))
    html = (d / "job.html").read_text()
    assert '<section id="ranks"><h2>Ranks</h2>' in html and "2 ranks in 1 capture;" in html
