"""The HTML report: sections, self-contained, no-iteration captures, refusal to overwrite.

``training_trace`` (also used by the export tests and scripts/screenshot_report.py) builds a
synthetic training loop with known blocks, kernels and iterations.
"""

import re

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.errors import PyobmemError

from synth import Trace

MiB = 1 << 20
KERNELS = {0xA1: "fwd_gemm_1", 0xA2: "fwd_gemm_2", 0xA3: "loss_kernel", 0xB2: "bwd_gemm_2", 0xB1: "bwd_gemm_1",
           0xC1: "adam_step"}


def htod(t: Trace, block: int, size: int) -> None:
    """A host-to-device copy into ``block`` (MEMCPY record: a seq, b dst word, d bytes)."""
    t.seq += 1
    t.add(abi.Ev.MEMCPY, flags=int(abi.CopyKind.HTOD), op=t.seq, dst=block << abi.ACCESS_OFFSET_BITS, bytes=size)


LOADER_NS = 30_000_000  # host time before each iteration (data loading)


def training_trace(iterations: int = 5, dt_ns: int = 500_000) -> tuple[Trace, dict]:
    """A training loop: 3 persistent blocks (W1 64 MiB, W2 32 MiB, O 64 MiB), a never-accessed
    block (N 2 MiB) and, per iteration (LOADER_NS of host time, then 21 records dt_ns apart), an
    input X (4 MiB) copied in, activations A1, A2 (16 MiB), a transient workspace (1 MiB) and 6
    kernels. Returns (trace, names -> block ids)."""
    t = Trace(dt_ns=dt_ns)
    for h, name in KERNELS.items():
        t.text(abi.Ev.KERNEL_NAME, h, name)
    t.text(abi.Ev.NOTE, 0, "device0.name=NVIDIA H200")
    t.text(abi.Ev.NOTE, 0, "driver_version=13000")
    ids = {"W1": t.alloc(64 * MiB), "W2": t.alloc(32 * MiB), "O": t.alloc(64 * MiB), "N": t.alloc(2 * MiB)}
    for _ in range(iterations):
        t.t += LOADER_NS
        x = t.alloc(4 * MiB)
        htod(t, x, 4 * MiB)
        a1 = t.alloc(16 * MiB)
        t.launch(0xA1, [ids["W1"], x, a1])
        a2 = t.alloc(16 * MiB)
        t.launch(0xA2, [ids["W2"], a1, a2])
        ws = t.alloc(1 * MiB)
        t.launch(0xA3, [a2, ws])
        t.free(ws)
        t.launch(0xB2, [ids["W2"], a2, a1])
        t.free(a2)
        t.launch(0xB1, [ids["W1"], a1, x])
        t.free(a1)
        t.launch(0xC1, [ids["W1"], ids["W2"], ids["O"]])
        t.free(x)
    return t, ids


def no_iteration_trace() -> Trace:
    """A few allocations and distinct kernels: nothing repeats."""
    t = Trace()
    a, b = t.alloc(8 * MiB), t.alloc(MiB)
    t.launch(0x10, [a])
    t.launch(0x11, [a, b])
    t.free(b)
    t.launch(0x12, [a])
    return t


@pytest.fixture
def training_capture(tmp_path):
    t, ids = training_trace()
    path = tmp_path / "train.pyobmem"
    t.write(path, meta={"argv": ["python", "train.py"], "command": "python train.py",
                        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}})
    return read_capture(str(path)), ids


def test_report_sections_and_classes(training_capture):
    from pyobmem.model import analyse
    from pyobmem.report import render
    from pyobmem.report.analysis import property_rows

    cap, ids = training_capture
    a = analyse(cap)
    assert len(a.iteration_windows) >= 4  # 5 iterations; the detector may leave out the last one's tail
    assert a.iteration_ops == 7  # one copy and six kernels
    row = {bid: i for i, bid in enumerate(cap.blocks["block_id"].tolist())}
    assert a.block_class[row[ids["W1"]]] == "persistent" and a.block_class[row[ids["O"]]] == "persistent"
    assert a.block_class[row[ids["N"]]] == "never-accessed"
    # per iteration: X (4 MiB) lives the whole iteration but the loader time, A1, A2 most of it, the
    # workspace 3 records (1.5 ms of 40.5 ms: under the model's 5% for transient)
    per_iter = cap.blocks[4:9]
    assert per_iter["size"].tolist() == [4 * MiB, 16 * MiB, 16 * MiB, 1 * MiB, 4 * MiB]
    assert [a.block_class[r] for r in range(4, 8)] == ["iteration-scoped"] * 3 + ["transient"]
    props = {p.name: p for p in property_rows(a.properties)}
    # the model matches 337 of the 345 MiB accessed in iterations (two 4 MiB inputs stay unmatched)
    # tensor level: every reuse interval recurs; block level: 337 of the 345 MiB accessed in
    # iterations are matched (two 4 MiB inputs stay unmatched)
    assert props["iterative"].holds and props["iterative"].value == 1.0
    assert f"block level: {337 / 345:.3f} of bytes" in props["iterative"].detail
    assert props["regular"].holds and props["regular"].value == pytest.approx(1.0)
    assert props["extremal"].value is not None
    html = render(cap, generated="test")
    for heading in ("Summary", "Memory over time, by block class", "Iterations", "Access map of one iteration",
                    "Idle intervals", "Saving curve", "Top swap candidates", "Properties", "Environment"):
        assert f"<h2>{heading}</h2>" in html
    assert "NVIDIA H200" in html and "expandable_segments:False" in html
    assert not re.search(r"(https?:)?//[a-z]", html.replace("file://", ""))  # nothing fetched
    assert "<script" not in html and "<link" not in html and "<img" not in html
    assert "No iteration was found" not in html
    assert html.count("<svg") == 5  # memory (the run, one iteration), access map, histogram, saving curve


def test_saving_curve_exact(training_capture):
    """The last iteration: W1 (64 MiB) idle from adam_step to the next fwd_gemm_1 wraps around the
    iteration; the curve is non-decreasing and never above the peak."""
    from pyobmem.model import analyse
    from pyobmem.report.analysis import candidates

    cap, _ = training_capture
    a = analyse(cap)
    saved = [s for _, s in a.saving.points]
    assert a.saving.peak_bytes == (64 + 32 + 64 + 2 + 4 + 16 + 16 + 1) * MiB
    assert np.all(np.diff(saved) >= 0)
    assert saved[-1] <= a.saving.peak_bytes
    c = candidates(a)
    assert c and c[0]["size"] == 64 * MiB


def test_report_without_iterations(tmp_path):
    from pyobmem.report import render

    path = tmp_path / "short.pyobmem"
    no_iteration_trace().write(path)
    html = render(read_capture(str(path)), generated="test")
    assert "No iteration was found" in html
    assert "<h2>Memory over time, by block class</h2>" in html and "<h2>Summary</h2>" in html
    assert "<h2>Saving curve</h2>" not in html and "<h2>Access map of one iteration</h2>" not in html
    assert "9.0 MiB" in html  # peak live bytes


def test_report_dropped_warning(tmp_path):
    from pyobmem.capture import CaptureWriter
    from pyobmem.report import render

    t, _ = training_trace(iterations=3)
    t.add(abi.Ev.DROPPED, count=17)
    w = CaptureWriter(str(tmp_path / "d.pyobmem"), {"argv": ["x"]})
    w.write(t.records())
    w.finish(dropped=17, exit_status=0, ts_ns=t.t + 1)  # CAPTURE_END carries the total
    w.close()
    html = render(read_capture(str(tmp_path / "d.pyobmem")), generated="test")
    assert "17 events were dropped" in html
    assert "<td class=n>17</td>" in html  # the summary row


def test_report_command(tmp_path, training_capture):
    from pyobmem.commands import report as cmd

    cap, _ = training_capture
    out = tmp_path / "r.html"
    args = cmd_args(cap.path, str(out), force=False)
    assert cmd.run(args) == 0
    size = out.stat().st_size
    assert 10_000 < size < 2_000_000
    with pytest.raises(PyobmemError, match="exists; use -f/--force"):
        cmd.run(args)
    assert cmd.run(cmd_args(cap.path, str(out), force=True)) == 0


def cmd_args(path, output, force):
    import argparse

    return argparse.Namespace(file=[path], output=output, force=force, rank=None)
