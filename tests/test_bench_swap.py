"""scripts/bench_swap.py: the logic that runs without a GPU (losses, budgets, peaks, schedule,
capture statistics, the no-GPU / no-NVML errors). The benchmark itself runs on the H200."""

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_swap", ROOT / "scripts" / "bench_swap.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_swap"] = bench
_spec.loader.exec_module(bench)

GIB, MIB = 1 << 30, 1 << 20
# GPT-2 medium on the H200: torch's reserved peak (bench/results/patterns_gpt2_medium.json) and a
# driver peak 1 GiB above it.
RESERVED = 37_429_968_896
DRIVER_PEAK = RESERVED + GIB


def synthetic_run(step_ms, doc=None, losses=None, peak=DRIVER_PEAK, stderr="", env=None):
    """A finished run with these step times (ms), losses (default one loss per step) and driver peak."""
    losses = [f"0x1.{i:04x}p+3" for i in range(len(step_ms))] if losses is None else losses
    return bench.Run("synthetic", ["python3", "gpt.py"], 0, 60.0, False, losses, list(step_ms), doc, "", stderr,
                     {"peak_bytes": peak, "peak_method": "nvml per-process used memory"}, len(step_ms), [], env or {})


def test_compare_losses_bit_for_bit():
    a = ["0x1.5f15ee0000000p+3", "0x1.5f5dd00000000p+3", "0x1.5f4ad40000000p+3"]
    assert bench.compare_losses(a, list(a)) == (True, None)
    assert bench.compare_losses(a, [a[0], a[1], "0x1.5f4ad40000001p+3"]) == (False, 2)  # last bit differs
    assert bench.compare_losses(a[:2], a) == (False, 2)  # a run cut short is not identical
    assert bench.compare_losses([], []) == (False, 0)


def test_steady_median_is_of_the_steps_after_warmup():
    # 5 warm-up steps (plan not adopted yet), then 20 measured: two slow ones among them still count
    steps = [9000.0, 5000.0, 2000.0, 700.0, 650.0] + [510.0 + i for i in range(18)] + [900.0, 950.0]
    assert bench.steady_median(steps) == 519.5  # median of 510..527, 900, 950 (20 values)
    assert bench.steady_median(steps, warmup=0) == 522.0  # the warm-up counted: 13th of 25
    assert bench.steady_median([5.0, 6.0, 7.0]) == 6.0  # no more steps than the warm-up: all of them
    assert bench.steady_median([]) is None
    run = synthetic_run(steps)
    assert (run.measured_steps, run.steady_ms) == (20, 519.5)
    assert bench.STEPS - bench.WARMUP >= 20 and bench.build_parser().parse_args([]).steps == bench.STEPS


def test_prediction_within_tolerance():
    assert bench.within(1.30, 1.15) is True  # 1.130
    assert bench.within(1.33, 1.15) is False  # 1.157
    assert bench.within(1.00, 1.15) is True  # 1/1.15 = 0.8696 <= 0.8696
    assert bench.within(1.00, 1.16) is False  # 0.862
    assert bench.within(1.2, None) is None and bench.within(None, 1.2) is None


def test_meets_targets():
    ok = {"completed": True, "under_budget": True, "loss_identical": True, "prediction_within_1_15": True}
    rows = [{"budget_fraction": 0.9, "time_ratio": 1.00, **ok},
            {"budget_fraction": 0.75, "time_ratio": 1.04, **ok},
            {"budget_fraction": 0.6, "time_ratio": 1.21, **ok},  # over its target of 1.20
            {"budget_fraction": 0.5, "time_ratio": 1.30, **ok, "under_budget": False},
            {"budget_fraction": 0.4, "completed": False, "skipped": "time budget spent"}]
    m = bench.meets_targets(rows)
    assert set(m) == {"0.75", "0.6", "0.5", "all_budgets", "all"}
    assert m["0.75"] == {"target_time_ratio": 1.05, "time_ratio": 1.04, "completed": True, "time_within_target": True,
                         "under_budget": True, "loss_identical": True, "prediction_within_1_15": True, "met": True}
    assert (m["0.6"]["time_within_target"], m["0.6"]["met"]) == (False, False)
    assert (m["0.5"]["time_within_target"], m["0.5"]["under_budget"], m["0.5"]["met"]) == (True, False, False)
    # the skipped 0.4 is left out of all_budgets; the 0.5 row over its budget is not
    assert m["all_budgets"] == {"completed": True, "under_budget": False, "loss_identical": True,
                                "prediction_within_1_15": True}
    assert m["all"] is False
    rows[2]["time_ratio"], rows[3]["under_budget"] = 1.20, True
    assert bench.meets_targets(rows)["all"] is True
    assert bench.meets_targets([])["0.75"]["met"] is False and bench.meets_targets([])["all"] is False


def test_presets_and_allocator_env():
    assert bench.preset_env({}) == {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync",
                                    "XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                    "TF_GPU_ALLOCATOR": "cuda_malloc_async"}
    # a user's PyTorch options are kept and the backend added to the variable they set
    assert bench.preset_env({"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"})["PYTORCH_ALLOC_CONF"] == \
        "max_split_size_mb:128,backend:cudaMallocAsync"
    env = {"PATH": "/bin", "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "XLA_FLAGS": "--xla_gpu_deterministic_ops=true", "TF_GPU_ALLOCATOR": "cuda_malloc_async"}
    assert bench.allocator_env(env) == {"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync",
                                        "TF_GPU_ALLOCATOR": "cuda_malloc_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def test_framework_reserved_reads_torch_and_jax_figures():
    def reserved(ms):
        return synthetic_run([1.0], doc={"memory_stats": ms}).framework_reserved()

    assert reserved({"reserved_bytes.all.peak": RESERVED, "peak_bytes_in_use": 5}) == RESERVED
    assert reserved({"peak_pool_bytes": 300 << 20, "peak_bytes_in_use": 280 << 20}) == 300 << 20  # JAX cuda_async
    assert reserved({"peak_bytes_in_use": 280 << 20}) == 280 << 20
    assert reserved({}) is None


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
    steps = bench.schedule(list(bench.PARTS), 25, 25, list(bench.FRACTIONS), bench.Estimates())
    assert [s.name for s in steps] == ["gpt baseline", "gpt preset", "gpt trace", "gpt swap 0.9", "gpt swap 0.75", "gpt swap 0.6",
                                       "gpt swap 0.5", "gpt swap 0.4", "gpt save_on_cpu", "gpt checkpointing",
                                       "resnet50 baseline", "resnet50 preset", "resnet50 swap", "jax baseline",
                                       "jax preset", "jax swap",
                                       "oversubscribed"]
    # 20 s start-up + 25 steps x 510 ms x the frontier's ratio (0.4: 1.52) + 12 s for the launcher and the capture
    assert steps[7].min_s() == pytest.approx(20 + 25 * 0.51 * 1.52 + 12)
    assert steps[2].min_s() == pytest.approx(20 + bench.TRACE_STEPS * 0.51 + 12)  # the trace `pyobmem plan` reads
    default_budget = bench.build_parser().parse_args([]).time_budget
    assert default_budget <= 540
    gpt = bench.schedule_estimate(["gpt"], 25, 25, list(bench.FRACTIONS))
    rest = bench.schedule_estimate(["frameworks", "oversubscribed"], 25, 25, list(bench.FRACTIONS))
    assert gpt == pytest.approx(447.31, abs=0.01) and gpt < default_budget - 80  # one call, room for slow swap runs
    assert rest == pytest.approx(274.0, abs=0.5)
    assert gpt + rest > default_budget  # all three parts need two calls
    # the second call runs the GPT baseline for the ballast's size: its errors belong to that part
    second = bench.schedule(["frameworks", "oversubscribed"], 25, 25, list(bench.FRACTIONS), bench.Estimates())
    assert (second[0].name, second[0].part) == ("gpt baseline", "oversubscribed")


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


def test_arguments():
    a = bench.build_parser().parse_args(["--parts", "oversubscribed,gpt", "--fractions", "0.6,0.5"])
    assert a.parts == ["gpt", "oversubscribed"] and a.fractions == [0.6, 0.5] and a.ref_steps is None
    for argv in (["--steps", "5", "--warmup", "5"], ["--ref-steps", "3"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2


def test_help_needs_no_gpu():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_swap.py"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--parts" in r.stdout and "--steps" in r.stdout


def injected_capture(tmp_path, out_cause=None):
    """A real capture (GPT tiny, H200) with a plan adoption and swaps injected, written as a swap
    run with the per-tensor presets; returns (path, the swapped block's size). out_cause: the
    SWAP_OUT record's flags (default planned; 0: not recorded, as before session 13)."""
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
    out_cause = abi.SwapOutCause.PLANNED if out_cause is None else out_cause
    extra["flags"] = [0, out_cause, abi.SwapInCause.PREFETCH, abi.SwapInCause.LATE, abi.SwapInCause.DEMAND]
    allr = np.concatenate([recs, extra])
    path = tmp_path / "injected.pyobmem"
    w = CaptureWriter(str(path), {**meta, "swap": {"min_swap_bytes": 4 << 20}, "blocks": "tensor",
                                  "presets": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}})
    w.write(allr[np.argsort(allr["ts_ns"], kind="stable")])
    w.close()
    return path, int(blk["c"])


def test_swap_statistics_and_daemon_replay(tmp_path):
    """Counts by cause, the blocks and presets the launcher recorded, the replay cut at the adopted
    plan, and its action count compared with the adopted one."""
    path, size = injected_capture(tmp_path)
    r = bench.analyse_capture(path, 900 << 20)
    assert r["errors"] == []
    assert (r["blocks"], r["presets"]) == ("tensor", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert (r["swapped_out_count"], r["swapped_out_bytes"], r["swapped_out_blocks"]) == (1, size, 1)
    assert r["swapped_in_count"] == 3 and r["swapped_in_bytes"] == 3 * size
    assert {k: v["count"] for k, v in r["swap_ins"].items()} == {"prefetch": 1, "late": 1, "demand": 1}
    assert {k: v["count"] for k, v in r["swap_outs"].items()} == {"planned": 1, "budget": 0, "room": 0}
    from pyobmem.capture import read_capture
    (tmp_path / "old").mkdir()
    old, _ = injected_capture(tmp_path / "old", out_cause=0)  # a capture before session 13
    assert bench.swap_stats(read_capture(str(old)))["swap_outs"] is None
    assert r["plan_adopted"] and r["plans_adopted"] == 1 and r["plans_dropped"] == 0 and r["plan_actions"] == 4
    assert r["swap_on"] is False  # a capture taken without swap mode: no "swap=on" note from the shim
    p = r["prediction"]
    assert p["source"].startswith("daemon replay: records up to the last adopted plan (generation 1, 4 actions)")
    assert p["adopted_actions"] == 4 and p["period_ops"] == 160
    assert p["learn_options"]["min_swap_bytes"] == 4 << 20  # what the daemon's SwapAgent passed
    assert p["plan_actions_match"] == (p["written_actions"] == 4)
    # the planner's figures for this budget: peak 952 MiB live, 708 MiB needed at one op, so 900 MiB
    # is out of reach and the daemon would have written no plan
    assert (p["peak_bytes"], p["needed_bytes"]) == (998_246_400, 742_393_856)
    assert p["feasible"] is False and r["predicted_time_ratio"] is None
    assert p["reason"] == "no plan fits the budget 900.00 MiB: the job needs at least 708.00 MiB at one op, and " \
                          "the best plan reaches 952.00 MiB"  # the daemon's own line


def test_daemon_prediction_follows_the_daemons_options(tmp_path, monkeypatch):
    """The replay plans through the daemon's SwapAgent.plan_now, whatever options it learns with:
    here a daemon that learns by allocation site (stream-ordered tensors are candidates)."""
    from pyobmem import daemon, planner
    from pyobmem.capture import decode_records

    chose = []

    def plan_now(self, choose=False):
        chose.append(choose)
        recs = np.concatenate(self.static + self.window)
        cap = decode_records(recs[np.argsort(recs["ts_ns"], kind="stable")], self.meta, "<live>")
        learned = planner.learn_iteration(cap, min_swap_bytes=self.control.min_swap_bytes, by_site=True)
        return None if isinstance(learned, planner.NoPlan) else planner.make_plan(learned, self.budget_bytes,
                                                                                choose=choose)

    monkeypatch.setattr(daemon.SwapAgent, "plan_now", plan_now)
    path, _ = injected_capture(tmp_path)
    p = bench.daemon_prediction(path, 2 * GIB, 4 << 20)
    assert p["learn_options"] == {"min_swap_bytes": 4 << 20, "by_site": True}
    assert p["feasible"] is True and p["predicted_time_ratio"] == p["best_time_ratio"]
    assert p["peak_bytes"] == 998_246_400 and p["budget_bytes"] == 2 * GIB
    assert p["written_actions"] == p["actions"] and p["plan_actions_match"] == (p["actions"] == 4)
    assert planner.learn_iteration.__name__ == "learn_iteration"  # the watch is undone
    assert chose == [False]  # one plan adopted: the daemon's first, the cost model's cover


def test_swap_row_and_the_json(tmp_path):
    """A swap run's row against its baseline (20 measured steps each), from a capture with the
    per-tensor presets, and the JSON with its targets."""
    a = bench.build_parser().parse_args(["--parts", "gpt", "--out-dir", str(tmp_path)])
    a.ref_steps = a.steps
    nvml = types.SimpleNamespace(info=lambda: {"name": "synthetic"})
    b = bench.Bench(a, nvml, tmp_path)
    base_ms = [2000.0] * 5 + [12.0] * 20
    base = synthetic_run(base_ms, doc={"memory_stats": {"reserved_bytes.all.peak": RESERVED}})
    b.gpt_base = base
    path, _ = injected_capture(tmp_path)
    budget = bench.shim_budget(0.5, DRIVER_PEAK, GIB)
    run = synthetic_run([9000.0] * 5 + [13.44] * 20, peak=budget["budget_bytes"] - 1, losses=base.losses,
                        doc={"allocator_backend": "cudaMallocAsync",
                             "alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}},
                        stderr="UserWarning: foo_backward_cuda does not have a deterministic implementation, but")
    b.start_plan(path, budget["shim_budget_bytes"])  # `pyobmem plan --json` on it, as on the bench's trace
    copy = tmp_path / "untraced.pyobmem"
    copy.write_bytes(path.read_bytes())  # swap_row removes the capture it read
    row = b.swap_row(run, base, budget, path, traced=True)
    assert (row["blocks"], row["presets"]) == ("tensor", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert (row["measured_steps"], row["step_ms_median"]) == (20, 13.44) and row["time_ratio"] == pytest.approx(1.12)
    assert row["loss_identical"] is True and row["under_budget"] is True and row["over_budget_bytes"] == 0
    assert row["workload_allocator"]["allocator_backend"] == "cudaMallocAsync"
    assert row["nondeterministic_ops"] == ["foo_backward_cuda"]
    # 17.9 GB for GPT tiny's 952 MiB: nothing to swap, 1.00x of the capture's own iteration, by
    # `pyobmem plan` (12.87 ms: its template of the whole capture) and by the daemon's planner
    # (13.39 ms: the records up to the adopted plan), over the baseline's 12.0 ms step: 1.12
    # measured is within 1.15x of either
    assert row["plan_prediction"]["plan_time_ratio"] == 1.0 and row["plan_prediction"]["iteration_ms"] == 12.874
    assert row["predicted_step_ms"] == 12.874 and row["predicted_time_ratio"] == 12.874 / 12.0
    # the copy engines' frontier there: nothing to move (at -1), 1.00x of the same iteration
    assert row["plan_prediction"]["frontier"]["at"] == -1 and row["frontier_time_ratio"] == pytest.approx(12.874 / 12.0, abs=1e-5)
    assert row["prediction_within_1_15"] is True
    assert row["daemon_prediction"]["predicted_time_ratio"] == 1.0 and row["daemon_prediction"]["iteration_ms"] == 13.392
    assert row["daemon_predicted_step_ms"] == 13.392 and row["daemon_predicted_time_ratio"] == 13.392 / 12.0
    assert row["daemon_prediction_within_1_15"] is True
    assert row["prediction_source"] == "pyobmem plan on the trace"
    untraced = b.swap_row(run, base, budget, copy)  # a framework's row: no trace, the daemon's prediction
    assert untraced["predicted_time_ratio"] == 13.392 / 12.0 and "plan_prediction" not in untraced
    assert untraced["prediction_source"] == "the daemon's planner"
    assert row["errors"] == ["the shim did not turn swap mode on (its swap notes: [])"]
    b.doc("gpt")["budgets"].append(row)
    b.save("gpt")
    d = json.loads((tmp_path / "swap_gpt2_medium.json").read_text())
    assert d["targets"] == {"0.75": 1.05, "0.6": 1.2, "0.5": 1.35} and d["blocks"] == "tensor"
    assert d["presets"] == bench.preset_env()
    assert d["meets_targets"]["0.5"]["met"] is True  # 1.12 <= 1.35, under the budget, same losses, prediction
    assert d["meets_targets"]["0.75"]["met"] is False and d["meets_targets"]["all"] is False  # 0.75 did not run
    assert d["warmup_steps"] == 5 and d["steps"] == 25


def test_gpt_and_frameworks_parts_with_stand_in_runs(tmp_path, monkeypatch, capsys):
    """The schedule of the gpt and frameworks parts end to end, each run a stand-in: which runs get
    the presets, which peak each budget is a fraction of, and the rows written."""
    peaks = {"gpt baseline": DRIVER_PEAK, "gpt preset": DRIVER_PEAK - GIB, "resnet50 baseline": 40 * GIB,
             "resnet50 preset": 40 * GIB + 64 * MIB,  # 64 MiB more overhead under the preset
             "jax baseline": 105 * GIB, "jax preset": 2 * GIB}  # plain JAX preallocates 75% of the card
    calls = []

    def run_measured(label, script, args, json_path, nvml, timeout, steps, sample_s, env=None, capture=None,
                     launcher_options=(), warmup=bench.WARMUP):
        calls.append((label, script, dict(env or {}), launcher_options))
        budget = int(launcher_options[2]) if "--swap" in launcher_options else None
        if label == "gpt trace":
            capture.write_bytes(b"")  # planned by the stand-in below
        fw = {"reserved_bytes.all.peak": RESERVED} if script != "flax_mlp.py" else {"peak_bytes_in_use": GIB}
        return synthetic_run([3000.0] * warmup + [500.0] * (steps - warmup), doc={"memory_stats": fw},
                             peak=peaks.get(label, budget), env=bench.allocator_env(env or {}))

    monkeypatch.setattr(bench, "run_measured", run_measured)
    planned = []
    monkeypatch.setattr(bench.Bench, "start_plan", lambda self, cap, b: planned.append((cap.name, b)))
    monkeypatch.setattr(bench.Bench, "plan_prediction", lambda self, b, base: {"predicted_time_ratio": 1.05, "errors": []})
    monkeypatch.setattr(bench, "analyse_capture", lambda path, budget: {
        "errors": [], "blocks": "tensor", "presets": bench.preset_env(), "swap_on": True, "predicted_time_ratio": 1.05})
    a = bench.build_parser().parse_args(["--parts", "gpt,frameworks", "--out-dir", str(tmp_path)])
    a.ref_steps = a.steps
    b = bench.Bench(a, types.SimpleNamespace(info=dict), tmp_path)
    assert b.run() == 0
    presets = bench.preset_env()
    assert [(c[0], c[2] == presets, bool(c[3])) for c in calls] == [
        ("gpt baseline", False, False), ("gpt preset", True, False), ("gpt trace", False, True),
        *[(f"gpt swap {f}", False, True) for f in bench.FRACTIONS],
        ("gpt save_on_cpu", False, False), ("gpt checkpointing", False, False),
        ("resnet50 baseline", False, False), ("resnet50 preset", True, False), ("resnet50 swap", False, True),
        ("jax baseline", False, False), ("jax preset", True, False), ("jax swap", False, True)]
    budgets = {c[0]: int(c[3][2]) for c in calls if "--swap" in c[3]}
    assert budgets["gpt swap 0.5"] == int(0.5 * DRIVER_PEAK) - GIB  # of the native baseline, less its overhead
    assert [c[3] for c in calls if c[0] == "gpt trace"] == [("--tensor-blocks", "-q")]
    # `pyobmem plan` on the trace at each swap run's own budget
    assert planned == [("gpt2_medium_trace.pyobmem", budgets[f"gpt swap {f}"]) for f in bench.FRACTIONS]
    # ResNet-50: half of the allocations, its driver peak less the overhead, the preset's (64 MiB larger
    # than the baseline's); JAX: of the preset's 2 GiB
    assert budgets["resnet50 swap"] == RESERVED // 2 - 32 * MIB
    assert budgets["jax swap"] == int(GIB + 0.5 * GIB) - GIB
    gpt = json.loads((tmp_path / "swap_gpt2_medium.json").read_text())
    assert gpt["preset_alone"]["allocator_env"] == presets and gpt["baseline"]["allocator_env"] == {}
    assert gpt["preset_alone"]["loss_identical"] is True and gpt["preset_alone"]["time_ratio"] == 1.0
    assert [r["budget_fraction"] for r in gpt["budgets"]] == list(bench.FRACTIONS)
    assert all(r["blocks"] == "tensor" and r["measured_steps"] == 20 and r["prediction_within_1_15"] for r in gpt["budgets"])
    assert gpt["meets_targets"]["all"] is True  # 1.00x measured everywhere, 1.05x predicted
    assert gpt["save_on_cpu"]["loss_identical_to_baseline_prefix"] is True
    fw = json.loads((tmp_path / "swap_frameworks.json").read_text())
    assert (fw["jax"]["budget_basis"], fw["resnet50"]["budget_basis"]) == ("preset_alone", "baseline")
    assert fw["jax"]["swap"]["budget_bytes"] == int(1.5 * GIB) and fw["jax"]["swap"]["under_budget"] is True
    assert fw["jax"]["swap"]["loss_identical"] is True and fw["resnet50"]["swap"]["time_ratio"] == 1.0
    out = capsys.readouterr().out
    assert "jax preset_alone" in out and "all met: yes" in out


def test_swap_overhead_is_the_larger_of_the_runs():
    """The swap run has the preset's allocator: its budget leaves room for the larger overhead of the
    baseline's and the preset's (GPT medium on the H200: 711 and 784 MB)."""
    base = synthetic_run([500.0] * 25, peak=38140903424, doc={"memory_stats": {"reserved_bytes.all.peak": 37429968896}})
    preset = synthetic_run([500.0] * 25, peak=39942356992, doc={"memory_stats": {"reserved_bytes.all.peak": 39158022144}})
    assert bench.swap_overhead(base, preset) == 784334848
    assert bench.swap_overhead(base, None) == 710934528
    assert bench.swap_overhead(None) is None


def test_which_plan_a_run_ended_under(tmp_path):
    """The daemon's prediction plans with the replay's choice only when the last plan adopted was
    the choice, read from the plans file: not when the cover came back after the choice's trial."""
    from pyobmem import abi

    cap = tmp_path / "run.pyobmem"
    adopted = np.zeros(3, abi.RECORD_DTYPE)
    adopted["ts_ns"], adopted["a"] = [10, 20, 30], [1, 2, 3]
    assert bench._ended_under_choice(cap, adopted[:2]) is True  # no plans file: two adopted, the choice last
    assert bench._ended_under_choice(cap, adopted) is False
    kept = [{"generation": 1, "chosen_by_replay": False}, {"generation": 2, "chosen_by_replay": True},
            {"generation": 3, "chosen_by_replay": False, "restores": 1}]
    (tmp_path / "run.plans.json").write_text(json.dumps({"plans": kept}))
    assert bench._ended_under_choice(cap, adopted) is False
    assert bench._ended_under_choice(cap, adopted[:2]) is True
    assert bench._ended_under_choice(cap, adopted[:0]) is False


def test_references_keep_a_short_warmup_in_a_steady_state_bench(tmp_path, monkeypatch):
    """With --steps 70 --warmup 48 (the swap runs measured after the daemon's trial of the
    replay's choice) the references run --ref-steps 8 with a warm-up of 5 (at most 3 less)."""
    seen = []

    def run_measured(label, script, args, json_path, nvml, timeout, steps, sample_s, env=None, capture=None,
                     launcher_options=(), warmup=bench.WARMUP):
        seen.append((label, steps, warmup))
        return synthetic_run([3000.0] * warmup + [2000.0] * (steps - warmup))

    monkeypatch.setattr(bench, "run_measured", run_measured)
    a = bench.build_parser().parse_args(["--parts", "gpt", "--steps", "70", "--warmup", "48", "--ref-steps", "8",
                                         "--out-dir", str(tmp_path)])
    b = bench.Bench(a, types.SimpleNamespace(info=dict), tmp_path)
    b.gpt_base = synthetic_run([500.0] * 70)
    b.run_gpt_saver("save_on_cpu", "--save-on-cpu", 100.0)
    assert seen == [("gpt save_on_cpu", 8, 5)]
    assert b.doc("gpt")["save_on_cpu"]["measured_steps"] == 3
