"""Perfetto / Chrome trace JSON: structure, counters equal to live bytes computed here, slices.

Perfetto's trace processor is not available offline (the PyPI ``perfetto`` package downloads
its binary at run time), so the JSON is checked against the Trace Event Format here.
"""

import json


from pyobmem.capture import read_capture
from pyobmem.export import export
from pyobmem.model.queries import cuda_span

from test_report import LOADER_NS, MiB, training_trace


def _load(tmp_path, top=None, iterations=5):
    t, ids = training_trace(iterations=iterations)
    t.write(tmp_path / "t.pyobmem")
    cap = read_capture(str(tmp_path / "t.pyobmem"))
    if top is None:
        export(cap, "perfetto", str(tmp_path / "t.json"))
        doc = json.loads((tmp_path / "t.json").read_text())
    else:
        from pyobmem.export.perfetto import trace
        doc = json.loads(json.dumps(trace(cap, top=top)))
    return cap, ids, doc


def test_structure(tmp_path):
    cap, _, doc = _load(tmp_path)
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"]["dropped_events"] == 0
    ev = doc["traceEvents"]
    for e in ev:
        assert e["ph"] in ("M", "C", "X") and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] != "M" or e["name"] != "process_name":
            assert isinstance(e.get("tid", 0), int)
        if e["ph"] in ("X", "C"):
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] > 0
    meta = [e for e in ev if e["ph"] == "M"]
    assert {"name": "pid 100"} in [e["args"] for e in meta if e["name"] == "process_name"]
    assert any(e["args"]["name"] == "stream 0x0 (launches)" for e in meta if e["name"] == "thread_name")


def test_counter_equals_live_bytes(tmp_path):
    cap, _, doc = _load(tmp_path)
    t0, _ = cuda_span(cap)  # t = 0 at the first CUDA event
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"device 0 live bytes"}
    # independent: replay alloc/free records in time order
    changes = {}
    for b in cap.blocks:
        changes[int(b["t_alloc"])] = changes.get(int(b["t_alloc"]), 0) + int(b["size"])
        if b["t_free"] >= 0:
            changes[int(b["t_free"])] = changes.get(int(b["t_free"]), 0) - int(b["size"])
    live, expect = 0, []
    for t in sorted(changes):
        live += changes[t]
        expect.append((round((t - t0) / 1000, 3), live))
    assert [(e["ts"], e["args"]["bytes"]) for e in counters] == expect
    assert max(v for _, v in expect) == (64 + 32 + 64 + 2 + 4 + 16 + 16 + 1) * MiB


def test_kernel_slices_and_block_tracks(tmp_path):
    cap, ids, doc = _load(tmp_path, top=3)
    ev = doc["traceEvents"]
    ops = [e for e in ev if e["ph"] == "X" and e["cat"] in ("kernel", "memcpy")]
    assert len(ops) == len(cap.ops) == 35
    assert [e["name"] for e in ops[:7]] == ["memcpy HTOD", "fwd_gemm_1", "fwd_gemm_2", "loss_kernel", "bwd_gemm_2",
                                              "bwd_gemm_1", "adam_step"]
    assert ops[1]["args"]["blocks"] == [f"100:{ids['W1']}", "100:5", "100:6"]  # pid:block id, as every verb
    assert ops[1]["dur"] == 50.0  # next op on the stream is 1.5 ms later: capped at 50 µs
    blocks = [e for e in ev if e["ph"] == "X" and e["cat"] == "block"]
    assert [b["args"]["size"] for b in blocks] == [64 * MiB, 64 * MiB, 32 * MiB]
    assert [b["args"]["block"] for b in blocks] == [f"100:{ids[k]}" for k in ("W1", "O", "W2")]
    idle = [e for e in ev if e["ph"] == "X" and e["cat"] == "idle"]
    # W1: 3 accesses per iteration (fwd1, bwd1, adam) -> 14 gaps; O: 5 accesses -> 4; W2: 15 -> 14
    per_tid = {}
    for e in idle:
        per_tid[e["tid"]] = per_tid.get(e["tid"], 0) + 1
    assert sorted(per_tid.values()) == [4, 14, 14]
    for e in idle:  # nested inside the block's lifetime slice
        life = next(b for b in blocks if b["tid"] == e["tid"])
        assert life["ts"] <= e["ts"] and e["ts"] + e["dur"] <= life["ts"] + life["dur"] + 1e-6
    o_idle = [e for e in idle if e["tid"] == next(b["tid"] for b in blocks if b["args"]["block"] == f"100:{ids['O']}")]
    assert {e["args"]["idle_ns"] for e in o_idle} == {LOADER_NS + 21 * 500_000}  # one iteration


def test_host_lead_counter_on_an_h200_capture():
    """GPT medium traced on the H200 (tests/data/gpt_medium_tensors_s10.pyobmem, 251 GPU clock
    samples): one counter point per sample at the GPU time its op ran, the host's lead in ms.
    The host waits for the GPU at every step's loss (a lead near 0) and runs ~350 ms ahead in the
    backward pass; the clock puts no op before its launch (no negative lead)."""
    from pathlib import Path

    import numpy as np
    from pyobmem.export.perfetto import trace

    cap = read_capture(str(Path(__file__).parent / "data" / "gpt_medium_tensors_s10.pyobmem"))
    doc = json.loads(json.dumps(trace(cap, top=0)))
    lead = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "host lead over the GPU (ms)"]
    assert len(lead) == 251
    t0, _ = cuda_span(cap)
    g = cap.gpu_times[cap.gpu_times["op"] >= 0]
    first = int(np.argmin(g["t_gpu"]))
    expect = (int(g["t_gpu"][first]) - int(cap.ops["ts_ns"][g["op"][first]])) / 1e6
    assert lead[0]["ts"] == round((int(g["t_gpu"][first]) - t0) / 1000, 3)
    assert lead[0]["args"]["ms"] == round(expect, 3)
    ms = [e["args"]["ms"] for e in lead]
    assert [e["ts"] for e in lead] == sorted(e["ts"] for e in lead)
    assert min(ms) >= 0 and min(ms) < 1 and 300 < max(ms) < 400
