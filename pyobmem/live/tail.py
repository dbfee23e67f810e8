"""Reading a capture while the daemon writes it, one poll at a time.

The daemon (pyobmem.daemon, through capture.CaptureWriter) creates the file, writes its header in
one write, then appends 64-byte records and never rewrites one; a reader may find the last record
half written. ``CaptureTail`` keeps the file open and the offset of the next record: each poll
reads only the whole records after it and leaves a partial one for the next poll, so a capture is
read once however long the view runs.
"""

from __future__ import annotations

import os
import stat
import time

import numpy as np

from .. import abi
from ..capture import _PREFIX, MAGIC, read_header
from ..errors import CaptureError

MAX_READ = 1 << 18  # records per poll (16 MiB): a large capture is read over several polls
HEADER_GRACE_S = 2.0  # a header still incomplete this long after it was first seen is truncated

_EMPTY = np.zeros(0, abi.RECORD_DTYPE)


class CaptureTail:
    """The records of the capture at ``path`` as they are appended.

    ``poll() -> np.ndarray``: the whole records (``abi.RECORD_DTYPE``, in the file's order, at
    most MAX_READ) appended since the previous poll; empty while there are none, the file does
    not exist yet or its header is being written (``waiting``; only with ``wait``). After a poll
    that found the file replaced or rewritten (a new run with -f), ``reset`` is True: the records
    returned before were of another capture, and this poll's start the new one. ``meta`` is the
    header's metadata (None while waiting), ``size`` the file's size in bytes at the last poll,
    ``bytes_read`` the record bytes read in all (each byte of the file is read once), ``behind``
    the whole records in the file not read yet.

    Raises CaptureError (exit code 2) for a foreign, corrupt or newer file, a file that cannot be
    read, and, without ``wait``, a missing file or an incomplete header; with ``wait``, a header
    still incomplete HEADER_GRACE_S after it was first seen.
    """

    def __init__(self, path: str, wait: bool = True, clock=time.monotonic):
        self.path = path
        self.wait = wait
        self.meta: dict | None = None
        self.size = 0
        self.bytes_read = 0
        self.reset = False
        self._clock = clock
        self._fd: int | None = None
        self._header = b""  # the header's bytes, to tell a rewritten file
        self._offset = 0  # of the next record
        self._pending_since: float | None = None

    @property
    def waiting(self) -> bool:
        return self.meta is None

    @property
    def behind(self) -> int:
        return max(self.size - self._offset, 0) // abi.RECORD_SIZE if self._fd is not None else 0

    def poll(self) -> np.ndarray:
        self.reset = False
        if self._fd is not None and self._replaced():
            self.close()
            self.reset = True
        if self._fd is None and not self._open():
            return _EMPTY
        self.size = os.fstat(self._fd).st_size
        n = min(max(self.size - self._offset, 0) // abi.RECORD_SIZE, MAX_READ)
        if n <= 0:
            return _EMPTY
        data = os.pread(self._fd, n * abi.RECORD_SIZE, self._offset)
        n = len(data) // abi.RECORD_SIZE
        self._offset += n * abi.RECORD_SIZE
        self.bytes_read += n * abi.RECORD_SIZE
        return np.frombuffer(data, abi.RECORD_DTYPE, count=n)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self.meta, self._header, self._offset, self.size = None, None, b"", 0, 0

    def _replaced(self) -> bool:
        """Another file under the path, or this one cut shorter or rewritten from the start."""
        try:
            now, mine = os.stat(self.path), os.fstat(self._fd)
        except FileNotFoundError:
            return False  # removed: what was read stays
        if (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev) or mine.st_size < self._offset:
            return True
        return os.pread(self._fd, len(self._header), 0) != self._header

    def _open(self) -> bool:
        """Open the file and read its header; False while there is no whole header yet."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return self._pending(missing=True)
        except OSError as e:
            raise CaptureError(f"{self.path}: cannot read capture: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CaptureError(f"{self.path}: not a pyobmem capture")
            head = os.pread(fd, _PREFIX.size, 0)
            whole = len(head) == _PREFIX.size and st.st_size >= _PREFIX.size + _PREFIX.unpack(head)[2]
            if whole or head[: len(MAGIC)] != MAGIC[: len(head)]:
                self.meta, self._offset = read_header(self.path)  # raises for a foreign or newer file
                self._header = os.pread(fd, self._offset, 0)
        except BaseException:
            os.close(fd)
            raise
        if self.meta is None:
            os.close(fd)
            return self._pending(missing=False)
        self._fd, self._pending_since = fd, None
        return True

    def _pending(self, missing: bool) -> bool:
        """No whole header yet: wait (False), or say why there is none (CaptureError)."""
        now = self._clock()
        if missing:
            self._pending_since = None
        elif self._pending_since is None:
            self._pending_since = now
        if self.wait and (missing or now - self._pending_since < HEADER_GRACE_S):
            return False
        read_header(self.path)  # raises: missing, truncated header
        raise CaptureError(f"{self.path}: truncated capture (header incomplete)")
