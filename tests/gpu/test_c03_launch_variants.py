"""C03: every launch variant is attributed: <<<>>>, cudaLaunchKernelEx with a launch attribute,
cudaLaunchCooperativeKernel (runtime); cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
cuLaunchKernelEx_ptsz (driver); Triton kernels on torch tensors."""

import json
import sys

import pytest

from gpu_util import PROGS, RT_FLAGS, RT_NAMES, check_variants, containing_block, describe_ops, ival, op_rows, run_traced, touched
from pyobmem import abi

EX, COOP = int(abi.LaunchFlag.EX), int(abi.LaunchFlag.COOPERATIVE)

DRV_NAMES = ["launch", "launch_ex", "cooperative", "launch_ex_ptsz"]
DRV_FLAGS = {"launch": (0, EX | COOP), "launch_ex": (EX, COOP), "cooperative": (COOP, EX),
             "launch_ex_ptsz": (EX, COOP)}


@pytest.fixture(scope="module")
def rt_run(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c03rt")
    run = run_traced([progs.build("launch_rt")], d)
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["wrong_values"] == "0"
    return run


@pytest.fixture(scope="module")
def drv_run(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c03drv")
    run = run_traced([progs.build("c03_launch_drv"), progs.build("kern.fatbin")], d)
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["wrong_values"] == "0"
    return run


@pytest.mark.gpu
def test_c03_launch_variants_attributed(rt_run):
    check_variants(rt_run, RT_NAMES, RT_FLAGS, stream=ival(rt_run.kv["stream"]))
    assert len(op_rows(rt_run.cap, rt_run.pid)) == 3, describe_ops(rt_run.cap, rt_run.pid)


@pytest.mark.gpu
def test_c03_launch_variants_driver_api(drv_run):
    kv = drv_run.kv
    rows = check_variants(drv_run, DRV_NAMES, DRV_FLAGS, handle=ival(kv["fn"]))
    for name in ("launch", "launch_ex", "cooperative"):
        assert int(drv_run.cap.ops["stream"][rows[name]]) == ival(kv["stream"]), name
    assert int(drv_run.cap.ops["grid"][rows["cooperative"]]) == 32
    assert len(op_rows(drv_run.cap, drv_run.pid)) == 4, describe_ops(drv_run.cap, drv_run.pid)


@pytest.mark.gpu
def test_c03_kernel_names(rt_run, drv_run):
    for run in (rt_run, drv_run):
        names = [run.cap.kernel_name(int(r)) for r in op_rows(run.cap, run.pid)]
        assert names and all("touch2" in n for n in names), names


@pytest.mark.gpu
def test_c03_triton_attributed(shim, need_triton, tmp_path):
    run = run_traced([sys.executable, PROGS / "triton_add.py", tmp_path / "triton.json"], tmp_path,
                     env={"PYTORCH_CUDA_ALLOC_CONF": None})
    assert run.rc == 0, run.why()
    info = json.loads((tmp_path / "triton.json").read_text())
    assert info["ok"]
    cap, pid, t = run.cap, info["pid"], info["t_snap"]
    want = set()
    for key in ("x", "y", "out"):
        row = containing_block(cap, pid, info[key], t)
        assert row is not None, f"{key} at {info[key]:#x} is in no live block; segments {info['segments']}"
        want.add((int(cap.blocks["addr"][row]), info[key] - int(cap.blocks["addr"][row])))
    hits = [int(r) for r in op_rows(cap, pid) if want <= set(touched(cap, int(r)))]
    assert len(hits) == info["launches"], (
        f"{len(hits)} launches touch {sorted(want)}, expected {info['launches']} (triton {info['triton']})\n"
        f"{describe_ops(cap, pid, 300)}"
    )
    for r in hits:
        assert int(cap.ops["flags"][r]) & int(abi.LaunchFlag.NO_LAYOUT) == 0, describe_ops(cap, pid, 300)
