"""The capture daemon: drains the shared-memory ring into a capture file.

Started by the launcher as ``python -m pyobmem.daemon --ring PATH --out FILE [--force]`` in its
own session (a Ctrl-C at the terminal does not reach it), it talks to the launcher through its
standard streams:

- stdin, line 1: the capture metadata, one JSON object. The daemon opens the ring, creates the
  capture, and answers ``ready`` on stdout, or ``error: <message>`` and exits 1.
- stdin, later: ``end <status>`` (the traced command's exit status; negative: killed by that
  signal; ``end`` alone: unknown). The daemon drains until the ring is empty (with a short grace
  for slots a killed producer reserved and never published), appends CAPTURE_END, and exits 0.
- stdin at end of file without ``end`` (or the launcher's pid gone): the launcher died. The
  daemon drains what is there, closes the capture without CAPTURE_END (it is then incomplete),
  removes the ring file, and exits.

SIGINT is ignored (the launcher decides when the run ends); SIGTERM stops like a dead launcher.
If the capture cannot be written (disk full) the daemon says so in one line and keeps draining,
so the traced application never finds the ring full because of it; the capture then ends at its
last whole record and is marked incomplete.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time

from .capture import CaptureWriter
from .ring import Ring

BATCH = 1 << 16  # records per drain and write (4 MiB)
IDLE_S = 0.003  # sleep when the ring is empty
STUCK_S = 2.0  # a reserved, unpublished slot is skipped after this long (while running)
FINAL_STUCK_S = 0.2  # the same when finishing
FINAL_GRACE_S = 0.5  # when finishing: give up on slots that never get published after this
FINAL_MAX_S = 10.0  # when finishing: stop even if producers keep writing


class Daemon:
    """Drains ``ring`` into ``writer`` until told to finish. ``control_fd`` carries the launcher's
    lines (see the module docstring); ``parent_pid`` is watched so the daemon never outlives it."""

    def __init__(
        self, ring: Ring, writer: CaptureWriter, control_fd: int, parent_pid: int | None = None, pending: bytes = b""
    ):
        self.ring = ring
        self.writer: CaptureWriter | None = writer
        self.control_fd = control_fd
        self.parent_pid = parent_pid
        self.lost_to_io = 0  # records drained but not written (capture write failed)
        self._buf = pending  # control bytes already read
        self._stop = False

    def run(self) -> bool:
        """Drain until the launcher says ``end`` (then finish: returns True) or goes away (False)."""
        signal.signal(signal.SIGTERM, self._on_term)
        if b"\n" in self._buf:
            status = self._parse_control()
            if status is not None:
                self.finish(status[0])
                return True
        while not self._stop:
            n = self._drain_once(STUCK_S)
            if n >= BATCH:
                ready = select.select([self.control_fd], [], [], 0)[0]
            else:
                ready = select.select([self.control_fd], [], [], IDLE_S)[0]
            if ready:
                status = self._read_control()
                if status is not None:
                    self.finish(status[0])
                    return True
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                break
        self._final_drain()
        self._close(end=None)
        return False

    def _on_term(self, signum, frame) -> None:
        self._stop = True

    def _read_control(self) -> tuple[int | None] | None:
        """Read what the launcher sent. Returns (status,) on ``end``; stops the loop on EOF."""
        try:
            chunk = os.read(self.control_fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            self._stop = True
            return None
        self._buf += chunk
        return self._parse_control()

    def _parse_control(self) -> tuple[int | None] | None:
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            words = line.split()
            if words and words[0] == b"end":
                try:
                    return (int(words[1]) if len(words) > 1 else None,)
                except ValueError:
                    return (None,)
        return None

    def _drain_once(self, stuck_s: float) -> int:
        recs = self.ring.drain(max_records=BATCH, stuck_timeout_s=stuck_s)
        if len(recs):
            self._write(recs)
        return len(recs)

    def _write(self, recs) -> None:
        if self.writer is None:
            self.lost_to_io += len(recs)
            return
        before = self.writer.records_written
        try:
            self.writer.write(recs)
        except OSError as e:
            # One line, then keep draining so producers never block on us.
            _warn(
                f"pyobmem: error: cannot write the capture ({e.strerror}); it ends here, "
                "events are drained and discarded until the run ends"
            )
            self.lost_to_io += len(recs) - (self.writer.records_written - before)
            self._abandon_writer()

    def _abandon_writer(self) -> None:
        writer, self.writer = self.writer, None
        try:
            writer.close()
        except OSError:
            pass

    def _final_drain(self) -> int:
        """Drain until the ring is empty; returns slots given up (reserved, never published)."""
        start = last_progress = time.monotonic()
        while True:
            if self._drain_once(FINAL_STUCK_S):
                last_progress = time.monotonic()
                if last_progress - start < FINAL_MAX_S:
                    continue
            head, tail = int(self.ring.header["head"][0]), int(self.ring.header["tail"][0])
            now = time.monotonic()
            if head <= tail:
                return 0
            if now - last_progress >= FINAL_GRACE_S or now - start >= FINAL_MAX_S:
                return head - tail
            time.sleep(IDLE_S)

    def finish(self, exit_status: int | None) -> None:
        """Drain everything, append CAPTURE_END (events dropped in total, exit status), close."""
        left = self._final_drain()
        dropped = self.ring.dropped + self.ring.skipped + left
        self._close(end=(dropped, exit_status))

    def _close(self, end: tuple[int, int | None] | None) -> None:
        if self.writer is None:
            return
        try:
            if end is not None:
                self.writer.finish(end[0], end[1], time.monotonic_ns())
            self.writer.close()
        except OSError as e:
            _warn(f"pyobmem: error: cannot write the end of the capture ({e.strerror})")
        self.writer = None


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m pyobmem.daemon", description=__doc__.split("\n\n")[0])
    p.add_argument("--ring", required=True, help="path of the event ring (created by the launcher)")
    p.add_argument("--out", required=True, help="capture file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing capture file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    parent = os.getppid()
    control = sys.stdin.fileno()
    line, pending = _read_line(control)
    if line is None:
        return 1  # the launcher went away before the run started
    try:
        meta = json.loads(line)
        ring = Ring.open(args.ring)
        writer = CaptureWriter(args.out, meta, force=args.force)
    except FileExistsError:
        return _fail(f"{args.out} exists (use -f/--force to overwrite)")
    except OSError as e:
        return _fail(f"{e.filename or args.out}: {e.strerror}")
    except ValueError as e:
        return _fail(str(e).splitlines()[0])
    print("ready", flush=True)
    daemon = Daemon(ring, writer, control, parent_pid=parent, pending=pending)
    if not daemon.run():
        ring.close(unlink=True)  # the launcher is gone: nobody else removes the ring
    else:
        ring.close(unlink=False)  # the launcher removes it
    return 0


def _read_line(fd: int) -> tuple[bytes | None, bytes]:
    """The first line from ``fd`` (unbuffered: later bytes are returned, not lost), and the rest."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, b""
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return line, rest


def _warn(line: str) -> None:
    """One line on stderr; a closed stderr (`pyobmem-run cmd 2>&1 | head`) must not stop the drain."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _fail(message: str) -> int:
    print(f"error: {message}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
