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

--shim counts another build of the shim (e.g. an older commit's, for a before/after table).
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
OPS = ("launch", "launch_ex", "launch_struct", "memcpy_async", "htod_async", "memset_async", "alloc_free_async")
N1, N2 = 1000, 5000
TOP = 12  # shim functions listed per op kind
RING_CAPACITY = 1 << 16  # records; a launch of cost_driver writes 2: N2 of them never fill it


def die(msg: str) -> None:
    print(f"shim_cost.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def build(d: Path, shim: Path) -> Path:
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
    a = ap.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        die(f"unknown op kind {bad[0]} (known: {', '.join(OPS)})")
    for tool in ("gcc", "valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            die(f"{tool} not found")
    if not (CUDA_INCLUDE / "cuda.h").exists():
        die(f"no cuda.h in {CUDA_INCLUDE} (set CUDA_HOME)")
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
