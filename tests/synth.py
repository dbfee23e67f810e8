"""Build synthetic event records and captures for CPU tests of logic (real captures live in
tests/data/). Records are written by the names of abi.h's payload structs (abi.EVENT_DTYPES)."""

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
        self.rows: list[np.ndarray] = []
        self.seq = 0
        self.next_block = 1
        self.live: dict[int, tuple[int, int]] = {}  # block id -> (addr, size)
        self.next_addr = 0x7F0000000000
        self.add(abi.Ev.PROCESS, ppid=1, driver_version=13000)

    def add(self, type_, flags=0, pid=None, ts=None, **payload):
        """Append a record of ``type_``; ``payload``: its fields by name (abi.EVENT_DTYPES[type_]),
        the others 0. Raises ValueError for a name the type's payload does not have."""
        self.t += self.dt_ns
        rec = abi.records(type_)
        rec["flags"], rec["pid"], rec["ts_ns"] = int(flags), pid or self.pid, self.t if ts is None else ts
        for name, value in payload.items():
            rec[name] = value
        self.rows.append(rec.view(abi.RECORD_DTYPE))

    def alloc(self, size: int, kind=abi.AllocKind.DRIVER) -> int:
        """Allocate a block of ``size`` bytes; returns its block id."""
        bid = self.next_block
        self.next_block += 1
        addr = self.next_addr
        self.next_addr += (size + 0xFFFFF) & ~0xFFFFF
        self.live[bid] = (addr, size)
        self.add(abi.Ev.ALLOC, block_id=bid, addr=addr, size=size, kind=int(kind))
        return bid

    def free(self, bid: int) -> None:
        addr, size = self.live.pop(bid)
        self.add(abi.Ev.FREE, block_id=bid, addr=addr, size=size)

    def launch(self, handle: int, blocks, offsets=None, flags=0, stream=0) -> int:
        """A kernel launch touching ``blocks`` (block ids) at ``offsets``; returns its op seq."""
        self.seq += 1
        offsets = offsets or [0] * len(blocks)
        self.add(abi.Ev.LAUNCH, flags=flags, op=self.seq, function=handle, stream=stream, grid=1,
                 n_touched=len(blocks), n_words=8)
        words = [(b << abi.ACCESS_OFFSET_BITS) | o for b, o in zip(blocks, offsets)]
        for i in range(0, len(words), 4):
            chunk = (words[i : i + 4] + [0, 0, 0])[:4]
            self.add(abi.Ev.ACCESS, flags=min(4, len(words) - i), op=self.seq, words=chunk)
        return self.seq

    def gpu_time(self, seq: int, t_gpu: int, stream: int = 0) -> None:
        """A GPU_TIME sample: op ``seq`` had run on the GPU at ``t_gpu`` ns."""
        self.add(abi.Ev.GPU_TIME, op=seq, stream=stream, t_gpu=t_gpu)

    def text(self, type_, key: int, text: str) -> None:
        """A KERNEL_NAME (key: the function handle) or NOTE (key 0) in TEXT_CHUNK-byte chunks."""
        raw, n = text.encode(), abi.TEXT_CHUNK
        chunks = [raw[i : i + n] for i in range(0, max(len(raw), 1), n)]
        for i, ch in enumerate(chunks):
            last = abi.TEXT_LAST if i == len(chunks) - 1 else 0
            self.add(type_, flags=i | last, key=key, text=np.frombuffer(ch.ljust(n, b"\0"), np.uint8))

    def records(self) -> np.ndarray:
        """The records so far (abi.RECORD_DTYPE)."""
        return np.concatenate(self.rows) if self.rows else np.zeros(0, abi.RECORD_DTYPE)

    def write(self, path, meta=None, end=True, exit_status=0) -> None:
        w = CaptureWriter(str(path), meta or {"argv": ["synthetic"]}, force=True)
        w.write(self.records())
        if end:
            w.finish(dropped=0, exit_status=exit_status, ts_ns=self.t + 1)
        w.close()
