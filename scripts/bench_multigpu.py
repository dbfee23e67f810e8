#!/usr/bin/env python3
"""Multi-GPU: DDP GPT under torchrun, untraced, traced by pyobmem and in swap mode, one rank per GPU.

Three runs of ``torchrun --standalone --nproc-per-node N scripts/workloads/gpt_ddp.py --size small
--steps 20 --deterministic --seed 0`` (N: ``--nproc``, default the visible GPUs):

1. untraced (the baseline);
2. ``pyobmem run -o multigpu.pyobmem -- torchrun ...``: the merged capture and one capture per rank
   (``multigpu.rank<R>.pyobmem``), the per-rank figures from pyobmem.ranks;
3. ``pyobmem run --swap --budget B -- torchrun ...`` with B = ``--budget-fraction`` (0.6) of the
   largest per-rank peak of live bytes in run 2 (every rank's shim keeps its own process under B).

``bench/results/multigpu.json`` (``--out``) gets, at the top: ``nproc``, ``ranks_traced`` (per-rank
captures written by run 2), ``launches_attributed_fraction`` (all ranks' launches attributed to at
least one block), ``loss_identical`` (every rank's per-step losses, float.hex, equal bit for bit in
runs 2 and 3 to run 1), ``time_ratio`` (run 2 over run 1: the slowest rank's median step time, the
first 3 steps left out), ``peak_bytes_per_rank`` (run 2's peak live device bytes of each rank, by
rank); then per-run and per-rank details: NCCL calls and the blocks they pinned, swap-outs and
swap-ins, the driver-measured peak of each GPU (NVML: device used memory less its idle value, the
rank's GPU being ``LOCAL_RANK``), losses, step times, errors.

NCCL refuses two ranks on one GPU: with more ranks than GPUs use ``--backend gloo`` (DDP then
reduces through host memory; that run says nothing about NCCL). With ``--nproc 1`` it runs on one
GPU (NCCL with one rank). Every run has a timeout (``--timeout``, 900 s); a run that overruns is
ended with its whole process tree, and its result says so.

    python3 scripts/bench_multigpu.py [--nproc N] [--size small] [--steps 20] [--capture-dir DIR]

The launcher is ``python3 -m pyobmem run`` with the repository on PYTHONPATH (PYOBMEM_BENCH_LAUNCHER
replaces it, as in bench_trace.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/_bench.py
from _bench import (NO_GPU, REPO, WORKLOADS, Nvml, child_env, compare_losses, die, launcher,  # noqa: E402
                    steady_median, visible_gpus)

WORKLOAD = WORKLOADS / "gpt_ddp.py"
KILL_GRACE_S = 10.0
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets its own


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ machine
def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torchrun() -> list[str]:
    """torchrun of this Python (the console script next to it, else ``python -m torch.distributed.run``)."""
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


# ------------------------------------------------------------------------------------ bounded runs
def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc, children before grandchildren)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out += kids
        todo += kids
    return out


def end_tree(pid: int, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM ``pid`` and every process below it (each by its id), then SIGKILL what is left."""
    tree = [pid, *descendants(pid)]
    for p in tree:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.1)
    for p in [pid, *descendants(pid), *tree]:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Bounded:
    rc: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None) -> Bounded:
    """Run ``cmd`` in its own session; past ``timeout`` its whole process tree is ended (rc 124)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return Bounded(p.returncode, out, err, time.monotonic() - t0, False)
    except subprocess.TimeoutExpired:
        end_tree(p.pid)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        return Bounded(124, out, err + f"\ntimed out after {timeout:.0f} s", time.monotonic() - t0, True)


# ------------------------------------------------------------------------------------ NVML peaks
class GpuPeaks:
    """Samples each GPU's used memory (NVML, through scripts/_bench.py's Nvml) from a thread while
    a run lasts; ``result()`` gives each GPU's peak less its idle value before the run, or the error."""

    def __init__(self, n: int, interval_s: float = 0.01):
        self.n, self.interval_s = n, interval_s
        self.error = None
        self.idle, self.peak = [0] * n, [0] * n
        try:
            self.devs = [Nvml(i) for i in range(n)]
            self.idle = [d.memory()[2] for d in self.devs]
        except Exception as e:  # noqa: BLE001 - NVML is optional: the figures are then missing
            self.devs, self.error = [], f"{type(e).__name__}: {e}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for i, d in enumerate(self.devs):
                    self.peak[i] = max(self.peak[i], d.memory()[2])
            except Exception as e:  # noqa: BLE001
                self.error = f"{type(e).__name__}: {e}"
                return
            self._stop.wait(self.interval_s)

    def __enter__(self):
        if self.devs:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def result(self) -> dict:
        if not self.devs:
            return {"peak_device_bytes": None, "nvml_error": self.error}
        return {"peak_device_bytes": [max(0, p - i) for p, i in zip(self.peak, self.idle)], "nvml_error": self.error,
                "method": "NVML device used memory, peak during the run less its value before it, by NVML index "
                          "(the rank's LOCAL_RANK when CUDA_VISIBLE_DEVICES is unset)"}


# ------------------------------------------------------------------------------------ one run
@dataclass
class Run:
    name: str
    cmd: list[str]
    proc: Bounded
    ranks: dict = field(default_factory=dict)  # rank -> the workload's JSON
    gpus: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)

    def losses(self) -> dict:
        return {r: doc.get("losses", []) for r, doc in sorted(self.ranks.items())}

    def step_ms(self) -> float | None:
        """The slowest rank's median step time (warm-up steps left out)."""
        meds = [steady_median(doc.get("step_ms", [])) for doc in self.ranks.values()]
        meds = [m for m in meds if m is not None]
        return max(meds) if meds else None


def run_job(name: str, work: Path, nproc: int, wargs: list[str], timeout: float, pre: list[str] = (),
            gpus: int = 0) -> Run:
    out = work / f"{name}.json"
    cmd = [*pre, *torchrun(), "--standalone", "--nproc-per-node", str(nproc), str(WORKLOAD), *wargs,
           "--json", str(out)]
    log(f"{name}: {shlex.join(cmd)}")
    with GpuPeaks(min(nproc, gpus)) as peaks:
        proc = run_bounded(cmd, timeout, env=child_env(drop=TORCHRUN_VARS), cwd=REPO)
    run = Run(name, cmd, proc, gpus=peaks.result())
    for r in range(nproc):
        path = work / f"{name}.rank{r}.json"
        try:
            run.ranks[r] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            run.errors.append(f"rank {r}: no workload result ({type(e).__name__})")
    if proc.rc != 0:
        run.errors.append(f"exit status {proc.rc}: {(proc.stderr.strip() or proc.stdout.strip())[-600:]}")
    log(f"{name}: rc {proc.rc} in {proc.wall_s:.1f} s, {len(run.ranks)} ranks reported")
    return run


def compare(base: Run, other: Run) -> tuple[bool, dict]:
    """(every rank's losses bitwise equal, per rank: None or the first differing step)."""
    first = {}
    for r, a in base.losses().items():
        first[r] = compare_losses(a, other.losses().get(r, []))[1]
    ok = bool(first) and all(v is None for v in first.values()) and set(other.ranks) == set(base.ranks)
    return ok, first


# ------------------------------------------------------------------------------------ captures
def capture_figures(path: Path) -> dict:
    """Per-rank figures of a merged capture (pyobmem.ranks) plus the swap and NCCL details."""
    import numpy as np

    from pyobmem import abi
    from pyobmem.capture import read_capture
    from pyobmem.ranks import rank_figures, rank_path, ranks, subset

    cap = read_capture(str(path))
    found = [r for r in ranks(cap) if r.active]
    rows = []
    for r in found:
        view = subset(cap, r.pids)
        row = rank_figures(view, r, file=str(path))
        sw = view.swaps
        ins = sw[sw["direction"] == 1]
        row["swap"] = {
            "out_count": int(np.count_nonzero(sw["direction"] == 0)),
            "out_bytes": int(sw["bytes"][sw["direction"] == 0].sum()),
            "in_by_cause": {c.name.lower(): int(np.count_nonzero(ins["cause"] == int(c))) for c in abi.SwapInCause},
            "plans_adopted": int(np.count_nonzero(~view.plans["dropped"])),
            "plans_dropped": int(np.count_nonzero(view.plans["dropped"])),
        }
        n = view.nccl
        named = np.unique(np.r_[n["send_block"], n["recv_block"]])
        named = named[named >= 0]
        first = {}
        for b in named.tolist():
            t = n["ts_ns"][(n["send_block"] == b) | (n["recv_block"] == b)]
            first[b] = int(t.min())
        # a block swapped out after an NCCL call first named it: what swap mode must never do
        late = [int(s["block"]) for s in sw[sw["direction"] == 0] if int(s["block"]) in first
                and int(s["ts_ns"]) > first[int(s["block"])]]
        row["nccl_by_call"] = {c.name.lower(): int(np.count_nonzero(n["call"] == int(c))) for c in abi.NcclCall
                               if np.any(n["call"] == int(c))}
        row["nccl_blocks_swapped_after_named"] = len(set(late))
        row["rank_capture"] = rank_path(str(path), r.rank) if Path(rank_path(str(path), r.rank)).exists() else None
        rows.append(row)
    launches = cap.ops[cap.ops["type"] == abi.Ev.LAUNCH]
    ranked = np.isin(launches["pid"], [p for r in found for p in r.pids])
    launches = launches[ranked]
    return {
        "capture": str(path), "complete": cap.complete, "dropped": int(cap.dropped), "ranks": rows,
        "launches": int(len(launches)),
        "launches_attributed_fraction": round(float(np.count_nonzero(launches["n_touched"] > 0)) / len(launches), 6)
        if len(launches) else None,
    }


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, help="ranks (default: the visible GPUs)")
    ap.add_argument("--size", choices=("tiny", "small", "medium"), default="small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--budget-fraction", type=float, default=0.6, help="swap run's budget: this x the per-rank peak")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "multigpu.json")
    ap.add_argument("--capture-dir", type=Path, help="keep the captures here (default: a temporary directory)")
    ap.add_argument("--skip-swap", action="store_true", help="only the untraced and the traced runs")
    a = ap.parse_args(argv)
    gpus = visible_gpus()
    if gpus == 0:
        die(NO_GPU)
    nproc = gpus if a.nproc is None else a.nproc
    if nproc < 1:
        die("--nproc must be at least 1")
    if a.backend == "nccl" and nproc > gpus:
        die(f"{nproc} ranks on {gpus} GPU(s): NCCL refuses two ranks on one GPU; use --backend gloo or fewer ranks")
    if not torch_available():
        die("PyTorch is not importable here (torchrun and the workload need it)")
    wargs = ["--size", a.size, "--steps", str(a.steps), "--batch", str(a.batch), "--seed", str(a.seed),
             "--deterministic", "--backend", a.backend]
    doc: dict = {"nproc": nproc, "gpus_visible": gpus, "backend": a.backend, "workload": f"gpt_ddp.py {shlex.join(wargs)}",
                 "swap": None, "errors": []}
    with tempfile.TemporaryDirectory(prefix="pyobmem-multigpu-") as tmp:
        work = Path(tmp)
        caps = a.capture_dir or work
        caps.mkdir(parents=True, exist_ok=True)
        base = run_job("untraced", work, nproc, wargs, a.timeout, gpus=gpus)
        traced_cap = caps / "multigpu.pyobmem"
        traced = run_job("traced", work, nproc, wargs, a.timeout, pre=launcher(traced_cap), gpus=gpus)
        runs = [base, traced]
        figures = capture_figures(traced_cap) if traced_cap.exists() else None
        if figures is None:
            doc["errors"].append(f"no capture at {traced_cap}")
        swap = None
        if not a.skip_swap and figures and figures["ranks"]:
            per_rank_peak = max(r["peak_live_bytes"] for r in figures["ranks"])
            budget = int(a.budget_fraction * per_rank_peak)
            swap_cap = caps / "multigpu_swap.pyobmem"
            swap = run_job("swap", work, nproc, wargs, a.timeout,
                           pre=launcher(swap_cap, ("--swap", "--budget", str(budget))), gpus=gpus)
            runs.append(swap)
            swap_doc = {"budget_bytes": budget, "budget_fraction": a.budget_fraction,
                        "of_per_rank_peak_bytes": per_rank_peak}
            same, first = compare(base, swap)
            swap_doc.update(loss_identical=same, first_loss_mismatch_step=first,
                            time_ratio=(swap.step_ms() / base.step_ms()) if base.step_ms() and swap.step_ms() else None,
                            gpus=swap.gpus, errors=swap.errors)
            if swap_cap.exists():
                swap_doc["capture"] = capture_figures(swap_cap)
            doc["swap"] = swap_doc
        same, first = compare(base, traced)
        doc.update({
            "ranks_traced": sum(1 for r in (figures or {}).get("ranks", []) if r.get("rank_capture")),
            "launches_attributed_fraction": (figures or {}).get("launches_attributed_fraction"),
            "loss_identical": same and (swap is None or doc["swap"]["loss_identical"]),
            "loss_identical_traced": same,
            "first_loss_mismatch_step_traced": first,
            "time_ratio": (traced.step_ms() / base.step_ms()) if base.step_ms() and traced.step_ms() else None,
            "peak_bytes_per_rank": [r["peak_live_bytes"] for r in (figures or {}).get("ranks", [])],
            "peak_bytes_definition": "peak of the sum of the rank's live device allocations (cuMemAlloc and "
                                     "VMM blocks) in the traced capture",
            "traced": figures,
            "step_ms": {run.name: run.step_ms() for run in runs},
            "gpus": {run.name: run.gpus for run in runs},
            "losses": {run.name: {str(r): v for r, v in run.losses().items()} for run in runs},
            "device": next((d.get("device_name") for d in base.ranks.values()), None),
            "torch_version": next((d.get("torch_version") for d in base.ranks.values()), None),
        })
        for run in runs:
            doc["errors"] += [f"{run.name}: {e}" for e in run.errors]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    log(f"wrote {a.out}: nproc {nproc}, ranks traced {doc['ranks_traced']}, attributed "
        f"{doc['launches_attributed_fraction']}, losses identical {doc['loss_identical']}, time ratio "
        f"{doc['time_ratio']}")
    for e in doc["errors"]:
        log(f"ERROR {e}")
    return 0 if not doc["errors"] and doc["loss_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
