"""Helpers shared by the analysis verbs (stats, patterns, report, export): option types that
argparse checks (a bad value is a usage error, exit 2) and reading a capture with its warnings."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys

from .. import planner
from ..capture import read_capture
from ..errors import PyobmemError
from ..model.sanitize import corrupt_note, sanitize

TIME_ORIGIN = "t = 0 at the first CUDA event of the capture"
INCOMPLETE = "the capture is incomplete (no end record: the run or the daemon was cut short); it is read up to its last whole record"


def _number(text: str, kind, what: str):
    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse type)."""
    v = _number(text, float, "a positive number")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return v


def percent(text: str) -> float:
    """A finite number >= 0 (argparse type)."""
    v = _number(text, float, "a number >= 0")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return v


def count(text: str) -> int:
    """An integer >= 0 (argparse type)."""
    v = _number(text, int, "an integer >= 0")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return v


TINY_BUDGET = 1 << 20  # a unit-less --budget under this many bytes is likely a size without its unit


def budget_arg(text: str, what: str = "--budget"):
    """``planner.parse_budget`` for a command-line value (``--min-swap-bytes`` too, through
    ``planner.parse_size`` when ``what`` names it): every bad value is one line and exit 2, also a
    number too large for a float (``1e400``)."""
    try:
        if what != "--budget":
            return planner.parse_size(text, what)
        budget = planner.parse_budget(text)
    except (OverflowError, ValueError):
        raise PyobmemError(f"bad {'budget' if what == '--budget' else what} {text!r}: too large", 2) from None
    if budget.bytes is not None and budget.bytes < TINY_BUDGET and text.strip().isdigit():
        # `--budget 2` meaning 2 GiB (a new user's trial, session 22): bytes, said once
        warn(f"--budget {text.strip()} is {budget.bytes} bytes (a number without a unit above 1 is bytes); "
             f"for gibibytes write {text.strip()}GiB")
    return budget


def warn(message: str) -> None:
    print(f"pyobmem: warning: {message}", file=sys.stderr, flush=True)


def distinct(paths: list[str]) -> list[str]:
    """``paths`` without repeats of one file (the same path, or another name of it), in order,
    with a warning for each file given more than once: a capture counted twice would double its
    rank in a table."""
    seen: dict = {}
    for p in paths:
        try:
            st = os.stat(p)
            key = (st.st_dev, st.st_ino)
        except OSError:
            key = os.path.abspath(p)  # missing: reading it says so
        seen.setdefault(key, []).append(p)
    for names in seen.values():
        if len(names) > 1:
            also = "" if len(set(names)) == 1 else f" (as {', '.join(names[1:])})"
            warn(f"{names[0]} is given {len(names)} times{also}; it is read once")
    return [names[0] for names in seen.values()]


def load(path: str, *, say_incomplete: bool = False):
    """Read a capture, leave out its corrupt records (saying so once on stderr) and, when
    ``say_incomplete`` (verbs whose output has no place for it), say it is incomplete."""
    cap, n_bad = sanitize(read_capture(path))
    if n_bad:
        warn(corrupt_note(n_bad))
    if say_incomplete and not cap.complete:
        warn(INCOMPLETE)
    return cap


# --- kernel names for narrow columns -------------------------------------------------------------


def _demangle_all(names: list[str]) -> dict:
    """Mangled C++ name -> demangled, through one ``c++filt`` run when it is installed ({} if not)."""
    mangled = sorted({n for n in names if n.startswith("_Z")})
    exe = shutil.which("c++filt")
    if not mangled or exe is None:
        return {}
    try:
        r = subprocess.run([exe], input="\n".join(mangled) + "\n", capture_output=True, text=True, timeout=10,
                           check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = r.stdout.split("\n")
    if r.returncode != 0 or len(out) < len(mangled):
        return {}
    return dict(zip(mangled, out))


def _itanium_nested(name: str) -> str:
    """The qualified identifier of an Itanium-mangled name without a demangler: ``_ZN2at6native3fooI...``
    -> ``at::native::foo``; other names unchanged."""
    if not name.startswith("_Z"):
        return name
    i = 2
    nested = name.startswith("_ZN")
    if nested:
        i = 3
        while i < len(name) and name[i] in "rVKLRO":
            i += 1
    parts = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        k = int(name[i:j])
        parts.append(name[j : j + k])
        i = j + k
        if not nested:
            break
    return "::".join(parts) if parts else name


_OPEN, _CLOSE = "<([{", ">)]}"


def function_name(demangled: str) -> str:
    """The qualified name of a demangled function, its template arguments kept, without its return
    type and parameter list: ``std::enable_if<!(false), void>::type ns::kernel<int>(int*) const`` ->
    ``ns::kernel<int>``. Brackets are matched, so a ``(`` or a space inside template arguments
    (``{lambda()#1}``, ``(bool)1``) is neither; ``operator()`` keeps its brackets."""
    depth, start = 0, 0
    i = 0
    while i < len(demangled):
        ch = demangled[i]
        if ch == "(" and depth == 0:
            if demangled.endswith("operator", 0, i) and demangled.startswith("()", i):
                i += 2
                continue
            return demangled[start:i] if i > start else demangled
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif ch == " " and depth == 0 and not demangled.endswith("operator", 0, i):
            start = i + 1
        i += 1
    return demangled[start:] or demangled


def short_name(name: str, width: int, demangled: dict | None = None) -> str:
    """A kernel name that fits ``width`` characters: demangled when possible, the return type and
    the parameter list left out, then cut with an ellipsis."""
    n = (demangled or {}).get(name)
    # A demangled signature loses its return type and parameters; other names stay as they are.
    n = _itanium_nested(name) if n is None else function_name(n.replace("(anonymous namespace)", "{anon}"))
    if len(n) <= width:
        return n
    base = n.split("<", 1)[0]
    last = base.rsplit("::", 1)[-1]
    for full, ident in ((n, base), (n[len(base) - len(last):], last)):
        if len(full) <= width:
            return full
        if len(ident) + 6 <= width:  # the identifier and the start of its template arguments
            return full[: width - 1] + "…"
    return last if len(last) <= width else last[: max(width - 1, 1)] + "…"


def terminal_width(default: int = 120) -> int:
    """Columns of the terminal (COLUMNS, else the terminal's size, else ``default``)."""
    return max(shutil.get_terminal_size((default, 24)).columns, 40)
