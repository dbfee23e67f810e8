#!/usr/bin/env python3
"""The cost of the shim's stream-ordered allocation path (swap mode serving every large tensor).

Two parts, one JSON file (``--out``, default bench/results/alloc_path.json):

- ``gpt``: GPT medium (scripts/workloads/gpt.py --size medium --batch 8 --seq 1024 --deterministic
  --seed 0, ``--steps`` 20) with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync and no pyobmem (the
  reference), then under ``pyobmem run --swap --budget <95% of the card>`` (far above the job's
  peak: nothing is swapped; the launcher's per-tensor preset gives the same backend). Reported: the
  step-time ratio (median of the steps after the first 3; goal <= 1.02), the losses compared bit
  for bit (they must be identical), the NVML peak of each run (bench_swap.py's sampler), the swap
  events of the capture (none expected) and how many of its blocks the shim served.
- ``loop``: tests/gpu/progs/alloc_loop.c (built here with gcc; CUDA headers, libcuda by dlopen):
  microseconds per cuMemAllocAsync + cuMemFreeAsync pair of ``--loop-bytes`` (64 MiB) on one
  stream in the steady state, without pyobmem, traced, and under swap mode (goal: swap mode adds
  under 2 us per pair over no pyobmem). Each is the median of ``--loop-repeats`` (5) runs.

Runs unattended in about two minutes on the H200:

    python3 scripts/bench_alloc_path.py [--parts gpt,loop] [--steps 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import NO_GPU, REPO, BenchError, Nvml, child_env, compare_losses, die, fmt, gpu_present, launcher  # noqa: E402

GPT_ARGS = ["--size", "medium", "--batch", "8", "--seq", "1024", "--deterministic", "--seed", "0"]
TORCH_ASYNC = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
SWAP_BUDGET = "95%"  # of the card: far above GPT medium's 35 GiB, so the shim serves and never swaps
LOOP_SRC = REPO / "tests" / "gpu" / "progs" / "alloc_loop.c"
GOAL_RATIO, GOAL_ADDED_US = 1.02, 2.0
MIB = 1 << 20
STEADY_FROM = 3


def log(msg: str) -> None:
    print(f"[bench_alloc_path] {msg}", file=sys.stderr, flush=True)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def steady(step_ms: list[float]) -> float | None:
    xs = step_ms[STEADY_FROM:] if len(step_ms) > STEADY_FROM else step_ms
    return statistics.median(xs) if xs else None


def shim_blocks(capture: Path) -> dict:
    """Blocks of the capture by kind, the ASYNC ones the shim could serve (>= min_swap_bytes), and
    the swap events (docs/swap.md: with a budget above the peak there are none)."""
    sys.path.insert(0, str(REPO))
    from pyobmem.abi import AllocKind
    from pyobmem.capture import read_capture

    cap = read_capture(str(capture))
    kinds = cap.blocks["kind"]
    min_swap = int((cap.meta.get("swap") or {}).get("min_swap_bytes") or 0)
    asyncs = kinds == int(AllocKind.ASYNC)
    return {
        "async_blocks": int(asyncs.sum()),
        "async_blocks_at_least_min_swap": int((asyncs & (cap.blocks["size"] >= min_swap)).sum()),
        "min_swap_bytes": min_swap,
        "swap_events": int(len(cap.swaps)),
        "presets": cap.meta.get("presets", {}),
        "notes": sorted({f"{k}={v}" for n in cap.notes.values() for k, v in n.items() if str(k).startswith("swap")}),
    }


def part_gpt(steps: int, work: Path, timeout: float) -> dict:
    from bench_swap import run_measured  # its NVML sampler and run bookkeeping

    nvml = Nvml()
    args = GPT_ARGS + ["--steps", str(steps)]
    ref = run_measured("reference", "gpt.py", args, work / "ref.json", nvml, timeout, steps, 0.002, env=TORCH_ASYNC)
    cap = work / "swap.pyobmem"
    swap = run_measured("swap", "gpt.py", args, work / "swap.json", nvml, timeout, steps, 0.002, env=TORCH_ASYNC,
                        capture=cap, launcher_options=("--swap", "--budget", SWAP_BUDGET))
    same, first = compare_losses(ref.losses, swap.losses)
    r_ms, s_ms = steady(ref.step_ms), steady(swap.step_ms)
    ratio = s_ms / r_ms if r_ms and s_ms else None
    doc = {
        "workload": "gpt.py " + " ".join(args),
        "reference": {**ref.summary(), "env": TORCH_ASYNC, "step_ms_steady": r_ms},
        "swap": {**swap.summary(), "budget": SWAP_BUDGET, "step_ms_steady": s_ms,
                 **(shim_blocks(cap) if cap.exists() else {"capture": "missing"})},
        "time_ratio": ratio,
        "time_ratio_goal": GOAL_RATIO,
        "time_ratio_met": ratio is not None and ratio <= GOAL_RATIO,
        "loss_identical": same,
        "first_loss_difference": first,
        "steady_from_step": STEADY_FROM,
    }
    log(f"gpt: steady step {fmt(r_ms, '.1f')} ms -> {fmt(s_ms, '.1f')} ms (ratio {fmt(ratio, '.4f')}), "
        f"losses identical: {fmt(same)}")
    return doc


def loop_run(cmd: list[str], env: dict, timeout: float) -> dict:
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    kv = dict(line.partition("=")[::2] for line in p.stdout.splitlines() if "=" in line)
    if p.returncode != 0 or "us_per_pair" not in kv:
        raise RuntimeError(f"{' '.join(cmd)}: rc {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
    return {"us_per_pair": float(kv["us_per_pair"]), "pairs": int(kv["pairs"])}


def part_loop(nbytes: int, pairs: int, repeats: int, work: Path, timeout: float) -> dict:
    exe = work / "alloc_loop"
    cc = os.environ.get("CC", "gcc")
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    subprocess.run([cc, "-O2", "-std=gnu11", f"-I{inc}", "-o", str(exe), str(LOOP_SRC), "-ldl"], check=True)
    prog = [str(exe), str(nbytes), str(pairs)]
    modes = {
        "no_pyobmem": prog,
        "trace": launcher(work / "loop_trace.pyobmem", ("-q",)) + prog,
        "swap": launcher(work / "loop_swap.pyobmem", ("-q", "--swap", "--budget", SWAP_BUDGET)) + prog,
    }
    out: dict = {"bytes": nbytes, "pairs": pairs, "repeats": repeats, "source": str(LOOP_SRC.relative_to(REPO))}
    for name, cmd in modes.items():
        runs = [loop_run(cmd, child_env(), timeout)["us_per_pair"] for _ in range(repeats)]
        out[name] = {"us_per_pair_median": statistics.median(runs), "us_per_pair_runs": runs}
        log(f"loop {name}: {statistics.median(runs):.3f} us per pair")
    added = out["swap"]["us_per_pair_median"] - out["no_pyobmem"]["us_per_pair_median"]
    out.update(swap_added_us=added, trace_added_us=out["trace"]["us_per_pair_median"] - out["no_pyobmem"]["us_per_pair_median"],
               added_goal_us=GOAL_ADDED_US, added_goal_met=added < GOAL_ADDED_US)
    cap = work / "loop_swap.pyobmem"
    if cap.exists():
        out["swap_capture"] = shim_blocks(cap)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="gpt,loop", help="comma-separated: gpt, loop (default both)")
    p.add_argument("--steps", type=int, default=20, help="GPT steps per run (default 20)")
    p.add_argument("--loop-bytes", type=int, default=64 * MIB, help="bytes per allocation in the loop (64 MiB)")
    p.add_argument("--loop-pairs", type=int, default=20000, help="timed allocation+free pairs per loop run")
    p.add_argument("--loop-repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per GPT run (default 150)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "alloc_path.json")
    a = p.parse_args(argv)
    parts = [x for x in a.parts.split(",") if x]
    if any(x not in ("gpt", "loop") for x in parts):
        die(f"--parts: unknown part in {a.parts!r} (gpt, loop)")
    if not gpu_present():
        die(NO_GPU)
    doc = {"bench": "alloc_path", "git_commit": git_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "host": os.uname().nodename}
    work = Path(tempfile.mkdtemp(prefix="bench_alloc_path-"))
    try:
        if "gpt" in parts:
            doc["gpt"] = part_gpt(a.steps, work, a.timeout)
        if "loop" in parts:
            doc["loop"] = part_loop(a.loop_bytes, a.loop_pairs, a.loop_repeats, work, 60.0)
    except (BenchError, RuntimeError, subprocess.SubprocessError, OSError) as e:
        doc["error"] = str(e)
        log(f"error: {e}")
    finally:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {a.out}")
    return 1 if "error" in doc else 0


if __name__ == "__main__":
    sys.exit(main())
