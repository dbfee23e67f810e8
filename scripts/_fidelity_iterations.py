"""Part "iterations" of bench_fidelity.py: is the detected iteration the optimizer step?

For each variant of scripts/workloads/trainer.py (200 optimizer steps, ``--deterministic``): an
untraced run with ``--count-ops`` (torch.profiler counts the GPU kernels and copies of optimizer
steps 10-19: the true ops per step), then a traced run under pyobmem's launcher, whose capture goes
through the model's iteration detection. Per variant:

    true_ops_per_step     ops per optimizer step, torch.profiler, untraced run
    detected_ops          ops per iteration of the main regime (must equal it)
    micro_steps           micro-steps per iteration (grad_accum_4: 4)
    iterations            iterations of the main regime
    deviating_iterations  of them, those that do not follow the template
    expected_deviating    the warm-up step plus the steps that log or evaluate (from the arguments)

About 25 s per variant on the H200 (most of it starting Python, torch and the DataLoader workers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import _bench

if str(_bench.REPO) not in sys.path:
    sys.path.insert(0, str(_bench.REPO))  # pyobmem from this tree

from pyobmem.capture import read_capture  # noqa: E402
from pyobmem.model.iterations import detect_iterations  # noqa: E402

STEPS = 200
TIMEOUT_S = 120
VARIANTS = {
    "log_every_10": ["--log-every", "10"],
    "eval_every_25": ["--log-every", "10", "--eval-every", "25"],
    "grad_accum_4": ["--grad-accum", "4", "--log-every", "10"],
    "plain": ["--log-every", "0"],
}


def expected_deviating(steps: int, log_every: int, eval_every: int) -> int:
    """Step 0 (it initialises the optimizer state) and the steps after which trainer.py reads a
    result back: every ``log_every``-th, the last, every ``eval_every``-th."""
    asides = {i for i in range(steps)
              if (log_every and (i + 1) % log_every == 0) or i == steps - 1 or (eval_every and (i + 1) % eval_every == 0)}
    return len(asides | {0})


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=_bench.child_env(), stdout=f, stderr=subprocess.STDOUT, timeout=TIMEOUT_S,
                           cwd=_bench.REPO)
    if p.returncode != 0:
        raise _bench.BenchError(f"{' '.join(cmd[:6])} ... exited {p.returncode} (see {log})")


def run(args) -> dict:
    """{variant: {true_ops_per_step, detected_ops, micro_steps, iterations, deviating_iterations,
    expected_deviating}} (see the module docstring); captures and logs under ``args.work``."""
    out = {}
    for name, extra in VARIANTS.items():
        wargs = ["--steps", str(STEPS), "--deterministic", *extra]
        count_json = args.work / f"trainer_{name}.count.json"
        _run(_bench.workload_command("trainer.py", [*wargs, "--count-ops"], count_json), args.work / f"trainer_{name}.count.log")
        counted = json.loads(count_json.read_text())
        capture = args.work / f"trainer_{name}.pyobmem"
        _run(_bench.workload_command("trainer.py", wargs, args.work / f"trainer_{name}.workload.json", capture=capture),
             args.work / f"trainer_{name}.log")
        it = detect_iterations(read_capture(str(capture)))
        r = it.main_regime
        w = dict(zip(extra[::2], (int(v) for v in extra[1::2])))
        out[name] = {
            "true_ops_per_step": counted.get("ops_per_step"),
            "detected_ops": r.period_ops if r else None,
            "micro_steps": r.micro_steps if r else None,
            "iterations": r.count if r else 0,
            "deviating_iterations": it.n_deviating,
            "expected_deviating": expected_deviating(STEPS, w.get("--log-every", 10), w.get("--eval-every", 0)),
        }
        print(f"{name}: {out[name]}", flush=True)
    return out
