"""Fidelity of the tracer on training scripts written the way people write them (issue: iterations,
attribution and cost that hold on real training scripts), on a CUDA machine.

    python3 scripts/bench_fidelity.py --part iterations --part attribution [--out bench/results/fidelity.json]

Each part NAME is ``run(args) -> dict`` of ``scripts/_fidelity_NAME.py``; its dict is merged into the
output JSON under NAME (other parts already there are kept), with the git commit it ran on.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import _bench

PARTS = ("iterations", "attribution", "profiler", "gpu_clock")


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_bench.REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "native", "pyobmem", "scripts"], cwd=_bench.REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", action="append", choices=PARTS, help="part to run (repeatable; default all)")
    p.add_argument("--out", type=Path, default=_bench.REPO / "bench" / "results" / "fidelity.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/fidelity"), help="captures and logs (default /tmp/fidelity)")
    args = p.parse_args()
    _bench.require_gpu()
    args.work.mkdir(parents=True, exist_ok=True)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    rc = 0
    for name in args.part or PARTS:
        print(f"== {name}", flush=True)
        try:
            result = importlib.import_module(f"_fidelity_{name}").run(args)
        except (_bench.BenchError, OSError, subprocess.SubprocessError) as e:
            print(f"{name}: failed: {e}", file=sys.stderr, flush=True)
            rc = 1
            continue
        result["commit"] = commit()
        doc[name] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps({name: result}, indent=1), flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
