"""CSV: one row per event, in time order.

Columns: time_ns, pid, event, op_seq, name, stream, block, addr, size, offset, bytes.
Events: ``alloc`` and ``free`` (one per block; block, addr, size, stream), ``launch``,
``memcpy``, ``memset``, ``graph_launch`` (one per op; op_seq, name, stream, bytes for copies and
sets), ``access`` (one per block an op touched, right after its op; op_seq, name, block, addr,
size, offset), ``untracked`` (a free or unmap of an address pyobmem never saw allocated),
``swap_out`` and ``swap_in`` (swap mode: a block's device memory released after its copy to host
memory / the block back on the device; name: the swap-in's cause, prefetch, late or demand, or
the swap-out's, planned, budget or room, empty in captures before session 13;
block, addr, size, stream of the copy, bytes copied) and ``dropped`` (events lost in the ring;
``bytes`` holds the count). Empty cells are fields that do not apply. ``time_ns``: ns from the first
CUDA event of the capture (t = 0 of every verb; ``cuda_span``), negative for the few records before
it; ``block``: ``pid:block id`` as every verb shows it (``Capture.block_label``); addresses hex.
"""

from __future__ import annotations

import csv as _csv

import numpy as np

from .. import abi
from ..model.queries import cuda_span, op_names

COLUMNS = ("time_ns", "pid", "event", "op_seq", "name", "stream", "block", "addr", "size", "offset", "bytes")
_OP_EVENT = {abi.Ev.LAUNCH: "launch", abi.Ev.MEMCPY: "memcpy", abi.Ev.MEMSET: "memset",
             abi.Ev.GRAPH_LAUNCH: "graph_launch"}
_UNTRACKED = {int(k): k.name.lower() for k in abi.UntrackedKind}
_CAUSE = {int(k): k.name.lower() for k in abi.SwapInCause}
_OUT_CAUSE = {int(k): k.name.lower() for k in abi.SwapOutCause}


def rows(capture):
    """The rows (tuples in COLUMNS order), sorted by time; ties keep alloc/free before ops and
    each op before its accesses."""
    out: list[tuple] = []  # (time, rank, index, sub, row), time from the origin
    t0 = cuda_span(capture)[0]
    b = capture.blocks
    b_label = [capture.block_label(i) for i in range(len(b))]
    for i in range(len(b)):
        blk = b[i]
        common = (int(blk["pid"]),)
        tail = (int(blk["stream"]), b_label[i], hex(int(blk["addr"])), int(blk["size"]), "", "")
        t = int(blk["t_alloc"]) - t0
        out.append((t, 0, i, 0, (t, *common, "alloc", "", "", *tail)))
        if blk["t_free"] >= 0:
            t = int(blk["t_free"]) - t0
            out.append((t, 0, i, 1, (t, *common, "free", "", "", *tail)))
    ops = capture.ops
    names = op_names(capture)
    acc = capture.accesses
    starts = np.searchsorted(acc["op"], np.arange(len(ops) + 1), side="left").tolist()
    o_ts, o_pid, o_seq = ops["ts_ns"].tolist(), ops["pid"].tolist(), ops["seq"].tolist()
    o_stream, o_type, o_bytes = ops["stream"].tolist(), ops["type"].tolist(), ops["bytes"].tolist()
    a_block, a_off = acc["block"].tolist(), acc["offset"].tolist()
    b_addr, b_size = [hex(a) for a in b["addr"].tolist()], b["size"].tolist()
    for i in range(len(ops)):
        t, pid, seq, stream, typ = o_ts[i] - t0, o_pid[i], o_seq[i], o_stream[i], o_type[i]
        nbytes = o_bytes[i] if typ in (abi.Ev.MEMCPY, abi.Ev.MEMSET) else ""
        out.append((t, 1, i, 0, (t, pid, _OP_EVENT.get(typ, str(typ)), seq, names[i], stream, "", "", "", "", nbytes)))
        for k in range(starts[i], starts[i + 1]):
            r = a_block[k]
            out.append((t, 1, i, 1 + k, (t, pid, "access", seq, names[i], stream, b_label[r], b_addr[r], b_size[r],
                                         a_off[k], "")))
    u = capture.untracked
    for i in range(len(u)):
        t, kind = int(u["ts_ns"][i]) - t0, int(u["kind"][i])
        out.append((t, 2, i, 0, (t, int(u["pid"][i]), "untracked", "", _UNTRACKED.get(kind, str(kind)), "", "",
                                 hex(int(u["addr"][i])), "", "", "")))
    sw = capture.swaps
    for i in range(len(sw)):
        t, r = int(sw["ts_ns"][i]) - t0, int(sw["block"][i])
        out_dir = int(sw["direction"][i]) == 0
        c = int(sw["cause"][i])
        cause = ((_OUT_CAUSE.get(c, str(c)) if c else "") if out_dir else _CAUSE.get(c, str(c)))
        out.append((t, 2, len(u) + i, 0, (t, int(sw["pid"][i]), "swap_out" if out_dir else "swap_in", "", cause,
                                          int(sw["stream"][i]),
                                          b_label[r] if r >= 0 else f"{int(sw['pid'][i])}:{int(sw['block_id'][i])}",
                                          b_addr[r] if r >= 0 else "", b_size[r] if r >= 0 else "", "",
                                          int(sw["bytes"][i]))))
    d = capture.drops
    for i in range(len(d)):
        t = int(d["ts_ns"][i]) - t0
        out.append((t, 3, i, 0, (t, int(d["pid"][i]), "dropped", "", "", "", "", "", "", "", int(d["count"][i]))))
    out.sort(key=lambda r: r[:4])
    return [r[4] for r in out]


def write(capture, f) -> None:
    """Write the CSV of ``capture`` (header line, then ``rows``) to the text file ``f``."""
    w = _csv.writer(f, lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows(rows(capture))
