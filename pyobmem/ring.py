"""The daemon's side of the shared-memory event ring (protocol in native/include/pyobmem/abi.h).

The ring is a file under /dev/shm created with mode 0600 (private to the user who started the
run), mapped by the daemon and by every traced process. The daemon is the single consumer.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import time

import numpy as np

from . import abi

DEFAULT_CAPACITY = 1 << 20  # records: 64 MiB of ring


class Ring:
    """A mapped event ring. ``Ring.create`` makes a new one; ``Ring.open`` maps an existing one.

    Attributes: ``path`` (str), ``capacity`` (records), ``header`` (a 1-element numpy view of
    ``abi.RING_HEADER_DTYPE``), ``records`` (numpy view of ``abi.RECORD_DTYPE``, length capacity).
    """

    def __init__(self, path: str, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        self.header = np.frombuffer(mm, dtype=abi.RING_HEADER_DTYPE, count=1)
        if int(self.header["magic"][0]) != abi.RING_MAGIC:
            raise ValueError(f"{path}: not a pyobmem ring")
        if int(self.header["abi_version"][0]) != abi.ABI_VERSION:
            raise ValueError(f"{path}: ring ABI version {int(self.header['abi_version'][0])}, expected {abi.ABI_VERSION}")
        self.capacity = int(self.header["capacity"][0])
        self.records = np.frombuffer(mm, dtype=abi.RECORD_DTYPE, count=self.capacity, offset=abi.RING_HEADER_SIZE)
        self._stuck_since: float | None = None
        self.skipped = 0  # slots reserved by a producer that never published them (killed mid-write)

    @classmethod
    def create(cls, capacity: int = DEFAULT_CAPACITY, directory: str = "/dev/shm") -> "Ring":
        """Create a ring of ``capacity`` records (rounded up to a power of two) in ``directory``.

        Raises OSError when the file cannot be created or its memory reserved (e.g. /dev/shm
        full: ENOSPC; see ``map_new_file``).
        """
        capacity = 1 << max(4, (capacity - 1).bit_length())
        path = os.path.join(directory, f"pyobmem-{os.getuid()}-{os.getpid()}-{secrets.token_hex(4)}")
        mm = map_new_file(path, abi.RING_HEADER_SIZE + capacity * abi.RECORD_SIZE)
        hdr = np.frombuffer(mm, dtype=abi.RING_HEADER_DTYPE, count=1)
        recs = np.frombuffer(mm, dtype=abi.RECORD_DTYPE, count=capacity, offset=abi.RING_HEADER_SIZE)
        recs["seq"] = np.arange(capacity, dtype=np.uint64)
        hdr["abi_version"] = abi.ABI_VERSION
        hdr["record_size"] = abi.RECORD_SIZE
        hdr["capacity"] = capacity
        hdr["creator_pid"] = os.getpid()
        hdr["magic"] = abi.RING_MAGIC  # last: a reader that sees the magic sees a whole header
        del hdr, recs
        return cls(path, mm)

    @classmethod
    def open(cls, path: str) -> "Ring":
        """Map an existing ring file. Raises OSError, or ValueError for a file that is no ring."""
        return cls(path, map_file(path))

    @property
    def dropped(self) -> int:
        """Events producers could not write because the ring was full."""
        return int(self.header["dropped"][0])

    def drain(self, max_records: int | None = None, stuck_timeout_s: float = 2.0) -> np.ndarray:
        """Take every published record in order and free their slots; returns a copy.

        A slot that a producer reserved but never published (the process was killed between
        reserve and publish) would block the ring forever: once later slots are ready and it
        has stayed unpublished for ``stuck_timeout_s``, it is skipped and counted in ``skipped``.
        """
        cap = self.capacity
        tail = int(self.header["tail"][0])
        head = int(self.header["head"][0])
        n = min(head - tail, cap)
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return np.empty(0, dtype=abi.RECORD_DTYPE)
        pos = np.arange(tail, tail + n, dtype=np.uint64)
        idx = (pos % np.uint64(cap)).astype(np.int64)
        ready = self.records["seq"][idx] == pos + np.uint64(1)
        k = n if ready.all() else int(np.argmin(ready))
        if k == 0:
            if ready.any() and self._slot_stuck(stuck_timeout_s):
                self.records["seq"][idx[0]] = np.uint64(tail + cap)
                self.header["tail"] = tail + 1
                self.skipped += 1
                return self.drain(max_records, stuck_timeout_s)
            return np.empty(0, dtype=abi.RECORD_DTYPE)
        self._stuck_since = None
        out = self.records[idx[:k]].copy()
        self.records["seq"][idx[:k]] = pos[:k] + np.uint64(cap)
        self.header["tail"] = tail + k
        return out

    def _slot_stuck(self, timeout_s: float) -> bool:
        now = time.monotonic()
        if self._stuck_since is None:
            self._stuck_since = now
        return now - self._stuck_since >= timeout_s

    def close(self, unlink: bool = True) -> None:
        """Unmap the ring and, by default, remove its file."""
        self.header = self.records = None  # release the buffer exports before closing the map
        unmap_file(self._mm, self.path, unlink)


def map_new_file(path: str, size: int) -> mmap.mmap:
    """Create ``path`` (mode 0600, refusing an existing file) with ``size`` bytes reserved and
    zeroed, and map it shared. Raises OSError (ENOSPC when the directory is full); on failure
    the file is removed.

    The memory is reserved up front with posix_fallocate: a tmpfs file that is only truncated to
    size gets its pages when they are first written, and on a full /dev/shm that write is a
    SIGBUS, here or, worse, in the traced application."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        return mmap.mmap(fd, size)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def map_file(path: str) -> mmap.mmap:
    """Map an existing file shared, read-write, whole. Raises OSError."""
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), 0)


def unmap_file(mm: mmap.mmap, path: str, unlink: bool) -> None:
    """Close ``mm`` (left to the garbage collector while numpy views of it remain) and, when
    ``unlink``, remove ``path`` (already gone is fine)."""
    try:
        mm.close()
    except BufferError:
        pass
    if unlink:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
