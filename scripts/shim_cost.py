#!/usr/bin/env python3
"""Instructions the shim adds per op, per op kind, counted with callgrind on the fake libcuda.

Builds tests/fake_cuda/fake_cuda.c (as libcuda.so.1) and tests/fake_cuda/cost_driver.c, then runs
the driver under ``valgrind --tool=callgrind`` for each op kind at N1 and N2 calls, with the shim
preloaded (tracing from its hooks, CUPTI off, a ring that never fills) and without it. The shim's
cost per call is ((shim N2 - shim N1) - (bare N2 - bare N1)) / (N2 - N1) instructions: start-up and
the fake driver's own work cancel. It also lists the shim functions that take the most
instructions per call (inclusive, from the N2 run), so a cost can be traced to a part.

Needs gcc, valgrind and the CUDA headers; no GPU. Instruction counts are exact for one build
(compiler, glibc) and say nothing about time on their own: a syscall counts as one instruction.

    python3 scripts/shim_cost.py [--ops launch,memcpy_async] [--live 64] [--shim LIB] [--out FILE.json]
    python3 scripts/shim_cost.py --time [--src TREE] [--evict-kb 256] [--ops ...]

--shim counts another build of the shim (e.g. an older commit's, for a before/after table).
--time builds a self-timing shim (native/selftime.c) from TREE's native/ (default this tree; an
older commit's `git archive` for a before/after table), runs each op kind natively N_TIME times,
REPEATS runs, and prints the ns per call of the shim's timed parts (the minimum over the runs: the
machine is shared). --evict-kb makes cost_driver write that much memory after each op, as the real
driver's work between launches does (the figures on a GPU host are of a cold path). Wall time on
this machine, not the H200's: compare builds with each other, not with the H200's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FAKE = REPO / "tests" / "fake_cuda"
SHIM = REPO / "pyobmem" / "libpyobmem.so"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
CFLAGS = ["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I", str(CUDA_INCLUDE)]
# cost_driver's op kinds that run on one thread (launch_vs_alloc, its two-thread case, is a test)
OPS = ("launch", "launch_rot", "launch_ex", "launch_struct", "launch_offsets", "launch_foreach", "get_function",
       "memcpy_async", "htod_async", "memset_async", "alloc_free_async")
N1, N2 = 1000, 5000
TOP = 12  # shim functions listed per op kind
# records; a launch writes 2 (launch_foreach 31): N2 of them never fill it
RING_CAPACITY = 1 << 18
N_TIME, REPEATS = 20000, 5
TIME_RING = 1 << 20  # records (64 MiB, the default ring's size): launch_foreach at N_TIME // 4
TIMED_PARTS = ("launch_record", "copy_record", "ring_write", "gpuclock_sample", "params_refresh")


def die(msg: str) -> None:
    print(f"shim_cost.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def build(d: Path, shim: Path | None) -> Path:
    if shim == SHIM:
        subprocess.run(["make", "-s", "native"], cwd=REPO, check=True)
    subprocess.run(["gcc", *CFLAGS, "-fPIC", "-shared", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1",
                    "-o", str(d / "libcuda.so.1"), str(FAKE / "fake_cuda.c"), "-lpthread"], check=True)
    subprocess.run(["gcc", *CFLAGS, "-o", str(d / "cost_driver"), str(FAKE / "cost_driver.c"), "-ldl", "-lpthread"],
                   check=True)
    return d / "cost_driver"


def callgrind(driver: Path, op: str, n: int, live: int, shim: Path | None, out: Path) -> int:
    """Total instructions of one driver run (callgrind's summary line)."""
    from pyobmem.ring import Ring

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_")}
    env["LD_LIBRARY_PATH"] = str(driver.parent)
    env["PYOBMEM_CUPTI"] = "0"
    ring = None
    if shim is not None:
        ring = Ring.create(capacity=RING_CAPACITY, directory=str(out.parent))
        env["LD_PRELOAD"] = str(shim)
        env["PYOBMEM_RING"] = ring.path
    try:
        p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(driver), op, str(n),
                            str(live)], env=env, capture_output=True, text=True)
        if p.returncode != 0 or "done=1" not in p.stdout:
            die(f"cost_driver {op} {n} failed: {p.stdout.strip()} {p.stderr.strip()[-400:]}")
        if ring is not None and ring.dropped:
            die(f"the ring dropped {ring.dropped} records: raise RING_CAPACITY")
    finally:
        if ring is not None:
            ring.close()
    m = re.search(r"^summary:\s+(\d+)", out.read_text(), re.M)
    if not m:
        die(f"no summary line in {out}")
    return int(m.group(1))


def build_selftime(d: Path, src: Path) -> Path:
    """A self-timing shim built from src's native/ into d (the tree's own build is left alone)."""
    lib = d / "selftime" / "libpyobmem.so"
    lib.parent.mkdir()
    p = subprocess.run(["make", "-s", "-C", str(src), f"SHIM={lib}", "SELFTIME=1", str(lib)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        die(f"building a self-timing shim from {src} failed: {p.stderr.strip()[-400:]}")
    return lib


def selftime(driver: Path, op: str, n: int, live: int, shim: Path, evict_kb: int) -> dict[str, float]:
    """ns per call of each timed part, from one native run of the driver (selftime.c's lines)."""
    from pyobmem.ring import Ring

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_")}
    env.update(LD_LIBRARY_PATH=str(driver.parent), PYOBMEM_CUPTI="0", LD_PRELOAD=str(shim),
               COST_EVICT_KB=str(evict_kb))
    ring = Ring.create(capacity=TIME_RING)
    env["PYOBMEM_RING"] = ring.path
    try:
        p = subprocess.run([str(driver), op, str(n), str(live)], env=env, capture_output=True, text=True)
        if p.returncode != 0 or "done=1" not in p.stdout:
            die(f"cost_driver {op} {n} failed: {p.stdout.strip()} {p.stderr.strip()[-400:]}")
        if ring.dropped:
            die(f"the ring dropped {ring.dropped} records: raise TIME_RING")
    finally:
        ring.close()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^pyobmem selftime (\S+) calls=\d+ ns_each=([\d.]+)", p.stderr, re.M)}


def time_ops(ops: list[str], src: Path, live: int, evict_kb: int) -> dict:
    """--time: the minimum over REPEATS runs of each part's ns per call, per op kind."""
    result = {"src": str(src), "n": N_TIME, "repeats": REPEATS, "live_blocks": live, "evict_kb": evict_kb, "ops": {}}
    with tempfile.TemporaryDirectory(prefix="pyobmem-cost-") as tmp:
        d = Path(tmp)
        driver = build(d, None)
        shim = build_selftime(d, src)
        print(f"{'op':<18} " + " ".join(f"{p:>16}" for p in TIMED_PARTS) + "   (ns per call, min of runs)")
        for op in ops:
            n = N_TIME // 4 if op == "launch_foreach" else N_TIME
            runs = [selftime(driver, op, n, live, shim, evict_kb) for _ in range(REPEATS)]
            best = {p: min(r[p] for r in runs) for p in TIMED_PARTS if all(p in r for r in runs)}
            result["ops"][op] = best
            print(f"{op:<18} " + " ".join(f"{best[p]:>16.1f}" if p in best else f"{'-':>16}" for p in TIMED_PARTS))
    return result


def shim_functions(out: Path, n: int) -> list[tuple[str, float]]:
    """(function, inclusive instructions per call) of the shim's functions, largest first."""
    p = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                       capture_output=True, text=True, check=True)
    rows = []
    for line in p.stdout.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S+?):(\S+)\s+\[(.*)\]\s*$", line)
        if m and m.group(4).endswith("libpyobmem.so"):
            rows.append((f"{Path(m.group(2)).name}:{m.group(3)}", int(m.group(1).replace(",", "")) / n))
    rows.sort(key=lambda r: -r[1])
    return rows[:TOP]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated op kinds (default: {','.join(OPS)})")
    ap.add_argument("--live", type=int, default=64, help="live blocks in the table (default 64)")
    ap.add_argument("--shim", type=Path, default=SHIM,
                    help=f"the shim library to count (default {SHIM.relative_to(REPO)}, built by make native)")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--time", action="store_true", help="ns per call of the self-timed parts instead (no valgrind)")
    ap.add_argument("--src", type=Path, default=REPO, help="--time: the source tree to build (default this one)")
    ap.add_argument("--evict-kb", type=int, default=256,
                    help="--time: KiB the driver writes after each op, to cool the caches (default 256)")
    a = ap.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        die(f"unknown op kind {bad[0]} (known: {', '.join(OPS)})")
    for tool in ("gcc", "make") if a.time else ("gcc", "valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            die(f"{tool} not found")
    if not (CUDA_INCLUDE / "cuda.h").exists():
        die(f"no cuda.h in {CUDA_INCLUDE} (set CUDA_HOME)")
    if a.time:
        if not (a.src / "native").is_dir():
            die(f"no native/ in {a.src}")
        result = time_ops(ops, a.src.resolve(), a.live, a.evict_kb)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"wrote {a.out}")
        return 0
    shim = a.shim.resolve()
    if shim != SHIM and not shim.exists():
        die(f"no shim library at {shim}")
    result = {"shim": str(shim), "n1": N1, "n2": N2, "live_blocks": a.live, "ops": {}}
    with tempfile.TemporaryDirectory(prefix="pyobmem-cost-") as tmp:
        d = Path(tmp)
        driver = build(d, shim)
        print(f"{'op':<18} {'instr/call':>10}   top shim functions (inclusive instructions per call)")
        for op in ops:
            ir = {(pre, n): callgrind(driver, op, n, a.live, shim if pre else None, d / f"cg.{op}.{int(pre)}.{n}")
                  for pre in (False, True) for n in (N1, N2)}
            per_call = ((ir[True, N2] - ir[True, N1]) - (ir[False, N2] - ir[False, N1])) / (N2 - N1)
            funcs = shim_functions(d / f"cg.{op}.1.{N2}", N2)
            result["ops"][op] = {"instructions_per_call": round(per_call, 1),
                                 "functions": {f: round(v, 1) for f, v in funcs}}
            top = ", ".join(f"{f} {v:.0f}" for f, v in funcs[:5])
            print(f"{op:<18} {per_call:>10.1f}   {top}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
