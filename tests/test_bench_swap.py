"""scripts/bench_swap.py: the logic that runs without a GPU (losses, budgets, peaks, schedule,
capture statistics, the no-GPU / no-NVML errors). The benchmark itself runs on the H200."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_swap", ROOT / "scripts" / "bench_swap.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_swap"] = bench
_spec.loader.exec_module(bench)

GIB = 1 << 30
# GPT-2 medium on the H200: torch's reserved peak (bench/results/patterns_gpt2_medium.json) and a
# driver peak 1 GiB above it.
RESERVED = 37_429_968_896
DRIVER_PEAK = RESERVED + GIB


def test_compare_losses_bit_for_bit():
    a = ["0x1.5f15ee0000000p+3", "0x1.5f5dd00000000p+3", "0x1.5f4ad40000000p+3"]
    assert bench.compare_losses(a, list(a)) == (True, None)
    assert bench.compare_losses(a, [a[0], a[1], "0x1.5f4ad40000001p+3"]) == (False, 2)  # last bit differs
    assert bench.compare_losses(a[:2], a) == (False, 2)  # a run cut short is not identical
    assert bench.compare_losses([], []) == (False, 0)


def test_steady_median_is_the_last_half():
    assert bench.steady_median([900.0, 1.0, 2.0, 470.0, 468.0, 469.5]) == 469.5
    assert bench.steady_median([5.0]) == 5.0
    assert bench.steady_median([]) is None


def test_budget_arithmetic():
    overhead = bench.overhead_of(DRIVER_PEAK, RESERVED)
    assert overhead == GIB
    b = bench.shim_budget(0.5, DRIVER_PEAK, overhead)
    assert b["budget_bytes"] == 19_251_855_360  # 0.5 x 38,503,710,720
    assert b["shim_budget_bytes"] == 19_251_855_360 - GIB
    assert not b["shim_budget_clamped"]
    # no reserved figure (JAX's platform allocator): nothing subtracted
    assert bench.overhead_of(DRIVER_PEAK, None) is None
    assert bench.shim_budget(0.4, 1000 << 20, None)["shim_budget_bytes"] == 400 << 20
    # a peak below the framework's own figure (sampling missed it): overhead 0, not negative
    assert bench.overhead_of(RESERVED - 1, RESERVED) == 0
    # the overhead exceeds the budget: clamped, never 0 (which the shim reads as "no budget")
    small = bench.shim_budget(0.5, 1100 << 20, 600 << 20)
    assert small["shim_budget_bytes"] == bench.MIN_SHIM_BUDGET and small["shim_budget_clamped"]


def test_oversubscribed_budget():
    free = int(0.7 * DRIVER_PEAK)
    b = bench.oversubscribed_budget(free, GIB, 1024 << 20)
    assert b["shim_budget_bytes"] == 26_952_597_504 - 2 * GIB
    assert b["free_bytes"] == 26_952_597_504


def test_peak_tracker_excludes_processes_that_were_there_before():
    idle = 600 << 20
    t = bench.PeakTracker(idle, excluded={777})  # 777: the ballast
    t.add(idle + (100 << 30), [(777, 100 << 30)], 0.0)  # the workload not started yet
    t.add(idle + (101 << 30), [(777, 100 << 30), (4242, 1 << 30)], 0.002)
    t.add(idle + (103 << 30), [(777, 100 << 30), (4242, 3 << 30), (4243, None)], 0.004)  # None: NVML does not say
    t.add(idle + (100 << 30), [(777, 100 << 30)], 0.006)
    r = t.result()
    assert r["peak_bytes"] == 3 << 30 and r["peak_process_sum_bytes"] == 3 << 30
    assert r["peak_method"].startswith("nvml per-process")
    assert r["peak_device_used_minus_idle_bytes"] == 103 << 30  # the ballast is in the device figure
    assert r["samples"] == 4 and r["processes_seen"] == 1 and r["sample_interval_ms"] == 2.0
    # a driver that cannot list processes: the device figure
    d = bench.PeakTracker(idle)
    d.add(idle + (5 << 30), None)
    d.add(idle + (2 << 30), None)
    assert d.result()["peak_bytes"] == 5 << 30 and d.result()["peak_process_sum_bytes"] is None


def test_step_timeout_and_default_schedule():
    assert bench.step_timeout(left=300, reserve=80, min_s=30, cap_s=200) == 200  # its cap
    assert bench.step_timeout(left=100, reserve=80, min_s=30, cap_s=200) == 30  # at least its own need
    assert bench.step_timeout(left=20, reserve=80, min_s=30, cap_s=200) == 20  # never more than is left
    steps = bench.schedule(list(bench.PARTS), 50, 12, list(bench.FRACTIONS), bench.Estimates())
    assert [s.name for s in steps][:7] == ["gpt baseline", "gpt swap 0.9", "gpt swap 0.75", "gpt swap 0.6",
                                           "gpt swap 0.5", "gpt swap 0.4", "gpt save_on_cpu"]
    assert len(steps) == 13
    total = bench.schedule_estimate(list(bench.PARTS), 50, 12, list(bench.FRACTIONS))
    default_budget = bench.build_parser().parse_args([]).time_budget
    assert 450 < total < default_budget <= 540  # the defaults fit in ~9 minutes, but not by much


def test_error_lines():
    err = ("Traceback (most recent call last):\n  File \"gpt.py\", line 98, in step\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB. GPU 0 has a total capacity "
           "of 139.81 GiB of which 1.02 GiB is free.\n")
    assert bench.last_error_line(err).startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB")
    assert bench.is_oom(err)
    assert bench.last_error_line("a\nb\n") == "b"
    assert not bench.is_oom("step 0 loss 0x1p+3 time_ms 1.0")


def test_nvml_absent_is_one_clear_error():
    with pytest.raises(bench.BenchError, match=r"NVML \(libnvidia-ml-absent\.so\.1\) is not loadable"):
        bench.Nvml(lib="libnvidia-ml-absent.so.1")


def test_main_without_gpu_or_nvml_exits_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(bench, "gpu_present", lambda: False)
    with pytest.raises(SystemExit) as e:
        bench.main([])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no NVIDIA GPU here" in err[0]
    real = bench.Nvml
    monkeypatch.setattr(bench, "gpu_present", lambda: True)
    monkeypatch.setattr(bench, "Nvml", lambda index: real(index, lib="libnvidia-ml-absent.so.1"))
    with pytest.raises(SystemExit) as e:
        bench.main(["--parts", "frameworks"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NVML" in err[0]


def test_help_needs_no_gpu():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_swap.py"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--parts" in r.stdout and "--steps" in r.stdout


def test_swap_statistics_and_daemon_replay(tmp_path):
    """A real capture (GPT tiny, H200) with a plan adoption and swaps injected: counts by cause, the
    replay cut at the adopted plan, and its action count compared with the adopted one."""
    from pyobmem import abi
    from pyobmem.capture import CaptureWriter, read_records

    meta, recs = read_records(str(ROOT / "tests" / "data" / "gpt_tiny.pyobmem"))
    launches = recs[recs["type"] == abi.Ev.LAUNCH]
    pid, t = int(launches["pid"][0]), int(launches["ts_ns"][len(launches) // 2])
    blk = recs[(recs["type"] == abi.Ev.ALLOC) & (recs["c"] >= 4 << 20)][0]
    extra = np.zeros(5, abi.RECORD_DTYPE)
    extra["pid"] = pid
    extra["type"] = [abi.Ev.PLAN, abi.Ev.SWAP_OUT, abi.Ev.SWAP_IN, abi.Ev.SWAP_IN, abi.Ev.SWAP_IN]
    extra["ts_ns"] = [t, t + 1, t + 2, t + 3, t + 4]
    extra["a"] = [1] + [blk["a"]] * 4  # plan generation 1; the block's id
    extra["b"] = [4] + [blk["c"]] * 4  # 4 actions; the block's size
    extra["flags"] = [0, 0, abi.SwapInCause.PREFETCH, abi.SwapInCause.LATE, abi.SwapInCause.DEMAND]
    allr = np.concatenate([recs, extra])
    path = tmp_path / "injected.pyobmem"
    w = CaptureWriter(str(path), {**meta, "swap": {"min_swap_bytes": 4 << 20}})
    w.write(allr[np.argsort(allr["ts_ns"], kind="stable")])
    w.close()

    r = bench.analyse_capture(path, 900 << 20)
    size = int(blk["c"])
    assert r["errors"] == []
    assert (r["swapped_out_count"], r["swapped_out_bytes"], r["swapped_out_blocks"]) == (1, size, 1)
    assert r["swapped_in_count"] == 3 and r["swapped_in_bytes"] == 3 * size
    assert {k: v["count"] for k, v in r["swap_ins"].items()} == {"prefetch": 1, "late": 1, "demand": 1}
    assert r["plan_adopted"] and r["plans_adopted"] == 1 and r["plans_dropped"] == 0 and r["plan_actions"] == 4
    assert r["swap_on"] is False  # a capture taken without swap mode: no "swap=on" note from the shim
    p = r["prediction"]
    assert p["source"].startswith("daemon replay: records up to the last adopted plan (generation 1, 4 actions)")
    assert p["adopted_actions"] == 4 and p["period_ops"] == 160
    assert p["plan_actions_match"] == (p["actions"] == 4)
    # the planner's figures for this budget: peak 952 MiB live, 708 MiB needed at one op, so 900 MiB
    # is out of reach and the daemon would have written no plan
    assert (p["peak_bytes"], p["needed_bytes"]) == (998_246_400, 742_393_856)
    assert p["feasible"] is False and r["predicted_time_ratio"] is None
