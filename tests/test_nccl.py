"""CPU tests of the shim's NCCL hooks (native/nccl.c) against a fake libnccl.

tests/fake_nccl/fake_nccl.c is built into <tmp>/libnccl.so.2 next to the fake libcuda
(conftest.fake_cuda); it prints every call's arguments as it received them and returns
$FAKE_NCCL_RESULT. tests/fake_nccl/nccl_driver.c calls it, linked (as PyTorch is) or through
dlopen. Each test asserts the exact NCCL records, the unchanged arguments and results, and in swap
mode that a block an NCCL call names comes back before NCCL sees it and is never swapped again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.abi import Ev, NcclCall, SwapInCause
from pyobmem.capture import decode_records
from pyobmem.ring import Ring

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "fake_nccl"
SHIM = ROOT / "pyobmem" / "libpyobmem.so"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
MIB = 1 << 20
S1 = 0x77
NONE32 = 0xFFFFFFFF
FAKE_CFLAGS = ["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I", str(CUDA_INCLUDE)]  # as conftest's

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or not (CUDA_INCLUDE / "cuda.h").exists(), reason="needs gcc and the CUDA headers"
)


@pytest.fixture(scope="session")
def nccl_dir(fake_cuda):
    """The fake libcuda's directory, with libnccl.so.2 and the two drivers built into it."""
    d = fake_cuda
    inc = ["-I", str(SRC)]
    subprocess.run(["gcc", *FAKE_CFLAGS, *inc, "-fPIC", "-shared", "-Wl,-soname,libnccl.so.2", "-o",
                    str(d / "libnccl.so.2"), str(SRC / "fake_nccl.c"), str(d / "libcuda.so.1"), "-ldl"], check=True)
    subprocess.run(["gcc", *FAKE_CFLAGS, *inc, "-DLINKED", "-o", str(d / "nccl_driver_linked"),
                    str(SRC / "nccl_driver.c"), str(d / "libnccl.so.2"), f"-Wl,-rpath-link,{d}", "-ldl"], check=True)
    subprocess.run(["gcc", *FAKE_CFLAGS, *inc, "-o", str(d / "nccl_driver"), str(SRC / "nccl_driver.c"), "-ldl"],
                   check=True)
    return d


class Run:
    def __init__(self, proc, records):
        self.rc, self.stdout, self.stderr, self.records = proc.returncode, proc.stdout, proc.stderr, records
        self.out, self.calls = {}, []
        for line in proc.stdout.splitlines():
            if line.startswith("call="):
                self.calls.append({k: (v if k == "call" else int(v)) for k, v in
                                   (f.split("=", 1) for f in line.split())})
            elif "=" in line:
                k, v = line.split("=", 1)
                self.out[k] = int(v) if v.lstrip("-").isdigit() else v

    def of(self, ev):
        return self.records[self.records["type"] == int(ev)]

    def block_id(self, addr):
        a = self.of(Ev.ALLOC)
        return int(a["a"][a["b"] == addr][-1])

    def word(self, base, offset):
        return (self.block_id(base) << abi.ACCESS_OFFSET_BITS) | offset


def control_file(path: Path, budget: int, min_swap: int) -> Path:
    c = np.zeros(1, dtype=abi.CONTROL_DTYPE)
    c["magic"], c["abi_version"] = abi.CONTROL_MAGIC, abi.ABI_VERSION
    c["budget_bytes"], c["min_swap_bytes"] = budget, min_swap
    c.tofile(path)
    return path


def run_nccl(d, tmp_path, program, *args, env=None, ring=True, timeout=60) -> Run:
    r = Ring.create(capacity=1 << 16, directory=str(tmp_path)) if ring else None
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYOBMEM_", "FAKE_"))}
    e.update(LD_LIBRARY_PATH=str(d), LD_PRELOAD=str(SHIM), PYOBMEM_CUPTI="0")
    if r is not None:
        e["PYOBMEM_RING"] = r.path
    e.update(env or {})
    try:
        proc = subprocess.run([str(d / program), *args], env=e, capture_output=True, text=True, timeout=timeout)
        recs = r.drain() if r is not None else np.zeros(0, abi.RECORD_DTYPE)
    finally:
        if r is not None:
            r.close()
    run = Run(proc, recs)
    assert run.rc == 0 and run.out.get("done") == 1, (proc.stdout, proc.stderr)
    return run


def expected_calls(o):
    """What the fake must have received from scenario_calls: exactly the driver's arguments."""
    a, b, comm, other = o["a"], o["b"], o["comm"], o["other"]
    c = dict(comm=comm, stream=S1, extra=-1)
    return [
        dict(call="ncclAllReduce", send=a + 64, recv=b + 128, count=1000, type=7, op=0, root=-1, **c),
        dict(call="ncclBroadcast", send=a, recv=b, count=10, type=9, op=-1, root=3, **c),
        dict(call="ncclBroadcast", send=b + 8, recv=b + 8, count=5, type=8, op=-1, root=2, **c),  # ncclBcast
        dict(call="ncclReduce", send=a, recv=b, count=7, type=2, op=2, root=1, **c),
        dict(call="ncclAllGather", send=a + 256, recv=b, count=100, type=6, op=-1, root=-1, **c),
        dict(call="ncclReduceScatter", send=a, recv=b + 512, count=100, type=6, op=0, root=-1, comm=other, stream=S1,
             extra=-1),
        dict(call="ncclAlltoAll", send=a, recv=b, count=3, type=0, op=-1, root=-1, **c),
        dict(call="ncclGather", send=a, recv=b, count=4, type=0, op=-1, root=0, **c),
        dict(call="ncclScatter", send=a, recv=b, count=4, type=0, op=-1, root=2, **c),
        dict(call="ncclSend", send=a + 1024, recv=0, count=16, type=7, op=-1, root=3, **c),
        dict(call="ncclRecv", send=0, recv=b + 2048, count=16, type=7, op=-1, root=0, **c),
        dict(call="ncclAllReduceConfig", send=a, recv=a, count=2, type=12345, op=0, root=-1, comm=comm, stream=S1,
             extra=0x5151),
    ]


def check_calls(run):
    got = [{k: v for k, v in c.items() if not k.endswith("_mapped")} for c in run.calls]
    assert got[:12] == expected_calls(run.out)
    assert [c["call"] for c in got[12:]] == ["ncclCommRegister", "ncclCommWindowRegister", "ncclMemAlloc",
                                            "ncclAllReduce"]
    reg, win, mem = got[12:15]
    assert (reg["send"], reg["count"], reg["comm"]) == (run.out["b"], MIB, run.out["comm"])
    assert (win["send"], win["count"], win["extra"]) == (run.out["a"] + 4096, 8192, 1)
    assert (mem["send"], mem["count"]) == (run.out["m"], 3 * MIB)
    assert run.out["handle"] == 0x4242 and run.out["win"] == 0x4343  # out-parameters as NCCL wrote them


def check_records(run):
    o = run.out
    a, b = o["a"], o["b"]
    w = run.word
    nc = run.of(Ev.NCCL)

    def peer_comm(peer, comm):
        return ((comm if comm is not None else NONE32) << 32) | (peer & NONE32)

    want = [
        (NcclCall.ALL_REDUCE, w(a, 64), w(b, 128), 4000, S1, peer_comm(-1, 0)),
        (NcclCall.BROADCAST, w(a, 0), w(b, 0), 20, S1, peer_comm(3, 0)),
        (NcclCall.BROADCAST, w(b, 8), w(b, 8), 40, S1, peer_comm(2, 0)),  # ncclBcast, recorded once
        (NcclCall.REDUCE, w(a, 0), w(b, 0), 28, S1, peer_comm(1, 0)),
        (NcclCall.ALL_GATHER, w(a, 256), w(b, 0), 200, S1, peer_comm(-1, 0)),
        (NcclCall.REDUCE_SCATTER, w(a, 0), w(b, 512), 200, S1, peer_comm(-1, 1)),  # the second communicator
        (NcclCall.ALL_TO_ALL, w(a, 0), w(b, 0), 3, S1, peer_comm(-1, 0)),
        (NcclCall.GATHER, w(a, 0), w(b, 0), 4, S1, peer_comm(0, 0)),
        (NcclCall.SCATTER, w(a, 0), w(b, 0), 4, S1, peer_comm(2, 0)),
        (NcclCall.SEND, w(a, 1024), 0, 64, S1, peer_comm(3, 0)),
        (NcclCall.RECV, 0, w(b, 2048), 64, S1, peer_comm(0, 0)),
        (NcclCall.ALL_REDUCE, w(a, 0), w(a, 0), 0, S1, peer_comm(-1, 0)),  # unknown datatype: 0 bytes
        (NcclCall.COMM_REGISTER, w(b, 0), 0, MIB, 0, peer_comm(-1, 0)),
        (NcclCall.WINDOW_REGISTER, w(a, 4096), 0, 8192, 0, peer_comm(-1, 0)),
        (NcclCall.MEM_ALLOC, w(o["m"], 0), 0, 3 * MIB, 0, peer_comm(-1, None)),
        (NcclCall.ALL_REDUCE, 0, 0, 1, S1, peer_comm(-1, 0)),  # host pointers: in no block
    ]
    got = [(int(r["flags"]), int(r["a"]), int(r["b"]), int(r["c"]), int(r["d"]), int(r["e"])) for r in nc]
    assert got == [tuple(int(x) for x in t) for t in want]
    # the communicators, noted once each with their rank (ncclCommUserRank, ncclCommCount, ncclCommCuDevice)
    cap = decode_records(run.records)
    notes = next(iter(cap.notes.values()))
    assert notes["nccl.comm0"] == "rank=1 nranks=4 device=0"
    assert notes["nccl.comm1"] == "rank=0 nranks=2 device=0"
    # the ncclMemAlloc buffer is the block the driver allocated inside it
    allocs = run.of(Ev.ALLOC)
    assert int(allocs["c"][allocs["b"] == o["m"]][0]) == 3 * MIB
    return cap


def test_linked_calls_recorded_and_passed_unchanged(nccl_dir, tmp_path):
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "calls")
    check_calls(run)
    assert all(v == 0 for k, v in run.out.items() if k.startswith("rc_"))
    cap = check_records(run)
    # the Python side: Capture.nccl, block rows and offsets
    n = cap.nccl
    assert len(n) == 16
    assert n["call"].tolist()[:3] == [NcclCall.ALL_REDUCE, NcclCall.BROADCAST, NcclCall.BROADCAST]
    a_row = int(np.flatnonzero(cap.blocks["addr"] == run.out["a"])[0])
    b_row = int(np.flatnonzero(cap.blocks["addr"] == run.out["b"])[0])
    assert (int(n["send_block"][0]), int(n["send_offset"][0])) == (a_row, 64)
    assert (int(n["recv_block"][0]), int(n["recv_offset"][0])) == (b_row, 128)
    assert int(n["recv_block"][9]) == -1 and int(n["send_block"][10]) == -1  # send / recv: one side
    assert int(n["peer"][1]) == 3 and int(n["peer"][0]) == -1
    assert int(n["comm"][5]) == 1 and int(n["comm"][14]) == -1
    assert n["bytes"].tolist()[0] == 4000


@pytest.mark.parametrize("how", ["global", "local"])
def test_dlopened_nccl_recorded(nccl_dir, tmp_path, how):
    """RTLD_GLOBAL (found through dlsym(RTLD_DEFAULT)) and RTLD_LOCAL (dlsym on its handle): the
    shim's wrapper is handed out and forwards to the library the handle names."""
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver", "calls", how)
    check_calls(run)
    check_records(run)


def test_results_passed_through(nccl_dir, tmp_path):
    # ncclInProgress (a nonblocking communicator): returned as is, and the calls are recorded
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "calls", env={"FAKE_NCCL_RESULT": "7"})
    rcs = {k: v for k, v in run.out.items() if k.startswith("rc_")}
    assert rcs and all(v == 7 for v in rcs.values()), rcs
    assert len(run.of(Ev.NCCL)) == 15  # everything but ncclMemAlloc (not enqueued: not done)
    # an error: returned as is, nothing recorded
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "calls", env={"FAKE_NCCL_RESULT": "4"})
    rcs = {k: v for k, v in run.out.items() if k.startswith("rc_")}
    assert all(v == 4 for v in rcs.values()), rcs
    assert len(run.of(Ev.NCCL)) == 0
    check_calls(run)


def test_disabled_and_untraced_pass_through(nccl_dir, tmp_path):
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "calls", env={"PYOBMEM_DISABLE": "1"})
    check_calls(run)
    assert len(run.records) == 0
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver", "calls", "local", env={"PYOBMEM_DISABLE": "1"})
    check_calls(run)
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "calls", ring=False)  # no ring: nothing recorded
    check_calls(run)


def test_without_nccl_a_probe_finds_none(nccl_dir, tmp_path):
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver", "absent")
    assert run.out["found"] == 0 and run.out["error_set"] == 1
    assert run.out["found_memalloc"] == 0
    assert len(run.of(Ev.NCCL)) == 0


def test_swap_block_named_by_nccl_comes_back_and_stays(nccl_dir, tmp_path):
    ctl = control_file(tmp_path / "control", budget=4 * MIB, min_swap=MIB)
    run = run_nccl(nccl_dir, tmp_path, "nccl_driver_linked", "swap", env={"PYOBMEM_CONTROL": str(ctl)})
    o = run.out
    assert o["a_out"] == 1, run.stdout  # swapped out before the call
    call = run.calls[0]
    assert call["call"] == "ncclAllReduce" and call["send"] == o["a"] + 64
    assert call["send_mapped"] != -1 and call["recv_mapped"] != -1  # mapped when NCCL got it
    assert o["rc_allreduce"] == 0
    assert o["a_in"] == 1 and o["bad_a"] == 0
    ida = run.block_id(o["a"])
    outs, ins = run.of(Ev.SWAP_OUT), run.of(Ev.SWAP_IN)
    assert outs["a"].tolist().count(ida) == 1  # once, before the call; never after
    a_in = ins[ins["a"] == ida]
    assert a_in["flags"].tolist() == [SwapInCause.DEMAND]
    nc = run.of(Ev.NCCL)
    assert int(nc["a"][0]) == run.word(o["a"], 64)
    assert int(a_in["ts_ns"][0]) <= int(nc["ts_ns"][0])  # back before the call was recorded
    # later pressure swapped other blocks out, never a
    assert len(outs) > 1
    assert o["a_still_in"] == 1 and o["bad_a_end"] == 0
    assert o["faults"] == 0
