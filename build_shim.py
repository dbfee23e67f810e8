"""The package build: setuptools' backend, plus compiling the shim into the wheel.

The shim (native/ -> pyobmem/libpyobmem.so) is built by the Makefile's own rule, so that `make`
and `pip install .` compile it the same way. It needs gcc, make and the CUDA headers (cuda.h and
CUPTI's): from $CUDA_HOME/include (default /usr/local/cuda), else from NVIDIA's pip packages
(nvidia/cu13/include), which the backend adds as build requirements only when no toolkit is found.
The shim is preloaded, not imported, so the wheel is tagged py3-none-<platform>. Editable
installs build nothing: `make` builds the shim into the source tree they point at.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403 (the PEP 517 hooks not overridden below)
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

# Every header the shim includes from CUDA, and the pip packages that ship them.
HEADERS = ("cuda.h", "cupti_callbacks.h", "cupti_driver_cbid.h", "generated_cuda_meta.h", "crt/host_defines.h")
HEADER_PACKAGES = ["nvidia-cuda-runtime>=13", "nvidia-cuda-crt>=13", "nvidia-cuda-cupti>=13"]
PIP_INCLUDE = os.path.join("nvidia", "cu13", "include")


def _has_headers(include: str) -> bool:
    return all(os.path.isfile(os.path.join(include, h)) for h in HEADERS)


def find_cuda_root(search_path: list[str] | None = None) -> str | None:
    """A directory D with every CUDA header the shim needs in D/include, or None.

    $CUDA_HOME (default /usr/local/cuda) first, then nvidia/cu13 in each entry of `search_path`
    (default sys.path: the build environment's site-packages, where the header packages go).
    """
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if _has_headers(os.path.join(cuda_home, "include")):
        return cuda_home
    for entry in sys.path if search_path is None else search_path:
        if _has_headers(os.path.join(entry, PIP_INCLUDE)):
            return os.path.dirname(os.path.join(entry, PIP_INCLUDE))
    return None


def missing_headers_message() -> str:
    """The one line a build without CUDA headers fails with: what to install or set."""
    where = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return (f"pyobmem: the CUDA headers (cuda.h, CUPTI) are not in {where}/include: set CUDA_HOME to a CUDA "
            f"toolkit, or `pip install {' '.join(HEADER_PACKAGES)}` and build with --no-build-isolation")


def get_requires_for_build_wheel(config_settings=None):
    """setuptools' requirements, plus the header packages when no toolkit's headers are found."""
    extra = HEADER_PACKAGES if find_cuda_root() is None else []
    return build_meta.get_requires_for_build_wheel(config_settings) + extra


def compile_shim(output: Path) -> None:
    """Build the shim into `output` with the Makefile's rule. Raises SystemExit with one line."""
    root = find_cuda_root()
    if root is None:
        raise SystemExit(missing_headers_message())
    output.parent.mkdir(parents=True, exist_ok=True)
    print(f"pyobmem: building the shim with the CUDA headers in {root}/include", file=sys.stderr)
    # Without -Werror: a newer compiler's new warning must not fail a user's install.
    cmd = ["make", "-s", "native", f"SHIM={output.resolve()}", f"CUDA_HOME={root}", "WERROR="]
    try:
        subprocess.run(cmd, cwd=Path(__file__).resolve().parent, check=True)
    except FileNotFoundError:
        raise SystemExit("pyobmem: building the shim needs make and gcc") from None
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"pyobmem: building the shim failed (`{' '.join(cmd)}` exited {e.returncode})") from None


class BuildPy(build_py):
    """build_py that also compiles pyobmem/libpyobmem.so into the build tree (not for editable installs)."""

    def run(self):
        super().run()
        if not self.editable_mode:
            compile_shim(Path(self.build_lib) / "pyobmem" / "libpyobmem.so")


class BdistWheel(bdist_wheel):
    """A platform wheel for any Python 3: the shim is native code, but no CPython extension."""

    def finalize_options(self):
        # As for a distribution with extensions: not pure, installed into platlib.
        self.distribution.has_ext_modules = lambda: True
        super().finalize_options()

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]
