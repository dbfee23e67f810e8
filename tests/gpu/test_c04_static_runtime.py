"""C04: a program built with nvcc's default static cudart (no cudaMalloc symbol to interpose):
allocations of known sizes and launches are still recorded and attributed, at the driver level."""

import shutil
import subprocess

import pytest

from gpu_util import RT_FLAGS, RT_NAMES, check_variants, describe_ops, ival, op_rows, run_traced


@pytest.mark.gpu
def test_c04_static_runtime(shim, progs, tmp_path):
    exe = progs.build("launch_rt_static")
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
        assert "libcudart" not in dyn, f"{exe} is not statically linked against cudart:\n{dyn}"
    run = run_traced([exe], tmp_path)
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["wrong_values"] == "0"
    check_variants(run, RT_NAMES, RT_FLAGS, stream=ival(run.kv["stream"]))
    assert len(op_rows(run.cap, run.pid)) == 3, describe_ops(run.cap, run.pid)
