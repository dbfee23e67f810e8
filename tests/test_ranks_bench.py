"""CPU tests of the multi-GPU bench's pieces that need no GPU (scripts/bench_multigpu.py,
scripts/workloads/gpt_ddp.py): a run past its timeout ends with its whole process tree, losses
compared rank by rank, the per-rank figures of a merged capture, the workload's per-rank JSON name
and its refusal to run outside torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_nccl import nccl_dir  # noqa: F401  (the fixture, used by name)
from test_ranks import job

from pyobmem.abi import Ev, RankSource

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "workloads"))

import bench_multigpu as bench  # noqa: E402
import gpt_ddp  # noqa: E402


def _pids_running(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in f.read().replace(b"\0", b" "):
                        out.append(int(d))
            except OSError:
                pass
    return [p for p in out if bench._alive(p)]


def test_timeout_ends_the_whole_tree():
    marker = f"{os.getpid() % 1000 + 7000}.25"  # a sleep only this test starts
    t0 = time.monotonic()
    r = bench.run_bounded(["sh", "-c", f"sleep {marker} & (sleep {marker} & wait) & echo started; wait"], 1.5)
    assert r.timed_out and r.rc == 124 and "started" in r.stdout
    assert time.monotonic() - t0 < 20
    assert _pids_running(f"sleep {marker}") == []


def test_bounded_run_passes_the_exit_status():
    r = bench.run_bounded(["sh", "-c", "echo out; echo err >&2; exit 3"], 30)
    assert (r.rc, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)


def make_run(name, losses: dict, step_ms=None):
    run = bench.Run(name, [], bench.Bounded(0, "", "", 0.0, False))
    for r, ls in losses.items():
        run.ranks[r] = {"losses": ls, "step_ms": step_ms or [9.0, 9.0, 9.0, 1.0, 2.0, 3.0]}
    return run


def test_losses_compared_rank_by_rank():
    a = make_run("a", {0: ["0x1p+0", "0x1p-1"], 1: ["0x1p+1", "0x1p-2"]})
    assert bench.compare(a, make_run("b", {0: ["0x1p+0", "0x1p-1"], 1: ["0x1p+1", "0x1p-2"]})) == (True, {0: None, 1: None})
    assert bench.compare(a, make_run("c", {0: ["0x1p+0", "0x1p-1"], 1: ["0x1p+1", "0x1p-3"]})) == (False, {0: None, 1: 1})
    assert bench.compare(a, make_run("d", {0: ["0x1p+0", "0x1p-1"]}))[0] is False  # a rank missing
    assert bench.compare(a, make_run("e", {0: ["0x1p+0"], 1: ["0x1p+1", "0x1p-2"]})) == (False, {0: 1, 1: None})
    assert a.step_ms() == 2.0  # the slowest rank's median after the 3 warm-up steps


def test_capture_figures_of_a_merged_capture(tmp_path):
    from pyobmem.ranks import split

    path = job(tmp_path)
    split(str(path))
    f = bench.capture_figures(path)
    assert [r["rank"] for r in f["ranks"]] == [0, 1, 2]
    assert [Path(r["rank_capture"]).name for r in f["ranks"]] == ["job.rank0.pyobmem", "job.rank1.pyobmem",
                                                                 "job.rank2.pyobmem"]
    assert f["launches"] == 6 and f["launches_attributed_fraction"] == 1.0  # pid 16 has no rank: left out
    r1 = f["ranks"][1]
    assert r1["nccl_by_call"] == {"all_reduce": 1, "send": 1} and r1["nccl_blocks_swapped_after_named"] == 0
    assert r1["swap"]["out_count"] == 0


def test_capture_figures_see_a_pinned_block_swapped_out(tmp_path):
    """A swap-out of a block after an NCCL call named it is counted (what swap mode must never do)."""
    from synth import Trace

    t = Trace(pid=20)
    t.add(Ev.PROCESS, ppid=1, driver_version=13000, rank=0, local_rank=0, world_size=1,
          rank_source=int(RankSource.TORCH))  # rank 0 of 1 (RANK)
    blk = t.alloc(8 << 20)
    t.launch(0x1, [blk])
    t.add(Ev.NCCL, flags=1, send=blk << 40, recv=blk << 40, bytes=64, stream=0x77, peer=0xFFFFFFFF, comm=0)
    t.add(Ev.SWAP_OUT, block_id=blk, bytes=8 << 20)
    t.write(tmp_path / "s.pyobmem")
    f = bench.capture_figures(tmp_path / "s.pyobmem")
    assert f["ranks"][0]["nccl_blocks_swapped_after_named"] == 1
    assert f["ranks"][0]["swap"]["out_bytes"] == 8 << 20


def test_workload_per_rank_json_and_refusal_outside_torchrun(tmp_path):
    assert gpt_ddp.rank_json(None, 0) is None
    assert gpt_ddp.rank_json("out/x.json", 3) == "out/x.rank3.json"
    assert gpt_ddp.rank_json("out/x.{rank}.json", 3) == "out/x.3.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "workloads" / "gpt_ddp.py"), "--size", "tiny"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == "gpt_ddp.py: error: RANK, LOCAL_RANK and WORLD_SIZE are not set: run this under torchrun"


@pytest.mark.parametrize("argv,message", [
    (["--nproc", "0"], "--nproc must be at least 1"),
])
def test_bench_refuses_bad_options_before_running(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(bench, "visible_gpus", lambda: 1)
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_refuses_two_nccl_ranks_on_one_gpu(monkeypatch, capsys):
    monkeypatch.setattr(bench, "visible_gpus", lambda: 1)
    with pytest.raises(SystemExit) as e:
        bench.main(["--nproc", "2"])
    assert e.value.code == 2
    assert "2 ranks on 1 GPU(s): NCCL refuses two ranks on one GPU; use --backend gloo" in capsys.readouterr().err


def test_bench_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(bench, "visible_gpus", lambda: 0)
    with pytest.raises(SystemExit) as e:
        bench.main([])
    assert e.value.code == 2 and "no NVIDIA GPU here" in capsys.readouterr().err


def test_bench_end_to_end_with_fakes(nccl_dir, tmp_path, monkeypatch):  # noqa: F811
    """The whole bench on the CPU: a fake torchrun starting two ranks of a fake workload whose CUDA
    process is tests/fake_nccl/nccl_driver.c on the fake libcuda (NCCL calls included); untraced,
    traced and swap runs, the JSON the issue asks for."""
    fakes = ROOT / "tests" / "fake_nccl"
    monkeypatch.setattr(bench, "visible_gpus", lambda: 2)
    monkeypatch.setattr(bench, "torch_available", lambda: True)
    monkeypatch.setattr(bench, "torchrun", lambda: [sys.executable, str(fakes / "fake_torchrun.py")])
    monkeypatch.setattr(bench, "WORKLOAD", fakes / "fake_ddp_workload.py")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(nccl_dir))
    monkeypatch.setenv("FAKE_DRIVER", str(nccl_dir / "nccl_driver_linked"))
    monkeypatch.setenv("PYOBMEM_BENCH_LAUNCHER", f"{sys.executable} -m pyobmem run --no-cupti")
    out = tmp_path / "multigpu.json"
    rc = bench.main(["--out", str(out), "--capture-dir", str(tmp_path / "caps"), "--timeout", "120"])
    doc = json.loads(out.read_text())
    assert rc == 0, doc["errors"]
    assert doc["errors"] == []
    assert (doc["nproc"], doc["ranks_traced"], doc["loss_identical"]) == (2, 2, True)
    assert doc["launches_attributed_fraction"] == 1.0  # the driver's two launches, each on its block
    assert len(doc["peak_bytes_per_rank"]) == 2 and all(p == 5 << 20 for p in doc["peak_bytes_per_rank"])
    assert doc["time_ratio"] == 1.0
    assert [r["rank"] for r in doc["traced"]["ranks"]] == [0, 1]
    assert all(r["nccl_calls"] == 16 for r in doc["traced"]["ranks"])
    assert doc["swap"]["budget_bytes"] == int(0.6 * (5 << 20)) and doc["swap"]["loss_identical"] is True
    assert sorted(p.name for p in (tmp_path / "caps").glob("*.pyobmem")) == [
        "multigpu.pyobmem", "multigpu.rank0.pyobmem", "multigpu.rank1.pyobmem", "multigpu_swap.pyobmem",
        "multigpu_swap.rank0.pyobmem", "multigpu_swap.rank1.pyobmem"]
