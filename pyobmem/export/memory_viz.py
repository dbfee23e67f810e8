"""PyTorch memory snapshot pickle: what pytorch.org/memory_viz and ``torch.cuda._memory_viz`` read.

The schema is PyTorch's (torch/cuda/memory.py ``_snapshot`` docstring, written by
torch/csrc/cuda/memory_snapshot.cpp, read by torch/cuda/_memory_viz.py and
torch/utils/viz/MemoryViz.js)::

    {"segments": [Segment], "device_traces": [[TraceEntry] per device], "allocator_settings": {}}
    Segment: device, address, total_size, allocated_size, active_size, requested_size, stream,
             segment_type ("large"/"small"), segment_pool_id (0, 0), is_expandable, frames, blocks
    Block:   address, size, requested_size, state ("active_allocated"/"inactive"), frames
    TraceEntry: action, addr, size, stream, time_us, frames (and "category", read by MemoryViz.js)
    Frame:   filename, line, name

A pyobmem block is one driver allocation, which is what PyTorch calls a segment. So each block is
a segment holding one allocation of its whole size: it enters the trace as ``segment_alloc`` +
``alloc`` and leaves as ``free_requested`` + ``free_completed`` + ``segment_free``; ``segments``
lists the blocks still live at the end of the capture. Frames carry what pyobmem knows instead of a
Python stack: the block's class (root frame) and the kernels that touched it first and last, so the
viewer's stack panel and flame graphs group by them; ``category`` (the class) colours the Active
Memory Timeline.
"""

from __future__ import annotations

import pickle

import numpy as np

from .. import abi
from ..model import analyse
from ..model.queries import op_names

SEGMENT_FIELDS = ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                  "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks")
BLOCK_FIELDS = ("address", "size", "requested_size", "state", "frames")
TRACE_FIELDS = ("action", "addr", "size", "stream", "time_us", "frames")
FRAME_FIELDS = ("filename", "line", "name")
LARGE_SEGMENT = 1 << 20  # PyTorch's large pool: allocations over 1 MiB
# MemoryViz.js has its own unpickler: protocols 2-4 only, and a fixed set of opcodes
# (tests/test_export_memory_viz.py checks the file uses no other).
PICKLE_PROTOCOL = 4

# MemoryViz.js expects "unknown" among the categories once any event has one (it appends it
# itself otherwise, through a misspelt attribute in some versions): free events carry it.
_UNKNOWN = "unknown"


def _frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": int(line), "name": name}


def block_frames(capture, classes: list[str]) -> list[list[dict]]:
    """Frames of each block, innermost first: last and first accessing kernel, then the class."""
    acc = capture.accesses
    n = len(capture.blocks)
    first_op = np.full(n, -1, np.int64)
    last_op = np.full(n, -1, np.int64)
    n_acc = np.zeros(n, np.int64)
    if len(acc):
        # accesses are grouped by op in op order: the first row per block is its first access
        blk = acc["block"]
        uniq, first_idx = np.unique(blk, return_index=True)
        first_op[uniq] = acc["op"][first_idx]
        uniq_r, last_idx = np.unique(blk[::-1], return_index=True)
        last_op[uniq_r] = acc["op"][::-1][last_idx]
        n_acc = np.bincount(blk, minlength=n)
    names = op_names(capture)
    seqs = capture.ops["seq"]
    out = []
    for i in range(n):
        root = _frame(f"pyobmem/{classes[i]}", int(capture.blocks["block_id"][i]),
                      f"block {capture.block_label(i)}: {classes[i]}, {int(n_acc[i])} accesses")
        if first_op[i] < 0:
            out.append([_frame("never accessed", 0, "(no kernel touched this block)"), root])
            continue
        f, l = int(first_op[i]), int(last_op[i])
        frames = [_frame("first access", int(seqs[f]), names[f])]
        if l != f:
            frames.insert(0, _frame("last access", int(seqs[l]), names[l]))
        out.append(frames + [root])
    return out


def snapshot(capture) -> dict:
    """The snapshot dict (see the module docstring) for ``capture``."""
    blocks = capture.blocks
    classes = list(analyse(capture, progress=False).block_class)
    frames = block_frames(capture, classes)
    n_dev = int(blocks["device"].max()) + 1 if len(blocks) else 1
    traces: list[list[tuple]] = [[] for _ in range(n_dev)]
    segments = []
    for i in range(len(blocks)):
        b = blocks[i]
        if int(b["kind"]) == abi.AllocKind.HOST:  # pinned host memory is no device memory
            continue
        addr, size, dev, stream = int(b["addr"]), int(b["size"]), int(b["device"]), int(b["stream"])
        t_alloc, t_free = int(b["t_alloc"]), int(b["t_free"])
        common = {"addr": addr, "size": size, "stream": stream}
        traces[dev].append((t_alloc, i, 0, {"action": "segment_alloc", **common, "time_us": t_alloc // 1000,
                                            "frames": frames[i], "category": classes[i]}))
        traces[dev].append((t_alloc, i, 1, {"action": "alloc", **common, "time_us": t_alloc // 1000,
                                            "frames": frames[i], "category": classes[i]}))
        if t_free >= 0:
            for k, action in enumerate(("free_requested", "free_completed", "segment_free")):
                traces[dev].append((t_free, i, 2 + k, {"action": action, **common, "time_us": t_free // 1000,
                                                       "frames": frames[i], "category": _UNKNOWN}))
        else:
            segments.append({
                "device": dev, "address": addr, "total_size": size, "allocated_size": size,
                "active_size": size, "requested_size": size, "stream": stream,
                "segment_type": "large" if size > LARGE_SEGMENT else "small", "segment_pool_id": (0, 0),
                "is_expandable": False, "frames": frames[i],
                "blocks": [{"address": addr, "size": size, "requested_size": size,
                            "state": "active_allocated", "frames": frames[i]}],
            })
    device_traces = []
    for tr in traces:
        tr.sort(key=lambda e: e[:3])
        device_traces.append([e[3] for e in tr])
    segments.sort(key=lambda s: (s["device"], s["address"]))
    return {"segments": segments, "device_traces": device_traces, "allocator_settings": allocator_settings(capture)}


def allocator_settings(capture) -> dict:
    """PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) as recorded in the capture, if any."""
    meta = capture.meta if isinstance(capture.meta, dict) else {}
    env = meta.get("env")
    if not isinstance(env, dict):  # a capture edited by hand: no settings to report
        return {}
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", env.get("PYTORCH_ALLOC_CONF"))
    return {} if conf is None else {"PYTORCH_CUDA_ALLOC_CONF": str(conf)}


def write(capture, f) -> None:
    """Pickle the snapshot of ``capture`` into the binary file ``f``."""
    pickle.dump(snapshot(capture), f, protocol=PICKLE_PROTOCOL)
