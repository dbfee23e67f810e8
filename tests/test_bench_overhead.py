"""scripts/bench_trace_overhead.py: the statistics that run without a GPU (paired ratios, added
microseconds per op, their bootstrap intervals, the targets). The benchmark runs on the H200."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
_spec = importlib.util.spec_from_file_location("bench_trace_overhead", ROOT / "scripts" / "bench_trace_overhead.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_trace_overhead"] = bench
_spec.loader.exec_module(bench)


def test_median_ci_brackets_the_median():
    xs = [1.10, 1.02, 1.05, 1.07, 1.04, 1.03, 1.06, 1.08, 1.05, 1.04]
    lo, hi = bench.median_ci(xs)
    assert lo <= 1.05 <= hi  # the sample median
    assert 1.02 <= lo and hi <= 1.10
    assert bench.median_ci([1.0, 2.0]) is None  # too few rounds for an interval


def test_paired_rounds_give_ratio_and_added_us_per_op(monkeypatch, tmp_path):
    # Round r: untraced 5.0 + r/10 ms, traced 5.5 + r/10 ms per step; 400 ops and 300 launches a step.
    steps = 20

    class FakeRun:
        def __init__(self, ms):
            self.rc, self.wall_s, self.errors, self.losses = 0, 1.0, [], ["0x1p+0"] * steps
            self.step_ms = [ms] * steps

    calls = []

    def run_workload(script, args, json_path, capture=None, **kw):
        tag = json_path.name.split(".")[1]
        r = -1 if tag == "warmup" else int(tag)
        calls.append((r, capture is not None))
        if capture is not None:
            capture.write_bytes(b"")
        return FakeRun(5.0 + r / 10 + (0.5 if capture is not None else 0.0))

    monkeypatch.setattr(bench.bt, "run_workload", run_workload)
    monkeypatch.setattr(bench, "counts_in", lambda cap: (300 * steps, 400 * steps, None))
    res = bench.bench("lstm_lm", "lstm_lm.py", [], steps, 4, 2, tmp_path, 10, None,
                      {"untraced": None, "traced": ()})
    assert calls[0] == (-1, False)  # the discarded warm-up run
    assert calls[1:] == [(0, False), (0, True), (1, True), (1, False), (2, False), (2, True), (3, True), (3, False)]
    assert res["rounds"] == 4
    assert res["ops_per_step"] == 400 and res["launches_per_step"] == 300
    assert res["added_us_per_op"] == pytest.approx(0.5 * 1000 / 400)
    assert res["added_us_per_launch"] == pytest.approx(0.5 * 1000 / 300)
    expected = sorted((5.5 + r / 10) / (5.0 + r / 10) for r in range(4))
    assert res["time_ratio"] == pytest.approx((expected[1] + expected[2]) / 2)
    lo, hi = res["time_ratio_ci95"]
    assert expected[0] <= lo <= hi <= expected[-1]
    assert "hooks_only" not in res


def test_meets_targets_reads_merged_entries():
    doc = {"gpt_small": {"time_ratio": 1.01}, "lstm_lm": {"time_ratio": 1.06},
           "op_cost": {"kinds": {"launch": {"added_us": 0.4}}}}
    assert bench.meets_targets(doc) == {"gpt_small": True, "mlp": None, "lstm_lm": False, "us_per_launch": True}


def test_op_cost_rounds_and_added_us(monkeypatch, tmp_path):
    # A stand-in for op_cost.cu: 3.0 us per launch untraced; under the stand-in launcher (which
    # drops its options up to "--" and sets TRACED) 3.4 us. The copy costs the same either way.
    exe = tmp_path / "op_cost"
    exe.write_text('#!/bin/sh\nl=3.0; [ -n "$TRACED" ] && l=3.4\n'
                   'echo "{\\"ops_per_kind\\": 20000, \\"us_per_op\\": {\\"launch\\": $l, \\"memcpy_async\\": 2.5},'
                   ' \\"clock_gettime_ns\\": 21.5}" > "$2"\n')
    exe.chmod(0o755)
    fake_launcher = tmp_path / "launch.sh"
    fake_launcher.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift\nTRACED=1 exec "$@"\n')
    fake_launcher.chmod(0o755)
    monkeypatch.setenv("PYOBMEM_BENCH_LAUNCHER", str(fake_launcher))
    monkeypatch.setattr(bench, "build_op_cost", lambda work: exe)
    res = bench.op_cost(4, tmp_path, None, 30, ("--no-cupti",))
    assert res["errors"] == []
    assert [(x["round"], x["mode"]) for x in res["runs"]] == [
        (0, "untraced"), (0, "traced"), (1, "traced"), (1, "untraced"),
        (2, "untraced"), (2, "traced"), (3, "traced"), (3, "untraced")]
    launch = res["kinds"]["launch"]
    assert launch["untraced_us"] == 3.0 and launch["traced_us"] == 3.4
    assert launch["added_us"] == pytest.approx(0.4) and launch["added_us_ci95"] == pytest.approx([0.4, 0.4])
    assert res["kinds"]["memcpy_async"]["added_us"] == 0
    assert res["clock_gettime_ns"] == 21.5 and res["launcher_options"] == ["--no-cupti"]


def test_parse_selftime_per_step():
    err = ("step 0 ...\n"
           "pyobmem selftime launch_driver calls=1200 ns_each=4300.0 total_ms=5.160\n"
           "pyobmem selftime launch_record calls=1200 ns_each=480.0 total_ms=0.576\n"
           "pyobmem selftime ring_write calls=1500 ns_each=140.0 total_ms=0.210\n"
           "pyobmem selftime params_refresh calls=600 ns_each=30.0 total_ms=0.018\n"
           "pyobmem selftime gpuclock_sample calls=40 ns_each=2000.0 total_ms=0.080\n")
    r = bench.parse_selftime(err, steps=4)
    assert r["parts"]["launch_record"] == {"calls_per_step": 300.0, "ns_each": 480.0, "us_per_step": 144.0}
    # the shim's own: launch records, layout refreshes and clock samples; not the driver, not the
    # ring writes inside the records
    assert r["shim_us_per_step"] == pytest.approx(144.0 + 4.5 + 20.0)
    with pytest.raises(ValueError, match="SELFTIME=1"):
        bench.parse_selftime("step 0 loss 0x1p+0 time_ms 5.0\n", steps=1)


def test_the_daemon_runs_off_the_workloads_cpu(monkeypatch, tmp_path):
    """A pinned workload runs alone on its CPU: the traced command puts the launcher (and the
    daemon it starts) on every other allowed CPU, the workload under ``taskset -c PIN``; an
    untraced command has no launcher; an unpinned one no taskset at all."""
    monkeypatch.setattr(bench.bt.os, "sched_getaffinity", lambda pid: {0, 1, 2, 5})
    assert bench.bt.off_cpu(2) == ["taskset", "-c", "0,1,5"]
    assert bench.bt.off_cpu(None) == []
    monkeypatch.setattr(bench.bt.os, "sched_getaffinity", lambda pid: {2})
    assert bench.bt.off_cpu(2) == []  # nowhere else to go
    monkeypatch.setattr(bench.bt.os, "sched_getaffinity", lambda pid: {0, 2})
    cmds = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    monkeypatch.setattr(bench.bt.subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or Done())
    bench.bt.run_workload("lstm_lm.py", [], tmp_path / "t.json", capture=tmp_path / "t.pyobmem", pin_cpu=2)
    bench.bt.run_workload("lstm_lm.py", [], tmp_path / "u.json", pin_cpu=2)
    bench.bt.run_workload("lstm_lm.py", [], tmp_path / "v.json", capture=tmp_path / "v.pyobmem")
    traced, untraced, unpinned = cmds
    assert traced[:3] == ["taskset", "-c", "0"] and "run" in traced[3:7]
    k = traced.index("--")
    assert traced[k + 1:k + 4] == ["taskset", "-c", "2"]
    assert untraced[:3] == ["taskset", "-c", "2"]
    assert "taskset" not in unpinned
