"""Pinned host <-> device copy bandwidth, each way alone and both ways at once (the swap executor's
two copy streams): the figure the host-clock replay (pyobmem.planner.replay) needs.

    python3 scripts/bench_copy_bandwidth.py [--out bench/results/copy_bandwidth.json]

For each size (4 MiB, 64 MiB, 512 MiB): ``d2h`` and ``h2d`` alone, and ``both`` (the two copies
issued together on two non-blocking streams, each timed by its own events), GB/s (1e9 B/s) per
direction, the median of 20 repetitions after 3 warm-ups. Needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SIZES = (4 << 20, 64 << 20, 512 << 20)
REPS, WARMUP = 20, 3


def _timed(torch, pairs) -> list:
    """Seconds of each (dst, src, stream) copy issued together, by events on its stream."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in pairs]
    torch.cuda.synchronize()
    for (dst, src, s), (a, b) in zip(pairs, ev):
        with torch.cuda.stream(s):
            a.record(s)
            dst.copy_(src, non_blocking=True)
            b.record(s)
    torch.cuda.synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in ev]


def measure(torch, size: int) -> dict:
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(size, dtype=torch.uint8, device="cuda")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    host2 = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    runs = {"d2h": [(host, dev, s1)], "h2d": [(dev2, host2, s2)], "both": [(host, dev, s1), (dev2, host2, s2)]}
    out = {}
    for name, pairs in runs.items():
        times = []
        for i in range(WARMUP + REPS):
            t = _timed(torch, pairs)
            if i >= WARMUP:
                times.append(t)
        gbs = [round(size / statistics.median(col) / 1e9, 2) for col in zip(*times)]
        out[name] = gbs if name == "both" else gbs[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/copy_bandwidth.json")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_copy_bandwidth: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_copy_bandwidth: no CUDA device", file=sys.stderr)
        return 2
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "unit": "GB/s (1e9 B/s) per direction; both: [d2h, h2d] issued together",
           "sizes": {str(s): measure(torch, s) for s in SIZES}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
