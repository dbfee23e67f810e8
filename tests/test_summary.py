"""`pyobmem summary`: the figures on synthetic captures (tests/synth.Trace), checked by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.cli import main
from pyobmem.commands.summary import NO_ACTIVITY, format_short, format_summary, summarize
from pyobmem.model.iterations import detect_in_sequence


def find_period(seq):
    """The main regime's period of a sequence (the model's detector, as summary uses it)."""
    found = detect_in_sequence(np.asarray(seq))
    if not found:
        return None
    best = max(found, key=lambda f: f["period"] * len(f["starts"]))
    return {"launches": int(best["period"])}

from synth import Trace

MiB = 1 << 20


def _summary(trace: Trace, tmp_path, **kw) -> dict:
    path = tmp_path / "s.pyobmem"
    trace.write(path, **kw)
    return summarize(read_capture(str(path)))


def test_allocations_peak_histogram_kinds(tmp_path):
    t = Trace()
    a = t.alloc(MiB)  # live 1 MiB
    b = t.alloc(4096)  # 1 MiB + 4 KiB
    t.free(b)  # 1 MiB
    c = t.alloc(3 * MiB, kind=abi.AllocKind.ASYNC)  # 4 MiB  <- peak
    t.free(a)  # 3 MiB
    t.alloc(MiB + 1, kind=abi.AllocKind.VMM)  # 4 MiB + 1 byte  <- new peak
    t.free(c)
    t.alloc(5000)
    s = _summary(t, tmp_path)
    al = s["allocations"]
    assert al["count"] == 5 and al["bytes"] == MiB + 4096 + 3 * MiB + MiB + 1 + 5000
    assert al["peak_live_bytes"] == 4 * MiB + 1
    assert al["live_at_end"] == {"count": 2, "bytes": MiB + 1 + 5000}
    assert al["by_kind"] == {
        "driver": {"count": 3, "bytes": MiB + 4096 + 5000},
        "async": {"count": 1, "bytes": 3 * MiB},
        "vmm": {"count": 1, "bytes": MiB + 1},
    }
    assert al["histogram"] == [
        {"lo": 4096, "hi": 8192, "count": 2, "bytes": 4096 + 5000},
        {"lo": MiB, "hi": 2 * MiB, "count": 2, "bytes": 2 * MiB + 1},
        {"lo": 2 * MiB, "hi": 4 * MiB, "count": 1, "bytes": 3 * MiB},
    ]
    text = format_summary(s)
    assert "peak live    4.0 MiB" in text
    assert "1.0 MiB - 2.0 MiB      2  2.0 MiB" in text


def test_peak_counts_a_free_before_an_allocation_at_the_same_time(tmp_path):
    t = Trace()
    a = t.alloc(MiB)
    t.free(a)
    t.rows[-1]["ts_ns"] = t.t + 1  # free at time T ...
    t.add(abi.Ev.ALLOC, block_id=2, addr=0x1000, size=MiB, ts=t.t + 1)  # ... and an allocation at T
    s = _summary(t, tmp_path)
    assert s["allocations"]["peak_live_bytes"] == MiB


def test_launch_attribution_copies_and_touched_blocks(tmp_path):
    t = Trace()
    x, y, z = t.alloc(4096), t.alloc(8192), t.alloc(MiB)
    t.launch(0xA, [x, y, z])
    t.launch(0xB, [x])
    t.launch(0xC, [], flags=int(abi.LaunchFlag.OPAQUE | abi.LaunchFlag.NO_LAYOUT))
    t.launch(0xD, [y, z], flags=int(abi.LaunchFlag.OPAQUE))
    t.seq += 1
    t.add(abi.Ev.MEMCPY, flags=int(abi.CopyKind.HTOD) | abi.COPY_ASYNC, op=t.seq, dst=z << abi.ACCESS_OFFSET_BITS, bytes=4096)
    t.seq += 1
    t.add(abi.Ev.MEMCPY, flags=int(abi.CopyKind.DTOH), op=t.seq, src=x << abi.ACCESS_OFFSET_BITS, bytes=100)
    t.seq += 1
    t.add(abi.Ev.MEMSET, op=t.seq, dst=y << abi.ACCESS_OFFSET_BITS, bytes=8192)
    t.add(abi.Ev.UNTRACKED, addr=0xDEAD, kind=int(abi.UntrackedKind.FREE))
    s = _summary(t, tmp_path, exit_status=-15)
    la = s["launches"]
    assert la["count"] == 4 and la["attributed_pct"] == 75.0 and la["opaque_pct"] == 50.0
    assert la["blocks_touched"] == {"mean": 1.5, "median": 1.5, "max": 3}
    assert s["copies"]["count"] == 2 and s["copies"]["bytes"] == 4196 and s["copies"]["async"] == 1
    assert s["copies"]["by_kind"] == {"HTOD": {"count": 1, "bytes": 4096}, "DTOH": {"count": 1, "bytes": 100}}
    assert s["memsets"] == {"count": 1, "bytes": 8192}
    assert s["capture"]["untracked_frees"] == 1 and s["capture"]["exit_status"] == -15
    assert s["processes"] == [{"pid": 100, "ppid": 1, "driver_version": 13000, "source": "hooks", "rank": None}]
    short = format_short(s)
    assert "4 launches (75.0% attributed, 50.0% opaque)" in short
    assert "command killed by signal 15" in short
    assert "13.0" in format_summary(s)


def test_no_cuda_activity(tmp_path):
    t = Trace()  # a PROCESS record and nothing else
    s = _summary(t, tmp_path)
    assert not s["cuda_activity"]
    assert NO_ACTIVITY in format_summary(s).splitlines()
    assert format_short(s).splitlines()[0] == "no CUDA activity was seen"
    assert s["iteration"] is None


def _training_trace(warmup: int, iterations: int, seed: int = 0) -> tuple[Trace, list[int], int]:
    """Warm-up launches (random, reusing the loop's kernels), then iterations of a 50-launch body
    with 4 identical 'layers' inside. Returns the trace, the body, and the records per body."""
    rng = np.random.default_rng(seed)
    t = Trace()
    blocks = [t.alloc(MiB) for _ in range(6)]
    layer = [0x100 + i for i in range(9)]
    body = [0x10] + layer * 4 + [0x20 + i for i in range(12)] + [0x30]  # 1 + 36 + 12 + 1 = 50
    assert len(body) == 50
    for h in rng.choice(body + [0x99, 0x98], size=warmup):
        t.launch(int(h), [blocks[0]])
    n0 = len(t.rows)
    for _ in range(iterations):
        for i, h in enumerate(body):
            t.launch(h, blocks[: 1 + i % 6])  # 1-6 blocks: 2 or 3 records per launch
    per_body = (len(t.rows) - n0) // iterations
    return t, body, per_body


def test_period_detected_exactly_after_warm_up(tmp_path):
    t, body, per_body = _training_trace(warmup=37, iterations=20)
    s = _summary(t, tmp_path)
    it = s["iteration"]
    assert it["launches"] == 50
    assert it["score"] == 1.0
    assert it["period_ns"] == per_body * t.dt_ns  # synthetic clock: dt per record
    assert it["pid"] == 100 and it["repeats"] in (19, 20)
    assert "50 ops per iteration" in format_short(s)


@pytest.mark.parametrize("iterations", [3, 8, 100])
def test_period_with_few_or_many_iterations(iterations):
    body = [5, 1, 2, 3, 1, 2, 3, 1, 2, 3, 9, 8, 7]
    warm = [1, 2, 9, 4, 4, 4, 6]
    seq = np.array(warm + body * iterations)
    assert find_period(seq)["launches"] == len(body)


def test_no_repeating_pattern():
    rng = np.random.default_rng(1)
    assert find_period(rng.integers(0, 50, size=5000)) is None
    assert find_period(np.arange(1000)) is None


def test_summary_command_json_and_text(tmp_path, capsys):
    t, _, _ = _training_trace(warmup=10, iterations=6)
    path = tmp_path / "t.pyobmem"
    t.write(path)
    assert main(["summary", "--json", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["launches"]["count"] == 310 and data["iteration"]["launches"] == 50
    assert main(["summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "kernel launches  310" in text and "50 ops per iteration" in text


def test_wrong_typed_metadata_is_left_out(tmp_path):
    """A hand-edited or foreign header: known keys of the wrong type are dropped by the reader."""
    from pyobmem.capture import read_capture
    from pyobmem.commands.summary import format_summary, summarize

    t = Trace()
    t.launch(0xA, [t.alloc(1 << 20)])
    meta = {"argv": [1, 2], "env": "PYTORCH_CUDA_ALLOC_CONF=x", "presets": None, "command": 5, "hostname": "h"}
    t.write(tmp_path / "m.pyobmem", meta=meta)
    cap = read_capture(str(tmp_path / "m.pyobmem"))
    assert cap.meta == {"hostname": "h"}
    s = summarize(cap)
    assert s["capture"]["command"] is None and s["environment"]["env"] == {}
    assert "  host  h" in format_summary(s).splitlines()
