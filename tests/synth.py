"""Build synthetic event records and captures for CPU tests of logic (real captures live in
tests/data/). Each helper returns one record array of abi.RECORD_DTYPE."""

from __future__ import annotations

import numpy as np

from pyobmem import abi
from pyobmem.capture import CaptureWriter


class Trace:
    """An event stream under construction: ``alloc``, ``free``, ``launch`` append records with a
    clock that advances ``dt_ns`` per event; ``write(path)`` makes a capture file."""

    def __init__(self, pid: int = 100, dt_ns: int = 1000):
        self.pid, self.dt_ns = pid, dt_ns
        self.t = 0
        self.rows: list[tuple] = []
        self.seq = 0
        self.next_block = 1
        self.live: dict[int, tuple[int, int]] = {}  # block id -> (addr, size)
        self.next_addr = 0x7F0000000000
        self.add(abi.Ev.PROCESS, a=1, b=13000)

    def add(self, type_, flags=0, a=0, b=0, c=0, d=0, e=0, pid=None, ts=None):
        self.t += self.dt_ns
        self.rows.append((0, int(type_), flags, pid or self.pid, self.t if ts is None else ts, a, b, c, d, e))

    def alloc(self, size: int, kind=abi.AllocKind.DRIVER) -> int:
        """Allocate a block of ``size`` bytes; returns its block id."""
        bid = self.next_block
        self.next_block += 1
        addr = self.next_addr
        self.next_addr += (size + 0xFFFFF) & ~0xFFFFF
        self.live[bid] = (addr, size)
        self.add(abi.Ev.ALLOC, a=bid, b=addr, c=size, e=int(kind))
        return bid

    def free(self, bid: int) -> None:
        addr, size = self.live.pop(bid)
        self.add(abi.Ev.FREE, a=bid, b=addr, c=size)

    def launch(self, handle: int, blocks, offsets=None, flags=0, stream=0) -> int:
        """A kernel launch touching ``blocks`` (block ids) at ``offsets``; returns its op seq."""
        self.seq += 1
        offsets = offsets or [0] * len(blocks)
        self.add(abi.Ev.LAUNCH, flags=flags, a=self.seq, b=handle, c=stream, d=1, e=len(blocks) | (8 << 32))
        words = [(b << abi.ACCESS_OFFSET_BITS) | o for b, o in zip(blocks, offsets)]
        for i in range(0, len(words), 4):
            chunk = (words[i : i + 4] + [0, 0, 0])[:4]
            self.add(abi.Ev.ACCESS, flags=min(4, len(words) - i), a=self.seq, b=chunk[0], c=chunk[1], d=chunk[2], e=chunk[3])
        return self.seq

    def gpu_time(self, seq: int, t_gpu: int, stream: int = 0) -> None:
        """A GPU_TIME sample: op ``seq`` had run on the GPU at ``t_gpu`` ns."""
        self.add(abi.Ev.GPU_TIME, a=seq, b=stream, c=t_gpu)

    def text(self, type_, key: int, text: str) -> None:
        raw = text.encode()
        chunks = [raw[i : i + 32] for i in range(0, max(len(raw), 1), 32)]
        for i, ch in enumerate(chunks):
            words = np.frombuffer(ch.ljust(32, b"\0"), dtype="<u8")
            last = abi.TEXT_LAST if i == len(chunks) - 1 else 0
            self.add(type_, flags=i | last, a=key, b=int(words[0]), c=int(words[1]), d=int(words[2]), e=int(words[3]))

    def records(self) -> np.ndarray:
        return np.array(self.rows, dtype=abi.RECORD_DTYPE)

    def write(self, path, meta=None, end=True, exit_status=0) -> None:
        w = CaptureWriter(str(path), meta or {"argv": ["synthetic"]}, force=True)
        w.write(self.records())
        if end:
            w.finish(dropped=0, exit_status=exit_status, ts_ns=self.t + 1)
        w.close()
