"""The live view's loop: ``run(path, log=None) -> exit code``.

Every TICK_S: read the keys (q quits; Ctrl-C, SIGTERM and SIGHUP quit the same way), read the
records appended to the capture since the last tick (pyobmem.live.tail), and redraw the screen
with rich.live.Live on the terminal's alternate screen (left as it was found on quitting). The
figures (pyobmem.live.figures) are computed on a worker thread from all the records read so far,
when new ones arrived, at most every MODEL_MIN_S and with at most MODEL_SHARE of the time: the
model's queries take the whole capture (iterations are found over the whole launch stream), so the
screen stays responsive on a long run and the figures follow it a little behind. Without a
terminal the view prints the current state once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import time
import tty

import numpy as np
from rich.console import Console
from rich.live import Live

from .. import abi
from ..capture import decode_records
from ..model.sanitize import sanitize
from .figures import figures
from .screen import Status, render
from .tail import CaptureTail

TICK_S = 0.25
MODEL_MIN_S = 0.5  # figures at most this often ...
MODEL_SHARE = 0.25  # ... and computing them takes at most this share of the time
LOG_TAIL_BYTES = 8192  # the end of the command's log read each tick
LOG_LINES = 3


class Reader:
    """The records read so far and the figures of them (see the module docstring).

    ``step(now)`` polls the capture once and, when due, starts computing the figures on a worker
    thread; ``figures`` is the last result (None before the first), ``status(now)`` the reading's
    state for the screen. ``wait`` as in CaptureTail. Raises CaptureError as CaptureTail does."""

    def __init__(self, path: str, log: str | None = None, wait: bool = True):
        self.tail = CaptureTail(path, wait=wait)
        self.log = log
        self.figures = None
        self.error: str | None = None
        self._chunks: list = []
        self._n = 0  # records read
        self._modeled = 0  # records the figures are of
        self._generation = 0  # counts resets: a worker's result for an older file is dropped
        self._worker: threading.Thread | None = None
        self._next_model = 0.0
        self._last_new: float | None = None

    def step(self, now: float) -> None:
        recs = self.tail.poll()
        if self.tail.reset:
            self._chunks, self._n, self._modeled, self._last_new = [], 0, 0, None
            self._generation += 1
            self.figures = self.error = None
        if len(recs):
            self._chunks.append(recs)
            self._n += len(recs)
            self._last_new = now
        if self._due(now):
            self._worker = threading.Thread(target=self._compute, args=(self._records(), self._generation), daemon=True)
            self._worker.start()

    def compute_now(self) -> None:
        """Compute the figures of the records read, in this thread."""
        self._compute(self._records(), self._generation)

    def status(self, now: float) -> Status:
        t = self.tail
        return Status(
            path=t.path, waiting=t.waiting, records=self._n, size=t.bytes_read, behind=t.behind * abi.RECORD_SIZE,
            quiet_s=None if self._last_new is None else now - self._last_new, log=self.log,
            updating=self._modeled != self._n, error=self.error,
        )

    def log_lines(self) -> list[str]:
        """The last LOG_LINES lines of the command's log (the text after a line's last carriage
        return: a progress bar's latest state)."""
        if self.log is None:
            return []
        try:
            with open(self.log, "rb") as f:
                f.seek(max(os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES, 0))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        lines = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
        return [line for line in lines if line.strip()][-LOG_LINES:]

    def _records(self) -> np.ndarray:
        if len(self._chunks) != 1:
            self._chunks = [np.concatenate(self._chunks)] if self._chunks else [np.zeros(0, abi.RECORD_DTYPE)]
        return self._chunks[0]

    def _due(self, now: float) -> bool:
        busy = self._worker is not None and self._worker.is_alive()
        return not busy and self._n > self._modeled and not self.tail.behind and now >= self._next_model

    def _compute(self, recs: np.ndarray, generation: int) -> None:
        t0 = time.monotonic()
        try:
            cap, corrupt = sanitize(decode_records(recs, self.tail.meta, self.tail.path))
            result, error = figures(cap, corrupt), None
        except Exception as e:  # a capture the model cannot take must not end the view
            result, error = self.figures, f"the figures could not be computed ({type(e).__name__}: {e})"
        if generation == self._generation:
            self.figures, self.error, self._modeled = result, error, len(recs)
        spent = time.monotonic() - t0
        self._next_model = t0 + max(MODEL_MIN_S, spent / MODEL_SHARE)


def run(path: str, log: str | None = None) -> int:
    """Show the capture at ``path`` until q (exit 0); ``log``: the command's output file, named
    and tailed on the screen. Raises CaptureError (one line, exit 2) for a foreign or truncated
    capture, and without a terminal for a missing one."""
    console = Console()
    if not (console.is_terminal and sys.stdin.isatty()):
        return _once(console, path, log)
    reader = Reader(path, log)
    try:
        with _quit_signals(), _keys() as keys, Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                now = time.monotonic()
                reader.step(now)
                live.update(render(reader.status(now), reader.figures, console, reader.log_lines()), refresh=True)
                if keys.quit(TICK_S):
                    break
    except KeyboardInterrupt:
        return 0
    if log is not None and not (reader.figures is not None and reader.figures.complete):
        print(f"pyobmem: the live view is closed; the run goes on (its output: {log})", file=sys.stderr, flush=True)
    return 0


def _once(console: Console, path: str, log: str | None) -> int:
    """Not a terminal: read the whole capture as it is now and print one screen."""
    reader = Reader(path, log, wait=False)
    reader.step(time.monotonic())
    while reader.tail.behind:
        reader.step(time.monotonic())
    reader.compute_now()
    console.print(render(reader.status(time.monotonic()), reader.figures, console, reader.log_lines(), interactive=False))
    return 0


class _Keys:
    def __init__(self, fd: int):
        self.fd = fd

    def quit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a key; True when it is q."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        return b"q" in os.read(self.fd, 64).lower()


@contextlib.contextmanager
def _keys():
    """The terminal in cbreak mode (keys one at a time, no echo; Ctrl-C still interrupts),
    restored on the way out."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield _Keys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _quit_signals():
    """SIGTERM and SIGHUP leave like Ctrl-C: the screen and the terminal restored."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
