"""A small progress bar on stderr, drawn only when stderr is a terminal (silent when piped)."""

from __future__ import annotations

import sys
import time


class Progress:
    """``with Progress("analysing", total=4) as p: ...; p.step("blocks")``.

    Draws ``label [#####     ] 2/4 blocks`` in place on a TTY stream (default stderr) and erases
    it at the end; does nothing on a pipe or a file, or when ``enabled`` is False.
    """

    WIDTH = 24

    def __init__(self, label: str, total: int, stream=None, enabled: bool | None = None):
        self.label, self.total, self.done = label, max(int(total), 1), 0
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._last = 0.0
        self._shown = False

    def __enter__(self) -> "Progress":
        self._draw("")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def step(self, what: str = "", n: int = 1) -> None:
        """Mark ``n`` more units done; ``what`` names the part now running."""
        self.done = min(self.done + n, self.total)
        self._draw(what)

    def _draw(self, what: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self._shown and now - self._last < 0.05 and self.done < self.total:
            return
        self._last = now
        fill = self.WIDTH * self.done // self.total
        line = f"{self.label} [{'#' * fill}{' ' * (self.WIDTH - fill)}] {self.done}/{self.total} {what}"
        self.stream.write("\r" + line[:100].ljust(100))
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()
            self._shown = False
