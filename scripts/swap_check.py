"""Compare a workload run without pyobmem and under --swap (used by scripts/gpu_session.sh):

    python3 scripts/swap_check.py BASE.json SWAP.json SWAP.pyobmem [NVIDIA_SMI_SAMPLES.csv]

Prints one JSON object: losses identical (bit for bit, the workloads write them as hex), median
step time of the second half of each run and their ratio, the capture's swap-outs and swap-ins by
cause, plans adopted and dropped, the shim's swap notes, and the driver's peak used memory (MiB,
from nvidia-smi samples, when given). Exit status 1 when the losses differ or a run is missing.
"""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np

from pyobmem import abi
from pyobmem.capture import SWAP_IN, SWAP_OUT, read_capture


def _median_tail(ms: list) -> float | None:
    tail = ms[len(ms) // 2 :]
    return statistics.median(tail) if tail else None


def main() -> int:
    base_path, swap_path, cap_path = sys.argv[1:4]
    out: dict = {"capture": cap_path}
    try:
        base, swap = (json.load(open(p)) for p in (base_path, swap_path))
    except (OSError, ValueError) as e:
        print(json.dumps({"error": f"missing run: {e}"}))
        return 1
    out["steps"] = [len(base["losses"]), len(swap["losses"])]
    out["loss_identical"] = base["losses"] == swap["losses"]
    tb, ts = _median_tail(base["step_ms"]), _median_tail(swap["step_ms"])
    out["step_ms"] = [tb, ts]
    out["time_ratio"] = ts / tb if tb and ts else None
    out["step_ms_swap_all"] = swap["step_ms"]
    cap = read_capture(cap_path)
    sw = cap.swaps
    outs, ins = sw[sw["direction"] == SWAP_OUT], sw[sw["direction"] == SWAP_IN]
    out["swap_out"] = {"count": len(outs), "bytes": int(outs["bytes"].sum())}
    out["swap_in"] = {c.name.lower(): int(np.count_nonzero(ins["cause"] == c)) for c in abi.SwapInCause}
    out["plans"] = {"adopted": int(np.count_nonzero(~cap.plans["dropped"])), "dropped": int(np.count_nonzero(cap.plans["dropped"]))}
    out["notes"] = {pid: {k: v for k, v in notes.items() if "swap" in k or "swap" in v} for pid, notes in cap.notes.items()}
    if len(sys.argv) > 4:
        used = [int(x) for x in open(sys.argv[4]).read().split() if x.strip().isdigit()]
        out["driver_peak_used_mib"] = max(used) if used else None
    for k in ("memory_stats",):
        if k in swap:
            out["torch_swap"] = swap[k]
            out["torch_base"] = base.get(k)
    print(json.dumps(out, indent=1, default=str))
    return 0 if out["loss_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
