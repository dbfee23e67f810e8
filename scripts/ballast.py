#!/usr/bin/env python3
"""Hold device memory so that only a given amount stays free, until told to stop.

    python3 scripts/ballast.py --free-bytes N [--device 0] [--tolerance 64MiB]

Allocates with cuMemAlloc (ctypes on libcuda.so.1, no framework: it starts in well under a
second) until cuMemGetInfo's free memory is within ``--tolerance`` above N (never below N, unless
the card already had less free), then prints one line on stdout

    ready free=<bytes> total=<bytes> held=<bytes> pid=<pid>

and waits. It frees everything and exits 0 when its standard input reaches end of file (the
parent closed it, or died) or on SIGTERM/SIGINT. Errors: one line on stderr, exit 1.
Used by scripts/bench_swap.py to oversubscribe the card.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import sys
from typing import NoReturn

MIB = 1 << 20
CHUNK_MAX = 8 << 30  # at most this much per cuMemAlloc
GRANULE = 2 * MIB  # allocations are rounded to this


def fail(msg: str) -> NoReturn:
    print(f"ballast: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--free-bytes", type=int, required=True, help="leave this much device memory free")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--tolerance", type=int, default=64 * MIB,
                    help="stop once free memory is at most this much above --free-bytes (default 64 MiB)")
    a = ap.parse_args(argv)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        fail(f"libcuda.so.1 not loadable ({e})")

    def check(r: int, what: str) -> None:
        if r != 0:
            fail(f"{what} failed (CUresult {r})")

    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int(0)
    check(cuda.cuDeviceGet(ctypes.byref(dev), a.device), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]

    def mem_info() -> tuple[int, int]:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return int(free.value), int(total.value)

    held: list[int] = []
    held_bytes = 0
    limit = CHUNK_MAX
    free, total = mem_info()
    while free - a.free_bytes > a.tolerance:
        want = min(limit, (free - a.free_bytes) // GRANULE * GRANULE)
        if want < GRANULE:
            break
        ptr = ctypes.c_uint64(0)
        if cuda.cuMemAlloc_v2(ctypes.byref(ptr), want) != 0:
            limit = want // 2 // GRANULE * GRANULE  # fragmentation: smaller pieces
            if limit < GRANULE:
                break
            continue
        held.append(ptr.value)
        held_bytes += want
        free, _ = mem_info()
    free, total = mem_info()
    print(f"ready free={free} total={total} held={held_bytes} pid={os.getpid()}", flush=True)

    stop = False

    def on_signal(signum, frame) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fd = sys.stdin.fileno()
    while not stop:
        try:
            ready = select.select([fd], [], [], 0.5)[0]
        except InterruptedError:
            continue
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
    for p in held:
        cuda.cuMemFree_v2(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
