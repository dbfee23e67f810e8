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
        if target == "gpu_time_swap":  # links libcuda itself: a probe of the driver, not traced
            return [[self._nvcc(), "-O2", *self._gencode(), inc, *shared_rt, "-o", out, str(PROGS / f"{target}.cu"),
                     f"-L{lib64}/stubs", "-lcuda", "-lpthread"]]
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


# ----------------------------------------------------------------------------- swap mode (test_swap_*.py)

MiB = 1 << 20
WORKLOADS = REPO / "scripts" / "workloads"
SWAP_PROG = "swap_cases"  # tests/gpu/progs/swap_cases.cu: every swap-mode C case, one mode per argv[1]


def build_swap_prog(builder: Builder) -> Path:
    """tests/gpu/progs/swap_cases.cu built once per session into the Builder's directory (nvcc,
    shared cudart, like the other runtime programs)."""
    if SWAP_PROG in builder.built:
        return builder.built[SWAP_PROG]
    builder.outdir.mkdir(parents=True, exist_ok=True)
    out = builder.outdir / SWAP_PROG
    cmd = [builder._nvcc(), "-O2", "-std=c++17", *builder._gencode(), f"-I{CUDA_HOME / 'include'}",
           "-cudart", "shared", "-Xlinker", "-rpath", "-Xlinker", str(CUDA_HOME / "lib64"),
           "-o", str(out), str(PROGS / f"{SWAP_PROG}.cu"), "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROGS, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"building {SWAP_PROG} failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    builder.built[SWAP_PROG] = out
    return out


def run_group(full: list, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``full`` in a session of its own; past ``timeout`` kill the whole process group (the
    launcher and the traced program it spawned: a hung GPU program must not outlive its test) and
    fail with the output so far."""
    proc = subprocess.Popen(full, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"timed out after {timeout} s (process group killed): {' '.join(full)}\n--- stdout\n{out[-3000:]}"
                    f"\n--- stderr\n{err[-3000:]}")
    return subprocess.CompletedProcess(full, proc.returncode, out, err)


def run_swap(cmd: list, cwd: Path, budget: str, min_swap: str | None = None, env: dict | None = None,
             timeout: float = 120, cap_name: str = "swap.pyobmem") -> Run:
    """Run ``cmd`` under ``python -m pyobmem run --swap --budget BUDGET [--min-swap-bytes N] -f -o CAP``
    (run_group: killed as a group past ``timeout``) and read the capture."""
    cap_path = Path(cwd) / cap_name
    opts = ["--swap", "--budget", str(budget)] + (["--min-swap-bytes", str(min_swap)] if min_swap else [])
    full = [sys.executable, "-m", "pyobmem", "run", *opts, "-f", "-o", str(cap_path), "--", *[str(c) for c in cmd]]
    proc = run_group(full, cwd, child_env(env), timeout)
    run = Run(proc, parse_kv(proc.stdout))
    assert cap_path.exists(), f"no capture written by {' '.join(full)}\n{run.why()}"
    run.cap = read_capture(str(cap_path))
    return run


def main_pid(cap: Capture) -> int:
    """The traced process with the most ops (the launcher's child for a single-process job)."""
    pids, counts = np.unique(cap.ops["pid"], return_counts=True)
    assert len(pids), "the capture has no ops"
    return int(pids[np.argmax(counts)])


def swap_on(cap: Capture, pid: int) -> str:
    """The shim's "swap=on budget=... min_swap_bytes=..." note; assertion error unless swap mode is on."""
    value = note(cap, pid, "swap")
    assert value is not None and value.startswith("on"), (
        f"swap mode is not on in pid {pid}: note swap={value!r}; notes {cap.notes.get(pid)}"
    )
    return value


def swap_rows(cap: Capture, pid: int, block: int | None = None, direction: int | None = None) -> np.ndarray:
    """Row indices of ``cap.swaps`` of ``pid`` (of block row ``block``; 0 = out, 1 = in), in time order."""
    s = cap.swaps
    m = s["pid"] == pid
    if block is not None:
        m &= s["block"] == block
    if direction is not None:
        m &= s["direction"] == direction
    return np.nonzero(m)[0]


def out_at(cap: Capture, block: int, t_ns: int) -> bool:
    """Whether block row ``block`` was out (its physical memory released) at ``t_ns``: its last
    SWAP_OUT / SWAP_IN event before ``t_ns`` is a SWAP_OUT. A SWAP_OUT is written when the memory
    is released, a SWAP_IN when the block is mapped and its copy is ordered before its next use."""
    s = cap.swaps
    rows = np.nonzero((s["block"] == block) & (s["ts_ns"] < t_ns))[0]
    return bool(len(rows)) and int(s["direction"][rows[-1]]) == 0


def describe_swaps(cap: Capture, pid: int, rows=None, limit: int = 60) -> str:
    """A readable list of swap events (block address, size, direction, cause), for messages."""
    s = cap.swaps
    rows = swap_rows(cap, pid) if rows is None else rows
    lines = []
    for r in list(rows)[:limit]:
        b = int(s["block"][r])
        addr = int(cap.blocks["addr"][b]) if b >= 0 else -1
        lines.append(f"  t={int(s['ts_ns'][r])} block {b} @ {addr:#x} {int(s['bytes'][r])} B "
                     f"{'in' if int(s['direction'][r]) else 'out'} cause={int(s['cause'][r])} "
                     f"dur={int(s['duration_ns'][r])} ns")
    more = len(rows) - limit
    return "\n".join(lines + ([f"  ... {more} more"] if more > 0 else [])) or "  (no swap events)"


def ops_named(cap: Capture, pid: int, name: str, type_=abi.Ev.LAUNCH) -> list[int]:
    """Op rows of ``pid`` whose kernel name contains ``name``."""
    return [int(r) for r in op_rows(cap, pid, type_) if name in cap.kernel_name(int(r))]


def step_losses(stdout: str) -> list[str]:
    """The "step <i> loss <hex> time_ms <ms>" lines of a scripts/workloads run: the losses (hex)."""
    return [line.split()[3] for line in stdout.splitlines() if line.startswith("step ") and " loss " in line]


class DeviceMemorySampler:
    """The device's used memory through NVML (the whole device, as nvidia-smi shows it), sampled
    every ``period_s`` in a thread while the ``with`` block runs: ``peak - baseline`` is the most the
    run added. The test process itself never creates a CUDA context. ``open()`` returns None
    (with ``why``) when NVML cannot be used."""

    why = ""

    def __init__(self, lib, handle, period_s: float):
        import ctypes as ct

        class Memory(ct.Structure):
            _fields_ = [("total", ct.c_ulonglong), ("free", ct.c_ulonglong), ("used", ct.c_ulonglong)]

        self._ct, self._lib, self._h, self._mem, self.period_s = ct, lib, handle, Memory(), period_s
        self.baseline = self.peak = self.samples = 0
        self._thread = None
        self._stop = None

    @classmethod
    def open(cls, index: int = 0, period_s: float = 0.0005):
        import ctypes as ct

        try:
            lib = ct.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            cls.why = f"libnvidia-ml.so.1 cannot be loaded: {e}"
            return None
        rc = lib.nvmlInit_v2()
        if rc != 0:
            cls.why = f"nvmlInit_v2 -> {rc}"
            return None
        h = ct.c_void_p()
        rc = lib.nvmlDeviceGetHandleByIndex_v2(ct.c_uint(index), ct.byref(h))
        if rc != 0:
            cls.why = f"nvmlDeviceGetHandleByIndex_v2({index}) -> {rc}"
            return None
        return cls(lib, h, period_s)

    def used(self) -> int:
        rc = self._lib.nvmlDeviceGetMemoryInfo(self._h, self._ct.byref(self._mem))
        if rc != 0:
            raise OSError(f"nvmlDeviceGetMemoryInfo -> {rc}")
        return int(self._mem.used)

    def _loop(self):
        import time

        while not self._stop.is_set():
            u = self.used()
            self.samples += 1
            if u > self.peak:
                self.peak = u
            time.sleep(self.period_s)

    def __enter__(self):
        import threading

        self.baseline = min(self.used() for _ in range(5))
        self.peak, self.samples = self.baseline, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        return False

    @property
    def added(self) -> int:
        """Peak minus baseline, bytes."""
        return self.peak - self.baseline
