"""A device-memory budget and byte sizes as the user writes them (``--budget``, ``--min-swap-bytes``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PyobmemError

BARE_NUMBER = ("a number without a unit is a fraction of the card when at most 1 (0.75; 1 is the whole card), "
               "else whole bytes; give other sizes with a unit (1.5GiB) or as a percentage of the card (75%)")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")
_UNITS = {
    "": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
    "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40,
}



@dataclass(frozen=True)
class Budget:
    """A device-memory budget: ``bytes`` (absolute) or ``fraction`` (of the card's total memory,
    0 < f <= 1, resolved once the card is known). ``text``: as the user wrote it."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, total_bytes: int | None) -> int | None:
        """Bytes of the budget; a fraction needs ``total_bytes`` (None while unknown)."""
        if self.bytes is not None:
            return self.bytes
        if not total_bytes:
            return None
        return int(self.fraction * int(total_bytes))


def parse_budget(text: str) -> Budget:
    """``16GiB``, ``16G`` (binary), ``16GB`` (decimal), ``500MiB``, ``75%`` (of the card's memory,
    the only size known at launch, not of the job's peak) or a number without a unit: a fraction
    of the card when at most 1 (``0.75``; ``1``: the whole card), else whole bytes (``123456``).
    Raises PyobmemError (exit 2) with one line."""
    m = _SIZE.match(str(text))
    if not m:
        raise PyobmemError(f"bad budget {text!r}: use a size (16GiB, 500MiB, bytes) or a share of the card (75%, 0.75)", 2)
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        if not 0 < value <= 100:
            raise PyobmemError(f"bad budget {text!r}: a percentage of the card must be in (0, 100]", 2)
        return Budget(text=text, fraction=value / 100)
    if unit == "":
        if value <= 0:
            raise PyobmemError(f"bad budget {text!r}: must be positive", 2)
        if value <= 1:
            return Budget(text=text, fraction=value)
        if value != int(value) or "." in m.group(1):
            raise PyobmemError(f"bad budget {text!r}: {BARE_NUMBER}", 2)
    if unit not in _UNITS:
        raise PyobmemError(f"bad budget {text!r}: unknown unit {m.group(2)!r} (B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB, %)", 2)
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise PyobmemError(f"bad budget {text!r}: must be positive", 2)
    return Budget(text=text, bytes=n)


def parse_size(text: str, what: str = "size") -> int:
    """A byte size (``4MiB``, ``4M``, ``4194304``); no fractions. Raises PyobmemError (exit 2)."""
    try:
        b = parse_budget(text) if _SIZE.match(str(text)) else None
    except PyobmemError as e:  # its message names the budget
        raise PyobmemError(str(e).replace("bad budget", f"bad {what}", 1), 2) from None
    if b is None or b.bytes is None:
        raise PyobmemError(f"bad {what} {text!r}: use a size such as 4MiB or a number of bytes", 2)
    return b.bytes
