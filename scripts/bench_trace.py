#!/usr/bin/env python3
"""Trace real workloads and check what the capture saw against what the framework did.

For each workload (GPT-2 small in PyTorch, a JAX jitted step, a CuPy iteration) run it untraced and
then under ``pyobmem run`` with the same seed and ``--deterministic``, and report: launches and the
fraction attributed to blocks, dropped events, device allocations seen versus the framework's own
count, whether the framework's live segments appear as live capture blocks at the same address and
size, whether the per-step losses are bitwise identical, and the traced/untraced step time ratio.

    python3 scripts/bench_trace.py [--only gpt|jax|cupy] [--out-dir bench/results] [--capture-dir DIR]

Writes bench/results/trace_gpt2_small.json and bench/results/trace_frameworks.json.
The launcher is ``python3 -m pyobmem run -f -o CAPTURE -- ...`` with the repository on PYTHONPATH;
set PYOBMEM_BENCH_LAUNCHER (e.g. "pyobmem-run") to use another command in its place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/_bench.py
from _bench import (REPO, WARMUP, child_env, compare_losses, fmt, read_steps, require_gpu,  # noqa: E402
                    steady_median, workload_command)

PROG = "bench_trace"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    cmd: list[str]
    rc: int
    wall_s: float
    losses: list[str]
    step_ms: list[float]
    doc: dict | None  # the workload's --json result
    stdout: str
    stderr: str
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and bool(self.losses)

    def steady_ms(self, warmup: int = WARMUP) -> float | None:
        return steady_median(self.step_ms, warmup)

    def tail(self, n: int = 600) -> str:
        return (self.stderr.strip() or self.stdout.strip())[-n:]


def off_cpu(pin_cpu: int | None) -> list[str]:
    """``taskset -c`` every CPU this process may use but ``pin_cpu`` (the launcher's prefix when
    the workload is pinned there); [] when not pinned or no other CPU is allowed."""
    if pin_cpu is None or not hasattr(os, "sched_getaffinity"):
        return []
    others = sorted(os.sched_getaffinity(0) - {pin_cpu})
    return ["taskset", "-c", ",".join(map(str, others))] if others else []


def run_workload(script: str, args: list[str], json_path: Path, capture: Path | None = None,
                 env: dict | None = None, timeout: float = 600, launcher_options: tuple[str, ...] = (),
                 pin_cpu: int | None = None) -> Run:
    """Run one workload (traced when ``capture`` is given) and collect its step lines and JSON.

    ``pin_cpu`` pins the workload process to that CPU with taskset, which removes most of the
    run-to-run spread of launch-bound step times on a many-core VM, and the launcher and its
    daemon to the other CPUs (``off_cpu``): the daemon drains the ring while the workload runs,
    and on the workload's CPU it would take time from it that is not the shim's.
    """
    pre = ("taskset", "-c", str(pin_cpu)) if pin_cpu is not None else ()
    cmd = workload_command(script, args, json_path, capture, launcher_options, pre)
    if capture is not None:
        cmd = off_cpu(pin_cpu) + cmd
    if json_path.exists():
        json_path.unlink()
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=REPO, env=child_env(env), capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
        err += f"\ntimed out after {timeout:.0f} s"
    wall = time.monotonic() - t0
    losses, step_ms, doc, errors = read_steps(out, json_path)
    run = Run(cmd, rc, wall, losses, step_ms, doc, out, err, errors)
    if rc != 0:
        run.errors.append(f"exit status {rc}: {run.tail(300)}")
    return run


# ------------------------------------------------------------------------------------ capture
def load_capture(path: Path):
    from pyobmem.capture import read_capture  # imported late: the bench must load without it

    return read_capture(str(path))


def main_pid(cap) -> int | None:
    """The traced process that did the work: the one with the most ops (then the most blocks)."""
    import numpy as np

    for arr in (cap.ops, cap.blocks):
        if len(arr):
            pids, counts = np.unique(arr["pid"], return_counts=True)
            return int(pids[np.argmax(counts)])
    return None


def capture_metrics(cap, pid: int | None) -> dict:
    """Launch, attribution and allocation figures for one process of a capture."""
    import numpy as np
    from pyobmem.abi import AllocKind, Ev, LaunchFlag

    ops = cap.ops if pid is None else cap.ops[cap.ops["pid"] == pid]
    blocks = cap.blocks if pid is None else cap.blocks[cap.blocks["pid"] == pid]
    launch = ops[ops["type"] == int(Ev.LAUNCH)]
    flags = launch["flags"].astype(np.int64)
    n_launch = int(len(launch))
    n_attr = int((launch["n_touched"] > 0).sum())
    kinds = {k.name: int((blocks["kind"] == int(k)).sum()) for k in AllocKind}
    seen = sum(kinds.get(k, 0) for k in ("DRIVER", "ASYNC", "VMM"))
    notes = {}
    if pid is not None and pid in cap.notes:
        notes = {str(k): (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
                 for k, v in cap.notes[pid].items()}
    return {
        "pid": pid,
        "processes": int(len(cap.processes)),
        "capture_complete": bool(getattr(cap, "complete", False)),
        "exit_status": None if getattr(cap, "exit_status", None) is None else int(cap.exit_status),
        "launches": n_launch,
        "launches_attributed_count": n_attr,
        "launches_attributed": (n_attr / n_launch) if n_launch else None,
        "launches_opaque": int(((flags & int(LaunchFlag.OPAQUE)) != 0).sum()),
        "launches_no_layout": int(((flags & int(LaunchFlag.NO_LAYOUT)) != 0).sum()),
        "launches_via_cupti": int(((flags & int(LaunchFlag.VIA_CUPTI)) != 0).sum()),
        "graph_launches": int((ops["type"] == int(Ev.GRAPH_LAUNCH)).sum()),
        "memcpys": int((ops["type"] == int(Ev.MEMCPY)).sum()),
        "memsets": int((ops["type"] == int(Ev.MEMSET)).sum()),
        "dropped_events": int(cap.dropped),
        "allocations_seen": int(seen),
        "allocations_by_kind": kinds,
        "shim_notes": notes,
    }


def match_segments(cap, pid: int | None, segments: list) -> dict:
    """How many framework (address, size) ranges are live capture blocks at that address and size.

    Live: never freed (t_free == -1), or freed only after the process's last op (teardown frees
    that follow the framework's end-of-run snapshot).
    """
    import numpy as np

    blocks = cap.blocks if pid is None else cap.blocks[cap.blocks["pid"] == pid]
    ops = cap.ops if pid is None else cap.ops[cap.ops["pid"] == pid]
    last = int(ops["ts_ns"].max()) if len(ops) else None
    t_free = blocks["t_free"].astype(np.int64)
    live = t_free < 0
    if last is not None:
        live |= t_free > last
    addr = blocks["addr"].astype(np.uint64)
    size = blocks["size"].astype(np.uint64)
    live_set = set(zip(addr[live].tolist(), size[live].tolist()))
    any_set = set(zip(addr.tolist(), size.tolist()))
    segs = [(int(a), int(s)) for a, s in segments]
    return {
        "matched": sum(1 for s in segs if s in live_set),
        "of": len(segs),
        "matched_any_time": sum(1 for s in segs if s in any_set),
        "definition": "framework (address, size) found among capture blocks of the traced process that "
                      "are live at its end (never freed, or freed after its last op)",
    }


# ------------------------------------------------------------------------------------ one workload
def bench_one(name: str, script: str, args: list[str], work: Path, capture_dir: Path | None,
              env: dict | None, timeout: float, expected_fn, segments_fn, notes: list[str]) -> dict:
    res: dict = {"workload": " ".join([f"scripts/workloads/{script}", *args]), "errors": []}
    log(f"{name}: untraced run")
    base = run_workload(script, args, work / f"{name}.untraced.json", env=env, timeout=timeout)
    log(f"{name}: untraced done in {base.wall_s:.1f} s, rc {base.rc}, {len(base.losses)} steps")
    cap_path = (capture_dir or work) / f"{name}.pyobmem"
    traced_json = work / f"{name}.traced.json"
    log(f"{name}: traced run -> {cap_path}")
    traced = run_workload(script, args, traced_json, capture=cap_path, env=env, timeout=timeout)
    log(f"{name}: traced done in {traced.wall_s:.1f} s, rc {traced.rc}, {len(traced.losses)} steps")
    res["errors"] += [f"untraced: {e}" for e in base.errors] + [f"traced: {e}" for e in traced.errors]

    identical, first = compare_losses(base.losses, traced.losses)
    mu, mt = base.steady_ms(), traced.steady_ms()
    res.update({
        "steps": len(traced.losses),
        "loss_identical": identical,
        "first_loss_mismatch_step": first,
        "losses_untraced": base.losses,
        "losses_traced": traced.losses,
        "step_ms_untraced_median": mu,
        "step_ms_traced_median": mt,
        "time_ratio": (mt / mu) if (mu and mt) else None,
        "warmup_steps_skipped": WARMUP,
        "untraced_rc": base.rc,
        "traced_rc": traced.rc,
        "untraced_wall_s": round(base.wall_s, 2),
        "traced_wall_s": round(traced.wall_s, 2),
        "capture": str(cap_path) if capture_dir else None,
        "capture_bytes": cap_path.stat().st_size if cap_path.exists() else None,
        "allocations_expected": expected_fn(traced.doc) if traced.doc else None,
        "allocations_matched": None,
    })
    if traced.doc and "device_name" in traced.doc:
        res["device"] = traced.doc["device_name"]
    if cap_path.exists():
        try:
            cap = load_capture(cap_path)
            pid = main_pid(cap)
            res.update(capture_metrics(cap, pid))
            segs = segments_fn(traced.doc) if traced.doc else None
            if segs is not None:
                res["allocations_matched"] = match_segments(cap, pid, segs)
        except Exception as e:  # noqa: BLE001 - report any reader failure in the results
            res["errors"].append(f"reading capture: {type(e).__name__}: {e}")
    else:
        res["errors"].append(f"no capture at {cap_path}")
    if capture_dir:
        for src, suffix in ((traced_json, ".json"),):
            if src.exists():
                shutil.copy(src, capture_dir / f"{name}{suffix}")
        (capture_dir / f"{name}.stdout.txt").write_text(traced.stdout + ("\n--- stderr ---\n" + traced.stderr if traced.stderr else ""))
    res["notes"] = notes
    for e in res["errors"]:
        log(f"{name}: ERROR {e}")
    return res


def torch_expected(doc: dict):
    return doc.get("memory_stats", {}).get("segment.all.allocated")


def torch_segments(doc: dict):
    return doc.get("segments")


def jax_expected(doc: dict):
    return (doc.get("memory_stats") or {}).get("num_allocs")


def cupy_expected(doc: dict):
    return doc.get("device_allocations")


def cupy_segments(doc: dict):
    return doc.get("allocations")


# ------------------------------------------------------------------------------------ table
def table(results: dict) -> str:
    head = f"{'workload':<12} {'steps':>5} {'launches':>9} {'attrib':>7} {'dropped':>7} " \
           f"{'allocs seen/exp':>15} {'matched':>9} {'loss same':>9} {'time x':>7}"
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        m = r.get("allocations_matched") or {}
        matched = f"{m['matched']}/{m['of']}" if m else "-"
        allocs = f"{fmt(r.get('allocations_seen'))}/{fmt(r.get('allocations_expected'))}"
        att = r.get("launches_attributed")
        lines.append(f"{name:<12} {fmt(r.get('steps')):>5} {fmt(r.get('launches')):>9} "
                     f"{(f'{100 * att:.1f}%' if att is not None else '-'):>7} {fmt(r.get('dropped_events')):>7} "
                     f"{allocs:>15} {matched:>9} {fmt(r.get('loss_identical')):>9} {fmt(r.get('time_ratio'), '.3f'):>7}")
    return "\n".join(lines)


def write_json(path: Path, doc: dict, merge: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if merge and path.exists():
        try:
            old = json.loads(path.read_text())
            old.update(doc)
            doc = old
        except ValueError:
            pass
    path.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("gpt", "jax", "cupy"), action="append",
                    help="run only this workload (repeatable; default all)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--capture-dir", type=Path, help="keep the captures (and the workloads' JSON) here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpt-size", choices=("tiny", "small", "medium"), default="small")
    ap.add_argument("--gpt-steps", type=int, default=20)
    ap.add_argument("--jax-steps", type=int, default=20)
    ap.add_argument("--cupy-steps", type=int, default=30)
    ap.add_argument("--jax-allocator", default="platform",
                    help="XLA_PYTHON_CLIENT_ALLOCATOR for both JAX runs ('' leaves the environment alone)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per workload run")
    a = ap.parse_args(argv)
    only = set(a.only or ("gpt", "jax", "cupy"))
    require_gpu()
    if a.capture_dir:
        a.capture_dir.mkdir(parents=True, exist_ok=True)
    seed = ["--seed", str(a.seed), "--deterministic"]
    shown: dict = {}
    failed = False
    with tempfile.TemporaryDirectory(prefix="pyobmem-bench-") as tmp:
        work = Path(tmp)
        if "gpt" in only:
            name = f"gpt2_{a.gpt_size}"
            r = bench_one(name, "gpt.py", ["--size", a.gpt_size, "--steps", str(a.gpt_steps), *seed], work,
                          a.capture_dir, None, a.timeout, torch_expected, torch_segments,
                          ["allocations_expected is PyTorch's segment.all.allocated (cudaMalloc calls of the "
                           "caching allocator); allocations_seen also counts driver allocations made outside it"])
            write_json(a.out_dir / f"trace_{name}.json", r)
            shown[name] = r
            failed |= bool(r["errors"])
        fw: dict = {}
        if "jax" in only:
            env = {"XLA_PYTHON_CLIENT_ALLOCATOR": a.jax_allocator} if a.jax_allocator else None
            fw["jax"] = bench_one("jax", "jax_step.py", ["--steps", str(a.jax_steps), *seed], work, a.capture_dir,
                                  env, a.timeout, jax_expected, lambda d: None,
                                  [f"both runs with XLA_PYTHON_CLIENT_ALLOCATOR={a.jax_allocator or '(unset)'}",
                                   "allocations_expected is memory_stats()['num_allocs'] of the JAX device when "
                                   "JAX reports it, else null (the platform allocator may report no stats); "
                                   "allocations_matched is null: JAX exposes no buffer addresses to compare"])
        if "cupy" in only:
            fw["cupy"] = bench_one("cupy", "cupy_iter.py", ["--steps", str(a.cupy_steps), *seed], work,
                                   a.capture_dir, None, a.timeout, cupy_expected, cupy_segments,
                                   ["allocations_expected counts cudaMalloc calls made by CuPy's default "
                                    "MemoryPool (counting allocator); cuBLAS workspaces etc. are outside it",
                                    "allocations_matched compares the pool's (pointer, size) list"])
        if fw:
            write_json(a.out_dir / "trace_frameworks.json", fw, merge=True)
            shown.update(fw)
            failed |= any(r["errors"] for r in fw.values())
    print()
    print(table(shown))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
