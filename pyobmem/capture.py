"""The capture file: a versioned header, JSON metadata, then raw 64-byte event records.

Layout (docs/internals.md): b"PYOBCAPT", u32 version, u32 JSON length, JSON, records. The writer
appends records as they arrive and flushes, so a capture whose traced process or daemon was
killed stays readable up to its last whole record; only a clean end adds CAPTURE_END.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from . import abi
from .errors import CaptureError

MAGIC = b"PYOBCAPT"
CAPTURE_VERSION = 1
_PREFIX = struct.Struct("<8sII")

OPS_DTYPE = np.dtype(
    [
        ("pid", "<u4"), ("seq", "<u8"), ("ts_ns", "<i8"), ("type", "<u2"), ("handle", "<u8"),
        ("stream", "<u8"), ("flags", "<u2"), ("grid", "<u8"), ("n_touched", "<u4"),
        ("n_words", "<u4"), ("bytes", "<u8"), ("copy_kind", "<u2"),
    ]
)
BLOCKS_DTYPE = np.dtype(
    [
        ("pid", "<u4"), ("block_id", "<u8"), ("addr", "<u8"), ("size", "<u8"), ("kind", "<u1"),
        ("device", "<u2"), ("stream", "<u8"), ("t_alloc", "<i8"), ("t_free", "<i8"),
    ]
)
ACCESSES_DTYPE = np.dtype([("op", "<i8"), ("block", "<i8"), ("offset", "<u8")])
# rank, local_rank: -1 when unknown; world_size 0 when unknown; rank_source abi.RankSource (NONE:
# the process was given no rank). From the pid's last PROCESS record, as ``source``.
PROCESSES_DTYPE = np.dtype(
    [("pid", "<u4"), ("ppid", "<u4"), ("ts_ns", "<i8"), ("driver_version", "<u4"), ("source", "<u1"),
     ("rank", "<i8"), ("local_rank", "<i8"), ("world_size", "<u4"), ("rank_source", "<u1")]
)
UNTRACKED_DTYPE = np.dtype([("pid", "<u4"), ("ts_ns", "<i8"), ("addr", "<u8"), ("kind", "<u1")])
DROPS_DTYPE = np.dtype([("pid", "<u4"), ("ts_ns", "<i8"), ("count", "<u8")])
# Swap mode: one row per SWAP_OUT / SWAP_IN event. direction 0 = out, 1 = in; cause: a swap-in's
# abi.SwapInCause (1 prefetch hit, 2 late prefetch = stall, 3 demand = the safety net), a swap-out's
# abi.SwapOutCause (1 planned, 2 budget eviction, 3 out of device memory; 0 before session 13).
SWAPS_DTYPE = np.dtype(
    [("ts_ns", "<i8"), ("pid", "<u4"), ("block", "<i8"), ("block_id", "<u8"), ("bytes", "<u8"),
     ("direction", "<u1"), ("cause", "<u1"), ("duration_ns", "<u8"), ("stream", "<u8")]
)
# One row per PLAN event: adopted (dropped False: value = actions) or dropped for a template
# mismatch (dropped True: value = position in the iteration where the launch stream left it).
PLANS_DTYPE = np.dtype(
    [("ts_ns", "<i8"), ("pid", "<u4"), ("generation", "<u8"), ("value", "<u8"), ("dropped", "?"),
     ("seen", "<u8"), ("expected", "<u8")]  # dropped: the op keys issued and expected there
)
SWAP_OUT, SWAP_IN = 0, 1
# One row per NCCL event (native/nccl.c): the call (abi.NcclCall), the blocks it names as rows of
# ``blocks`` (-1: that side is absent or in no known block) with the offsets into them, bytes,
# stream, peer or root rank (-1: none) and the communicator's index in its process (-1: none; its
# rank is NOTE nccl.comm<index>).
NCCL_DTYPE = np.dtype(
    [("ts_ns", "<i8"), ("pid", "<u4"), ("call", "<u1"), ("send_block", "<i8"), ("send_offset", "<u8"),
     ("recv_block", "<i8"), ("recv_offset", "<u8"), ("bytes", "<u8"), ("stream", "<u8"), ("peer", "<i4"),
     ("comm", "<i4")]
)

# One row per GPU_TIME event (native/gpuclock.c): op ``seq`` of ``pid`` (``op``: its row in
# ``ops``, -1 if it is not there) had run on the GPU at ``t_gpu`` (CLOCK_MONOTONIC ns, the capture's
# time base), on ``stream``; ``ts_ns``: when the shim read it back. Sorted by pid, then seq.
GPU_TIMES_DTYPE = np.dtype(
    [("pid", "<u4"), ("seq", "<u8"), ("op", "<i8"), ("stream", "<u8"), ("t_gpu", "<i8"), ("ts_ns", "<i8")]
)

_OP_TYPES = (abi.Ev.LAUNCH, abi.Ev.MEMCPY, abi.Ev.MEMSET, abi.Ev.GRAPH_LAUNCH)
# Per op type: column of OPS_DTYPE <- field of its payload (abi.h); columns not named stay 0.
_OP_COLUMNS = {
    abi.Ev.LAUNCH: {"seq": "op", "handle": "function", "stream": "stream", "grid": "grid", "n_touched": "n_touched",
                    "n_words": "n_words"},
    abi.Ev.GRAPH_LAUNCH: {"seq": "op", "handle": "graph_exec", "stream": "stream", "n_touched": "n_touched"},
    abi.Ev.MEMCPY: {"seq": "op", "stream": "stream", "bytes": "bytes", "copy_kind": "flags"},
    abi.Ev.MEMSET: {"seq": "op", "stream": "stream", "bytes": "bytes"},
}


class CaptureWriter:
    """Append-only capture writer used by the daemon.

    ``CaptureWriter(path, meta)`` creates ``path`` (refusing an existing file unless
    ``force``), writes the header with ``meta`` (a JSON-serialisable dict), and then takes
    record arrays (``abi.RECORD_DTYPE``) through ``write``. ``finish(dropped, exit_status)``
    appends the CAPTURE_END record. Raises OSError on I/O errors.
    """

    def __init__(self, path: str, meta: dict, force: bool = False):
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
        self._fd = os.open(path, flags, 0o644)
        blob = json.dumps(meta, sort_keys=True).encode()
        try:
            self._size = 0
            self._write_all(_PREFIX.pack(MAGIC, CAPTURE_VERSION, len(blob)) + blob)
        except BaseException:
            os.close(self._fd)
            raise
        self.records_written = 0

    def _write_all(self, data: bytes) -> int:
        """Write all of ``data`` (os.write may write less, e.g. when the disk fills up)."""
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                done += os.write(self._fd, view[done:])
        finally:
            self._size += done
        return done

    def write(self, records: np.ndarray) -> None:
        """Append records (a structured array of ``abi.RECORD_DTYPE``) and push them to the OS.

        On an I/O error (disk full) a record written in part is cut off again, so the file
        stays a whole number of records and readable; the error is raised.
        """
        if not len(records):
            return
        start = self._size
        try:
            self._write_all(records.tobytes())
        except OSError:
            whole = (self._size - start) // abi.RECORD_SIZE
            self._size = start + whole * abi.RECORD_SIZE
            self.records_written += whole
            try:
                os.ftruncate(self._fd, self._size)
                os.lseek(self._fd, self._size, os.SEEK_SET)
            except OSError:
                pass
            raise
        self.records_written += len(records)

    def finish(self, dropped: int, exit_status: int | None, ts_ns: int) -> None:
        """Append CAPTURE_END (``dropped`` events lost in total, the command's exit status)."""
        end = abi.records(abi.Ev.CAPTURE_END)
        end["ts_ns"] = ts_ns
        end["dropped"] = dropped
        end["exit_status"] = exit_status if exit_status is not None else -(1 << 31)
        self.write(end.view(abi.RECORD_DTYPE))

    def close(self) -> None:
        """Flush to disk and close."""
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)


@dataclass
class Capture:
    """A decoded capture. Arrays are numpy structured arrays (dtypes above), sorted by time.

    ``blocks`` has one row per block (t_free = -1 if never freed); ``ops`` one row per kernel
    launch, copy, memset or graph launch; ``accesses`` one row per (op, block) touched, with
    ``op`` and ``block`` as row indices into ``ops`` and ``blocks``. Times are CLOCK_MONOTONIC
    ns, sizes bytes. See docs/internals.md.
    """

    path: str
    meta: dict
    complete: bool
    exit_status: int | None
    dropped: int
    drops: np.ndarray = field(repr=False)
    notes: dict = field(repr=False)
    processes: np.ndarray = field(repr=False)
    kernel_names: dict = field(repr=False)
    blocks: np.ndarray = field(repr=False)
    ops: np.ndarray = field(repr=False)
    accesses: np.ndarray = field(repr=False)
    untracked: np.ndarray = field(repr=False)
    swaps: np.ndarray = field(default_factory=lambda: np.zeros(0, SWAPS_DTYPE), repr=False)
    plans: np.ndarray = field(default_factory=lambda: np.zeros(0, PLANS_DTYPE), repr=False)
    nccl: np.ndarray = field(default_factory=lambda: np.zeros(0, NCCL_DTYPE), repr=False)
    gpu_times: np.ndarray = field(default_factory=lambda: np.zeros(0, GPU_TIMES_DTYPE), repr=False)

    def kernel_name(self, op_row: int) -> str:
        """A readable name of ``ops[op_row]``: kernel name, "memcpy HtoD", "memset", "graph 0x…"."""
        op = self.ops[op_row]
        t = int(op["type"])
        if t == abi.Ev.MEMCPY:
            kind = int(op["copy_kind"]) & 0xFF
            return "memcpy " + (abi.CopyKind(kind).name if kind in abi.CopyKind._value2member_map_ else "?")
        if t == abi.Ev.MEMSET:
            return "memset"
        if t == abi.Ev.GRAPH_LAUNCH:
            return f"graph {int(op['handle']):#x}"
        return self.kernel_names.get((int(op["pid"]), int(op["handle"])), f"kernel {int(op['handle']):#x}")

    def block_label(self, row: int) -> str:
        """The id of ``blocks[row]`` that every verb shows: ``"<pid>:<block id>"`` (``"2160:12"``;
        the shim numbers blocks per process, so the pid makes it unique in the capture)."""
        return f"{int(self.blocks['pid'][row])}:{int(self.blocks['block_id'][row])}"


def read_header(path: str) -> tuple[dict, int]:
    """Read and check the header; returns (metadata dict, offset of the first record).

    Raises CaptureError for a missing, foreign, truncated or newer-version file.
    """
    try:
        with open(path, "rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < _PREFIX.size:
                if not prefix.startswith(MAGIC[: len(prefix)]) or not prefix:
                    raise CaptureError(f"{path}: not a pyobmem capture")
                raise CaptureError(f"{path}: truncated capture (header incomplete)")
            magic, version, n = _PREFIX.unpack(prefix)
            if magic != MAGIC:
                raise CaptureError(f"{path}: not a pyobmem capture")
            if version == 0:
                raise CaptureError(f"{path}: corrupt capture (format version 0)")
            if version > CAPTURE_VERSION:
                raise CaptureError(
                    f"{path}: capture format version {version} is newer than this pyobmem reads "
                    f"({CAPTURE_VERSION}); upgrade pyobmem"
                )
            blob = f.read(n)
    except OSError as e:
        raise CaptureError(f"{path}: cannot read capture: {e.strerror}") from None
    if len(blob) < n:
        raise CaptureError(f"{path}: truncated capture (metadata incomplete)")
    try:
        meta = json.loads(blob)
    except ValueError:
        raise CaptureError(f"{path}: corrupt capture metadata") from None
    if not isinstance(meta, dict):
        raise CaptureError(f"{path}: corrupt capture metadata")
    return _typed_meta(meta), _PREFIX.size + n


# The metadata keys the launcher writes and their types: a value of another type (a hand-edited
# or foreign file) is left out, so no reader has to check types.
_META_TYPES = {
    "argv": list, "command": str, "executable": str, "cwd": str, "pyobmem_version": str,
    "start_time": (int, float), "start_time_iso": str, "start_monotonic_ns": int, "presets": dict,
    "env": dict, "hostname": str, "shim": str, "cupti": str, "ring_capacity": int, "launcher_pid": int,
    "swap": dict, "copy_bandwidth": (int, float), "blocks": str,
}


def _typed_meta(meta: dict) -> dict:
    out = {}
    for key, value in meta.items():
        want = _META_TYPES.get(key)
        if want is not None and (not isinstance(value, want) or isinstance(value, bool)):
            continue
        if key == "argv" and not all(isinstance(a, str) for a in value):
            continue
        if key in ("env", "presets") and not all(isinstance(v, str) for v in value.values()):
            continue
        out[key] = value
    return out


def read_records(path: str) -> tuple[dict, np.ndarray]:
    """Header metadata and every whole record (a partial trailing record is ignored)."""
    meta, offset = read_header(path)
    size = os.path.getsize(path)
    count = (size - offset) // abi.RECORD_SIZE
    recs = np.fromfile(path, dtype=abi.RECORD_DTYPE, count=count, offset=offset)
    return meta, recs


def _texts(recs: np.ndarray) -> dict:
    """Group text chunk records (KERNEL_NAME) by (pid, key) and join them; returns {(pid, key): text}."""
    out: dict = {}
    if not len(recs):
        return out
    recs = abi.view(recs, abi.Ev.KERNEL_NAME)
    payload = recs["text"]
    pids, keys, flags = recs["pid"], recs["key"], recs["flags"]
    parts: dict = {}
    for i in range(len(recs)):
        k = (int(pids[i]), int(keys[i]))
        parts.setdefault(k, []).append(bytes(payload[i]))
        if flags[i] & abi.TEXT_LAST:
            out[k] = b"".join(parts.pop(k)).split(b"\0", 1)[0].decode("utf-8", "replace")
    for k, chunks in parts.items():  # a name whose last chunk was lost
        out.setdefault(k, b"".join(chunks).split(b"\0", 1)[0].decode("utf-8", "replace"))
    return out


def read_capture(path: str) -> Capture:
    """Read and decode a capture file into a ``Capture``.

    Raises CaptureError (exit code 2) for a missing, foreign, truncated-header or newer file.
    A capture cut short (no CAPTURE_END) is read up to its last whole record, complete=False.
    """
    meta, recs = read_records(path)
    return decode_records(recs, meta, path)


def decode_records(recs: np.ndarray, meta: dict | None = None, path: str = "<records>") -> Capture:
    """Decode an array of records (``abi.RECORD_DTYPE``, in drain order) into a ``Capture``: what
    ``read_capture`` does after reading the file, used as is by the daemon on the records it
    keeps in memory (swap mode)."""
    meta = {} if meta is None else meta
    rtype = recs["type"]

    def of(ev: abi.Ev) -> np.ndarray:  # the records of one type, their payload named (abi.h)
        return abi.view(recs[rtype == ev], ev)

    end = of(abi.Ev.CAPTURE_END)
    complete = len(end) > 0
    exit_status = None
    if complete:
        status = int(end["exit_status"][-1])
        exit_status = None if status == -(1 << 31) else status

    drop_recs = of(abi.Ev.DROPPED)
    drops = np.zeros(len(drop_recs), dtype=DROPS_DTYPE)
    drops["pid"], drops["ts_ns"], drops["count"] = drop_recs["pid"], drop_recs["ts_ns"], drop_recs["count"]
    dropped = int(end["dropped"][-1]) if complete else int(drops["count"].sum())

    notes: dict = {}
    for rec_pid, text in _texts_sequential(recs[rtype == abi.Ev.NOTE]):
        key, _, value = text.partition("=")
        notes.setdefault(rec_pid, {})[key] = value

    kernel_names = _texts(recs[rtype == abi.Ev.KERNEL_NAME])

    p = of(abi.Ev.PROCESS)
    # A pid writes PROCESS again when its launch source changes (abi.h): one row per pid, the
    # first record's time and the last record's source.
    _, first = np.unique(p["pid"], return_index=True)
    _, last_reversed = np.unique(p["pid"][::-1], return_index=True)
    order = np.argsort(first)  # processes in order of appearance
    first, last = first[order], (len(p) - 1 - last_reversed)[order]
    processes = np.zeros(len(first), dtype=PROCESSES_DTYPE)
    processes["pid"], processes["ppid"], processes["ts_ns"] = p["pid"][first], p["ppid"][first], p["ts_ns"][first]
    processes["driver_version"], processes["source"] = p["driver_version"][first], p["source"][last]
    p = p[last]
    ranked = p["rank_source"] != 0
    for name in ("rank", "local_rank"):
        processes[name] = np.where(ranked & (p[name] != abi.RANK_UNKNOWN), p[name].astype(np.int64), -1)
    processes["world_size"] = np.where(ranked, p["world_size"], 0)
    processes["rank_source"] = p["rank_source"]

    blocks, block_index = _blocks(recs)
    ops, accesses = _ops(recs, blocks, block_index)

    u = of(abi.Ev.UNTRACKED)
    untracked = np.zeros(len(u), dtype=UNTRACKED_DTYPE)
    untracked["pid"], untracked["ts_ns"], untracked["addr"], untracked["kind"] = u["pid"], u["ts_ns"], u["addr"], u["kind"]

    # SWAP_OUT and SWAP_IN share their payload struct (abi.h)
    sw = abi.view(recs[(rtype == abi.Ev.SWAP_OUT) | (rtype == abi.Ev.SWAP_IN)], abi.Ev.SWAP_OUT)
    swaps = np.zeros(len(sw), dtype=SWAPS_DTYPE)
    swaps["ts_ns"], swaps["pid"], swaps["block_id"], swaps["bytes"] = sw["ts_ns"], sw["pid"], sw["block_id"], sw["bytes"]
    swaps["block"] = block_index.lookup(sw["pid"], sw["block_id"]) if len(sw) else np.zeros(0, np.int64)
    swaps["direction"] = np.where(sw["type"] == abi.Ev.SWAP_IN, SWAP_IN, SWAP_OUT)
    swaps["cause"] = sw["flags"] & 0xFF
    swaps["duration_ns"], swaps["stream"] = sw["duration_ns"], sw["stream"]

    pl = of(abi.Ev.PLAN)
    plans = np.zeros(len(pl), dtype=PLANS_DTYPE)
    plans["ts_ns"], plans["pid"], plans["generation"], plans["value"] = pl["ts_ns"], pl["pid"], pl["generation"], pl["value"]
    plans["dropped"] = (pl["flags"] & 1) != 0
    plans["seen"], plans["expected"] = pl["seen"], pl["expected"]

    return Capture(
        path=path, meta=meta, complete=complete, exit_status=exit_status, dropped=dropped, drops=drops,
        notes=notes, processes=processes, kernel_names=kernel_names, blocks=blocks, ops=ops,
        accesses=accesses, untracked=untracked, swaps=swaps, plans=plans, nccl=_nccl(recs, block_index),
        gpu_times=_gpu_times(recs, ops),
    )


def _gpu_times(recs: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """One row per GPU_TIME record, with the op row it names, sorted by (pid, seq)."""
    g = abi.view(recs[recs["type"] == abi.Ev.GPU_TIME], abi.Ev.GPU_TIME)
    out = np.zeros(len(g), dtype=GPU_TIMES_DTYPE)
    out["pid"], out["seq"], out["stream"], out["ts_ns"] = g["pid"], g["op"], g["stream"], g["ts_ns"]
    out["t_gpu"] = g["t_gpu"]
    out["op"] = _KeyIndex(ops["pid"], ops["seq"]).lookup(g["pid"], g["op"]) if len(g) and len(ops) else -1
    return out[np.lexsort((out["seq"], out["pid"]))]


def _nccl(recs: np.ndarray, block_index: "_KeyIndex") -> np.ndarray:
    """One row per NCCL record; the access words resolved to block rows and offsets."""
    n = abi.view(recs[recs["type"] == abi.Ev.NCCL], abi.Ev.NCCL)
    out = np.zeros(len(n), dtype=NCCL_DTYPE)
    out["ts_ns"], out["pid"], out["call"] = n["ts_ns"], n["pid"], n["flags"] & 0xFF
    for side in ("send", "recv"):
        block_id, offset = abi.access_word_split(n[side])
        rows = block_index.lookup(n["pid"], block_id) if len(n) else np.zeros(0, np.int64)
        out[f"{side}_block"] = np.where(n[side] != 0, rows, -1)
        out[f"{side}_offset"] = np.where(out[f"{side}_block"] >= 0, offset, 0)
    out["bytes"], out["stream"] = n["bytes"], n["stream"]
    out["peer"] = n["peer"].view(np.int32)  # RANK_UNKNOWN: -1
    out["comm"] = n["comm"].view(np.int32)
    return out


def _texts_sequential(recs: np.ndarray) -> list:
    """Join chunked texts whose key is not unique (NOTEs): chunks run per pid until TEXT_LAST."""
    out = []
    if not len(recs):
        return out
    recs = abi.view(recs, abi.Ev.NOTE)
    payload = recs["text"]
    pending: dict = {}
    for i in range(len(recs)):
        pid = int(recs["pid"][i])
        pending.setdefault(pid, []).append(bytes(payload[i]))
        if recs["flags"][i] & abi.TEXT_LAST:
            out.append((pid, b"".join(pending.pop(pid)).split(b"\0", 1)[0].decode("utf-8", "replace")))
    return out


class _KeyIndex:
    """Vectorised map (pid, id) -> row; for a repeated key the last row wins."""

    def __init__(self, pids: np.ndarray, ids: np.ndarray):
        keys = self._keys(pids, ids)
        order = np.argsort(keys, kind="stable")
        self._keys_sorted = keys[order]
        self._rows = order

    @staticmethod
    def _keys(pids: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return (np.asarray(pids, np.uint64) << np.uint64(40)) | (np.asarray(ids, np.uint64) & np.uint64((1 << 40) - 1))

    def lookup(self, pids: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Rows of the given keys (int64), -1 where absent."""
        keys = self._keys(pids, ids)
        pos = np.searchsorted(self._keys_sorted, keys, side="right") - 1
        ok = pos >= 0
        ok[ok] = self._keys_sorted[pos[ok]] == keys[ok]
        return np.where(ok, self._rows[np.maximum(pos, 0)], -1).astype(np.int64)


def _blocks(recs: np.ndarray) -> tuple[np.ndarray, "_KeyIndex"]:
    """One row per block from ALLOC and FREE records; index (pid, block_id) -> row."""
    rtype = recs["type"]
    al = abi.view(recs[rtype == abi.Ev.ALLOC], abi.Ev.ALLOC)
    blocks = np.zeros(len(al), dtype=BLOCKS_DTYPE)
    for name in ("pid", "block_id", "addr", "size", "stream", "kind"):
        blocks[name] = al[name]
    blocks["device"], blocks["t_alloc"] = al["flags"], al["ts_ns"]
    blocks["t_free"] = -1
    # Block ids are per process and may wrap (24 bits): the latest allocation of an id wins.
    index = _KeyIndex(al["pid"], al["block_id"])
    fr = abi.view(recs[rtype == abi.Ev.FREE], abi.Ev.FREE)
    rows = index.lookup(fr["pid"], fr["block_id"])
    blocks["t_free"][rows[rows >= 0]] = fr["ts_ns"][rows >= 0]
    return blocks, index


def _ops(recs: np.ndarray, blocks: np.ndarray, block_index: _KeyIndex) -> tuple[np.ndarray, np.ndarray]:
    """Ops from LAUNCH/MEMCPY/MEMSET/GRAPH_LAUNCH; accesses from ACCESS records and copy sides."""
    rtype = recs["type"]
    is_op = np.isin(rtype, [int(t) for t in _OP_TYPES])
    o = recs[is_op]
    ops = np.zeros(len(o), dtype=OPS_DTYPE)
    for name in ("pid", "ts_ns", "type", "flags"):
        ops[name] = o[name]
    for ev, columns in _OP_COLUMNS.items():
        sel = o["type"] == ev
        typed = abi.view(o[sel], ev)
        for column, payload_field in columns.items():
            ops[column][sel] = typed[payload_field]
    ops["flags"][o["type"] == abi.Ev.MEMCPY] = 0  # a copy's flags are its copy_kind

    # Accesses: ACCESS records name their op by (pid, seq); copies and sets carry their own words.
    op_row = _KeyIndex(ops["pid"], ops["seq"])
    acc_recs = abi.view(recs[rtype == abi.Ev.ACCESS], abi.Ev.ACCESS)
    pairs = []  # (pid, op seq, word)
    for k in range(acc_recs.dtype["words"].shape[0]):
        w = acc_recs["words"][:, k]
        nz = w != 0
        pairs.append((acc_recs["pid"][nz], acc_recs["op"][nz], w[nz]))
    for ev, side in ((abi.Ev.MEMCPY, "dst"), (abi.Ev.MEMCPY, "src"), (abi.Ev.MEMSET, "dst")):
        c = abi.view(o[o["type"] == ev], ev)
        sel = c[side] != 0
        pairs.append((c["pid"][sel], c["op"][sel], c[side][sel]))
    pid = np.concatenate([p[0] for p in pairs]).astype(np.uint32)
    seq = np.concatenate([p[1] for p in pairs]).astype(np.uint64)
    word = np.concatenate([p[2] for p in pairs]).astype(np.uint64)
    block_id, offset = abi.access_word_split(word)
    acc = np.zeros(len(word), dtype=ACCESSES_DTYPE)
    acc["op"] = op_row.lookup(pid, seq)
    acc["block"] = block_index.lookup(pid, block_id)
    acc["offset"] = offset
    acc = acc[(acc["op"] >= 0) & (acc["block"] >= 0)]
    acc = acc[np.argsort(acc["op"], kind="stable")]
    return ops, acc
