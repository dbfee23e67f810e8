#!/usr/bin/env python3
"""Swap mode on real workloads: driver-measured peak device memory, step time and losses under budgets.

Swap mode works at tensor granularity (issue 9): ``pyobmem run --swap`` applies the per-tensor
allocation presets (pyobmem.launcher.tensor_presets: PyTorch ``backend:cudaMallocAsync``, JAX
``cuda_async`` without preallocation), so every large tensor is its own block. Each swap row records
``"blocks"`` and ``"presets"`` as the launcher wrote them into the capture.

Three parts (``--parts``, default all), each writing one JSON file under ``--out-dir``:

- ``gpt`` -> swap_gpt2_medium.json: GPT medium (scripts/workloads/gpt.py --size medium --batch 8
  --seq 1024 --deterministic --seed 0) run unmodified (the baseline: PyTorch's native allocator,
  no pyobmem), then with the presets alone (``preset_alone``: no pyobmem), under ``pyobmem run
  --swap --budget`` at 0.9, 0.75, 0.6, 0.5 and 0.4 of the baseline's peak, then with PyTorch's own
  savers (``--save-on-cpu``, ``--checkpoint``) for comparison. ``targets`` (budget fraction ->
  the step-time ratio it must meet) and ``meets_targets``: per target, completed, time within the
  target, under the budget, losses identical and the prediction within 1.15x; ``all``.
- ``frameworks`` -> swap_frameworks.json: torchvision's ResNet-50 (resnet50.py, batch 128) and
  the flax MLP (flax_mlp.py, batch 16384), each unmodified, with the presets alone and under swap
  mode at 50% of its peak (the budget leaves room for the larger overhead of the two runs).
  Plain JAX preallocates most of the card, so its budget is a fraction of the peak of a run with
  the presets alone (``budget_basis``); its losses and time are compared with plain JAX.
- ``oversubscribed`` -> swap_oversubscribed.json: a ballast process (scripts/ballast.py) leaves
  free only 70% of GPT medium's peak; GPT medium unmodified (expected: out of memory), then under
  swap mode with a budget of that free memory less the baseline's non-allocation overhead and a
  margin.

Peak device memory is measured from the driver, not from the framework: a thread of this process
samples NVML (libnvidia-ml.so.1, ctypes) every ``--sample-ms`` (2 ms) while a run lasts: the
per-process used memory of every process that was not on the GPU before the run started (the
workload; never this process, which makes no CUDA context), and the device's used memory less its
idle value measured just before. ``peak_bytes`` is the per-process figure when NVML reports it,
else the device figure (``peak_method`` says which; both are recorded).

The budget a swap run gets (``shim_budget_bytes``, passed as ``--budget <bytes>``) is the shim's
allocation budget: ``budget_fraction x baseline peak`` (``budget_bytes``, what the run's peak is
compared with: ``under_budget``) less the baseline's non-allocation overhead (driver peak minus the
framework's own reserved peak: CUDA context, module images, library handles).

Step time: the median of the steps after the first ``--warmup`` (5 of the default 25 steps: 20
measured). ``time_ratio``: that over the baseline's. ``loss_identical``: the per-step losses
(float.hex, from the workload's JSON) equal bit for bit. ``trace``: the workload traced with the
per-tensor presets and no swapping (``pyobmem run --tensor-blocks``, TRACE_STEPS steps), on which
``pyobmem plan --json`` runs at every swap row's budget, in the background while the swap runs go:
a row's ``predicted_time_ratio`` is that plan's (the host-clock replay's ratio, ``planner.replay``)
times the trace's iteration (``predicted_step_ms``) over the baseline's step (``plan_prediction``
has the plan's figures): what a user is told before swapping (the frameworks and oversubscribed
parts trace nothing: their ``predicted_time_ratio`` is the daemon's; ``prediction_source``). ``daemon_predicted_time_ratio``:
the daemon's own planner on the swap run's records up to the last plan the shim adopted (its
SwapAgent.plan_now, so with its learning options; ``daemon_prediction``), of an iteration the
run's swaps before the plan had slowed, as a step time over the baseline's.
``prediction_within_1_15`` (``daemon_prediction_within_1_15``): the measured ratio within 1.15x
of it either way. Swap statistics
come from ``Capture.swaps`` / ``Capture.plans``. ``allocator_env``: the allocator variables of
each run's environment (before the launcher's presets).

Every run has a timeout taken from ``--time-budget`` (default 530 s for everything): each run may
use what is left once the least the runs after it need is set aside, so a slow run is cut (its
completed steps are kept, ``completed`` false) rather than the bench overrunning. The JSON files
are rewritten after every run. All three parts need more than one device call of 9 minutes
(about 410 s for ``gpt``, 275 s for the other two): run them as two calls.

    python3 scripts/bench_swap.py --parts gpt
    python3 scripts/bench_swap.py --parts frameworks,oversubscribed

The launcher is ``python3 -m pyobmem run`` with the repository on PYTHONPATH; set
PYOBMEM_BENCH_LAUNCHER (e.g. "pyobmem-run") to use another command in its place.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/_bench.py
from _bench import (NO_GPU, REPO, BenchError, Nvml, child_env, compare_losses, die, fmt,  # noqa: E402
                    gpu_present, read_steps, workload_command)

BALLAST = REPO / "scripts" / "ballast.py"
PARTS = ("gpt", "frameworks", "oversubscribed")
FRACTIONS = (0.9, 0.75, 0.6, 0.5, 0.4)
TARGETS = {0.75: 1.05, 0.6: 1.20, 0.5: 1.35}  # issue 9: the step-time ratio each budget must meet
PREDICTION_TOLERANCE = 1.15  # measured / predicted ratio within this factor either way
STEPS, WARMUP = 25, 5  # steps per run, of which the first WARMUP are left out of the step time
GPT_ARGS = ["--size", "medium", "--batch", "8", "--seq", "1024", "--deterministic", "--seed", "0"]
MIB, GIB = 1 << 20, 1 << 30
MIN_SHIM_BUDGET = 64 * MIB  # the shim reads a budget of 0 as "no budget": never pass less than this
IDLE_SLACK = 512 * MIB  # after a run the device is back to idle when used <= idle + this
# The per-process query can be much slower than the device's memory info: the sampler reads the device
# every interval and lists the processes only when the device is near its highest reading of the run
# (within PROC_NEAR) or PROC_EVERY_S has passed since the last listing.
PROC_NEAR = 64 * MIB
PROC_EVERY_S = 0.05
# Estimates for the schedule until measured (GPT medium on the H200, issue 9's measurements).
GPT_STEP_S = 0.51  # GPT-2 medium, batch 8, seq 1024
GPT_START_S = 20.0  # process start, model build and copy to the device
SAVE_ON_CPU_X, CHECKPOINT_X = 4.22, 1.25  # their step time over the baseline's
# The least step-time ratio a swap run can have at a budget fraction: the frontier the copy
# engines set (issue 9); 1.0 for fractions not listed.
FRONTIER_X = {0.75: 1.00, 0.6: 1.16, 0.5: 1.28, 0.4: 1.52}
SWAP_EXTRA_S = 12.0  # launcher and daemon start and finish, and reading the capture afterwards ...
ANALYSIS_S = 8.0  # ... of which this is kept out of a swap run's own timeout for the capture's analysis
TRACE_STEPS = 8  # the traced unswapped run `pyobmem plan` predicts from: warm-up and 5+ whole steps
PLAN_WAIT_S = 180.0  # the most a swap row waits for its `pyobmem plan` (started after the trace, in parallel)
# Workloads of the frameworks part: (script, arguments, start-up s, step s) for the schedule.
FRAMEWORKS = {
    "resnet50": ("resnet50.py", ["--batch", "128"], 25.0, 0.25),
    # batch 16384: activations most of the memory, as in training; at 2048 the optimizer's one fused
    # update (every parameter and Adam state) alone needed more than half the peak (H200, session 7)
    "jax": ("flax_mlp.py", ["--batch", "16384"], 15.0, 0.05),
}
# Allocator variables a run's environment is recorded with (those of pyobmem.launcher.RECORDED_ENV).
ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TF_GPU_ALLOCATOR")
NONDETERMINISTIC = re.compile(r"(\w+) does not have a deterministic implementation")

_T0 = time.monotonic()
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # pyobmem from this tree (imported only when needed: --help needs nothing)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ machine
def preset_env(base: dict | None = None) -> dict:
    """The per-tensor allocation presets swap mode applies to environment ``base`` (default this
    one): pyobmem.launcher.tensor_presets, e.g. PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,
    XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async, XLA_PYTHON_CLIENT_PREALLOCATE=false (name -> value)."""
    from pyobmem.launcher import tensor_presets

    return dict(tensor_presets(dict(os.environ) if base is None else base)[0])


def allocator_env(env: dict) -> dict:
    """The allocator variables of a workload's environment ``env`` (PyTorch's, TensorFlow's, JAX's
    XLA_PYTHON_CLIENT_*): what decides how it allocates device memory."""
    return {k: v for k, v in sorted(env.items()) if k in ALLOCATOR_ENV or k.startswith("XLA_PYTHON_CLIENT_")}


def versions() -> dict:
    from importlib import metadata

    out: dict = {}
    try:
        import pyobmem

        out["pyobmem"] = pyobmem.__version__
    except Exception:  # noqa: BLE001
        out["pyobmem"] = None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
        out["pyobmem_commit"] = head.stdout.strip() or None
        out["pyobmem_tree_modified"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        out["pyobmem_commit"] = None
    out["python"] = platform.python_version()
    for p in ("torch", "jax", "jaxlib", "jax-cuda13-plugin", "cupy-cuda13x", "numpy", "scipy"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


# ------------------------------------------------------------------------------------ NVML
class PeakTracker:
    """The peak of one run from NVML samples: the device's used memory less ``idle_used``, and the
    sum of the per-process used memory of the processes not in ``excluded`` (those on the GPU before
    the run: a ballast, a leftover)."""

    def __init__(self, idle_used: int, excluded: set | frozenset = frozenset()):
        self.idle_used = int(idle_used)
        self.excluded = set(excluded)
        self.samples = 0
        self.process_samples = 0
        self.peak_device = 0
        self.peak_process: int | None = None
        self.pids: set = set()
        self.t_first = self.t_last = None

    def add(self, used: int, procs: list | None, t: float | None = None) -> None:
        """One sample: the device's used bytes, the [(pid, bytes or None)] listing (None: not listed
        this time, or not supported), the sample's time (s)."""
        self.samples += 1
        self.process_samples += procs is not None
        if t is not None:
            self.t_first = t if self.t_first is None else self.t_first
            self.t_last = t
        self.peak_device = max(self.peak_device, int(used) - self.idle_used)
        if procs:
            mine = [(pid, b) for pid, b in procs if pid not in self.excluded and b is not None]
            if mine:
                self.pids.update(pid for pid, _ in mine)
                total = sum(b for _, b in mine)
                self.peak_process = total if self.peak_process is None else max(self.peak_process, total)

    def result(self) -> dict:
        per_process = self.peak_process is not None
        span = (self.t_last - self.t_first) if (self.t_first is not None and self.samples > 1) else None
        return {
            "peak_bytes": self.peak_process if per_process else max(self.peak_device, 0),
            "peak_method": "nvml per-process used memory (sum over the run's processes)" if per_process
            else "nvml device used memory minus its idle value before the run",
            "peak_process_sum_bytes": self.peak_process,
            "peak_device_used_minus_idle_bytes": self.peak_device,
            "idle_used_bytes": self.idle_used,
            "processes_seen": len(self.pids),
            "samples": self.samples,
            "process_samples": self.process_samples,
            "sample_interval_ms": round(1e3 * span / (self.samples - 1), 3) if span else None,
        }


class Sampler:
    """Samples NVML into a PeakTracker from a thread until stopped (a context manager)."""

    def __init__(self, nvml: Nvml, tracker: PeakTracker, interval_s: float):
        self.nvml, self.tracker, self.interval_s = nvml, tracker, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self.error: str | None = None

    def _run(self) -> None:
        try:
            top, listed = -1, -1e9
            while True:
                t = time.monotonic()
                used = self.nvml.memory()[2]
                procs = None
                if used >= top - PROC_NEAR or t - listed >= PROC_EVERY_S:
                    procs, listed = self.nvml.processes(), t
                top = max(top, used)
                self.tracker.add(used, procs, t)
                if self._stop.wait(self.interval_s):
                    break
        except Exception as e:  # noqa: BLE001 - reported with the run
            self.error = f"{type(e).__name__}: {e}"

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


# ------------------------------------------------------------------------------------ arithmetic
def steady_median(step_ms: list[float], warmup: int = WARMUP) -> float | None:
    """The median of the steps after the first ``warmup`` (all of them when there are no more)."""
    xs = step_ms[warmup:] if len(step_ms) > warmup else step_ms
    return float(statistics.median(xs)) if xs else None


def ratio(x: float | None, y: float | None) -> float | None:
    return (x / y) if (x is not None and y) else None


def within(measured: float | None, predicted: float | None, tolerance: float = PREDICTION_TOLERANCE) -> bool | None:
    """measured / predicted within ``tolerance`` either way; None when either is unknown."""
    if measured is None or not predicted:
        return None
    return 1 / tolerance <= measured / predicted <= tolerance


def swap_overhead(*runs) -> int | None:
    """The non-allocation overhead a swap run's budget leaves room for: the largest of ``runs``'
    (overhead_of each; None ones skipped). A swap run has the preset's allocator, whose overhead
    is not the native allocator's: 784 against 711 MB on GPT medium (H200, session 5), and the
    swap runs' driver peaks passed their budgets by 40-60 MB with the baseline's."""
    vals = [overhead_of(r.peak.get("peak_bytes"), r.framework_reserved()) for r in runs if r is not None]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def overhead_of(driver_peak: int | None, framework_reserved: int | None) -> int | None:
    """The non-allocation device memory of a run: driver peak less the framework's reserved peak
    (context, module images, library handles); None when either is unknown; never negative."""
    if driver_peak is None or not framework_reserved:
        return None
    return max(int(driver_peak) - int(framework_reserved), 0)


def shim_budget(fraction: float, driver_peak: int, overhead: int | None, of_allocations: bool = False) -> dict:
    """The budget of one swap run: ``budget_bytes`` = fraction x the baseline's driver peak (what the
    run's driver peak is compared with), ``shim_budget_bytes`` = that less the non-allocation
    overhead (unknown overhead: none subtracted), at least MIN_SHIM_BUDGET. ``of_allocations``:
    the fraction applies to the allocations only (driver peak less the overhead), for small
    workloads whose context and library workspaces are half their peak or more: ``budget_bytes``
    = overhead + fraction x allocations."""
    budget = int(fraction * driver_peak)
    if of_allocations:
        budget = int((overhead or 0) + fraction * (driver_peak - (overhead or 0)))
    shim = budget - (overhead or 0)
    return {
        "budget_fraction": fraction,
        "budget_of": "allocations (driver peak less overhead)" if of_allocations else "driver peak",
        "budget_bytes": budget,
        "shim_budget_bytes": max(shim, MIN_SHIM_BUDGET),
        "shim_budget_clamped": shim < MIN_SHIM_BUDGET,
        "overhead_bytes": overhead,
    }


def meets_targets(rows: list[dict], targets: dict = TARGETS) -> dict:
    """Issue 9's targets against the swap rows (dicts with budget_fraction, completed, time_ratio,
    under_budget, loss_identical, prediction_within_1_15): per target fraction, each check and
    ``met`` (all of them; False when that budget did not run); ``all_budgets``: the checks but the
    time over every swap row that ran; ``all``: everything met."""
    out: dict = {}
    for f, target in targets.items():
        r = next((x for x in rows if x.get("budget_fraction") == f), {})
        checks = {
            "completed": r.get("completed") is True,
            "time_within_target": r.get("time_ratio") is not None and r["time_ratio"] <= target,
            "under_budget": r.get("under_budget") is True,
            "loss_identical": r.get("loss_identical") is True,
            "prediction_within_1_15": r.get("prediction_within_1_15") is True,
        }
        out[str(f)] = {"target_time_ratio": target, "time_ratio": r.get("time_ratio"), **checks, "met": all(checks.values())}
    ran = [r for r in rows if not r.get("skipped")]
    out["all_budgets"] = {k: bool(ran) and all(r.get(k) is True for r in ran)
                          for k in ("completed", "under_budget", "loss_identical", "prediction_within_1_15")}
    out["all"] = all(out[str(f)]["met"] for f in targets) and all(out["all_budgets"].values())
    return out


def oversubscribed_budget(free_bytes: int, overhead: int | None, margin: int) -> dict:
    """The shim's budget on a card with ``free_bytes`` free: free less the baseline's
    non-allocation overhead less ``margin`` (blocks under min_swap_bytes are outside the shim's
    budget, and the driver rounds), at least MIN_SHIM_BUDGET."""
    shim = int(free_bytes) - int(overhead or 0) - int(margin)
    return {"free_bytes": int(free_bytes), "overhead_bytes": overhead, "margin_bytes": int(margin),
            "shim_budget_bytes": max(shim, MIN_SHIM_BUDGET), "shim_budget_clamped": shim < MIN_SHIM_BUDGET}


def last_error_line(text: str) -> str | None:
    """The last line that names an error (a Python exception line, ``error:``), else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception)\b|error:|out of memory", ln):
            return ln[:400]
    return lines[-1][:400] if lines else None


def is_oom(text: str) -> bool:
    return bool(re.search(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|RESOURCE_EXHAUSTED", text))


# ------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    label: str
    cmd: list[str]
    rc: int
    wall_s: float
    timed_out: bool
    losses: list[str]
    step_ms: list[float]
    doc: dict | None  # the workload's --json result (written at its end)
    stdout: str
    stderr: str
    peak: dict
    steps_expected: int
    errors: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)  # the allocator variables the workload's environment had
    warmup: int = WARMUP

    @property
    def completed(self) -> bool:
        return self.rc == 0 and not self.timed_out and len(self.losses) == self.steps_expected

    @property
    def steady_ms(self) -> float | None:
        return steady_median(self.step_ms, self.warmup)

    def tail(self, n: int = 600) -> str:
        return (self.stderr.strip() or self.stdout.strip())[-n:]

    def framework_reserved(self) -> int | None:
        """The framework's own peak of device memory it holds (bytes): PyTorch's reserved peak,
        JAX's pool peak (cuda_async) or peak in use; None when it reports none."""
        ms = (self.doc or {}).get("memory_stats") or {}
        v = next((ms[k] for k in ("reserved_bytes.all.peak", "peak_pool_bytes", "peak_bytes_in_use") if ms.get(k)), None)
        return int(v) if v else None

    @property
    def measured_steps(self) -> int:
        """The steps the step time is the median of."""
        n = len(self.step_ms)
        return n - self.warmup if n > self.warmup else n

    def summary(self) -> dict:
        """The figures every run reports; ``workload_allocator``: what the workload says it ran
        with (PyTorch's allocator backend and configuration, JAX's XLA variables)."""
        doc = self.doc or {}
        ms = doc.get("memory_stats") or {}
        return {
            "rc": self.rc,
            "completed": self.completed,
            "timed_out": self.timed_out,
            "steps_completed": len(self.losses),
            "steps": self.steps_expected,
            "wall_s": round(self.wall_s, 2),
            "warmup_steps": self.warmup,
            "measured_steps": self.measured_steps,
            "step_ms_median": self.steady_ms,
            "step_ms": self.step_ms,
            "allocator_env": self.env,
            "workload_allocator": {k: doc[k] for k in ("allocator_backend", "alloc_conf", "xla_env") if k in doc},
            "nondeterministic_ops": sorted(set(NONDETERMINISTIC.findall(self.stderr))),
            **self.peak,
            "framework_reserved_peak_bytes": self.framework_reserved(),
            "framework_allocated_peak_bytes": int(ms["allocated_bytes.all.peak"]) if ms.get("allocated_bytes.all.peak") else None,
            "command": shlex.join(self.cmd),
            "errors": list(self.errors),
            **({} if self.completed else {"stderr_tail": self.stderr[-2000:]}),
        }


def _stop(p: subprocess.Popen, steps: tuple, send=os.kill, gone: tuple = (ProcessLookupError,)) -> None:
    """For each (signal or None, seconds) of ``steps``: send the signal (``send(p.pid, sig)``; none
    for None), then wait that long for ``p`` to exit; done once it has, or once sending raises one of
    ``gone``."""
    for sig, wait in steps:
        if sig is not None:
            try:
                send(p.pid, sig)
            except gone:
                return
        try:
            p.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_group(p: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the run's process group (the launcher forwards it to the workload and closes the
    capture), then SIGKILL after ``grace_s``."""
    _stop(p, ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)), os.killpg, (ProcessLookupError, PermissionError))


def wait_idle(nvml: Nvml, idle_used: int, timeout_s: float = 30.0) -> bool:
    """Wait until the device's used memory is back near ``idle_used`` (the run's processes gone)."""
    end = time.monotonic() + timeout_s
    while True:
        if nvml.memory()[2] <= idle_used + IDLE_SLACK:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.2)


def run_measured(label: str, script: str, args: list[str], json_path: Path, nvml: Nvml, timeout: float,
                 steps: int, sample_s: float, env: dict | None = None, capture: Path | None = None,
                 launcher_options: tuple[str, ...] = (), warmup: int = WARMUP) -> Run:
    """Run one workload (under the launcher when ``capture`` is given) with this environment and
    ``env`` set, while sampling NVML; collect its step lines, its JSON and the driver-side peak.
    Never raises for a failing run."""
    cmd = workload_command(script, args, json_path, capture, launcher_options)
    run_env = child_env(env)
    if json_path.exists():
        json_path.unlink()
    idle, before = nvml.snapshot()
    tracker = PeakTracker(idle, before)
    log(f"{label}: start (timeout {timeout:.0f} s): {shlex.join(cmd)}")
    t0 = time.monotonic()
    timed_out = False
    # Output goes to files, not pipes: the pyobmem daemon inherits the launcher's stderr and may
    # outlive a killed launcher by a few seconds; the run ends when its process does.
    out_path, err_path = json_path.with_suffix(".stdout"), json_path.with_suffix(".stderr")
    with Sampler(nvml, tracker, sample_s) as sampler, open(out_path, "w") as fo, open(err_path, "w") as fe:
        p = subprocess.Popen(cmd, cwd=REPO, env=run_env, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                             text=True, start_new_session=True)
        try:
            try:
                p.wait(timeout=max(timeout, 1.0))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(p)
        except BaseException:
            _kill_group(p, grace_s=5.0)  # the bench is being stopped: leave nothing running
            raise
    out = out_path.read_text(errors="replace")
    err = err_path.read_text(errors="replace")
    if timed_out:
        err += f"\n{label}: stopped after the timeout of {timeout:.0f} s"
    wall = time.monotonic() - t0
    rc = 124 if timed_out else p.returncode
    losses, step_ms, doc, errors = read_steps(out or "", json_path)
    if sampler.error:
        errors.append(f"NVML sampling stopped: {sampler.error}")
    run = Run(label, cmd, rc, wall, timed_out, losses, step_ms, doc, out or "", err or "", tracker.result(), steps, errors,
              allocator_env(run_env), warmup)
    if not wait_idle(nvml, idle):
        run.errors.append("the device did not return to its idle memory within 30 s after the run")
    log(f"{label}: rc {rc}{' (timed out)' if timed_out else ''}, {len(losses)}/{steps} steps, "
        f"{wall:.1f} s, peak {fmt_gib(run.peak['peak_bytes'])}, step {fmt(run.steady_ms, '.1f')} ms")
    return run


# ------------------------------------------------------------------------------------ captures
def swap_stats(cap) -> dict:
    """Swap-outs and swap-ins by cause, plans adopted and dropped, pinned host memory and the
    shim's swap notes, from a Capture (``swaps``, ``plans``, ``notes``). ``swap_outs``: None for a
    capture that did not record why blocks went out (before session 13)."""
    import numpy as np
    from pyobmem.abi import SwapInCause, SwapOutCause
    from pyobmem.report.swap import swaps_by_cause

    sw, pl = cap.swaps, cap.plans
    out = sw[sw["direction"] == 0]
    ins = sw[sw["direction"] == 1]
    by_cause = swaps_by_cause(ins, SwapInCause)
    adopted = pl[~pl["dropped"]]
    pinned = [int(n["swap.pinned_bytes"]) for n in cap.notes.values() if str(n.get("swap.pinned_bytes", "")).isdigit()]
    notes = {}
    for pid, n in cap.notes.items():
        for k, v in n.items():
            if str(k).startswith("swap"):
                notes[f"{k}={v}" if v else str(k)] = int(pid)
    ops = getattr(cap, "ops", None)
    t0 = int(ops["ts_ns"].min()) if ops is not None and len(ops) else None
    return {
        "swapped_out_bytes": int(out["bytes"].sum()),
        "swapped_out_count": int(len(out)),
        "swapped_out_blocks": int(len(np.unique(out["block"]))),
        "swap_outs": swaps_by_cause(out, SwapOutCause) if np.any(out["cause"] != 0) else None,
        "swapped_in_bytes": int(ins["bytes"].sum()),
        "swapped_in_count": int(len(ins)),
        "swap_ins": by_cause,
        "plan_adopted": bool(len(adopted)),
        "plans_adopted": int(len(adopted)),
        "plans_dropped": int(pl["dropped"].sum()),
        "plan_actions": int(adopted["value"][-1]) if len(adopted) else None,
        "plan_adopted_at_s": round((int(adopted["ts_ns"][0]) - t0) / 1e9, 3) if (len(adopted) and t0 is not None) else None,
        "pinned_bytes": max(pinned) if pinned else None,
        "swap_on": any(n.startswith("swap=on") for n in notes),  # the shim's note at start: "swap=on budget=..."
        "swap_notes": sorted(notes),
    }


def _ended_under_choice(path: Path, adopted) -> bool:
    """Whether the last plan the shim adopted (``adopted``: its PLAN records) was the replay's
    choice, by the daemon's plans file beside the capture (``chosen_by_replay``; a cover written
    again after the choice's trial is not); without the file, whether it adopted exactly two (the
    cover, then the choice)."""
    import numpy as np
    from pyobmem.daemon import plans_path, read_plans

    if not len(adopted):
        return False
    gen = int(adopted[int(np.argmax(adopted["ts_ns"]))]["a"])
    kept = read_plans(plans_path(str(path)))
    if kept is None:
        return len(adopted) == 2
    return any(k.get("generation") == gen and k.get("chosen_by_replay") for k in kept)


def daemon_prediction(path: Path, budget_bytes: int, min_swap_bytes: int) -> dict:
    """The planner's prediction for a swap run, as the daemon made it: the capture's records up to
    the last plan the shim adopted (all of them when none was) are fed to pyobmem.daemon.SwapAgent
    (which keeps what the daemon keeps: every ALLOC/FREE/PROCESS/NOTE, a window of ops and
    accesses, forgetting what preceded a dropped plan), and its own ``plan_now`` learns and plans,
    so the prediction follows the daemon's options (``learn_options``: e.g. ``by_site``) whatever
    they are. The planner's learn_iteration and make_plan are watched during that call for the
    plan's figures (plan_now returns only a plan it would write: ``written_actions``). The daemon
    writes no plan figures into the capture, so this replay is the most faithful source;
    ``plan_actions_match`` checks the plan it would write against the actions of the adopted one."""
    import types

    import numpy as np
    from pyobmem import abi, planner
    from pyobmem.capture import read_records
    from pyobmem.daemon import SwapAgent

    meta, recs = read_records(str(path))
    pl = recs[recs["type"] == abi.Ev.PLAN]
    adopted = pl[(pl["flags"] & 1) == 0]
    res: dict = {}
    if len(adopted):
        last = adopted[int(np.argmax(adopted["ts_ns"]))]
        recs = recs[recs["ts_ns"] <= last["ts_ns"]]
        res["source"] = "daemon replay: records up to the last adopted plan (generation " \
                        f"{int(last['a'])}, {int(last['b'])} actions)"
        res["adopted_actions"] = int(last["b"])
    else:
        res["source"] = "daemon replay: the whole capture (no plan was adopted)"
        res["adopted_actions"] = None
    ctl = types.SimpleNamespace(plan_drops=0, min_swap_bytes=min_swap_bytes, budget_bytes=budget_bytes,
                                write_plan=lambda plan, generation=None: None)
    agent = SwapAgent(ctl, planner.Budget(text=str(budget_bytes), bytes=int(budget_bytes)), meta, warn=lambda s: None)
    for i in range(0, len(recs), 1 << 16):
        agent.feed(recs[i:i + (1 << 16)])
    seen: dict = {}
    learn, make = planner.learn_iteration, planner.make_plan

    def watch_learn(*a, **k):
        seen["learn_options"] = {n: v for n, v in k.items() if isinstance(v, (bool, int, float, str))}
        return learn(*a, **k)

    def watch_make(*a, **k):
        seen["plan"] = make(*a, **k)
        return seen["plan"]

    t = time.monotonic()
    planner.learn_iteration, planner.make_plan = watch_learn, watch_make
    try:
        written = agent.plan_now(choose=_ended_under_choice(path, adopted))
    finally:
        planner.learn_iteration, planner.make_plan = learn, make
    res["learn_options"] = seen.get("learn_options")
    res["written_actions"] = int(len(written.actions)) if written is not None else None  # None: no plan written
    plan = seen.get("plan")
    if plan is None:
        res.update({"predicted_time_ratio": None, "feasible": False, "reason": agent.last_reason,
                    "planning_s": round(time.monotonic() - t, 3)})
        return res
    res.update({
        "predicted_time_ratio": _predicted(plan) if plan.feasible else None,
        "feasible": bool(plan.feasible),
        "best_time_ratio": _predicted(plan),
        "model_time_ratio": plan.time_ratio,
        "replay": plan.replay.to_json() if plan.replay is not None else None,
        "budget_bytes": int(budget_bytes),
        "peak_bytes": plan.peak_bytes,
        "predicted_peak_bytes": plan.predicted_peak,
        "needed_bytes": plan.needed_bytes,
        "swapped_bytes": plan.swapped_bytes,
        "swapped_blocks": len({s.block for s in plan.swaps}),
        "actions": int(len(plan.actions)),
        "period_ops": plan.period,
        "iteration_ms": round(plan.iteration_ns / 1e6, 3),
        "iterations_matching": plan.matching,
        "planning_s": round(time.monotonic() - t, 3),
    })
    if res["adopted_actions"] is not None:
        res["plan_actions_match"] = res["written_actions"] == res["adopted_actions"]
    if not plan.feasible:
        res["reason"] = agent.last_reason
    return res


def _predicted(plan) -> float:
    """The plan's predicted time ratio: the host-clock replay's (planner.replay), else the cost model's."""
    return plan.predicted_time_ratio if plan.predicted_time_ratio is not None else plan.time_ratio


def analyse_capture(path: Path, budget_bytes: int, min_swap_bytes: int | None = None) -> dict:
    """Swap statistics, the blocks and presets the launcher recorded (``"blocks": "tensor"``: the
    per-tensor presets were applied) and the planner's prediction of one swap run's capture;
    errors as a list."""
    res: dict = {"capture_bytes": path.stat().st_size if path.exists() else None, "errors": []}
    if not path.exists():
        res["errors"].append(f"no capture at {path}")
        return res
    t = time.monotonic()
    try:
        from pyobmem.capture import read_capture

        cap = read_capture(str(path))
        sw = cap.meta.get("swap") if isinstance(cap.meta.get("swap"), dict) else {}
        if min_swap_bytes is None:
            min_swap_bytes = int(sw.get("min_swap_bytes") or 4 * MIB)
        res.update({"capture_complete": bool(cap.complete), "dropped_events": int(cap.dropped),
                    "exit_status": cap.exit_status, "min_swap_bytes": min_swap_bytes,
                    "blocks": cap.meta.get("blocks"), "presets": cap.meta.get("presets")})
        res.update(swap_stats(cap))
        del cap
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"reading the capture: {type(e).__name__}: {e}")
        return res
    try:
        pred = daemon_prediction(path, budget_bytes, min_swap_bytes)
        res["predicted_time_ratio"] = pred.get("predicted_time_ratio")
        res["prediction"] = pred
    except Exception as e:  # noqa: BLE001
        res["predicted_time_ratio"] = None
        res["errors"].append(f"planner on the capture: {type(e).__name__}: {e}")
    res["analysis_s"] = round(time.monotonic() - t, 2)
    return res


def daemon_messages(stderr: str) -> list[str]:
    """What pyobmem said on the run's stderr (the daemon's swap warnings, errors), deduplicated."""
    keep = [ln.strip() for ln in stderr.splitlines()
            if ln.startswith(("pyobmem: swap", "pyobmem: error", "pyobmem: the capture daemon", "pyobmem: warning"))]
    return list(dict.fromkeys(keep))[:20]


# ------------------------------------------------------------------------------------ schedule
@dataclass
class Step:
    """One scheduled piece of work: ``min_s()`` the least time it needs (an estimate, updated once
    the GPT baseline has run), ``cap_s()`` the most it may take."""

    name: str
    part: str
    min_s: Callable[[], float]
    cap_s: Callable[[], float]


def step_timeout(left: float, reserve: float, min_s: float, cap_s: float) -> float:
    """A step may use what is left once the later steps' least needs are set aside, and at least its
    own least need (taken from the later steps when the budget is short), never more than its cap
    nor than what is left."""
    return max(0.0, min(cap_s, max(left - reserve, min_s), left))


@dataclass
class Estimates:
    start_s: float = GPT_START_S
    gpt_step_s: float = GPT_STEP_S

    def gpt_run(self, steps: int, factor: float = 1.0) -> float:
        return self.start_s + steps * self.gpt_step_s * factor


def schedule(parts: list[str], steps: int, ref_steps: int, fractions: list[float], est: Estimates) -> list[Step]:
    """The runs of ``parts`` in order, with their least and most time (read from ``est`` when asked)."""
    out: list[Step] = []
    if "gpt" in parts or "oversubscribed" in parts:
        # its errors go to the part that runs (a second call of the bench must not rewrite the other's file)
        out.append(Step("gpt baseline", "gpt" if "gpt" in parts else "oversubscribed", lambda: est.gpt_run(steps),
                        lambda: 2 * est.gpt_run(steps) + 60))
    if "gpt" in parts:
        out.append(Step("gpt preset", "gpt", lambda: est.gpt_run(steps), lambda: 2 * est.gpt_run(steps) + 60))
        out.append(Step("gpt trace", "gpt", lambda: est.gpt_run(TRACE_STEPS) + SWAP_EXTRA_S,
                        lambda: 2 * est.gpt_run(TRACE_STEPS) + 60))
        for f in fractions:
            out.append(Step(f"gpt swap {f}", "gpt", lambda f=f: est.gpt_run(steps, FRONTIER_X.get(f, 1.0)) + SWAP_EXTRA_S,
                            lambda: est.gpt_run(steps, 3.0) + 60))
        out.append(Step("gpt save_on_cpu", "gpt", lambda: est.gpt_run(ref_steps, SAVE_ON_CPU_X),
                        lambda: est.gpt_run(ref_steps, 2 * SAVE_ON_CPU_X) + 60))
        out.append(Step("gpt checkpointing", "gpt", lambda: est.gpt_run(ref_steps, CHECKPOINT_X),
                        lambda: est.gpt_run(ref_steps, 2 * CHECKPOINT_X) + 60))
    if "frameworks" in parts:
        for name, (_, _, start_s, step_s) in FRAMEWORKS.items():
            run_s = start_s + steps * step_s
            out.append(Step(f"{name} baseline", "frameworks", lambda r=run_s: r, lambda: 180.0))
            # the preset's run gives the overhead under the swap run's allocator, and for plain JAX,
            # which preallocates, the peak the budget is of
            out.append(Step(f"{name} preset", "frameworks", lambda r=run_s: r, lambda: 180.0))
            out.append(Step(f"{name} swap", "frameworks", lambda r=run_s: r + SWAP_EXTRA_S, lambda: 240.0))
    if "oversubscribed" in parts:
        # ballast, the unmodified run (out of memory at its first step), the swap run
        out.append(Step("oversubscribed", "oversubscribed",
                        lambda: 5.0 + (est.start_s + 5.0) + est.gpt_run(steps) + SWAP_EXTRA_S,
                        lambda: 5.0 + est.gpt_run(steps) + 60 + est.gpt_run(steps, 3.0) + 60))
    return out


def schedule_estimate(parts: list[str], steps: int, ref_steps: int, fractions: list[float]) -> float:
    """The least seconds the runs of ``parts`` need (with the default estimates)."""
    return sum(st.min_s() for st in schedule(parts, steps, ref_steps, fractions, Estimates()))


# ------------------------------------------------------------------------------------ output
def fmt_gib(v) -> str:
    return "-" if v is None else f"{v / GIB:.2f} GiB"


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def table(gpt: dict | None, fw: dict | None, over: dict | None) -> str:
    head = f"{'run':<26} {'budget':>10} {'peak':>10} {'under':>5} {'time x':>7} {'pred x':>7} {'daemon':>7} {'loss same':>9} " \
           f"{'done':>5} {'out GiB':>8} {'in pf/late/dem':>15}"
    lines = [head, "-" * len(head)]

    def row(name: str, r: dict) -> None:
        si = r.get("swap_ins") or {}
        ins = "/".join(str((si.get(k) or {}).get("count", "-")) for k in ("prefetch", "late", "demand")) if si else "-"
        out = r.get("swapped_out_bytes")
        lines.append(f"{name:<26} {fmt_gib(r.get('budget_bytes')):>10} {fmt_gib(r.get('peak_bytes')):>10} "
                     f"{fmt(r.get('under_budget')):>5} {fmt(r.get('time_ratio'), '.3f'):>7} "
                     f"{fmt(r.get('predicted_time_ratio'), '.3f'):>7} {fmt(r.get('daemon_predicted_time_ratio'), '.3f'):>7} "
                     f"{fmt(r.get('loss_identical')):>9} "
                     f"{fmt(r.get('completed')):>5} {('-' if out is None else f'{out / GIB:.2f}'):>8} {ins:>15}")

    if gpt:
        for k in ("baseline", "preset_alone"):
            if gpt.get(k):
                row(f"gpt {k}", gpt[k])
        for r in gpt.get("budgets", []):
            row(f"gpt swap {r.get('budget_fraction')}", r)
        for k in ("save_on_cpu", "checkpointing"):
            if gpt.get(k):
                row(f"gpt {k}", gpt[k])
    for name in FRAMEWORKS:
        for k in ("baseline", "preset_alone", "swap"):
            if fw and fw.get(name) and fw[name].get(k):
                row(f"{name} {k}" + (f" {fw.get('budget_fraction')}" if k == "swap" else ""), fw[name][k])
    if over:
        for k in ("unmodified", "swap"):
            if over.get(k):
                row(f"oversubscribed {k}", over[k])
    met = (gpt or {}).get("meets_targets")
    if met:
        lines.append("targets: " + ", ".join(f"{f} <= {t}x: {fmt(met[str(f)]['met'])}" for f, t in TARGETS.items())
                     + f"; every budget under it, losses identical, prediction within {PREDICTION_TOLERANCE}x: "
                     + fmt(all(met["all_budgets"].values())) + f"; all met: {fmt(met['all'])}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ the bench
class Bench:
    def __init__(self, a: argparse.Namespace, nvml: Nvml, work: Path):
        self.a = a
        self.nvml = nvml
        self.work = work
        self.capdir = a.capture_dir or work
        self.est = Estimates()
        self.gpt_base: Run | None = None
        self.gpt_preset: Run | None = None  # the presets alone: the swap runs' overhead (swap_overhead)
        self.planners: dict = {}  # shim budget -> (`pyobmem plan` process, its stdout path) on the trace
        self.fw_runs: dict = {}  # "<framework> baseline" / "<framework> preset" -> Run
        self.presets = preset_env()
        self.docs: dict = {}
        self.paths = {"gpt": a.out_dir / "swap_gpt2_medium.json", "frameworks": a.out_dir / "swap_frameworks.json",
                      "oversubscribed": a.out_dir / "swap_oversubscribed.json"}
        self.common = {"machine": {"hostname": socket.gethostname(), "platform": platform.platform(),
                                   "cpus": os.cpu_count(), **nvml.info()},
                       "versions": versions()}
        self.failed = False

    # -- documents
    def doc(self, part: str) -> dict:
        if part not in self.docs:
            d: dict = {}
            if part == "gpt":
                d = {"workload": shlex.join(["scripts/workloads/gpt.py", *self.gpt_args(self.a.steps)]),
                     "steps": self.a.steps, "warmup_steps": self.a.warmup, "blocks": "tensor",
                     "presets": self.presets, "targets": TARGETS, "meets_targets": None, "baseline": None,
                     "preset_alone": None, "budgets": [], "save_on_cpu": None, "checkpointing": None}
            elif part == "frameworks":
                d = {"budget_fraction": self.a.frameworks_fraction, "steps": self.a.steps,
                     "warmup_steps": self.a.warmup, "blocks": "tensor", "presets": self.presets,
                     **{name: None for name in FRAMEWORKS}}
            else:
                d = {"workload": shlex.join(["scripts/workloads/gpt.py", *self.gpt_args(self.a.steps)]),
                     "free_fraction_of_peak": self.a.oversub_free_fraction, "steps": self.a.steps,
                     "warmup_steps": self.a.warmup, "blocks": "tensor", "presets": self.presets,
                     "budget_rule": "the ballast leaves free_fraction_of_peak x the empty-card baseline's driver peak "
                                    "free; the swap run's budget_bytes is that free memory (cuMemGetInfo), its "
                                    "shim_budget_bytes the free memory less the baseline's overhead less margin_bytes"}
            d["method"] = {
                "baseline": "the workload unmodified, without pyobmem, in this environment (PyTorch's native "
                            "allocator; plain JAX); allocator_env in each run lists its allocator variables",
                "swap": "pyobmem run --swap: the launcher applies the per-tensor presets (blocks 'tensor'; presets: "
                        "the variables it set, read from the capture, on top of the run's allocator_env)",
                "preset_alone": "the workload with the swap presets set and no pyobmem",
                "peak": "NVML sampled every ~%g ms from a thread of the bench while the run lasts; per-process "
                        "used memory of the processes not on the GPU before the run (else device used minus "
                        "idle); see peak_method per run" % self.a.sample_ms,
                "step_ms_median": f"median of the steps after the first warmup_steps ({self.a.warmup}): "
                                  "measured_steps of them; a step's time is the wall time from the previous "
                                  "step's record to its own (the whole loop iteration, with the syncs and the "
                                  "loss read between steps; until session 11 the window between the step's two "
                                  "device syncs, which missed up to 40 ms a step of loss.item() waiting behind swap-outs)",
                "time_ratio": "step_ms_median over the unmodified baseline's",
                "loss_identical": "per-step losses (float.hex) equal bit for bit to the baseline's, same step count",
                "budget": "budget_bytes = fraction x baseline driver peak; shim_budget_bytes (--budget) = budget_bytes "
                          "less the baseline's overhead (driver peak - framework reserved peak)",
                "predicted_time_ratio": "`pyobmem plan --json` on the traced unswapped run (trace: pyobmem run "
                                        "--tensor-blocks, no swapping) at the row's shim_budget_bytes: the replay's "
                                        "ratio times the trace's iteration (predicted_step_ms) over the baseline's "
                                        "step; plan_prediction has the plan's figures",
                "frontier_time_ratio": "the copy engines' bound for any plan at the budget (pyobmem.planner.frontier, "
                                       "`pyobmem plan --json`'s frontier on the same trace), as a ratio over the "
                                       "baseline's step like predicted_time_ratio",
                "daemon_predicted_time_ratio": "the daemon's own planner (SwapAgent.plan_now on the swap run's records up "
                                               "to its last adopted plan; daemon_prediction): planned on iterations "
                                               "its swaps before the plan had slowed",
                "prediction_within_1_15": f"time_ratio / predicted_time_ratio within {PREDICTION_TOLERANCE}x either way",
            }
            d["errors"] = []
            d.update(self.common)
            self.docs[part] = d
        return self.docs[part]

    def save(self, part: str) -> None:
        d = self.doc(part)
        if part == "gpt":
            d["meets_targets"] = meets_targets(d["budgets"])
        d["elapsed_s"] = round(time.monotonic() - _T0, 1)
        write_json(self.paths[part], d)

    def error(self, part: str, msg: str) -> None:
        log(f"{part}: ERROR {msg}")
        self.doc(part)["errors"].append(msg)
        self.failed = True

    # -- workloads
    def gpt_args(self, steps: int, *extra: str) -> list[str]:
        return [*GPT_ARGS, "--steps", str(steps), *extra]

    def measure(self, label: str, script: str, args: list[str], name: str, timeout: float, steps: int,
                env: dict | None = None, capture: Path | None = None, budget: int | None = None,
                warmup: int | None = None) -> Run:
        """One run_measured with this bench's NVML, sampling and warm-up (``warmup``, default
        ``--warmup``); under ``pyobmem run --swap --budget budget`` when ``capture`` is given."""
        swap = ("--swap", "--budget", str(budget), "-q") if capture is not None else ()
        return run_measured(label, script, args, self.work / f"{name}.json", self.nvml, timeout, steps,
                            self.a.sample_ms / 1e3, env=env, capture=capture, launcher_options=swap,
                            warmup=self.a.warmup if warmup is None else warmup)

    def base_doc(self, run: Run) -> dict:
        """A baseline's row: its summary, overhead (driver peak less the framework's own peak) and losses."""
        s = run.summary()
        s["overhead_bytes"] = overhead_of(run.peak["peak_bytes"], run.framework_reserved())
        s["losses"] = run.losses
        return s

    def gpt_base_doc(self) -> dict | None:
        b = self.gpt_base
        if b is None or not b.losses or not b.peak.get("peak_bytes"):
            return None
        s = self.base_doc(b)
        s["torch_max_memory_reserved_bytes"] = b.framework_reserved()
        return s

    def run_gpt_baseline(self, timeout: float) -> None:
        b = self.measure("gpt baseline", "gpt.py", self.gpt_args(self.a.steps), "gpt.base", timeout, self.a.steps)
        self.gpt_base = b
        if b.step_ms:
            started = b.wall_s - sum(b.step_ms) / 1e3
            self.est.start_s = max(5.0, started)
            self.est.gpt_step_s = (b.steady_ms or GPT_STEP_S * 1e3) / 1e3
        if not b.peak.get("peak_bytes"):
            b.errors.append(f"no driver peak: {b.peak['samples']} NVML samples, none above idle")
        if not b.completed or not b.peak.get("peak_bytes"):
            for part in ("gpt", "oversubscribed"):
                if part in self.a.parts:
                    self.error(part, f"baseline: rc {b.rc}, {len(b.losses)}/{b.steps_expected} steps, peak "
                                     f"{b.peak.get('peak_bytes')}: {'; '.join(b.errors) or b.tail(300)}")
        if "gpt" in self.a.parts:
            self.doc("gpt")["baseline"] = self.gpt_base_doc()
            self.save("gpt")

    def compared(self, run: Run, base: Run | None, prefix: bool = False) -> dict:
        """A run's summary with its time ratio, driver peak and losses against ``base`` (``prefix``:
        against the baseline's first steps, for runs of fewer steps)."""
        r = run.summary()
        r["time_ratio"] = ratio(run.steady_ms, base.steady_ms if base else None)
        if base is not None:
            same, first = compare_losses(run.losses, base.losses[: len(run.losses)] if prefix else base.losses)
            r["loss_identical_to_baseline_prefix" if prefix else "loss_identical"] = same
            r["first_loss_mismatch_step"] = first
            if not same:
                r["losses"] = run.losses
            if base.peak.get("peak_bytes"):
                r["peak_fraction_of_baseline"] = ratio(r["peak_bytes"], base.peak["peak_bytes"])
        if not run.completed:
            r["errors"].append(f"rc {run.rc}: {run.tail(300)}")
            self.failed = True
        return r

    def run_preset(self, label: str, script: str, args: list[str], name: str, timeout: float) -> Run:
        """The workload with swap mode's presets set and no pyobmem."""
        run = self.measure(label, script, args, name, timeout, self.a.steps, env=self.presets)
        backend = (run.doc or {}).get("allocator_backend")  # PyTorch's workloads report it, JAX's do not
        if backend not in (None, "cudaMallocAsync"):
            run.errors.append(f"the preset did not take: PyTorch reports allocator backend {backend!r}")
        return run

    def run_gpt_preset(self, timeout: float) -> None:
        d = self.doc("gpt")
        run = self.run_preset("gpt preset", "gpt.py", self.gpt_args(self.a.steps), "gpt.preset", timeout)
        self.gpt_preset = run
        r = self.compared(run, self.gpt_base)
        r["overhead_bytes"] = overhead_of(run.peak["peak_bytes"], run.framework_reserved())
        d["preset_alone"] = r
        log(f"gpt preset: time x {fmt(r['time_ratio'], '.3f')}, loss identical {fmt(r.get('loss_identical'))}")
        self.save("gpt")

    def gpt_budget(self, fraction: float) -> dict:
        """The budget of the swap run at ``fraction`` of the baseline's peak (``shim_budget``)."""
        return shim_budget(fraction, self.gpt_base.peak["peak_bytes"], swap_overhead(self.gpt_base, self.gpt_preset))

    def run_gpt_trace(self, timeout: float) -> None:
        """GPT medium traced with the per-tensor presets (``pyobmem run --tensor-blocks``), no
        swapping, then ``pyobmem plan --json`` on that capture at every swap run's budget, all
        at once in the background: what a user sees before swapping, and each swap row's
        ``predicted_time_ratio``."""
        d = self.doc("gpt")
        cap = self.capdir / "gpt2_medium_trace.pyobmem"
        if cap.exists():
            cap.unlink()
        run = run_measured("gpt trace", "gpt.py", self.gpt_args(TRACE_STEPS), self.work / "gpt.trace.json", self.nvml,
                           timeout, TRACE_STEPS, self.a.sample_ms / 1e3, capture=cap,
                           launcher_options=("--tensor-blocks", "-q"), warmup=min(self.a.warmup, TRACE_STEPS - 3))
        r = self.compared(run, self.gpt_base, prefix=True)
        r["capture"] = str(cap)
        r["capture_bytes"] = cap.stat().st_size if cap.exists() else None
        d["trace"] = r
        self.save("gpt")
        if not cap.exists() or self.gpt_base_doc() is None:
            self.error("gpt", f"trace: no capture to plan on (rc {run.rc})")
            return
        for f in self.a.fractions:
            self.start_plan(cap, self.gpt_budget(f)["shim_budget_bytes"])
        log(f"gpt trace: `pyobmem plan` started at {len(self.planners)} budgets")

    def start_plan(self, cap: Path, budget_bytes: int) -> None:
        """``pyobmem plan --json`` on ``cap`` at ``budget_bytes``, in the background (plan_prediction reads it)."""
        out = self.work / f"plan_{budget_bytes}.json"
        with open(out, "w") as fo, open(out.with_suffix(".stderr"), "w") as fe:
            p = subprocess.Popen([sys.executable, "-m", "pyobmem", "plan", str(cap), "--budget", str(budget_bytes), "--json"],
                                 cwd=REPO, env=child_env(None), stdin=subprocess.DEVNULL, stdout=fo, stderr=fe)
        self.planners[budget_bytes] = (p, out)

    def plan_prediction(self, budget_bytes: int, base: Run) -> dict:
        """``pyobmem plan --json`` on the trace at ``budget_bytes`` (run_gpt_trace): its
        prediction as a step time (the replay's ratio times the trace's iteration) and as a ratio
        over the baseline's step; ``errors`` as a list."""
        res: dict = {"source": "pyobmem plan --json on the traced unswapped run (gpt trace)", "errors": []}
        if budget_bytes not in self.planners:
            res["errors"].append("no `pyobmem plan` ran for this budget (no trace)")
            return res
        p, out = self.planners[budget_bytes]
        try:
            p.wait(timeout=PLAN_WAIT_S)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            res["errors"].append(f"`pyobmem plan` still running after {PLAN_WAIT_S:.0f} s")
            return res
        try:
            plan = json.loads(out.read_text())
        except (OSError, ValueError) as e:
            err = out.with_suffix(".stderr").read_text(errors="replace").strip()[-300:]
            res["errors"].append(f"`pyobmem plan` rc {p.returncode}, no JSON ({type(e).__name__}): {err}")
            return res
        ratio = plan.get("predicted_time_ratio") or plan.get("time_ratio")
        it_ms = plan["iteration_ns"] / 1e6
        res.update({"rc": p.returncode, "feasible": plan.get("feasible"), "plan_time_ratio": ratio,
                    "model_time_ratio": plan.get("time_ratio"), "iteration_ms": round(it_ms, 3),
                    "predicted_peak_bytes": plan.get("predicted_peak_bytes"), "swapped_bytes": plan.get("swapped_bytes"),
                    "swapped_blocks": plan.get("swapped_blocks"), "replay": plan.get("replay")})
        if ratio and base.steady_ms:
            res["predicted_step_ms"] = round(ratio * it_ms, 3)
            res["predicted_time_ratio"] = res["predicted_step_ms"] / base.steady_ms
        front = plan.get("frontier")
        res["frontier"] = front
        if front and base.steady_ms:  # the copy engines' bound for any plan, as a ratio over the baseline's step
            res["frontier_time_ratio"] = round(front["time_ratio"] * it_ms / base.steady_ms, 6)
        return res

    def swap_row(self, run: Run, base: Run, budget: dict, capture: Path, traced: bool = False) -> dict:
        """One swap run's row: the budget, the run's figures against the unmodified ``base``, the
        capture's swap statistics, blocks and presets, and the planner's prediction."""
        r = dict(budget)
        r.update(self.compared(run, base))
        if "budget_bytes" in r and r.get("peak_bytes") is not None:
            r["under_budget"] = r["peak_bytes"] <= r["budget_bytes"]
            r["over_budget_bytes"] = max(0, r["peak_bytes"] - r["budget_bytes"])
        r["pyobmem_messages"] = daemon_messages(run.stderr)
        a = analyse_capture(capture, r["shim_budget_bytes"])
        r["errors"] += a.pop("errors")
        r.update(a)
        if a.get("swap_on") is False:
            r["errors"].append(f"the shim did not turn swap mode on (its swap notes: {a.get('swap_notes')})")
        if a.get("blocks") is not None and a["blocks"] != "tensor":
            r["errors"].append(f"the launcher recorded blocks {a['blocks']!r}, not 'tensor' (presets {a.get('presets')})")
        # The daemon's replay ratio is of the iteration it learned from the swap run itself, which
        # its swaps before the plan already slowed: as a step time, that ratio times that iteration.
        daemon = r.pop("predicted_time_ratio", None)
        it_ms = (r.get("prediction") or {}).get("iteration_ms")
        if daemon is not None and it_ms and base.steady_ms:
            r["daemon_predicted_step_ms"] = round(daemon * it_ms, 3)
            daemon = r["daemon_predicted_step_ms"] / base.steady_ms
        r["daemon_predicted_time_ratio"] = daemon
        r["daemon_prediction"] = r.pop("prediction", None)
        r["daemon_prediction_within_1_15"] = within(r["time_ratio"], daemon)
        if traced:  # the prediction: `pyobmem plan` on the traced unswapped run, before any swapping
            pp = self.plan_prediction(r["shim_budget_bytes"], base)
            r["errors"] += pp.pop("errors")
            r["plan_prediction"] = pp
            r["predicted_time_ratio"] = pp.get("predicted_time_ratio")
            r["predicted_step_ms"] = pp.get("predicted_step_ms")
            r["frontier_time_ratio"] = pp.get("frontier_time_ratio")
        else:  # no trace of this workload in the bench: the daemon's is the prediction there is
            r["predicted_time_ratio"] = daemon
            r["predicted_step_ms"] = r.get("daemon_predicted_step_ms")
        r["prediction_source"] = "pyobmem plan on the trace" if traced else "the daemon's planner"
        r["prediction_within_1_15"] = within(r["time_ratio"], r["predicted_time_ratio"])
        if self.a.capture_dir:
            r["capture"] = str(capture)
        elif capture.exists():
            capture.unlink()
        if r["errors"]:
            self.failed = True
        return r

    def run_gpt_swap(self, fraction: float, timeout: float) -> None:
        d = self.doc("gpt")
        base = self.gpt_base
        if self.gpt_base_doc() is None:
            d["budgets"].append({"budget_fraction": fraction, "completed": False, "skipped": "no baseline"})
            self.error("gpt", f"swap {fraction}: skipped, no usable baseline (steps and a driver peak)")
            self.save("gpt")
            return
        budget = self.gpt_budget(fraction)
        cap = self.capdir / f"gpt2_medium_swap_{fraction}.pyobmem"
        run = self.measure(f"gpt swap {fraction}", "gpt.py", self.gpt_args(self.a.steps), f"gpt.swap{fraction}",
                           timeout - ANALYSIS_S, self.a.steps, capture=cap, budget=budget["shim_budget_bytes"])
        row = self.swap_row(run, base, budget, cap, traced=True)
        log(f"gpt swap {fraction}: under budget {fmt(row.get('under_budget'))}, time x {fmt(row['time_ratio'], '.3f')} "
            f"(predicted {fmt(row.get('predicted_time_ratio'), '.3f')}), loss identical {fmt(row.get('loss_identical'))}, "
            f"plan adopted {fmt(row.get('plan_adopted'))}")
        d["budgets"].append(row)
        self.save("gpt")

    def run_gpt_saver(self, key: str, flag: str, timeout: float) -> None:
        # The references' own warm-up is at most --ref-steps less 3, as the trace's: a steady-state
        # bench (--steps 70 --warmup 48: after the daemon's trial of the replay's choice) keeps them short.
        run = self.measure(f"gpt {key}", "gpt.py", self.gpt_args(self.a.ref_steps, flag), f"gpt.{key}", timeout,
                           self.a.ref_steps, warmup=min(self.a.warmup, self.a.ref_steps - 3))
        # Information only: the saver may change numerics. The workload draws its tokens for all steps
        # up front from one seeded generator, so its first steps see the baseline's data.
        r = self.compared(run, self.gpt_base, prefix=True)
        r["flag"] = flag
        r["note"] = "the losses are compared with the baseline's first steps for information only"
        self.doc("gpt")[key] = r
        self.save("gpt")

    def run_framework(self, name: str, timeout: float, kind: str) -> None:
        """``kind``: "baseline" (unmodified), "preset" (JAX: the presets, no pyobmem; the peak its
        budget is a fraction of, since plain JAX preallocates) or "swap"."""
        d = self.doc("frameworks")
        script, extra, _, _ = FRAMEWORKS[name]
        args = [*extra, "--steps", str(self.a.steps), "--seed", "0", "--deterministic"]
        entry = d.get(name) or {"workload": shlex.join([f"scripts/workloads/{script}", *args]),
                                "budget_basis": "preset_alone" if name == "jax" else "baseline",
                                "baseline": None, "preset_alone": None, "swap": None}
        d[name] = entry
        base = self.fw_runs.get(f"{name} baseline")
        if kind == "baseline":
            run = self.measure(f"{name} baseline", script, args, f"{name}.base", timeout, self.a.steps)
            self.fw_runs[f"{name} baseline"] = run
            if not run.completed:
                self.error("frameworks", f"{name} baseline: rc {run.rc}: {run.tail(300)}")
            entry["baseline"] = self.base_doc(run)
        elif kind == "preset":
            run = self.run_preset(f"{name} preset", script, args, f"{name}.preset", timeout)
            self.fw_runs[f"{name} preset"] = run
            entry["preset_alone"] = {**self.compared(run, base),
                                     "overhead_bytes": overhead_of(run.peak["peak_bytes"], run.framework_reserved())}
        else:
            basis = self.fw_runs.get(f"{name} preset" if name == "jax" else f"{name} baseline")
            if base is None or not base.losses or basis is None or not basis.peak.get("peak_bytes"):
                entry["swap"] = {"completed": False, "skipped": "no baseline"}
                self.error("frameworks", f"{name} swap: skipped, no usable baseline (steps and a driver peak)")
            else:
                overhead = swap_overhead(basis, self.fw_runs.get(f"{name} preset"))
                budget = shim_budget(self.a.frameworks_fraction, basis.peak["peak_bytes"], overhead, of_allocations=True)
                if overhead is None:
                    budget["note"] = "the framework reports no peak of its own: no overhead subtracted, the shim's " \
                                     "budget is budget_bytes"
                cap = self.capdir / f"{name}_swap.pyobmem"
                run = self.measure(f"{name} swap", script, args, f"{name}.swap", timeout - ANALYSIS_S, self.a.steps,
                                   capture=cap, budget=budget["shim_budget_bytes"])
                entry["swap"] = self.swap_row(run, base, budget, cap)
                log(f"{name} swap: under budget {fmt(entry['swap'].get('under_budget'))}, time x "
                    f"{fmt(entry['swap']['time_ratio'], '.3f')}, loss identical {fmt(entry['swap'].get('loss_identical'))}")
        self.save("frameworks")

    def run_oversubscribed(self, timeout: float) -> None:
        d = self.doc("oversubscribed")
        end = time.monotonic() + timeout
        base = self.gpt_base
        bdoc = self.gpt_base_doc()
        if bdoc is None:
            d["skipped"] = "no GPT medium baseline"
            self.error("oversubscribed", "no GPT medium baseline to size the ballast")
            self.save("oversubscribed")
            return
        peak = base.peak["peak_bytes"]
        overhead = bdoc["overhead_bytes"]
        d["baseline_empty_card"] = {k: bdoc.get(k) for k in ("peak_bytes", "peak_method", "step_ms_median",
                                                            "torch_max_memory_reserved_bytes", "overhead_bytes",
                                                            "completed")}
        target = int(self.a.oversub_free_fraction * peak)
        idle_before, _ = self.nvml.snapshot()
        ballast = subprocess.Popen([sys.executable, str(BALLAST), "--free-bytes", str(target)], cwd=REPO,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            line = _read_line(ballast.stdout, 60.0)
            m = re.match(r"ready free=(\d+) total=(\d+) held=(\d+)", line or "")
            if not m:
                err = ""
                if ballast.poll() is not None:
                    err = (ballast.stderr.read() or "").strip()
                d["ballast"] = {"ready": False, "line": line, "stderr": err[-400:], "rc": ballast.poll()}
                self.error("oversubscribed", f"the ballast did not get ready: {line or err or 'no output within 60 s'}")
                return
            free_cu, total, held = (int(x) for x in m.groups())
            _, free_nvml, _ = self.nvml.memory()
            d["ballast"] = {"ready": True, "pid": ballast.pid, "target_free_bytes": target, "free_bytes_cuMemGetInfo": free_cu,
                            "free_bytes_nvml": free_nvml, "held_bytes": held, "total_bytes": total}
            log(f"oversubscribed: ballast holds {fmt_gib(held)}, free {fmt_gib(free_cu)} "
                f"(target {fmt_gib(target)} = {self.a.oversub_free_fraction} x peak {fmt_gib(peak)})")
            self.save("oversubscribed")

            # Unmodified: expected out of memory (fast), but allowed a full run in case it fits.
            left = end - time.monotonic()
            t_unmod = min(max(left - self.est.gpt_run(self.a.steps) - SWAP_EXTRA_S, self.est.start_s + 40.0), left)
            run = self.measure("oversubscribed unmodified", "gpt.py", self.gpt_args(self.a.steps), "over.unmod", t_unmod,
                               self.a.steps)
            u = run.summary()
            u["fits_without_swap"] = run.completed
            u["out_of_memory"] = is_oom(run.stderr)
            u["last_error_line"] = last_error_line(run.stderr)
            u["time_ratio"] = ratio(run.steady_ms, base.steady_ms)
            d["unmodified"] = u
            d["fits_without_swap"] = run.completed
            self.save("oversubscribed")

            budget = oversubscribed_budget(free_cu, overhead, self.a.oversub_margin_mib * MIB)
            budget["budget_bytes"] = free_cu  # what the run's peak must stay under: the free memory
            cap = self.capdir / "gpt2_medium_oversubscribed.pyobmem"
            left = end - time.monotonic()
            run = self.measure("oversubscribed swap", "gpt.py", self.gpt_args(self.a.steps), "over.swap",
                               max(left - ANALYSIS_S, 1.0), self.a.steps, capture=cap, budget=budget["shim_budget_bytes"])
            r = self.swap_row(run, base, budget, cap)
            r["completed_with_swap"] = run.completed
            r["out_of_memory"] = is_oom(run.stderr)
            r["last_error_line"] = None if run.completed else last_error_line(run.stderr)
            d["swap"] = r
            d["completed_with_swap"] = run.completed
            d["loss_identical"] = r.get("loss_identical")
            d["time_ratio"] = r.get("time_ratio")
            d["peak_bytes"] = r.get("peak_bytes")
            log(f"oversubscribed: fits without swap {fmt(d['fits_without_swap'])}, completed with swap "
                f"{fmt(run.completed)}, loss identical {fmt(r.get('loss_identical'))}, time x {fmt(r.get('time_ratio'), '.3f')}")
        finally:
            stop_ballast(ballast)
            d["ballast_stopped"] = ballast.poll() is not None
            d["idle_after_ballast"] = wait_idle(self.nvml, idle_before)
            self.save("oversubscribed")

    # -- the schedule
    def handler(self, name: str) -> Callable[[float], None]:
        if name == "gpt baseline":
            return self.run_gpt_baseline
        if name == "gpt preset":
            return self.run_gpt_preset
        if name == "gpt trace":
            return self.run_gpt_trace
        if name.startswith("gpt swap "):
            f = float(name.split()[-1])
            return lambda t: self.run_gpt_swap(f, t)
        if name == "gpt save_on_cpu":
            return lambda t: self.run_gpt_saver("save_on_cpu", "--save-on-cpu", t)
        if name == "gpt checkpointing":
            return lambda t: self.run_gpt_saver("checkpointing", "--checkpoint", t)
        if name.split()[0] in FRAMEWORKS:
            fw, kind = name.split()
            return lambda t: self.run_framework(fw, t, kind)
        if name == "oversubscribed":
            return self.run_oversubscribed
        raise ValueError(name)

    def skipped(self, st: Step) -> None:
        """Record a step the time budget left no room for, where its result would have been."""
        self.error(st.part, f"{st.name}: skipped, the time budget ({self.a.time_budget:.0f} s) is spent")
        d = self.doc(st.part)
        if st.name.startswith("gpt swap "):
            d["budgets"].append({"budget_fraction": float(st.name.split()[-1]), "completed": False,
                                 "skipped": "time budget spent"})
        d.setdefault("skipped", []).append(st.name)
        self.save(st.part)

    def run(self) -> int:
        for part in self.a.parts:
            self.save(part)
        steps = schedule(self.a.parts, self.a.steps, self.a.ref_steps, self.a.fractions, self.est)
        deadline = _T0 + self.a.time_budget
        for i, st in enumerate(steps):
            left = deadline - time.monotonic()
            reserve = sum(s.min_s() for s in steps[i + 1:])
            timeout = step_timeout(left, reserve, st.min_s(), st.cap_s())
            if timeout < max(5.0, 0.5 * st.min_s()):  # too short to learn anything from the run
                self.skipped(st)
                continue
            t0 = time.monotonic()
            try:
                self.handler(st.name)(timeout)
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 - one step failing must not stop the others
                self.error(st.part, f"{st.name}: {type(e).__name__}: {e}")
                self.save(st.part)
            log(f"== {st.name}: {time.monotonic() - t0:.1f} s (limit {timeout:.0f} s); elapsed "
                f"{time.monotonic() - _T0:.0f} s of {self.a.time_budget:.0f} s")
        print(table(self.docs.get("gpt"), self.docs.get("frameworks"), self.docs.get("oversubscribed")))
        for part in self.a.parts:
            print(f"wrote {self.paths[part]}")
        return 1 if self.failed else 0


def _read_line(stream, timeout_s: float) -> str | None:
    """One line from a text pipe within ``timeout_s``, or None (read as the launcher reads the daemon's)."""
    from pyobmem.launcher import _read_line as read_line

    return read_line(stream, timeout_s).decode(errors="replace").strip() or None


def stop_ballast(p: subprocess.Popen) -> None:
    """Close its stdin (it frees and exits), then SIGTERM, then SIGKILL: always gone afterwards."""
    try:
        p.stdin.close()
    except (OSError, ValueError):
        pass
    _stop(p, ((None, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)))


def parse_parts(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"unknown part {', '.join(bad) or '(none)'}: choose from {','.join(PARTS)}")
    return [p for p in PARTS if p in parts]


def parse_fractions(text: str) -> list[float]:
    try:
        fs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of fractions: {text!r}") from None
    if not fs or any(not 0 < f <= 1 for f in fs):
        raise argparse.ArgumentTypeError(f"fractions must be in (0, 1]: {text!r}")
    return fs


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Writes swap_gpt2_medium.json, swap_frameworks.json and swap_oversubscribed.json.")
    ap.add_argument("--parts", type=parse_parts, default=list(PARTS),
                    help="comma-separated parts to run: gpt,frameworks,oversubscribed (default all)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"training steps per run (default {STEPS})")
    ap.add_argument("--warmup", type=int, default=WARMUP,
                    help=f"first steps left out of the step time (default {WARMUP}: {STEPS - WARMUP} measured steps)")
    ap.add_argument("--ref-steps", type=int, help="steps of the save_on_cpu and checkpointing runs (default --steps; "
                    "at least 4; their warm-up: --warmup, at most --ref-steps less 3)")
    ap.add_argument("--fractions", type=parse_fractions, default=list(FRACTIONS),
                    help="budget fractions of the GPT baseline's peak (default 0.9,0.75,0.6,0.5,0.4)")
    ap.add_argument("--frameworks-fraction", type=float, default=0.5,
                    help="budget fraction for ResNet-50 and JAX (default 0.5)")
    ap.add_argument("--oversub-free-fraction", type=float, default=0.7,
                    help="the ballast leaves this fraction of the GPT baseline's peak free (default 0.7)")
    ap.add_argument("--oversub-margin-mib", type=int, default=1024,
                    help="oversubscribed: the shim's budget is the free memory less the overhead less this (default 1024)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--capture-dir", type=Path, help="keep the swap runs' captures here (default: a temporary directory)")
    ap.add_argument("--time-budget", type=float, default=530.0,
                    help="seconds for the whole bench; runs are cut or skipped to stay within it (default 530)")
    ap.add_argument("--sample-ms", type=float, default=2.0, help="NVML sampling interval (default 2 ms)")
    ap.add_argument("--device-index", type=int, default=0, help="NVML index of the GPU the workloads use (default 0)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    a.ref_steps = a.steps if a.ref_steps is None else a.ref_steps
    if a.warmup < 0 or a.steps <= a.warmup or a.ref_steps < 4:
        die(f"--steps must be more than --warmup ({a.warmup}), which must not be negative, and --ref-steps at least 4")
    if not gpu_present():
        die(NO_GPU)
    try:
        nvml = Nvml(a.device_index)
    except BenchError as e:
        die(str(e))
    shim = os.environ.get("PYOBMEM_SHIM") or str(REPO / "pyobmem" / "libpyobmem.so")
    if not os.environ.get("PYOBMEM_BENCH_LAUNCHER") and not os.path.isfile(shim):
        die(f"the shim {shim} is not built; run `make native` first")
    if a.capture_dir:
        a.capture_dir.mkdir(parents=True, exist_ok=True)
    est = schedule_estimate(a.parts, a.steps, a.ref_steps, a.fractions)
    log(f"parts {','.join(a.parts)}, {a.steps} steps ({a.steps - a.warmup} measured); the runs need about {est:.0f} s "
        f"at least, time budget {a.time_budget:.0f} s")
    if est > a.time_budget:
        log("warning: the last runs will be skipped; split the parts over calls (--parts gpt, then --parts "
            "frameworks,oversubscribed) or pass fewer --fractions")

    def on_term(signum, frame):
        raise KeyboardInterrupt  # unwinds through the runs' cleanup (process groups, ballast)

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="pyobmem-bench-swap-") as tmp:
        try:
            return Bench(a, nvml, Path(tmp)).run()
        except BenchError as e:
            die(str(e))
        except KeyboardInterrupt:
            log("stopped; the JSON files hold what ran")
            return 130


if __name__ == "__main__":
    sys.exit(main())
