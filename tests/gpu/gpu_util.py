"""Helpers for the GPU tests: build the test programs, run them plain or under `pyobmem run`,
and read what the capture says about blocks, launches and the blocks each launch touched.

Test programs print their results as "@ key=value" lines on stdout (parse_kv). Figures worth
keeping (overheads, counts) go to $PYOBMEM_TEST_OUT/<name>.json when that variable is set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.capture import Capture, read_capture

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROGS = HERE / "progs"
SHIM = REPO / "pyobmem" / "libpyobmem.so"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
# Compute capability of the test GPU (H200: 9.0). SASS for it plus PTX, so a newer GPU JITs.
ARCH = os.environ.get("PYOBMEM_TEST_ARCH", "90")


# ----------------------------------------------------------------------------- building programs

def find_nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), str(CUDA_HOME / "bin" / "nvcc"), "/usr/local/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


class Builder:
    """Compiles tests/gpu/progs sources into ``outdir`` on first use, once per session.

    Targets: ``kern.fatbin`` (module for the driver-API programs), driver-API C programs (gcc,
    CUDA headers only, libcuda reached through dlopen), runtime programs (nvcc; ``*_static``
    variants with nvcc's default static cudart, the others with the shared one).
    """

    def __init__(self, outdir: Path):
        self.outdir = Path(outdir)
        self.built: dict[str, Path] = {}

    def _gencode(self) -> list[str]:
        return ["-gencode", f"arch=compute_{ARCH},code=[sm_{ARCH},compute_{ARCH}]"]

    def _nvcc(self) -> str:
        nvcc = find_nvcc()
        if nvcc is None:
            pytest.skip("nvcc not found (needed to build the GPU test programs)")
        return nvcc

    def commands(self, target: str) -> list[list[str]]:
        """The compile command(s) for ``target`` (output in self.outdir)."""
        out = str(self.outdir / target)
        inc = f"-I{CUDA_HOME / 'include'}"
        lib64 = str(CUDA_HOME / "lib64")
        shared_rt = ["-cudart", "shared", "-Xlinker", "-rpath", "-Xlinker", lib64]
        if target == "kern.fatbin":
            return [[self._nvcc(), "-fatbin", *self._gencode(), "-o", out, str(PROGS / "kern.cu")]]
        if target in ("c02_getproc", "c03_launch_drv"):
            cc = os.environ.get("CC", "gcc")
            return [[cc, "-O2", "-std=gnu11", "-Wall", "-Wextra", inc, "-o", out, str(PROGS / f"{target}.c"), "-ldl"]]
        if target == "launch_rt_static":
            return [[self._nvcc(), "-O2", *self._gencode(), "-cudart", "static", "-o", out, str(PROGS / "launch_rt.cu")]]
        if target in ("launch_rt", "c05_cupti_first", "c07_many_threads", "c12_untracked"):
            return [[self._nvcc(), "-O2", "-std=c++17", *self._gencode(), inc, *shared_rt, "-o", out,
                     str(PROGS / f"{target}.cu"), "-ldl"]]
        raise KeyError(target)

    def build(self, target: str) -> Path:
        if target in self.built:
            return self.built[target]
        self.outdir.mkdir(parents=True, exist_ok=True)
        for cmd in self.commands(target):
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROGS, timeout=600)
            if proc.returncode != 0:
                pytest.fail(f"building {target} failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        self.built[target] = self.outdir / target
        return self.built[target]

    def build_all(self) -> list[Path]:
        return [self.build(t) for t in ALL_TARGETS]


ALL_TARGETS = ["kern.fatbin", "c02_getproc", "c03_launch_drv", "launch_rt", "launch_rt_static",
               "c05_cupti_first", "c07_many_threads", "c12_untracked"]


def build_shim() -> Path:
    """`make native` (incremental): the shim the traced runs preload."""
    proc = subprocess.run(["make", "-C", str(REPO), "native"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not SHIM.exists():
        pytest.fail(f"`make native` failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return SHIM


def find_cupti() -> str | None:
    cand = [os.environ.get("PYOBMEM_TEST_CUPTI", ""), str(CUDA_HOME / "lib64" / "libcupti.so.13"),
            "/usr/local/cuda/lib64/libcupti.so.13"]
    for c in cand:
        if c and os.path.exists(c):
            return c
    return None


# ----------------------------------------------------------------------------- running

def child_env(extra: dict | None = None) -> dict:
    """Environment of a test run: the source tree importable (python -m pyobmem), plus ``extra``
    (a value of None removes the variable)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYOBMEM_DISABLE", None)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def parse_kv(stdout: str) -> dict[str, str]:
    """The "@ key=value" lines a test program printed (later lines win)."""
    kv = {}
    for line in stdout.splitlines():
        if line.startswith("@ ") and "=" in line:
            k, _, v = line[2:].partition("=")
            kv[k.strip()] = v.strip()
    return kv


def ival(s: str) -> int:
    """An integer printed by a test program: decimal, 0x-hex, or %p ("0x..."/"(nil)")."""
    return 0 if s == "(nil)" else int(s, 0)


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    kv: dict
    cap: Capture | None = None

    @property
    def rc(self) -> int:
        return self.proc.returncode

    @property
    def pid(self) -> int:
        return int(self.kv["pid"])

    def why(self) -> str:
        """Tail of the run's output, for assertion messages."""
        return f"rc={self.rc}\n--- stdout\n{self.proc.stdout[-3000:]}\n--- stderr\n{self.proc.stderr[-3000:]}"


def run_plain(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> Run:
    """Run ``cmd`` without pyobmem."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=child_env(env), capture_output=True, text=True,
                          timeout=timeout)
    return Run(proc, parse_kv(proc.stdout))


def run_traced(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 600,
               cap_name: str = "run.pyobmem") -> Run:
    """Run ``cmd`` under ``python -m pyobmem run -f -o CAP -- cmd`` and read the capture."""
    cap_path = Path(cwd) / cap_name
    full = [sys.executable, "-m", "pyobmem", "run", "-f", "-o", str(cap_path), "--", *[str(c) for c in cmd]]
    proc = subprocess.run(full, cwd=cwd, env=child_env(env), capture_output=True, text=True, timeout=timeout)
    run = Run(proc, parse_kv(proc.stdout))
    assert cap_path.exists(), f"no capture written by {' '.join(full)}\n{run.why()}"
    run.cap = read_capture(str(cap_path))
    return run


def record_figure(name: str, data: dict) -> None:
    """Write ``data`` to $PYOBMEM_TEST_OUT/<name>.json (when set) and print it (pytest -s)."""
    print(f"[figure] {name}: {json.dumps(data, sort_keys=True)}")
    out = os.environ.get("PYOBMEM_TEST_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- reading captures

def block_rows(cap: Capture, pid: int, addr: int | None = None, size: int | None = None) -> np.ndarray:
    """Row indices of ``cap.blocks`` of process ``pid`` (optionally at ``addr`` / of ``size``)."""
    b = cap.blocks
    m = b["pid"] == pid
    if addr is not None:
        m &= b["addr"] == np.uint64(addr)
    if size is not None:
        m &= b["size"] == np.uint64(size)
    return np.nonzero(m)[0]


def one_block(cap: Capture, pid: int, addr: int, size: int | None = None) -> int:
    """The single block row of ``pid`` at ``addr`` (and of ``size``); assertion error otherwise."""
    rows = block_rows(cap, pid, addr, size)
    near = block_rows(cap, pid, addr)
    assert len(rows) == 1, (
        f"expected one block at {addr:#x} size {size} in pid {pid}, found {len(rows)}; blocks at that address: "
        f"{[(int(cap.blocks['size'][r]), int(cap.blocks['kind'][r])) for r in near]}; "
        f"{int((cap.blocks['pid'] == pid).sum())} blocks in that pid"
    )
    return int(rows[0])


def live_at(cap: Capture, row: int, t_ns: int) -> bool:
    b = cap.blocks[row]
    return int(b["t_alloc"]) <= t_ns and (int(b["t_free"]) == -1 or int(b["t_free"]) > t_ns)


def containing_block(cap: Capture, pid: int, addr: int, t_ns: int | None = None) -> int | None:
    """Row of the block of ``pid`` that contains ``addr`` (live at ``t_ns`` if given; latest wins)."""
    b = cap.blocks
    m = (b["pid"] == pid) & (b["addr"] <= np.uint64(addr)) & (b["addr"] + b["size"] > np.uint64(addr))
    rows = [int(r) for r in np.nonzero(m)[0] if t_ns is None or live_at(cap, int(r), t_ns)]
    return rows[-1] if rows else None


def touched(cap: Capture, op_row: int) -> list[tuple[int, int]]:
    """Sorted (block address, offset) pairs that op ``op_row`` touched, per the accesses table."""
    acc = cap.accesses
    lo = np.searchsorted(acc["op"], op_row, side="left")
    hi = np.searchsorted(acc["op"], op_row, side="right")
    return sorted((int(cap.blocks["addr"][acc["block"][i]]), int(acc["offset"][i])) for i in range(lo, hi))


def touched_blocks(cap: Capture, op_row: int) -> set[int]:
    """Block rows op ``op_row`` touched."""
    acc = cap.accesses
    lo = np.searchsorted(acc["op"], op_row, side="left")
    hi = np.searchsorted(acc["op"], op_row, side="right")
    return {int(x) for x in acc["block"][lo:hi]}


def op_rows(cap: Capture, pid: int, type_=abi.Ev.LAUNCH) -> np.ndarray:
    o = cap.ops
    return np.nonzero((o["pid"] == pid) & (o["type"] == int(type_)))[0]


def ops_touching_exactly(cap: Capture, pid: int, expected: list[tuple[int, int]], type_=abi.Ev.LAUNCH) -> list[int]:
    """Op rows of ``pid`` whose touched (block addr, offset) pairs are exactly ``expected``."""
    want = sorted(expected)
    return [int(r) for r in op_rows(cap, pid, type_) if touched(cap, int(r)) == want]


def ops_touching_all(cap: Capture, pid: int, expected: list[tuple[int, int]], type_=abi.Ev.LAUNCH) -> list[int]:
    """Op rows of ``pid`` whose touched pairs include every pair of ``expected``."""
    want = set(expected)
    return [int(r) for r in op_rows(cap, pid, type_) if want <= set(touched(cap, int(r)))]


def describe_ops(cap: Capture, pid: int, limit: int = 40) -> str:
    """A readable list of a process's ops and what they touched, for assertion messages."""
    lines = []
    for r in np.nonzero(cap.ops["pid"] == pid)[0][:limit]:
        o = cap.ops[r]
        lines.append(
            f"  op {int(r)} {cap.kernel_name(int(r))!r} type={int(o['type'])} flags={int(o['flags']):#x} "
            f"stream={int(o['stream']):#x} n_touched={int(o['n_touched'])} bytes={int(o['bytes'])} "
            f"touched={[(hex(a), off) for a, off in touched(cap, int(r))]}"
        )
    return "\n".join(lines) or "  (no ops)"


def note(cap: Capture, pid: int, key: str) -> str | None:
    return cap.notes.get(pid, {}).get(key)


def process_row(cap: Capture, pid: int) -> int:
    rows = np.nonzero(cap.processes["pid"] == pid)[0]
    assert len(rows) >= 1, f"no PROCESS record for pid {pid}; processes: {cap.processes.tolist()}"
    return int(rows[0])


# launch_rt.cu's variants and the launch flags each must have / must not have.
RT_NAMES = ["chevron", "launch_ex", "cooperative"]
RT_FLAGS = {
    "chevron": (0, int(abi.LaunchFlag.EX | abi.LaunchFlag.COOPERATIVE)),
    "launch_ex": (int(abi.LaunchFlag.EX), int(abi.LaunchFlag.COOPERATIVE)),
    "cooperative": (int(abi.LaunchFlag.COOPERATIVE), 0),
}


def check_variants(run: Run, names: list[str], flags: dict[str, tuple[int, int]], stream: int | None = None,
                   handle: int | None = None) -> dict[str, int]:
    """Each variant `name` of a launch program allocated `{name}_a`/`{name}_b` (sizes
    `{name}_size_a/_b`) and launched one kernel on exactly those two buffers at offset 0.

    Checks: both are blocks of the exact size (kind DRIVER, freed by the end); exactly one launch
    touches either of them, and it touches exactly the two, at offset 0, with n_touched == 2;
    its flags include flags[name][0] and none of flags[name][1] (OPAQUE and NO_LAYOUT never);
    its stream / handle when given. Returns {name: op row}.
    """
    cap, kv, pid = run.cap, run.kv, run.pid
    found = {}
    launches = op_rows(cap, pid)
    for name in names:
        a, b = ival(kv[f"{name}_a"]), ival(kv[f"{name}_b"])
        sa, sb = int(kv[f"{name}_size_a"]), int(kv[f"{name}_size_b"])
        ra, rb = one_block(cap, pid, a, sa), one_block(cap, pid, b, sb)
        for r in (ra, rb):
            assert int(cap.blocks["kind"][r]) == abi.AllocKind.DRIVER, f"{name}: block kind {cap.blocks[r]}"
            assert int(cap.blocks["t_free"][r]) != -1, f"{name}: block {int(cap.blocks['addr'][r]):#x} never freed"
        rows = [int(r) for r in launches if touched_blocks(cap, int(r)) & {ra, rb}]
        assert len(rows) == 1, (
            f"{name}: {len(rows)} launches touch its buffers a={a:#x} b={b:#x}, expected 1\n{describe_ops(cap, pid)}"
        )
        r = rows[0]
        op = cap.ops[r]
        assert touched(cap, r) == sorted([(a, 0), (b, 0)]), f"{name}: touched {touched(cap, r)}"
        assert int(op["n_touched"]) == 2, f"{name}: n_touched {int(op['n_touched'])}"
        f = int(op["flags"])
        need, forbid = flags.get(name, (0, 0))
        forbid |= abi.LaunchFlag.OPAQUE | abi.LaunchFlag.NO_LAYOUT | abi.LaunchFlag.TRUNCATED
        assert f & need == need, f"{name}: flags {abi.LaunchFlag(f)!r} lack {abi.LaunchFlag(need)!r}"
        assert f & forbid == 0, f"{name}: flags {abi.LaunchFlag(f)!r} include {abi.LaunchFlag(f & forbid)!r}"
        if stream is not None:
            assert int(op["stream"]) == stream, f"{name}: stream {int(op['stream']):#x} != {stream:#x}"
        if handle is not None:
            assert int(op["handle"]) == handle, f"{name}: handle {int(op['handle']):#x} != {handle:#x}"
        found[name] = r
    return found
