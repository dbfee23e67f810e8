"""Installed like a Python package: `python -m build` (sdist, then the wheel from it) gives a
py3-none-<platform> wheel with the shim inside; installed into a fresh venv, its `pyobmem-run`
traces the fake driver from outside the source tree with no CUDA_HOME and no PYTHONPATH.

One wheel per session (about 15 s); the venv sees the system's site-packages, as on a GPU machine,
so that numpy and scipy need not be installed again (pip fetches them where they are missing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from pyobmem.abi import Ev
from pyobmem.capture import read_capture

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

pytestmark = [
    pytest.mark.skipif(not (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda.h").exists(),
                       reason="needs the CUDA headers"),
    pytest.mark.skipif(subprocess.run([PY, "-m", "build", "--version"], capture_output=True).returncode != 0,
                       reason="needs the `build` package (pip install -e '.[test]')"),
]


def _clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYOBMEM_", "XLA_", "PYTORCH_"))}
    for k in ("LD_PRELOAD", "PYTHONPATH", "CUDA_HOME", "VIRTUAL_ENV"):
        env.pop(k, None)
    env.update(extra or {})
    return env


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([PY, "-m", "build", "-o", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1 and len(list(out.glob("*.tar.gz"))) == 1
    return wheels[0]


@pytest.fixture(scope="session")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (its dependencies resolved by pip); its bin/."""
    d = tmp_path_factory.mktemp("venv")
    subprocess.run([PY, "-m", "venv", "--system-site-packages", "--without-pip", str(d)], check=True, timeout=120)
    proc = subprocess.run([PY, "-m", "pip", "--python", str(d / "bin" / "python"), "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=600, env=_clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d / "bin"


def test_wheel_is_tagged_for_any_python3_and_carries_the_shim(wheel):
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name == f"pyobmem-0.1.0-py3-none-{platform}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        wheel_meta = z.read("pyobmem-0.1.0.dist-info/WHEEL").decode()
        shim = z.read("pyobmem/libpyobmem.so")
    assert "Root-Is-Purelib: false" in wheel_meta.splitlines()
    assert shim[:4] == b"\x7fELF"
    assert "pyobmem/include/pyobmem/abi.h" in names  # pyobmem/abi.py reads the ABI from it
    assert not [n for n in names if n.startswith(("native/", "tests/")) or n.endswith(".c")]


def test_installed_pyobmem_run_traces_the_fake_driver(venv, build_fake_program, tmp_path):
    fake = build_fake_program("driver", "-ldl", "-lpthread")
    env = _clean_env({"LD_LIBRARY_PATH": str(fake), "PYOBMEM_CUPTI": "0"})
    proc = subprocess.run([str(venv / "pyobmem-run"), "-o", "c.pyobmem", str(fake / "driver"), "basic"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "done=1" in proc.stdout.splitlines()
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    site = subprocess.run([str(venv / "python"), "-c", "import pyobmem, os; print(os.path.dirname(pyobmem.__file__))"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert site.startswith(str(venv.parent)) and cap.meta["shim"] == os.path.join(site, "libpyobmem.so")
    assert cap.complete and cap.exit_status == 0 and cap.dropped == 0
    # scenario_basic of tests/fake_cuda/driver.c: two allocations, five launches of which the
    # failed one (rc 400) is not recorded, attributed to the blocks their arguments point into
    assert cap.blocks["size"].tolist() == [1 << 20, 4096]
    launches = cap.ops[cap.ops["type"] == Ev.LAUNCH]
    assert launches["n_touched"].tolist() == [2, 1, 2, 1, 2]
    assert sorted(set(cap.kernel_names.values())) == ["kernel_a", "kernel_b_with_a_rather_long_templated_name<float, 128, true>"]


def test_build_without_cuda_headers_says_what_to_install(tmp_path):
    """No toolkit and no header packages (no build isolation, so none are fetched): one line saying
    what to install, and no wheel."""
    env = _clean_env({"CUDA_HOME": str(tmp_path / "no-cuda")})
    proc = subprocess.run([PY, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not list(tmp_path.glob("*.whl"))
    line = (f"pyobmem: the CUDA headers (cuda.h, CUPTI) are not in {tmp_path}/no-cuda/include: set CUDA_HOME to a "
            "CUDA toolkit, or `pip install nvidia-cuda-runtime>=13 nvidia-cuda-crt>=13 nvidia-cuda-cupti>=13` and "
            "build with --no-build-isolation")
    assert line in [s.strip() for s in (proc.stdout + proc.stderr).splitlines()]
