"""GPU tests: every test here is marked `gpu` and is skipped cleanly (not errored) unless
`nvidia-smi -L` lists a GPU and libcuda.so.1 loads. Session fixtures build the shim
(`make native`) and the test programs (tests/gpu/progs, with nvcc) once, on first use."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # gpu_util
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("pyobmem") is None:
    sys.path.insert(0, _REPO)  # run from the source tree

import gpu_util  # noqa: E402

_reason_cache: list = []


def gpu_unavailable_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can (computed once)."""
    if _reason_cache:
        return _reason_cache[0]
    reason = None
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0 or "GPU" not in proc.stdout:
            reason = f"nvidia-smi -L failed (rc {proc.returncode}): no NVIDIA GPU"
    except (OSError, subprocess.SubprocessError) as e:
        reason = f"nvidia-smi -L cannot run ({e.__class__.__name__}): no NVIDIA GPU"
    if reason is None:
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            reason = f"libcuda.so.1 cannot be loaded: {e}"
    _reason_cache.append(reason)
    return reason


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and driver (skipped cleanly elsewhere)")


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for it in gpu_items:
            it.add_marker(skip)


@pytest.fixture(scope="session")
def shim():
    """Path of pyobmem/libpyobmem.so, built (or brought up to date) by `make native`."""
    return gpu_util.build_shim()


@pytest.fixture(scope="session")
def progs(tmp_path_factory):
    """A gpu_util.Builder: progs.build("c02_getproc") -> path of the compiled program."""
    return gpu_util.Builder(tmp_path_factory.mktemp("progs"))


@pytest.fixture(scope="session")
def cupti_path():
    path = gpu_util.find_cupti()
    if path is None:
        pytest.skip("libcupti.so.13 not found (set PYOBMEM_TEST_CUPTI)")
    return path


@pytest.fixture(scope="session")
def need_torch():
    """Skip unless torch is importable (not imported here: the test process stays CUDA-free)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


@pytest.fixture(scope="session")
def need_triton(need_torch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
