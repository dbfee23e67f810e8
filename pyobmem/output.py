"""Output files of the verbs that write one (``pyobmem export``, ``pyobmem report``): refused when
they would destroy something, written under a temporary name and renamed at the end."""

from __future__ import annotations

import contextlib
import os

from .capture import MAGIC
from .errors import PyobmemError


def check_output(path: str, force: bool, source: str | None = None) -> None:
    """Refuse (PyobmemError) an output that is a directory, the capture ``source`` itself or any
    other capture (even with ``force``: -f never destroys a capture), or an existing file unless
    ``force``. Called before any work."""
    if os.path.isdir(path):
        raise PyobmemError(f"{path} is a directory; give a file name (-o FILE)")
    if source is not None and os.path.exists(path):
        try:
            same = os.path.samefile(path, source)
        except OSError:
            same = False
        if same:
            raise PyobmemError(f"{path} is the capture being read; choose another output (-o FILE)")
    if _is_capture(path):
        raise PyobmemError(f"{path} is a pyobmem capture; -f never overwrites one: choose another output (-o FILE)")
    if os.path.lexists(path) and not force:
        raise PyobmemError(f"{path} exists; use -f/--force to overwrite it")


def _is_capture(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


@contextlib.contextmanager
def open_output(path: str, force: bool, binary: bool = False, source: str | None = None):
    """Open ``path`` for writing; refused as ``check_output`` says (PyobmemError).

    Written to a temporary name beside it and renamed at the end, so an interrupted export never
    leaves a half file under the final name.
    """
    check_output(path, force, source)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        f = open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""}))
    except OSError as e:
        raise PyobmemError(f"cannot write {path}: {e.strerror}") from None
    try:
        with f:
            yield f
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise PyobmemError(f"cannot write {path}: {e.strerror}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
