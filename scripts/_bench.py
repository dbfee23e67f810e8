"""What the benches share (bench_swap.py, bench_trace.py, bench_trace_overhead.py, bench_multigpu.py):
the GPU check, the one-line error exit, a workload's environment and command under the launcher,
its step lines and JSON, losses compared bit for bit, the table cells, and NVML through ctypes.

Only the standard library: ``--help`` of a bench needs no GPU, no NVML and no pyobmem. The
benches find this module next to them (``sys.path``: the scripts' directory).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "scripts" / "workloads"
# The workloads' per-step line (scripts/workloads/_common.py): the loss as float.hex.
STEP_RE = re.compile(r"^step (\d+) loss (\S+) time_ms ([-+0-9.eE]+)\s*$")
WARMUP = 3  # steps left out of steady_median
NO_GPU = "no NVIDIA GPU here (libcuda.so.1 not loadable or no device); run this on a CUDA machine"
NVML_LIB = "libnvidia-ml.so.1"
NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE = 0, 7
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1


class BenchError(Exception):
    """A condition that stops the bench: one line for the user."""


def die(msg: str, code: int = 2) -> NoReturn:
    print(f"{os.path.basename(sys.argv[0])}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# ------------------------------------------------------------------------------------ machine
def visible_gpus() -> int:
    """CUDA devices this process can see (CUDA_VISIBLE_DEVICES honoured); 0 without a driver. cuInit
    creates no context: this process holds no device memory."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        return n.value if cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0
    except OSError:
        return 0


def gpu_present() -> bool:
    """True when libcuda.so.1 loads, cuInit succeeds and at least one device exists."""
    return visible_gpus() > 0


def require_gpu() -> None:
    if not gpu_present():
        die(NO_GPU)


# ------------------------------------------------------------------------------------ workloads
def child_env(extra: dict | None = None, drop: tuple[str, ...] = ()) -> dict:
    """This environment with the repository on PYTHONPATH, unbuffered output, the variables in
    ``drop`` removed and ``extra`` set (its None values left out)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for k in drop:
        env.pop(k, None)
    if extra:
        env.update({k: v for k, v in extra.items() if v is not None})
    return env


def launcher(capture: Path, options: tuple[str, ...] = ()) -> list[str]:
    """``python3 -m pyobmem run [options] -f -o CAPTURE --`` (PYOBMEM_BENCH_LAUNCHER replaces the
    ``python3 -m pyobmem run`` part)."""
    custom = os.environ.get("PYOBMEM_BENCH_LAUNCHER")
    base = shlex.split(custom) if custom else [sys.executable, "-m", "pyobmem", "run"]
    return [*base, *options, "-f", "-o", str(capture), "--"]


def workload_command(script: str, args: list[str], json_path: Path, capture: Path | None = None,
                     launcher_options: tuple[str, ...] = (), pre: tuple[str, ...] = ()) -> list[str]:
    """scripts/workloads/``script`` with ``args`` and ``--json json_path``, after ``pre`` (e.g.
    taskset), under the launcher when ``capture`` is given."""
    cmd = [*pre, sys.executable, str(WORKLOADS / script), *args, "--json", str(json_path)]
    if capture is not None:
        cmd = launcher(capture, launcher_options) + cmd
    return cmd


def read_steps(stdout: str, json_path: Path) -> tuple[list[str], list[float], dict | None, list[str]]:
    """(losses, step times in ms, the workload's JSON, errors): from its JSON when it wrote one
    (at its end), else from its step lines."""
    losses, step_ms = [], []
    for line in stdout.splitlines():
        m = STEP_RE.match(line)
        if m:
            losses.append(m.group(2))
            step_ms.append(float(m.group(3)))
    doc, errors = None, []
    if json_path.exists():
        try:
            doc = json.loads(json_path.read_text())
            losses, step_ms = list(doc["losses"]), [float(x) for x in doc["step_ms"]]
        except (ValueError, KeyError) as e:
            errors.append(f"unreadable workload JSON {json_path}: {e}")
    return losses, step_ms, doc, errors


# ------------------------------------------------------------------------------------ figures
def steady_median(step_ms: list[float], warmup: int = WARMUP) -> float | None:
    """The median step time after the first ``warmup`` steps (all of them when there are no more).
    bench_swap.py takes the last half instead (its own steady_median)."""
    xs = step_ms[warmup:] if len(step_ms) > warmup else step_ms
    return statistics.median(xs) if xs else None


def compare_losses(a: list[str], b: list[str]) -> tuple[bool, int | None]:
    """(identical, first differing step or None): identical means the same number of steps and every
    loss equal as text (float.hex, so bit for bit)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return False, i
    if len(a) != len(b) or not a:
        return False, min(len(a), len(b))
    return True, None


def fmt(v, spec: str = "") -> str:
    """A table cell: '-' for None, yes/NO for a bool."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return format(v, spec)


# ------------------------------------------------------------------------------------ NVML
class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (the layout of nvmlDeviceGetComputeRunningProcesses_v2 and _v3)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class MemoryInfo(ctypes.Structure):
    """nvmlMemory_t."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """The few NVML calls the benches need, through ctypes. Raises BenchError (one line)."""

    def __init__(self, index: int = 0, lib: str = NVML_LIB):
        try:
            self.lib = ctypes.CDLL(lib)
        except OSError as e:
            raise BenchError(f"NVML ({lib}) is not loadable ({e}); the driver-side peak memory needs it") from None
        try:
            init = self.lib.nvmlInit_v2
        except AttributeError:
            raise BenchError(f"{lib} has no nvmlInit_v2; the driver-side peak memory needs NVML") from None
        r = init()
        if r != NVML_SUCCESS:
            raise BenchError(f"nvmlInit_v2 failed: {self.error(r)}")
        self.handle = ctypes.c_void_p()
        r = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle))
        if r != NVML_SUCCESS:
            raise BenchError(f"nvmlDeviceGetHandleByIndex_v2({index}) failed: {self.error(r)}")
        self.index = index
        self._procs = None
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            fn = getattr(self.lib, name, None)
            if fn is not None:
                self._procs, self.procs_function = fn, name
                break
        self._buf = (ProcessInfo * 64)()

    def error(self, r: int) -> str:
        try:
            f = self.lib.nvmlErrorString
            f.restype = ctypes.c_char_p
            return f"{f(r).decode(errors='replace')} ({r})"
        except (AttributeError, OSError):
            return f"NVML error {r}"

    def memory(self) -> tuple[int, int, int]:
        """(total, free, used) bytes of the device."""
        m = MemoryInfo()
        r = self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m))
        if r != NVML_SUCCESS:
            raise BenchError(f"nvmlDeviceGetMemoryInfo failed: {self.error(r)}")
        return int(m.total), int(m.free), int(m.used)

    def processes(self) -> list[tuple[int, int]] | None:
        """[(pid, used bytes or None when NVML does not say)] of the compute processes, or None when
        this driver cannot list them (then it is not asked again)."""
        if self._procs is None:
            return None
        for _ in range(3):
            n = ctypes.c_uint(len(self._buf))
            r = self._procs(self.handle, ctypes.byref(n), self._buf)
            if r == NVML_SUCCESS:
                return [(int(p.pid), None if p.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else int(p.usedGpuMemory))
                        for p in self._buf[: n.value]]
            if r == NVML_ERROR_INSUFFICIENT_SIZE:
                self._buf = (ProcessInfo * max(2 * len(self._buf), n.value + 8))()
                continue
            break
        self._procs = None
        return None

    def _text(self, fn_name: str, *args) -> str | None:
        fn = getattr(self.lib, fn_name, None)
        if fn is None:
            return None
        buf = ctypes.create_string_buffer(256)
        return buf.value.decode(errors="replace") if fn(*args, buf, ctypes.c_uint(len(buf))) == NVML_SUCCESS else None

    def info(self) -> dict:
        cuda = ctypes.c_int(0)
        fn = getattr(self.lib, "nvmlSystemGetCudaDriverVersion_v2", None)
        cuda_v = int(cuda.value) if fn is not None and fn(ctypes.byref(cuda)) == NVML_SUCCESS else None
        total, _, _ = self.memory()
        return {
            "gpu": self._text("nvmlDeviceGetName", self.handle), "gpu_index": self.index, "gpu_total_bytes": total,
            "driver_version": self._text("nvmlSystemGetDriverVersion"),
            "cuda_driver_version": cuda_v, "nvml_process_query": getattr(self, "procs_function", None),
        }

    def snapshot(self, n: int = 5, gap_s: float = 0.005) -> tuple[int, set]:
        """(median device used bytes over ``n`` reads, pids of the compute processes now)."""
        used = []
        for _ in range(n):
            used.append(self.memory()[2])
            time.sleep(gap_s)
        procs = self.processes() or []
        return int(statistics.median(used)), {pid for pid, _ in procs}
