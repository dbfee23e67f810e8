"""Byte sizes and durations as text: the one place every verb, export and report formats them.

    format_bytes(1536)                      # '1.5 KiB'
    format_bytes(25165824, digits=2)        # '24.00 MiB'
    format_duration(1_234_567)              # '1.2 ms'
    format_duration(100_000, digits=3)      # '100.0 µs' (never finer than 100 ns)
    format_duration(2e6, significant=3)     # '2 ms' (plot labels)

Sizes use binary units (B, KiB, MiB, GiB, TiB); durations take nanoseconds and use ns, µs, ms, s.
Both give "-" for None (a value a capture does not have).
"""

from __future__ import annotations

BYTE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))
"""(name, bytes) from the smallest unit up."""

DURATION_UNITS = (("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9))
"""(name, nanoseconds) from the smallest unit up."""

_MAX_DECIMALS = {"ns": 0, "µs": 1, "ms": 4, "s": 7}  # never finer than 100 ns (whole ns under 1 µs)


def format_bytes(n: int | float | None, digits: int = 1) -> str:
    """``n`` bytes in the largest binary unit it reaches (up to TiB), with ``digits`` decimals;
    under 1 KiB a whole number of bytes: 1000 -> '1000 B', 1536 -> '1.5 KiB', with digits=2
    '1.50 KiB'. None -> '-'."""
    if n is None:
        return "-"
    n = float(n)
    name, unit = BYTE_UNITS[0]
    for name_up, unit_up in BYTE_UNITS[1:]:
        if abs(n) < unit_up:
            break
        name, unit = name_up, unit_up
    if unit == 1:
        return f"{n:.0f} B"
    return f"{n / unit:.{digits}f} {name}"


def format_duration(ns: int | float | None, digits: int = 1, *, significant: int | None = None) -> str:
    """``ns`` nanoseconds in the largest unit it reaches (ns, µs, ms, s), the sign kept, with
    ``digits`` decimals but never finer than 100 ns (at most 1 decimal in µs; whole ns under
    1 µs): 1_234_567 -> '1.2 ms', with digits=3 '1.235 ms'; 12_345 -> '12.3 µs' with any digits
    from 1 up; 999 -> '999 ns'. ``significant`` instead gives that many significant digits,
    trailing zeros dropped (``%g``, for plot labels): format_duration(2e6, significant=3) -> '2 ms'.
    None -> '-'."""
    if ns is None:
        return "-"
    ns = float(ns)
    name, unit = DURATION_UNITS[0]
    for name_up, unit_up in DURATION_UNITS[1:]:
        if abs(ns) < unit_up:
            break
        name, unit = name_up, unit_up
    if significant is not None:
        return f"{ns / unit:.{significant}g} {name}"
    return f"{ns / unit:.{min(digits, _MAX_DECIMALS[name])}f} {name}"


def format_iteration(index: int, count: int) -> str:
    """``iteration 4 of 0..8``: an iteration of the main regime as every verb numbers it (from 0,
    as ``IterationModel.main_rows()`` and the saving curve count them); ``count`` in the regime."""
    return f"iteration {index} of 0..{count - 1}" if count > 0 and index >= 0 else "iteration ?"
