"""The event ABI, read at import from the one definition, include/pyobmem/abi.h, with cffi.

cffi's parser (ABI mode: nothing is compiled) gives every enum, integer constant and struct
layout of the header; the Python side is built from that: enums as IntEnum/IntFlag classes named
in ``_ENUMS``, each object-like ``#define PYOBMEM_X`` as the module constant ``X`` (string
constants by a regex, as cdef takes none), and numpy structured dtypes from the structs' offsets
and sizes. Records: ``RECORD_DTYPE`` sees the payload as five words a..e (to move records);
``EVENT_DTYPES[Ev.X]`` names them as the type's payload struct (to read and write them), see
``view``. Function-like macros are C only; their Python forms are below, checked against the C
compiler by tests/test_abi.py.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

import numpy as np

try:
    import cffi
except ImportError:  # a user's one line, not a traceback (cffi is a dependency of the package)
    raise SystemExit("pyobmem: the cffi package is missing (pip install cffi): pyobmem reads its ABI with it") from None

HEADER = Path(__file__).resolve().parent / "include" / "pyobmem" / "abi.h"

# C enum -> (Python class, prefix its C member names drop, base class, docstring).
_ENUMS = {
    "pyobmem_event_type": ("Ev", "PYOBMEM_EV_", enum.IntEnum, "Event types (the record's ``type``)."),
    "pyobmem_nccl_call": ("NcclCall", "PYOBMEM_NCCL_", enum.IntEnum, "Which NCCL call an NCCL record is (flags)."),
    "pyobmem_rank_source": ("RankSource", "PYOBMEM_RANK_", enum.IntEnum,
                            "Which environment variables gave a process its rank (PROCESS rank_source)."),
    "pyobmem_swap_in_cause": ("SwapInCause", "PYOBMEM_SWAP_IN_", enum.IntEnum, "Why a block came back (SWAP_IN flags)."),
    "pyobmem_swap_out_cause": ("SwapOutCause", "PYOBMEM_SWAP_OUT_", enum.IntEnum,
                               "Why a block went out (SWAP_OUT flags; 0: not recorded, captures before session 13)."),
    "pyobmem_alloc_kind": ("AllocKind", "PYOBMEM_ALLOC_", enum.IntEnum, "How a block was allocated (ALLOC kind)."),
    "pyobmem_launch_flags": ("LaunchFlag", "PYOBMEM_LAUNCH_", enum.IntFlag, "Flags of a LAUNCH record."),
    "pyobmem_copy_kind": ("CopyKind", "PYOBMEM_COPY_", enum.IntEnum,
                          "Direction of a MEMCPY record (low byte of flags; COPY_ASYNC is or'ed in)."),
    "pyobmem_untracked_kind": ("UntrackedKind", "PYOBMEM_UNTRACKED_", enum.IntEnum, "What an UNTRACKED record saw."),
    "pyobmem_launch_source": ("LaunchSource", "PYOBMEM_SOURCE_", enum.IntEnum,
                              "Where a process's launches were attributed from (PROCESS source)."),
    "pyobmem_action_kind": ("ActionKind", "PYOBMEM_ACT_", enum.IntEnum, "What a plan action does."),
}
_PRIMITIVES = {"uint8_t": "<u1", "uint16_t": "<u2", "uint32_t": "<u4", "uint64_t": "<u8", "int32_t": "<i4",
               "int64_t": "<i8"}
_DEFINE = re.compile(r'^[ \t]*#[ \t]*define[ \t]+PYOBMEM_(\w+)[ \t]+("(?:[^"\\]|\\.)*"|\S+)', re.M)


def cdef_text(header: str) -> str:
    """The header as cffi's cdef takes it: no comments, includes, guards, string or function-like
    macros, nor _Static_assert lines (integer #defines with C suffixes stay: cdef reads them)."""
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.S).replace("\\\n", " ")
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") and not re.match(r'#\s*define\s+\w+\s+[^"\s]', s) or s.startswith("_Static_assert"):
            continue  # other directives, the guard's bare #define, string and function-like macros
        keep.append(line)
    return "\n".join(keep)


def _load(header: str):
    ffi = cffi.FFI()
    ffi.cdef(cdef_text(header))
    return ffi, ffi.dlopen(None)  # the process itself: the header's constants need no library


_TEXT = HEADER.read_text()
ffi, _lib = _load(_TEXT)

# Every object-like #define PYOBMEM_X as X (ints from cffi, strings as written).
for _name, _value in _DEFINE.findall(re.sub(r"/\*.*?\*/", " ", _TEXT, flags=re.S)):
    globals()[_name] = _value[1:-1] if _value.startswith('"') else getattr(_lib, "PYOBMEM_" + _name)
ACCESS_OFFSET_MASK = (1 << ACCESS_OFFSET_BITS) - 1  # noqa: F821 (a header constant)


def _enum(c_name: str, py_name: str, prefix: str, base: type, doc: str):
    members = sorted(ffi.typeof(f"enum {c_name}").relements.items(), key=lambda m: m[1])
    cls = base(py_name, [(n[len(prefix):], v) for n, v in members], module=__name__)
    cls.__doc__ = f"{doc} C: ``enum {c_name}``."
    return cls


for _c, (_py, _prefix, _base, _doc) in _ENUMS.items():
    globals()[_py] = _enum(_c, _py, _prefix, _base, _doc)
Ev = globals()["Ev"]  # for the lines below (the other enums are used only from outside)


def _fields(ctype, base: int = 0) -> list[tuple[str, object, int]]:
    """(name, numpy format, offset) of each field of a cffi struct type; padding is left out."""
    return [(name, _dtype(f.type), base + f.offset) for name, f in ctype.fields if not name.startswith("_pad")]


def _dtype(ctype) -> np.dtype:
    if ctype.kind == "primitive":
        return np.dtype(_PRIMITIVES[ctype.cname])
    if ctype.kind == "array":
        return np.dtype((_dtype(ctype.item), (ctype.length,)))
    if ctype.kind == "struct":
        return _struct(_fields(ctype), ffi.sizeof(ctype))
    raise TypeError(f"abi.h: no numpy form for {ctype.cname}")


def _struct(fields: list[tuple], itemsize: int) -> np.dtype:
    names = [f[0] for f in fields]
    if len(set(names)) != len(names):
        raise TypeError(f"abi.h: a record's payload field repeats a header field name: {names}")
    return np.dtype({"names": names, "formats": [f[1] for f in fields], "offsets": [f[2] for f in fields],
                     "itemsize": itemsize})


def _struct_dtype(name: str) -> np.dtype:
    return _dtype(ffi.typeof(f"struct {name}"))


_RECORD = ffi.typeof("struct pyobmem_record")
# The ring's and the record's own fields (the payload members of the union are structs).
_RECORD_HEAD = [(n, _dtype(f.type), f.offset) for n, f in _RECORD.fields if f.type.kind != "struct"]


def _record_dtype(member: str) -> np.dtype:
    """The record with union member ``member``'s fields in place of the payload."""
    f = dict(_RECORD.fields)[member]
    return _struct(_RECORD_HEAD + _fields(f.type, f.offset), ffi.sizeof(_RECORD))


RECORD_DTYPE = _record_dtype("words")
# One per event type: its payload struct, the union member named as the type in lower case.
EVENT_DTYPES = {ev: _record_dtype(ev.name.lower()) for ev in Ev if ev != Ev.NONE}
RING_HEADER_DTYPE = _struct_dtype("pyobmem_ring_header")
ACTION_DTYPE = _struct_dtype("pyobmem_action")
PLAN_DTYPE = _struct_dtype("pyobmem_plan")
CONTROL_DTYPE = _struct_dtype("pyobmem_control")


def view(records: np.ndarray, event_type: int) -> np.ndarray:
    """``records`` (``RECORD_DTYPE``, shape (n,)) seen as ``EVENT_DTYPES[event_type]``: the same
    bytes with the payload named (a view where the array is contiguous, else a copy)."""
    return np.ascontiguousarray(records).view(EVENT_DTYPES[Ev(event_type)])


def records(event_type: int, n: int = 1) -> np.ndarray:
    """``n`` zeroed records of ``event_type`` (``EVENT_DTYPES[event_type]``, type set), to fill by
    field name; ``.view(RECORD_DTYPE)`` gives them as plain records."""
    out = np.zeros(n, EVENT_DTYPES[Ev(event_type)])
    out["type"] = int(event_type)
    return out


def op_key_copy(event_type: int, copy_kind: int) -> int:
    """Template key of a copy or set (``PYOBMEM_OP_KEY_COPY``); launches use their handle."""
    return (0xFF << 56) | (int(event_type) << 16) | int(copy_kind)


def access_word_split(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split access words (``PYOBMEM_ACCESS_WORD``, uint64 array) into (block ids, byte offsets);
    0 words mean unused."""
    words = np.asarray(words, dtype=np.uint64)
    return words >> np.uint64(ACCESS_OFFSET_BITS), words & np.uint64(ACCESS_OFFSET_MASK)  # noqa: F821
