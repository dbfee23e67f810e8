"""bench_fidelity.py part ``gpu_clock``: the GPU clock's iteration time against the workload's own.

GPT-2 medium (scripts/workloads/gpt.py --size medium --steps 12 --deterministic) traced by
``pyobmem run`` with the GPU clock at its default (a timing event every 32 ops for ops this long:
the interval grows only where 32 ops take under 1 ms of GPU time). The workload times
each step between two device syncs (``step_ms``); the model gives the iteration time on the host
clock (launch times) and on the GPU clock (pyobmem.model.gpuclock). Goal: the GPU-clock iteration
within 3% of the measured step.
"""

from __future__ import annotations

import subprocess
import time

import _bench

ARGS = ["--size", "medium", "--steps", "12", "--deterministic"]
TOLERANCE = 0.03


def run(args) -> dict:
    """Trace the workload, read the capture, compare. Raises _bench.BenchError when the run fails
    or the capture has no iteration or no GPU clock."""
    from pyobmem.capture import read_capture
    from pyobmem.model.gpuclock import clock_facts
    from pyobmem.model.iterations import detect_iterations
    from pyobmem.model.saving import execution_clock

    cap_path = args.work / "gpu_clock_gpt_medium.pyobmem"
    json_path = args.work / "gpu_clock_gpt_medium.json"
    cmd = _bench.workload_command("gpt.py", ARGS, json_path, cap_path)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=_bench.REPO, env=_bench.child_env(), capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise _bench.BenchError(f"gpt.py under pyobmem exited {p.returncode}: {(p.stderr or p.stdout)[-400:]}")
    losses, step_ms, _, errors = _bench.read_steps(p.stdout, json_path)
    if errors or not step_ms:
        raise _bench.BenchError("; ".join(errors) or "gpt.py printed no step lines")
    cap = read_capture(str(cap_path))
    it = detect_iterations(cap)
    facts = clock_facts(cap, it)
    if it.main_regime is None:
        raise _bench.BenchError("no iteration found in the capture")
    if facts is None or facts.get("iteration_ns_gpu") is None:
        raise _bench.BenchError("the capture has no GPU clock (no GPU_TIME samples)")
    measured = _bench.steady_median(step_ms)
    gpu_ms = facts["iteration_ns_gpu"] / 1e6
    host_ms = facts["iteration_ns_host"] / 1e6
    main = it.main_rows()
    clock = execution_clock(cap, it, int(main[len(main) // 2]))
    return {
        "workload": "gpt.py " + " ".join(ARGS),
        "step_ms_measured": round(measured, 3),
        "iteration_ms_gpu": round(gpu_ms, 3),
        "iteration_ms_host": round(host_ms, 3),
        "gpu_vs_measured": round(gpu_ms / measured - 1, 4),
        "host_vs_measured": round(host_ms / measured - 1, 4),
        "within_3pct": abs(gpu_ms / measured - 1) <= TOLERANCE,
        "iterations": int(len(main)),
        "ops_per_iteration": int(it.main_regime.period_ops),
        "samples": facts["samples"], "sample_every": facts["every"], "samples_skipped": facts["skipped"],
        "gpu_lag_max_ms": round(facts["lag_max_ns"] / 1e6, 3),
        "gpu_lag_median_ms": round(facts["lag_median_ns"] / 1e6, 3),
        "model_clock": clock.source,
        "dropped_events": int(cap.dropped),
        "wall_s": round(wall, 1),
    }
