"""C01: pip PyTorch gets every driver entry point through cuGetProcAddress_v2 before cuInit.
The capture's blocks must be exactly the caching allocator's segments."""

import json
import sys

import numpy as np
import pytest

from gpu_util import PROGS, block_rows, containing_block, live_at, one_block, process_row, record_figure, \
    run_traced, touched, op_rows, describe_ops
from pyobmem import abi


@pytest.fixture(scope="module")
def c01(shim, need_torch, tmp_path_factory):
    d = tmp_path_factory.mktemp("c01")
    # The default allocator (no expandable segments): one cudaMalloc per segment.
    run = run_traced([sys.executable, PROGS / "torch_alloc.py", d / "torch.json"], d,
                     env={"PYTORCH_CUDA_ALLOC_CONF": None})
    assert run.rc == 0, run.why()
    info = json.loads((d / "torch.json").read_text())
    run.kv["pid"] = str(info["pid"])
    return run, info


@pytest.mark.gpu
def test_c01_torch_allocations_counted(c01):
    run, info = c01
    cap, pid, t = run.cap, info["pid"], info["t_snap"]
    assert cap.complete and cap.exit_status == 0
    assert info["segments"], "torch reported no segments"
    driver_rows = block_rows(cap, pid)[cap.blocks["kind"][block_rows(cap, pid)] == abi.AllocKind.DRIVER]
    live_driver = [r for r in driver_rows if live_at(cap, int(r), t)]
    for seg in info["segments"]:
        row = one_block(cap, pid, seg["address"], seg["total_size"])
        assert int(cap.blocks["kind"][row]) == abi.AllocKind.DRIVER, cap.blocks[row]
        assert live_at(cap, row, t), f"segment {seg} is not live in the capture at the snapshot: {cap.blocks[row]}"
    # Nothing live in the capture that torch does not know about (cuBLAS workspaces are torch
    # allocations too; a handful of driver-internal blocks would show up here).
    seg_addrs = {s["address"] for s in info["segments"]}
    extra = [(hex(int(cap.blocks["addr"][r])), int(cap.blocks["size"][r])) for r in live_driver
             if int(cap.blocks["addr"][r]) not in seg_addrs]
    n_driver = len(driver_rows)
    n_freed = int(sum(1 for r in driver_rows if int(cap.blocks["t_free"][r]) != -1 and int(cap.blocks["t_free"][r]) <= t))
    record_figure("c01_torch_allocations", {
        "segments_live": len(info["segments"]), "segment_all_allocated": info["segment_all_allocated"],
        "segment_all_freed": info["segment_all_freed"], "driver_blocks": n_driver,
        "driver_blocks_freed_before_snapshot": n_freed, "live_blocks_not_torch": extra,
    })
    assert n_driver >= info["segment_all_allocated"], (n_driver, info["segment_all_allocated"])
    assert n_freed >= info["segment_all_freed"], (n_freed, info["segment_all_freed"])
    assert len(live_driver) >= len(info["segments"])


@pytest.mark.gpu
def test_c01_freed_segment_recorded(c01):
    """The 200 MiB segment handed back by empty_cache() is a block freed before the snapshot."""
    run, info = c01
    cap, pid = run.cap, info["pid"]
    row = one_block(cap, pid, info["big_ptr"], info["big_size"])
    b = cap.blocks[row]
    assert int(b["t_free"]) != -1 and int(b["t_alloc"]) < int(b["t_free"]) <= info["t_snap"], b


@pytest.mark.gpu
def test_c01_elementwise_kernel_attributed(c01):
    """z = x + 1 (TensorIterator kernel: pointers inside a by-value struct) touches x and z."""
    run, info = c01
    cap, pid, t = run.cap, info["pid"], info["t_snap"]
    rx, rz = containing_block(cap, pid, info["x_ptr"], t), containing_block(cap, pid, info["z_ptr"], t)
    assert rx is not None and rz is not None
    want = {(int(cap.blocks["addr"][rx]), info["x_ptr"] - int(cap.blocks["addr"][rx])),
            (int(cap.blocks["addr"][rz]), info["z_ptr"] - int(cap.blocks["addr"][rz]))}
    hits = [int(r) for r in op_rows(cap, pid) if want <= set(touched(cap, int(r)))]
    assert len(hits) == 1, f"{len(hits)} launches touch x and z at their offsets {want}\n{describe_ops(cap, pid, 200)}"


@pytest.mark.gpu
def test_c01_process_recorded(c01):
    run, info = c01
    cap = run.cap
    row = process_row(cap, info["pid"])
    assert int(cap.processes["driver_version"][row]) == info["driver_version"], cap.processes[row]
    assert np.count_nonzero(cap.processes["pid"] == info["pid"]) == 1
