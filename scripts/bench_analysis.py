"""Time and peak memory to read and analyse captures of 1 M and 10 M events.

    python3 scripts/bench_analysis.py [BASE.pyobmem] [--sizes 1000000 10000000] [--out FILE]

The captures repeat a base trace until they hold the number of events asked for: a real capture
given as BASE, else a synthetic GPT-like training step (about 900 ops per iteration over about
300 blocks: 12 layers, weights and optimizer state, activations allocated and freed every
iteration). Each size is measured in a fresh child process (``--child``): read_capture, then the
whole model (pyobmem.model.analyse) and patterns_json; peak memory is the child's maximum RSS
(resource.getrusage). Writes bench/results/analysis_scale.json. Goal: 10 M events in < 60 s and
< 4 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pyobmem import abi  # noqa: E402
from pyobmem.capture import CaptureWriter, read_records  # noqa: E402

GOAL_S, GOAL_BYTES = 60.0, 4 << 30
MiB = 1 << 20


class _Iter:
    """Records of one synthetic training iteration, with the fields that change per repetition."""

    def __init__(self):
        self.rows: list = []
        self.t = 0
        self.seq = 0

    def add(self, type_, flags=0, a=0, b=0, c=0, d=0, e=0, dt=1000):
        self.t += dt
        self.rows.append((0, int(type_), flags, 100, self.t, a, b, c, d, e))

    def launch(self, handle, blocks, dt=2000):
        self.seq += 1
        self.add(abi.Ev.LAUNCH, a=self.seq, b=handle, c=7, d=1, e=len(blocks) | (8 << 32), dt=dt)
        words = [(bb << abi.ACCESS_OFFSET_BITS) for bb in blocks]
        for i in range(0, len(words), 4):
            w = (words[i : i + 4] + [0, 0, 0])[:4]
            self.add(abi.Ev.ACCESS, flags=min(4, len(words) - i), a=self.seq, b=w[0], c=w[1], d=w[2], e=w[3], dt=0)


def gpt_like(layers: int = 12) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """(setup records, iteration records, first activation id, activations per iteration, period ns)."""
    rng = np.random.default_rng(7)
    setup = _Iter()
    weights, states = [], []
    bid = 1
    for _ in range(layers * 12 + 2):
        size = int(rng.choice([1, 2, 4, 9, 16]) * MiB)
        for lst in (weights, states):
            setup.add(abi.Ev.ALLOC, a=bid, b=0x7F0000000000 + bid * (64 * MiB), c=size)
            lst.append(bid)
            bid += 1
    act0 = bid
    it = _Iter()
    it.t = 0
    acts = []
    handles = iter(range(0x1000, 0x100000))

    def new_act(size):
        nonlocal bid
        it.add(abi.Ev.ALLOC, a=bid, b=0x7E0000000000 + bid * (64 * MiB), c=size, dt=500)
        acts.append(bid)
        bid += 1
        return bid - 1

    emb = [next(handles) for _ in range(5)]
    fwd = [next(handles) for _ in range(25)]
    bwd = [next(handles) for _ in range(45)]
    opt = [next(handles) for _ in range(50)]
    x = new_act(32 * MiB)
    for h in emb:
        it.launch(h, [weights[0], weights[1], x])
    saved = []
    for layer in range(layers):
        w = weights[2 + 12 * layer : 14 + 12 * layer]
        a = [new_act(int(rng.choice([4, 8, 16, 32])) * MiB) for _ in range(10)]
        saved.append(a)
        for k, h in enumerate(fwd):
            it.launch(h, [w[k % 12], a[k % 10], a[(k + 3) % 10]])
    for layer in reversed(range(layers)):
        w = weights[2 + 12 * layer : 14 + 12 * layer]
        a = saved[layer]
        for k, h in enumerate(bwd):
            it.launch(h, [w[k % 12], a[k % 10], x])
        for blk in a:
            it.add(abi.Ev.FREE, a=blk, dt=300)
    for k, h in enumerate(opt):
        sel = range(k * 6, min(k * 6 + 6, len(weights)))
        it.launch(h, [weights[i] for i in sel] + [states[i] for i in sel])
    it.add(abi.Ev.FREE, a=x, dt=300)
    it.t += 50_000  # the host waits for the loss before the next step
    return (np.array(setup.rows, dtype=abi.RECORD_DTYPE), np.array(it.rows, dtype=abi.RECORD_DTYPE),
            act0, bid - act0, it.t)


def from_capture(path: str) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """A real capture as the base: no setup; the whole capture is repeated (block ids shifted)."""
    _, recs = read_records(path)
    recs = recs[recs["type"] != abi.Ev.CAPTURE_END]
    ids = recs["a"][np.isin(recs["type"], [abi.Ev.ALLOC, abi.Ev.FREE])]
    span = int(recs["ts_ns"].max() - recs["ts_ns"].min()) + 1000
    return recs[:0], recs, 0, int(ids.max()) + 1 if len(ids) else 1, span


def build(path: str, events: int, base) -> int:
    """Write a capture of about ``events`` records by repeating ``base``; returns the record count."""
    setup, it, act0, n_act, period = base
    reps = max(1, (events - len(setup)) // len(it))
    w = CaptureWriter(path, {"argv": ["bench_analysis"], "bench": True}, force=True)
    w.write(setup)
    t_base = int(setup["ts_ns"].max()) + 10_000 if len(setup) else 0
    seq_per = int(it["a"][it["type"] == abi.Ev.LAUNCH].max(initial=0)) + 1
    is_alloc_free = np.isin(it["type"], [abi.Ev.ALLOC, abi.Ev.FREE])
    shift_id = is_alloc_free & (it["a"] >= act0)
    is_seq = np.isin(it["type"], [abi.Ev.LAUNCH, abi.Ev.ACCESS, abi.Ev.MEMCPY, abi.Ev.MEMSET, abi.Ev.GRAPH_LAUNCH])
    word_fields = ("b", "c", "d", "e")
    is_acc = it["type"] == abi.Ev.ACCESS
    word_shift = {}
    for f in word_fields:
        blk = it[f] >> np.uint64(abi.ACCESS_OFFSET_BITS)
        word_shift[f] = is_acc & (it[f] != 0) & (blk >= np.uint64(act0))
    chunk = max(1, (1 << 20) // len(it))
    for r0 in range(0, reps, chunk):
        k = np.arange(r0, min(reps, r0 + chunk), dtype=np.uint64)
        rec = np.tile(it, len(k))
        kk = np.repeat(k, len(it))
        rec["ts_ns"] += np.uint64(t_base) + kk * np.uint64(period)
        rec["a"] = np.where(np.tile(is_seq, len(k)), rec["a"] + kk * np.uint64(seq_per), rec["a"])
        rec["a"] = np.where(np.tile(shift_id, len(k)), rec["a"] + kk * np.uint64(n_act), rec["a"])
        for f in word_fields:
            m = np.tile(word_shift[f], len(k))
            rec[f] = np.where(m, rec[f] + ((kk * np.uint64(n_act)) << np.uint64(abi.ACCESS_OFFSET_BITS)), rec[f])
        w.write(rec)
    w.finish(dropped=0, exit_status=0, ts_ns=t_base + reps * period + 1)
    w.close()
    return len(setup) + reps * len(it)


def child(path: str) -> dict:
    from pyobmem.capture import read_capture
    from pyobmem.model import analyse, patterns_json

    t0 = time.perf_counter()
    cap = read_capture(path)
    t1 = time.perf_counter()
    a = analyse(cap, progress=False)
    t2 = time.perf_counter()
    pj = patterns_json(a)
    t3 = time.perf_counter()
    return {
        "read_s": round(t1 - t0, 3), "analyse_s": round(t2 - t1, 3), "patterns_json_s": round(t3 - t2, 3),
        "total_s": round(t3 - t0, 3), "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "ops": int(len(cap.ops)), "accesses": int(len(cap.accesses)), "blocks": int(len(cap.blocks)),
        "iterations_detected": pj["iterations_detected"], "period_launches": pj["period_launches"],
        "regular": pj["regular"], "peak_live_bytes": pj["peak_live_bytes"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", nargs="?", help="a real capture to repeat (default: synthetic GPT-like steps)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000], help="events per capture")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "analysis_scale.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    base = from_capture(args.base) if args.base else gpt_like()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = os.path.join(tmp, f"bench_{n}.pyobmem")
            t = time.perf_counter()
            written = build(path, n, base)
            build_s = time.perf_counter() - t
            r = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True, text=True)
            if r.returncode:
                sys.stderr.write(r.stderr)
                return r.returncode
            m = json.loads(r.stdout)
            m.update({"events": written, "file_bytes": os.path.getsize(path), "build_s": round(build_s, 3),
                      "ops_per_iteration": m["period_launches"]})
            m["within_goal"] = m["total_s"] < GOAL_S and m["max_rss_bytes"] < GOAL_BYTES
            results.append(m)
            os.unlink(path)
            print(f"{written:>10} events: read {m['read_s']:.1f} s + analyse {m['analyse_s']:.1f} s, "
                  f"max RSS {m['max_rss_bytes'] / 2**30:.2f} GiB, {m['iterations_detected']} iterations of "
                  f"{m['period_launches']} ops", flush=True)
    out = {
        "base": args.base or "synthetic GPT-like (12 layers, ~900 ops and ~300 blocks per iteration)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "platform": platform.platform()},
        "goal": {"events": 10_000_000, "seconds": GOAL_S, "bytes": GOAL_BYTES},
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
