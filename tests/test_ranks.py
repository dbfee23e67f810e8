"""Ranks of a distributed job (pyobmem/ranks.py): the shim's rank fields of the PROCESS record, which
process is which rank, one capture per rank (split), and the rank table of summary and report.

The shim side runs tests/fake_nccl/nccl_driver.c on the fake libcuda (test_nccl's fixture); the
Python side uses synthetic merged captures built record by record (tests/synth.py), and one
end-to-end run of ``pyobmem run`` over a shell that starts two ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synth import Trace
from test_nccl import nccl_dir, run_nccl  # noqa: F401  (nccl_dir: the fixture, used by name)

from pyobmem import abi, ranks
from pyobmem.model.gpuclock import gpu_op_times
from pyobmem.abi import Ev, NcclCall, RankSource
from pyobmem.capture import read_capture, read_records
from pyobmem.commands import summary
from pyobmem.errors import PyobmemError
from helpers import pyobmem

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
NONE = abi.RANK_UNKNOWN


def rank_fields(rank, local=NONE, world=0, source=RankSource.TORCH):
    """PROCESS rank fields by name (abi.h), for synth.Trace.add."""
    return {"rank": rank, "local_rank": local, "world_size": world, "rank_source": int(source)}


# ---------------------------------------------------------------- the shim: PROCESS rank fields


@pytest.mark.parametrize("env,want", [
    ({}, (-1, -1, 0, RankSource.NONE)),
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, (3, 1, 8, RankSource.TORCH)),
    ({"RANK": "3", "SLURM_PROCID": "5", "SLURM_NTASKS": "9"}, (3, -1, 0, RankSource.TORCH)),  # RANK first
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"},
     (2, 0, 4, RankSource.OMPI)),
    ({"PMI_RANK": "7", "PMI_SIZE": "16"}, (7, -1, 16, RankSource.PMI)),
    ({"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2"}, (1, 1, 2, RankSource.SLURM)),
    ({"RANK": "x1", "WORLD_SIZE": "2"}, (-1, -1, 0, RankSource.NONE)),  # not a number: no rank
    ({"RANK": "-1"}, (-1, -1, 0, RankSource.NONE)),
])
def test_process_record_carries_the_launchers_rank(nccl_dir, tmp_path, env, want):
    clean = {k: "" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID",
                             "SLURM_LOCALID", "SLURM_NTASKS")}
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "init", env={**clean, **env})
    proc = run.of(Ev.PROCESS)
    assert len(proc) == 1
    from pyobmem.capture import decode_records

    p = decode_records(run.records).processes
    assert (int(p["rank"][0]), int(p["local_rank"][0]), int(p["world_size"][0]), int(p["rank_source"][0])) == want


# ---------------------------------------------------------------- which process is which rank


def job(tmp_path: Path, end=True) -> Path:
    """A merged capture of a torchrun-like job on one host:
    10: the agent (no rank; a PROCESS record, no CUDA);
    11: rank 0 (RANK env), 13: its child (no rank of its own, uses CUDA: rank 0's);
    12: rank 1 (RANK env), with an NCCL all-reduce on its block;
    14: rank 2 from its NCCL communicator only (no env);
    15: rank 3 that never used CUDA (no capture); 16: a process without rank that used CUDA
    (only in the merged capture); 17: Slurm rank 0 of a one-task step (no rank)."""
    t = Trace(pid=10)
    t.pid = 11
    t.add(Ev.PROCESS, ppid=10, driver_version=13000, **rank_fields(0, 0, 4))
    a0 = t.alloc(64 * MiB)
    for _ in range(4):
        t.launch(0x100, [a0])
    t.pid = 12
    t.add(Ev.PROCESS, ppid=10, driver_version=13000, **rank_fields(1, 1, 4))
    t.next_block = 1
    a1 = t.alloc(32 * MiB)
    b1 = t.alloc(MiB)
    t.launch(0x100, [a1])
    t.text(Ev.NOTE, 0, "nccl.comm0=rank=1 nranks=4 device=1")
    t.add(Ev.NCCL, flags=int(NcclCall.ALL_REDUCE), send=(a1 << 40) | 64, recv=(a1 << 40) | 64, bytes=4096, stream=0x77,
          peer=abi.RANK_UNKNOWN, comm=0)
    t.add(Ev.NCCL, flags=int(NcclCall.SEND), send=(b1 << 40), recv=0, bytes=256, stream=0x77, peer=3, comm=0)
    t.pid = 13
    t.add(Ev.PROCESS, ppid=11, driver_version=13000)
    t.next_block = 1
    c0 = t.alloc(2 * MiB)
    t.launch(0x200, [c0])
    t.pid = 14
    t.add(Ev.PROCESS, ppid=10, driver_version=13000)
    t.text(Ev.NOTE, 0, "nccl.comm0=rank=0 nranks=1 device=2")
    t.text(Ev.NOTE, 0, "nccl.comm1=rank=2 nranks=4 device=2")
    t.next_block = 1
    t.alloc(8 * MiB)
    t.pid = 15
    t.add(Ev.PROCESS, ppid=10, driver_version=13000, **rank_fields(3))
    t.pid = 16
    t.add(Ev.PROCESS, ppid=1, driver_version=13000)
    t.next_block = 1
    t.alloc(MiB)
    t.pid = 17
    t.add(Ev.PROCESS, ppid=1, driver_version=13000, **rank_fields(0, 0, 1, RankSource.SLURM))
    t.next_block = 1
    t.alloc(MiB)
    t.pid = 11
    t.free(a0)
    t.add(Ev.DROPPED, count=5)
    path = tmp_path / "job.pyobmem"
    t.write(path, meta={"argv": ["torchrun", "train.py"]}, end=end)
    return path


def test_ranks_of_a_job(tmp_path):
    cap = read_capture(str(job(tmp_path)))
    found = ranks.ranks(cap)
    assert [(r.rank, r.pids, r.source, r.active) for r in found] == [
        (0, (11, 13), "RANK", True), (1, (12,), "RANK", True), (2, (14,), "NCCL", True), (3, (15,), "RANK", False)]
    assert (found[0].local_rank, found[0].world_size) == (0, 4)
    assert (found[2].local_rank, found[2].world_size) == (None, 4)  # the largest communicator


def test_subset_renumbers_rows(tmp_path):
    cap = read_capture(str(job(tmp_path)))
    one = ranks.subset(cap, [12])
    assert one.blocks["pid"].tolist() == [12, 12] and one.blocks["size"].tolist() == [32 * MiB, MiB]
    assert len(one.ops) == 1 and one.accesses["block"].tolist() == [0] and one.accesses["op"].tolist() == [0]
    assert one.nccl["send_block"].tolist() == [0, 1] and one.nccl["recv_block"].tolist() == [0, -1]
    assert one.nccl["send_offset"].tolist() == [64, 0] and one.nccl["peer"].tolist() == [-1, 3]
    assert list(one.notes) == [12] and one.processes["pid"].tolist() == [12]
    zero = ranks.subset(cap, [11, 13])
    assert zero.drops["count"].tolist() == [5]
    assert sorted(zero.accesses["block"].tolist()) == [0, 0, 0, 0, 1]


def test_rank_figures(tmp_path):
    cap = read_capture(str(job(tmp_path)))
    rows = ranks.rank_rows([cap])
    assert [r["rank"] for r in rows] == [0, 1, 2]
    r0, r1, r2 = rows
    assert r0["pids"] == [11, 13] and r0["peak_live_bytes"] == 66 * MiB and r0["launches"] == 5
    assert r0["attributed_fraction"] == 1.0 and r0["dropped"] == 5
    assert r1["peak_live_bytes"] == 33 * MiB and r1["nccl_calls"] == 2 and r1["nccl_bytes"] == 4096 + 256
    assert r1["nccl_blocks"] == 2
    assert r2["launches"] == 0 and r2["attributed_fraction"] is None and r2["peak_live_bytes"] == 8 * MiB


# ---------------------------------------------------------------- one capture per rank


def test_split_writes_each_ranks_records(tmp_path):
    path = job(tmp_path)
    outs = ranks.split(str(path))
    assert [(r.rank, Path(p).name) for r, p in outs] == [
        (0, "job.rank0.pyobmem"), (1, "job.rank1.pyobmem"), (2, "job.rank2.pyobmem")]
    assert not (tmp_path / "job.rank3.pyobmem").exists()  # rank 3 never used CUDA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.pyobmem", "job.rank0.pyobmem", "job.rank1.pyobmem",
                                                         "job.rank2.pyobmem"]
    _, merged = read_records(str(path))
    for r, p in outs:
        meta, recs = read_records(p)
        want = merged[np.isin(merged["pid"], list(r.pids)) | (merged["type"] == Ev.CAPTURE_END)]
        assert np.array_equal(recs, want)
        assert meta["rank"]["rank"] == r.rank and meta["rank"]["pids"] == list(r.pids)
        assert meta["argv"] == ["torchrun", "train.py"]
        cap = read_capture(p)
        assert cap.complete and cap.exit_status == 0
        assert [x.rank for x in ranks.ranks(cap)] == [r.rank]
    # the figures of a per-rank capture are the rank's figures in the merged one
    per_file = ranks.rank_rows([read_capture(p) for _, p in outs])
    in_merged = ranks.rank_rows([read_capture(str(path))])
    for a, b in zip(per_file, in_merged):
        assert {k: v for k, v in a.items() if k != "file"} == {k: v for k, v in b.items() if k != "file"}


def test_split_refuses_to_overwrite_and_keeps_a_cut_capture(tmp_path):
    path = job(tmp_path, end=False)  # the run was cut short: no end record
    ranks.split(str(path))
    with pytest.raises(PyobmemError, match="exists; use -f"):
        ranks.split(str(path))
    outs = ranks.split(str(path), force=True)
    assert len(outs) == 3
    for _, p in outs:
        assert not read_capture(p).complete
    assert not list(tmp_path.glob("*.tmp"))


def test_split_without_ranks(tmp_path):
    t = Trace()
    t.launch(0x1, [t.alloc(MiB)])
    t.write(tmp_path / "one.pyobmem")
    assert ranks.split(str(tmp_path / "one.pyobmem")) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.pyobmem"]


# ---------------------------------------------------------------- summary and report


def test_summary_rank_table(tmp_path):
    path = job(tmp_path)
    s = summary.summarize(read_capture(str(path)))
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2]
    text = summary.format_summary(s)
    lines = text.splitlines()
    head = lines.index("Ranks (each rank's processes alone; the figures above are of all together)")
    table = lines[head + 1: head + 5]
    assert table[0].split()[:5] == ["rank", "local", "pids", "GPU", "peak"]
    assert table[1].split()[:3] == ["0", "0", "11,13"] and "66.0 MiB" in table[1]
    assert table[2].split()[:3] == ["1", "1", "12"] and "33.0 MiB" in table[2] and "4.2 KiB" in table[2]
    assert table[3].split()[:3] == ["2", "-", "14"]
    short = summary.format_short(s)
    assert "3 ranks (the figures above are of all processes together):" in short
    # a capture without ranks has no rank table
    t = Trace()
    t.launch(0x1, [t.alloc(MiB)])
    t.write(tmp_path / "plain.pyobmem")
    plain = summary.summarize(read_capture(str(tmp_path / "plain.pyobmem")))
    assert plain["ranks"] is None and "Ranks" not in summary.format_summary(plain)


def test_summary_of_several_captures(tmp_path):
    path = job(tmp_path)
    outs = [p for _, p in ranks.split(str(path))]
    proc = pyobmem("summary", *outs, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "3 captures, 3 ranks"
    assert lines[1].split()[-1] == "capture"
    assert lines[2].split()[0] == "0" and lines[2].split()[-1] == "job.rank0.pyobmem"
    assert sum(line.startswith("Capture ") for line in lines) == 3
    proc = pyobmem("summary", "--json", *outs, cwd=tmp_path)
    m = json.loads(proc.stdout)
    assert [r["rank"] for r in m["ranks"]] == [0, 1, 2] and len(m["captures"]) == 3
    assert m["ranks"][1]["nccl_calls"] == 2


def test_report_ranks_section(tmp_path):
    path = job(tmp_path)
    proc = pyobmem("report", path, "-o", tmp_path / "r.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "r.html").read_text()
    assert '<section id="ranks"><h2>Ranks</h2>' in html
    assert "3 ranks in 1 capture;" in html and "The sections below analyse rank 0" in html
    assert "rank 0 of " in html  # the title line
    assert html.count("<polyline") >= 3  # one line per rank
    assert "Peak live bytes from 8.0 MiB (rank 2) to 66.0 MiB (rank 0)" in html
    proc = pyobmem("report", path, "-o", tmp_path / "r1.html", "--rank", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "The sections below analyse rank 1" in (tmp_path / "r1.html").read_text()
    proc = pyobmem("report", path, "-o", tmp_path / "r9.html", "--rank", "9", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "pyobmem: error: no rank 9 in the captures (ranks: 0, 1, 2)"
    # one capture per rank: the same section, with the capture column
    outs = [p for _, p in ranks.split(str(path))]
    proc = pyobmem("report", *outs, "-o", tmp_path / "rr.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "rr.html").read_text()
    assert "3 ranks in 3 captures;" in html and "job.rank2.pyobmem" in html


def test_split_verb(tmp_path):
    path = job(tmp_path)
    proc = pyobmem("split", path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == f"rank 0: {tmp_path / 'job.rank0.pyobmem'} (pids 11, 13)"
    assert pyobmem("split", path, cwd=tmp_path).returncode == 1  # exists
    assert pyobmem("split", "-f", path, cwd=tmp_path).returncode == 0
    t = Trace()
    t.write(tmp_path / "plain.pyobmem")
    proc = pyobmem("split", tmp_path / "plain.pyobmem", cwd=tmp_path)
    assert proc.returncode == 1 and "no process of the capture was given a rank" in proc.stderr


# ---------------------------------------------------------------- end to end: pyobmem run over two ranks


def test_run_splits_a_two_rank_job(nccl_dir, tmp_path):  # noqa: F811
    """``pyobmem run -- sh -c '...'`` where the shell (no rank, no CUDA) starts two ranks of the fake
    CUDA program, each calling NCCL: the merged capture and one capture per rank, nothing for the shell."""
    drv = nccl_dir / "nccl_driver_linked"
    script = (f"RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 {drv} calls > r0.out & "
              f"RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 {drv} calls > r1.out & wait")
    env = {"LD_LIBRARY_PATH": str(nccl_dir)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        env[k] = ""
    proc = pyobmem("run", "--no-cupti", "-o", tmp_path / "job.pyobmem", "--", "sh", "-c", script, cwd=tmp_path,
                   env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.glob("*.pyobmem")) == ["job.pyobmem", "job.rank0.pyobmem",
                                                                 "job.rank1.pyobmem"]
    err = proc.stderr.splitlines()
    assert f"pyobmem: per-rank captures: {tmp_path / 'job.rank0.pyobmem'} {tmp_path / 'job.rank1.pyobmem'}" in err
    assert any(line.startswith("pyobmem: 2 ranks") for line in err)
    merged = read_capture(str(tmp_path / "job.pyobmem"))
    pids = {}
    for r in (0, 1):
        out = dict(line.split("=", 1) for line in (tmp_path / f"r{r}.out").read_text().splitlines()
                   if "=" in line and not line.startswith("call="))
        cap = read_capture(str(tmp_path / f"job.rank{r}.pyobmem"))
        found = ranks.ranks(cap)
        assert [(x.rank, x.local_rank, x.world_size) for x in found] == [(r, r, 2)]
        pids[r] = found[0].pids
        assert len(cap.nccl) == 16 and set(cap.nccl["pid"].tolist()) == set(found[0].pids)
        assert int(cap.blocks["addr"][cap.nccl["send_block"][0]]) == int(out["a"])
        assert cap.complete and cap.exit_status == 0
    assert set(merged.processes["pid"].tolist()) == set(pids[0]) | set(pids[1])  # the shell wrote nothing


def test_subset_keeps_the_gpu_clock_of_its_processes(tmp_path):
    """GPU time samples name op rows: a rank's part of a merged capture renumbers them with its
    ops (report --rank on a merged capture of a GPU-clocked job raised IndexError)."""
    t = Trace(pid=1)
    for pid in (1, 2):
        t.pid, t.seq = pid, 0
        b = t.alloc(MiB)
        for k in range(8):
            t.gpu_time(t.launch(0x1000 + pid, [b]), t.t + 1000 * pid)
    t.write(tmp_path / "two.pyobmem")
    cap = read_capture(str(tmp_path / "two.pyobmem"))
    two = ranks.subset(cap, [2])
    assert len(two.ops) == 8 and two.gpu_times["pid"].tolist() == [2] * 8
    assert two.gpu_times["op"].tolist() == list(range(8))  # rows 8..15 of the merged capture, 0..7 here
    assert (two.ops["seq"][two.gpu_times["op"]] == two.gpu_times["seq"]).all()
    gpu = gpu_op_times(two)
    assert gpu is not None and (gpu - two.ops["ts_ns"].astype(np.int64) >= 0).all()


def test_split_of_a_rank_capture_is_refused(tmp_path):
    """A rank's own capture has nothing to split (a new user got job.rank1.rank1.pyobmem)."""
    ranks.split(str(job(tmp_path)))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(PyobmemError, match=r"job\.rank1\.pyobmem is already the capture of rank 1: nothing to split"):
        ranks.split(str(tmp_path / "job.rank1.pyobmem"))
    assert sorted(p.name for p in tmp_path.iterdir()) == before
