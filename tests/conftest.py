import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/synth.py

ROOT = Path(__file__).resolve().parent.parent
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
# The flags every test program and fake library is built with.
FAKE_CFLAGS = ["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I", str(CUDA_INCLUDE)]


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory) -> Path:
    """Build the shim (make native) and, into one directory that is returned, the fake
    libcuda.so.1 (tests/fake_cuda/fake_cuda.c) and libcupti.so (fake_cupti.c). Needs gcc and the
    CUDA headers: use it from modules that skip without them."""
    subprocess.run(["make", "-s", "native"], cwd=ROOT, check=True)
    d = tmp_path_factory.mktemp("fake_cuda")
    src = ROOT / "tests" / "fake_cuda"
    subprocess.run(
        ["gcc", *FAKE_CFLAGS, "-fPIC", "-shared", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1",
         "-o", str(d / "libcuda.so.1"), str(src / "fake_cuda.c"), "-lpthread"],
        check=True,
    )
    subprocess.run(
        ["gcc", *FAKE_CFLAGS, "-fPIC", "-shared", "-o", str(d / "libcupti.so"), str(src / "fake_cupti.c"), "-ldl"],
        check=True,
    )
    return d


@pytest.fixture(scope="session")
def build_fake_program(fake_cuda):
    """A function (tests/fake_cuda/NAME.c, extra link flags...) -> the program built next to the
    fake libcuda (same flags); returns the directory, for LD_LIBRARY_PATH."""

    def build(name: str, *libs: str) -> Path:
        src = ROOT / "tests" / "fake_cuda" / f"{name}.c"
        subprocess.run(["gcc", *FAKE_CFLAGS, "-o", str(fake_cuda / name), str(src), *libs], check=True)
        return fake_cuda

    return build
