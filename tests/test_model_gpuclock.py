"""The model's GPU clock (pyobmem.model.gpuclock) on synthetic captures: exact expected times."""

from __future__ import annotations

import numpy as np

from pyobmem.capture import read_capture
from pyobmem.model.gpuclock import gpu_op_times, iteration_ns_gpu
from pyobmem.model.iterations import detect_iterations
from pyobmem.model.saving import execution_clock

from synth import Trace

K = 0x1000


def _times(tr, tmp_path):
    tr.write(tmp_path / "c.pyobmem")
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    return cap, gpu_op_times(cap)


def test_interpolated_between_samples_lag_kept_outside(tmp_path):
    tr = Trace()  # PROCESS at 1000 ns; op k launched at (k + 1) * 1000 ns
    for _ in range(9):
        tr.launch(K, [])
    tr.gpu_time(3, 100_000)
    tr.gpu_time(7, 108_000)
    cap, g = _times(tr, tmp_path)
    assert cap.gpu_times["seq"].tolist() == [3, 7]
    assert cap.gpu_times["op"].tolist() == [2, 6]
    # 1-2: the first sample's lag (96 us); 3-7: linear; 8-9: the last sample's lag (100 us)
    assert g.tolist() == [98_000, 99_000, 100_000, 102_000, 104_000, 106_000, 108_000, 109_000, 110_000]


def test_never_before_launch(tmp_path):
    tr = Trace()
    tr.launch(K, [])  # 2000
    tr.launch(K, [])  # 3000
    tr.t = 19_000  # the host pauses: the GPU waits for it
    for _ in range(3):
        tr.launch(K, [])  # 20000, 21000, 22000
    tr.gpu_time(1, 2_500)
    tr.gpu_time(5, 22_500)
    _, g = _times(tr, tmp_path)
    assert g.tolist() == [2_500, 7_500, 20_000, 21_000, 22_500]


def test_stream_order_bounds_below(tmp_path):
    tr = Trace()
    for s in (1, 2, 1, 2, 1):
        tr.launch(K, [], stream=s)
    tr.gpu_time(1, 10_000, 1)
    tr.gpu_time(3, 30_000, 1)
    tr.gpu_time(5, 20_000, 1)
    _, g = _times(tr, tmp_path)
    # linear: 10, 20, 30, 25, 20 us; stream 1 runs 1, 3, 5 in order: op 5 no earlier than op 3
    assert g.tolist() == [10_000, 20_000, 30_000, 25_000, 30_000]


def test_no_samples_no_gpu_clock(tmp_path):
    tr = Trace()
    for _ in range(4):
        tr.launch(K, [])
    tr.gpu_time(2, 50_000)  # one sample is not a clock
    cap, g = _times(tr, tmp_path)
    assert g is None


def test_iteration_time_on_both_clocks(tmp_path):
    tr = Trace()
    blk = tr.alloc(1 << 20)
    n_iter = 8
    for _ in range(n_iter):
        for h in (0x1000, 0x2000, 0x3000):
            tr.launch(h, [blk])  # LAUNCH + ACCESS: 2000 ns per op, 6000 per iteration on the host
    for i in range(n_iter):  # the GPU takes 9000 ns per iteration
        tr.gpu_time(3 * i + 1, 1_000_000 + 9_000 * i)
    tr.gpu_time(3 * n_iter, 1_000_000 + 9_000 * (n_iter - 1) + 6_000)
    cap = _times(tr, tmp_path)[0]
    it = detect_iterations(cap)
    assert it.iteration_ns == 6_000
    assert iteration_ns_gpu(cap, it) == 9_000
    row = int(it.main_rows()[1])
    clock = execution_clock(cap, it, row)
    assert clock.source == "gpu"
    assert clock.t1 - clock.t0 == 9_000
    launch = cap.ops["ts_ns"][it.start_op[row] : it.start_op[row] + 3]
    assert (clock(launch) - clock.t0).tolist() == [0, 3_000, 6_000]


def _iteration_capture(tmp_path):
    tr = Trace()
    blk = tr.alloc(1 << 20)
    for _ in range(8):
        for h in (0x1000, 0x2000, 0x3000):
            tr.launch(h, [blk])
    for i in range(8):
        tr.gpu_time(3 * i + 1, 1_000_000 + 9_000 * i)
    tr.gpu_time(24, 1_000_000 + 9_000 * 7 + 6_000)
    tr.write(tmp_path / "c.pyobmem")
    return str(tmp_path / "c.pyobmem")


def test_summary_and_stats_show_both_clocks(tmp_path):
    from pyobmem.commands.summary import format_summary, summarize
    from pyobmem.commands.stats import format_stats, stats_dict
    from pyobmem.model import analyse

    cap = read_capture(_iteration_capture(tmp_path))
    s = summarize(cap)
    assert s["iteration"]["period_ns"] == 6_000 and s["iteration"]["period_gpu_ns"] == 9_000
    assert s["gpu_clock"]["samples"] == 9
    assert s["gpu_clock"]["lag_max_ns"] == 1_000_000 + 9_000 * 7 + 6_000 - int(cap.ops["ts_ns"][23])
    text = format_summary(s)
    assert "6.0 µs each (GPU clock: 9.0 µs)" in text
    assert "GPU clock: 9 samples" in text
    d = stats_dict(analyse(cap, progress=False))
    assert d["gpu_clock"]["iteration_ns_host"] == 6_000 and d["gpu_clock"]["iteration_ns_gpu"] == 9_000
    assert "6.0 µs host, 9.0 µs GPU clock" in format_stats(d)


def test_report_shows_both_clocks(tmp_path):
    from pyobmem.report import render

    html = render(read_capture(_iteration_capture(tmp_path)), generated="test")
    assert "6 µs host, 9 µs GPU clock" in html
    assert "on the GPU clock (the shim's GPU time samples)" in html
