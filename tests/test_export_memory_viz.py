"""memory_viz export: PyTorch's snapshot schema (torch/cuda/memory.py ``_snapshot`` TypedDicts,
torch/csrc/cuda/memory_snapshot.cpp), totals, and a pickle MemoryViz.js can decode. The last
test runs PyTorch's own ``torch.cuda._memory_viz`` on it and is skipped without torch."""

import pickle
import pickletools
import subprocess
import sys

import pytest

from pyobmem.capture import read_capture
from pyobmem.export import export
from pyobmem.export.memory_viz import BLOCK_FIELDS, FRAME_FIELDS, SEGMENT_FIELDS, TRACE_FIELDS

from test_report import MiB, training_trace

# Opcodes MemoryViz.js's own unpickler handles (torch/utils/viz/MemoryViz.js ``unpickle``).
JS_OPCODES = {"APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1",
              "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2", "APPEND",
              "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1",
              "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}


@pytest.fixture
def exported(tmp_path):
    t, ids = training_trace(iterations=3)
    t.write(tmp_path / "t.pyobmem", meta={"argv": ["x"], "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
    cap = read_capture(str(tmp_path / "t.pyobmem"))
    out = tmp_path / "t.pickle"
    export(cap, "memory-viz", str(out))
    return cap, ids, out


def _frames_ok(frames):
    assert isinstance(frames, list) and frames
    for f in frames:
        assert set(f) == set(FRAME_FIELDS)
        assert isinstance(f["filename"], str) and isinstance(f["line"], int) and isinstance(f["name"], str)


def test_schema_and_totals(exported):
    cap, ids, out = exported
    snap = pickle.loads(out.read_bytes())
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    assert snap["allocator_settings"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # segments: the blocks live at the end (W1, W2, O, N), one active block each
    segs = snap["segments"]
    assert [s["total_size"] for s in segs] == [64 * MiB, 32 * MiB, 64 * MiB, 2 * MiB]
    for s, row in zip(segs, range(4)):
        assert set(s) == set(SEGMENT_FIELDS)
        assert s["address"] == int(cap.blocks["addr"][row]) and s["device"] == 0 and s["stream"] == 0
        assert s["allocated_size"] == s["active_size"] == s["requested_size"] == s["total_size"]
        assert s["segment_type"] == "large" and s["segment_pool_id"] == (0, 0) and s["is_expandable"] is False
        _frames_ok(s["frames"])
        (b,) = s["blocks"]
        assert set(b) == set(BLOCK_FIELDS)
        assert (b["address"], b["size"], b["requested_size"], b["state"]) == (s["address"], s["total_size"],
                                                                               s["total_size"], "active_allocated")
    assert segs[3]["frames"][0]["filename"] == "never accessed"
    assert segs[0]["frames"][-1]["name"] == "block 100:1: persistent, 9 accesses"
    assert [f["name"] for f in segs[0]["frames"][:2]] == ["adam_step", "fwd_gemm_1"]  # last, first access
    # device trace: 2 events per block, 3 more per freed block, in time order
    (trace,) = snap["device_traces"]
    n, freed = len(cap.blocks), int((cap.blocks["t_free"] >= 0).sum())
    assert (n, freed) == (16, 12)
    assert len(trace) == 2 * n + 3 * freed
    for e in trace:
        assert set(TRACE_FIELDS) <= set(e) <= set(TRACE_FIELDS) | {"category"}
        assert e["action"] in ACTIONS
        _frames_ok(e["frames"])
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)
    live = 0
    for e in trace:
        live += {"alloc": e["size"], "free_completed": -e["size"]}.get(e["action"], 0)
    assert live == sum(s["total_size"] for s in segs) == 162 * MiB
    assert {e["category"] for e in trace} == {"persistent", "never-accessed", "iteration-scoped", "transient",
                                              "unknown"}


def test_pickle_readable_by_memory_viz_js(exported):
    _, _, out = exported
    data = out.read_bytes()
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops <= JS_OPCODES, ops - JS_OPCODES
    assert data[0] == 0x80 and 2 <= data[1] <= 4  # PROTO 2..4


def test_torch_memory_viz_reads_it(exported):
    """Run on the GPU machine (torch installed): PyTorch's own readers accept the file."""
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz as mv

    _, _, out = exported
    snap = pickle.loads(out.read_bytes())
    stats = mv.segsum(snap)
    assert "segments: 4" in stats and "total_reserved: 162.0MiB" in stats and "total_allocated: 162.0MiB" in stats
    text = mv.trace(snap)
    assert "68 entries" in text and text.count("cudaMalloc(") == 16
    lines = mv.segments(snap, format_flamegraph=lambda s: s)
    assert lines.count("active_allocated") == 4
    assert "Active Memory Timeline" in mv.trace_plot(snap)
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "segments: 4" in r.stdout, r.stderr
