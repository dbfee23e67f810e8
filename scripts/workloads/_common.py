"""Plumbing shared by the workloads: arguments, the per-step line, the JSON result.

Every workload prints one line per step, exactly ``step <i> loss <float.hex(loss)> time_ms <ms>``,
and with ``--json PATH`` writes ``{"losses": [hex, ...], "step_ms": [...], "framework": ...}`` plus
the framework's own memory statistics. Frameworks are imported only inside the workloads, after
the environment that must precede CUDA initialisation has been set.
"""

from __future__ import annotations

import argparse
from typing import NoReturn
import json
import os
import sys
import time

# cuBLAS needs this before the CUDA context exists to be bitwise reproducible.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"

TORCH_STAT_KEYS = (
    "segment.all.allocated",
    "segment.all.freed",
    "allocation.all.allocated",
    "reserved_bytes.all.peak",
    "allocated_bytes.all.peak",
)


def parser(description: str, steps: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the random data (default 0)")
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument("--deterministic", action="store_true", help="bitwise reproducible run to run")
    p.add_argument("--json", metavar="PATH", help="write losses, step times and memory statistics here")
    return p


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr and a non-zero exit, no traceback."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


class Recorder:
    """Collects the per-step losses and times and prints the step lines.

    ``step(i, loss, ms)``: ``ms`` is what the loop timed between its own device syncs
    (``sync_ms``). A step's time (``step_ms``, printed) is the wall time since the previous record,
    per step between the two (a loop may record every N steps): the whole loop iteration, as
    throughput sees it, with the loss read and the syncs between one step's compute and the next.
    In swap mode work of the shim's can land there (session 12: loss.item() waited 40 ms a step
    behind swap-outs, which the window between syncs missed). The first record's is its ``ms``."""

    def __init__(self) -> None:
        self.losses: list[str] = []
        self.step_ms: list[float] = []
        self.sync_ms: list[float] = []
        self._last: tuple[int, float] | None = None  # (step, time) of the previous record

    def step(self, i: int, loss: float, ms: float) -> None:
        t = now()
        h = float(loss).hex()
        wall = ms if self._last is None else (t - self._last[1]) * 1e3 / max(i - self._last[0], 1)
        self._last = (i, t)
        self.losses.append(h)
        self.step_ms.append(round(wall, 4))
        self.sync_ms.append(round(ms, 4))
        print(f"step {i} loss {h} time_ms {wall:.3f}", flush=True)

    def write(self, path: str | None, framework: str, args: argparse.Namespace, **extra) -> None:
        if not path:
            return
        doc = {
            "losses": self.losses,
            "step_ms": self.step_ms,
            "sync_ms": self.sync_ms,
            "framework": framework,
            "argv": sys.argv,
            "seed": args.seed,
            "steps": args.steps,
            "deterministic": bool(args.deterministic),
        }
        doc.update(extra)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)


def now() -> float:
    return time.perf_counter()


# ---------------------------------------------------------------- JAX
def import_jax(deterministic: bool):
    """Set XLA_FLAGS for bitwise reproducible runs when asked (before jax is imported), import jax
    and return (jax, its first GPU device); one error line when jax or a GPU is missing. The
    allocator settings (XLA_PYTHON_CLIENT_*) are left to the environment: the launcher's preset."""
    if deterministic:
        flags = os.environ.get("XLA_FLAGS", "")
        if "--xla_gpu_deterministic_ops" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()
    try:
        import jax
    except ImportError as e:
        fail(f"JAX is not importable ({e})")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        fail("no CUDA GPU available to JAX")
    return jax, gpus[0]


# ---------------------------------------------------------------- PyTorch
def import_torch(deterministic: bool):
    """Set the environment that must precede CUDA init, import torch and check for a GPU."""
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not importable ({e})")
    if not torch.cuda.is_available():
        fail("no CUDA GPU available to PyTorch")
    if deterministic:
        torch.use_deterministic_algorithms(True)
        # Deterministic mode also NaN-fills every uninitialised tensor by default: extra kernels that
        # the results do not depend on, and that would distort launch counts and step times.
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return torch


def torch_memory(torch) -> dict:
    """The allocator's counters and the (address, size) of its segments now. ``segments`` is read
    from a memory snapshot under the native backend only: the cudaMallocAsync backend (set by
    ``PYTORCH_CUDA_ALLOC_CONF`` or ``PYTORCH_ALLOC_CONF``; pyobmem's swap-mode preset) has no
    segments and raises on ``torch.cuda.memory._snapshot()``. The backend is the one PyTorch reports
    (``torch.cuda.get_allocator_backend()``: it parsed both variables), not our reading of them."""
    stats = torch.cuda.memory_stats()
    backend = torch.cuda.get_allocator_backend()
    segments = torch.cuda.memory._snapshot()["segments"] if backend == "native" else None
    return {
        "memory_stats": {k: int(stats.get(k, 0)) for k in TORCH_STAT_KEYS},
        "segments": None if segments is None else [[int(s["address"]), int(s["total_size"])] for s in segments],
        "allocator_backend": backend,
        "device_name": torch.cuda.get_device_name(0),
        "torch_version": torch.__version__,
        "alloc_conf": {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k in os.environ},
    }


def optimizer_step(opt, loss):
    """Gradients reset (to None), ``loss`` backward, one step of ``opt``; returns the loss, detached."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def torch_train(torch, rec: Recorder, steps: int, step_fn) -> None:
    """Run ``step_fn(i) -> loss tensor`` ``steps`` times, timing each between device syncs."""
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = now()
        loss = step_fn(i)
        torch.cuda.synchronize()
        ms = (now() - t0) * 1e3
        rec.step(i, loss.item(), ms)
