#!/usr/bin/env python3
"""Regenerate bench/results/patterns_<workload>.json from a directory of captures.

    python3 scripts/patterns_all.py /work/caps [-o bench/results]

Each ``<name>.pyobmem`` gives ``patterns_<workload>.json`` (pyobmem.model.patterns_json), where
the workload is the capture name with ``gpt_medium`` written ``gpt2_medium``. When the workload's
JSON (``<name>.json``: steps, step_ms, torch memory stats) lies beside the capture, a ``workload``
section is added for the sanity check: steps, median step time, torch peak allocated / reserved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyobmem.capture import read_capture  # noqa: E402
from pyobmem.model import patterns_json  # noqa: E402

RENAME = {"gpt_medium": "gpt2_medium"}


def workload_facts(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    w = json.load(open(path))
    ms = w.get("memory_stats") or {}
    out = {"steps": w.get("steps"), "step_ms_median": None,
           "torch_peak_allocated_bytes": ms.get("allocated_bytes.all.peak"),
           "torch_peak_reserved_bytes": ms.get("reserved_bytes.all.peak")}
    if w.get("step_ms"):
        out["step_ms_median"] = round(statistics.median(w["step_ms"]), 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("captures", help="directory holding <name>.pyobmem (and <name>.json)")
    ap.add_argument("-o", "--out", default=os.path.join(os.path.dirname(__file__), "..", "bench", "results"))
    ap.add_argument("--only", nargs="*", help="capture names to do (default: all)")
    args = ap.parse_args(argv)
    names = sorted(f[:-8] for f in os.listdir(args.captures) if f.endswith(".pyobmem"))
    for name in names:
        if args.only and name not in args.only:
            continue
        d = patterns_json(read_capture(os.path.join(args.captures, name + ".pyobmem")), progress=False)
        facts = workload_facts(os.path.join(args.captures, name + ".json"))
        if facts:
            d["workload"] = facts
        out = os.path.join(args.out, f"patterns_{RENAME.get(name, name)}.json")
        with open(out, "w") as f:
            json.dump(d, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{out}: {d['iterations_detected']} iterations x {d['period_launches']} ops, "
              f"peak {d['peak_live_bytes'] / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
