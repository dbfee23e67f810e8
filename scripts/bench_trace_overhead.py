#!/usr/bin/env python3
"""What tracing costs: step time traced versus untraced, and the added time per op.

Workloads: GPT-2 small and the launch-bound MLP in rounds (--repeats) of three adjacent runs:
untraced, traced (the launcher's default: the shim's launch hooks) and traced with CUPTI launch
callbacks (--cupti); the LSTM language model (scripts/workloads/lstm_lm.py, ~380 ops per 6 ms
batch) in --lstm-rounds rounds of two adjacent runs, untraced and traced (the launcher's
defaults). The order flips every round; the workload is pinned to one CPU (--cpu), the launcher and
its daemon to the others (its ring draining is not the shim's cost). Per run
the figure is the median step time after the warm-up steps; the ratio is the median over rounds
of traced / untraced within the round, with a 95% bootstrap confidence interval of that median
(scipy.stats.bootstrap), and the added microseconds per op the same statistic of (traced -
untraced step ms) * 1000 / ops per step (launches, copies, sets and graph launches, from the
capture).

--only selftime runs the LSTM traced once more under a self-timing shim (`make native
SELFTIME=1`, built into the work directory and given by PYOBMEM_SHIM): the shim's own time per
step, part by part, measured inside the program, which the run-to-run spread of step times (60%
between untraced runs on the H200) does not blur.

The per-op-kind figures come from tests/gpu/progs/op_cost.cu (built here with nvcc): host
microseconds per kernel launch (three pointers, or a 512-byte struct), async copy, async set and
stream-ordered alloc+free pair, untraced and under the launcher in --op-rounds alternating rounds.

    python3 scripts/bench_trace_overhead.py [--only gpt|mlp|lstm|ops|selftime ...] [--repeats 5] [--cpu 2]

Writes bench/results/trace_overhead.json (entries of workloads not run are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_trace as bt
from _bench import REPO, WARMUP, child_env, die, fmt, launcher, require_gpu, steady_median

TARGETS = {"gpt_small": 1.02, "mlp": 1.15, "lstm_lm": 1.05, "us_per_launch": 1.0}
OP_COST_SRC = REPO / "tests" / "gpu" / "progs" / "op_cost.cu"
ARCH = os.environ.get("PYOBMEM_TEST_ARCH", "90")
CI_RESAMPLES = 10000


def counts_in(capture: Path) -> tuple[int | None, int | None, str | None]:
    """(launches, ops: launches, copies, sets and graph launches) of the capture's main process."""
    try:
        cap = bt.load_capture(capture)
        pid = bt.main_pid(cap)
        m = bt.capture_metrics(cap, pid)
        ops = int((cap.ops["pid"] == pid).sum()) if pid is not None else 0
        return m["launches"], ops, None
    except Exception as e:  # noqa: BLE001
        return None, None, f"reading capture: {type(e).__name__}: {e}"


def median_ci(xs: list[float]) -> list[float] | None:
    """95% percentile-bootstrap confidence interval of the median of xs (None for fewer than 3)."""
    if len(xs) < 3:
        return None
    from scipy.stats import bootstrap  # imported late: --help needs no scipy

    r = bootstrap((xs,), statistics.median, n_resamples=CI_RESAMPLES, confidence_level=0.95,
                  method="percentile", vectorized=False, random_state=0)
    return [float(r.confidence_interval.low), float(r.confidence_interval.high)]


# Modes: untraced; traced from the shim's own launch hooks (the default); traced with CUPTI launch
# callbacks (--cupti), which shows what the CUPTI callback itself costs.
MODES = {"untraced": None, "traced": (), "traced_cupti": ("--cupti",)}


def bench(name: str, script: str, args: list[str], steps: int, repeats: int, warmup: int, work: Path,
          timeout: float, pin_cpu: int | None, modes: dict = MODES) -> dict:
    runs = []
    errors = []
    ref_losses = None
    identical = True
    # One discarded run first: on the H200 VM the first runs of a session were up to 1.6x slower
    # (clocks ramping), which swamps a ~1 us/launch effect.
    bt.log(f"{name}: warm-up run (discarded)")
    bt.run_workload(script, args, work / f"{name}.warmup.json", timeout=timeout, pin_cpu=pin_cpu)
    for r in range(repeats):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            options = modes[mode]
            cap = work / f"{name}.{r}.{mode}.pyobmem" if options is not None else None
            bt.log(f"{name}: repeat {r + 1}/{repeats} {mode}")
            run = bt.run_workload(script, args, work / f"{name}.{r}.{mode}.json", capture=cap, timeout=timeout,
                                  launcher_options=options or (), pin_cpu=pin_cpu)
            med = steady_median(run.step_ms, warmup)
            row = {"repeat": r, "mode": mode, "rc": run.rc, "wall_s": round(run.wall_s, 2), "steps": len(run.step_ms),
                   "step_ms_median": med}
            errors += [f"{mode} repeat {r}: {e}" for e in run.errors]
            if cap is not None:
                launches, ops, err = counts_in(cap) if cap.exists() else (None, None, f"no capture at {cap}")
                row["launches"] = launches
                row["launches_per_step"] = launches / len(run.step_ms) if launches and run.step_ms else None
                row["ops_per_step"] = ops / len(run.step_ms) if ops and run.step_ms else None
                if err:
                    errors.append(f"traced repeat {r}: {err}")
                cap.unlink(missing_ok=True)
            if run.losses:
                if ref_losses is None:
                    ref_losses = run.losses
                elif run.losses != ref_losses:
                    identical = False
            bt.log(f"{name}: {mode} median step {fmt(med, '.3f')} ms (rc {run.rc}, {run.wall_s:.1f} s)")
            runs.append(row)

    def med_of(mode: str, key: str = "step_ms_median"):
        xs = [x[key] for x in runs if x["mode"] == mode and x.get(key) is not None]
        return statistics.median(xs) if xs else None

    def paired(mode: str, per_step: float | None) -> dict:
        """Median over rounds of (mode's step time / untraced step time) and of the added
        microseconds per op, each with its 95% CI: each round's runs are adjacent in time, so
        drift between rounds cancels."""
        by = {(x["repeat"], x["mode"]): x["step_ms_median"] for x in runs if x.get("step_ms_median") is not None}
        pairs = [(by[r, mode], by[r, "untraced"]) for r in range(repeats) if (r, mode) in by and (r, "untraced") in by]
        if not pairs:
            return {"traced_step_ms": med_of(mode), "time_ratio": None, "time_ratio_ci95": None,
                    "added_us_per_op": None, "added_us_per_op_ci95": None, "rounds": 0}
        ratios = [t / u for t, u in pairs]
        added = [(t - u) * 1000.0 / per_step for t, u in pairs] if per_step else []
        return {"traced_step_ms": med_of(mode), "time_ratio": statistics.median(ratios),
                "time_ratio_ci95": median_ci(ratios),
                "added_us_per_op": statistics.median(added) if added else None,
                "added_us_per_op_ci95": median_ci(added) if added else None, "rounds": len(pairs),
                "_added_ms": statistics.median(t - u for t, u in pairs)}

    lps, ops = med_of("traced", "launches_per_step"), med_of("traced", "ops_per_step")
    traced = {m: paired(m, ops) for m in modes if m != "untraced"}
    for t in traced.values():
        dt = t.pop("_added_ms", None)
        t["added_us_per_launch"] = (dt * 1000.0 / lps) if (dt is not None and lps) else None
    res = {
        "steps_per_run": steps,
        "warmup_steps_skipped": warmup,
        "pinned_cpu": pin_cpu,
        "daemon_cpus": "all but pinned_cpu" if bt.off_cpu(pin_cpu) else "any",
        "untraced_step_ms": med_of("untraced"),
        **traced["traced"],
        "launches_per_step": lps,
        "ops_per_step": ops,
        **({"cupti": traced["traced_cupti"]} if "traced_cupti" in traced else {}),
        "loss_identical_all_runs": identical if ref_losses else None,
        "runs": runs,
        "errors": errors,
    }
    for e in errors:
        bt.log(f"{name}: ERROR {e}")
    return res


def build_op_cost(work: Path) -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    exe = work / "op_cost"
    p = subprocess.run([nvcc, "-O2", "-gencode", f"arch=compute_{ARCH},code=[sm_{ARCH},compute_{ARCH}]", "-cudart",
                        "shared", "-o", str(exe), str(OP_COST_SRC)], capture_output=True, text=True)
    if p.returncode != 0:
        die(f"building {OP_COST_SRC.name} failed: {(p.stderr or p.stdout).strip()[-300:]}")
    return exe


def op_cost(rounds: int, work: Path, pin_cpu: int | None, timeout: float, options: tuple[str, ...] = ()) -> dict:
    """Host microseconds per op kind (op_cost.cu), untraced and traced (the launcher's defaults,
    then ``options``) in alternating rounds: medians, and the median added time per op with its
    95% CI."""
    exe = build_op_cost(work)
    pre = ["taskset", "-c", str(pin_cpu)] if pin_cpu is not None else []
    runs, errors = [], []
    for r in range(rounds):
        for mode in (("untraced", "traced") if r % 2 == 0 else ("traced", "untraced")):
            out = work / f"op_cost.{r}.{mode}.json"
            cmd = [*pre, str(exe), "--json", str(out)]
            if mode == "traced":
                cmd = bt.off_cpu(pin_cpu) + launcher(work / f"op_cost.{r}.pyobmem", options) + cmd
            bt.log(f"op_cost: round {r + 1}/{rounds} {mode}")
            try:
                p = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)
                rc, tail = p.returncode, (p.stderr or p.stdout).strip()[-300:]
            except subprocess.TimeoutExpired:
                rc, tail = 124, f"timed out after {timeout:.0f} s"
            if rc != 0 or not out.exists():
                errors.append(f"{mode} round {r}: exit status {rc}: {tail}")
                continue
            runs.append({"round": r, "mode": mode, **json.loads(out.read_text())})
            (work / f"op_cost.{r}.pyobmem").unlink(missing_ok=True)
    kinds = sorted({k for x in runs for k in x["us_per_op"]})
    res: dict = {"rounds": rounds, "launcher_options": list(options), "kinds": {}, "runs": runs, "errors": errors}
    by = {(x["round"], x["mode"]): x for x in runs}
    for k in kinds:
        un = [x["us_per_op"][k] for x in runs if x["mode"] == "untraced"]
        tr = [x["us_per_op"][k] for x in runs if x["mode"] == "traced"]
        added = [by[r, "traced"]["us_per_op"][k] - by[r, "untraced"]["us_per_op"][k]
                 for r in range(rounds) if (r, "traced") in by and (r, "untraced") in by]
        res["kinds"][k] = {
            "untraced_us": statistics.median(un) if un else None,
            "traced_us": statistics.median(tr) if tr else None,
            "added_us": statistics.median(added) if added else None,
            "added_us_ci95": median_ci(added) if added else None,
        }
    clocks = [x["clock_gettime_ns"] for x in runs]
    res["clock_gettime_ns"] = statistics.median(clocks) if clocks else None
    for e in errors:
        bt.log(f"op_cost: ERROR {e}")
    return res


SELFTIME_RE = re.compile(r"^pyobmem selftime (\w+) calls=(\d+) ns_each=([\d.]+) total_ms=([\d.]+)$", re.M)
# The parts that are the shim's own work on the application's thread (ring writes are inside the
# records; launch_driver is the driver's own launch call, for scale).
SHIM_PARTS = ("launch_record", "copy_record", "params_refresh", "gpuclock_sample")


def parse_selftime(stderr: str, steps: int) -> dict:
    """The self-timing shim's exit lines (native/selftime.c) per training step: {"parts": {part:
    {"calls_per_step", "ns_each", "us_per_step"}}, "shim_us_per_step"} (the sum over SHIM_PARTS).
    Raises ValueError when there is none."""
    parts = {m[0]: {"calls_per_step": int(m[1]) / steps, "ns_each": float(m[2]),
                    "us_per_step": float(m[3]) * 1000.0 / steps} for m in SELFTIME_RE.findall(stderr)}
    if not parts:
        raise ValueError("no selftime lines: was the shim built with SELFTIME=1?")
    return {"parts": parts, "shim_us_per_step": sum(parts[k]["us_per_step"] for k in SHIM_PARTS if k in parts)}


def selftime(steps: int, warmup_ms: float | None, work: Path, timeout: float, pin_cpu: int | None,
             common: list[str]) -> dict:
    """One traced LSTM run under a self-timing shim: the shim's own µs per step, and that against
    the untraced step time of the lstm part (``warmup_ms``: its median, when run) as a ratio."""
    shim = work / "libpyobmem_selftime.so"
    p = subprocess.run(["make", "-s", "-B", "native", f"SHIM={shim}", "SELFTIME=1"], cwd=REPO, capture_output=True,
                       text=True)
    if p.returncode != 0:
        die(f"building the self-timing shim failed: {(p.stderr or p.stdout).strip()[-300:]}")
    bt.log("lstm_lm: traced run under the self-timing shim")
    run = bt.run_workload("lstm_lm.py", ["--steps", str(steps), *common], work / "lstm_lm.selftime.json",
                          capture=work / "lstm_lm.selftime.pyobmem", env={"PYOBMEM_SHIM": str(shim)},
                          timeout=timeout, pin_cpu=pin_cpu)
    res: dict = {"steps": len(run.step_ms), "step_ms_median": steady_median(run.step_ms, steps // 2),
                 "errors": list(run.errors)}
    try:
        res.update(parse_selftime(run.stderr, max(len(run.step_ms), 1)))
    except ValueError as e:
        res["errors"].append(str(e))
        return res
    if warmup_ms:
        res["untraced_step_ms"] = warmup_ms
        res["shim_share_of_untraced_step"] = res["shim_us_per_step"] / 1000.0 / warmup_ms
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="untraced/traced/CUPTI rounds per workload (default 5)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--only", choices=("gpt", "mlp", "lstm", "ops", "selftime"), action="append",
                    help="default: gpt, mlp, lstm and ops (lstm and ops alone take about 3.5 minutes on the "
                         "H200); selftime: the LSTM under a self-timing shim")
    ap.add_argument("--gpt-steps", type=int, default=15)
    ap.add_argument("--mlp-steps", type=int, default=300)
    ap.add_argument("--lstm-steps", type=int, default=400)
    ap.add_argument("--lstm-warmup", type=int, default=200,
                    help="LSTM batches left out of each run's median (default 200)")
    ap.add_argument("--lstm-rounds", type=int, default=10, help="untraced/traced rounds of the LSTM (default 10)")
    ap.add_argument("--op-rounds", type=int, default=5, help="untraced/traced rounds of op_cost (default 5)")
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=2, help="pin the workload to this CPU (-1: do not pin; default 2)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per workload run")
    ap.add_argument("--no-cupti-rounds", action="store_true",
                    help="GPT and MLP rounds without the --cupti run (two runs a round instead of three)")
    ap.add_argument("--deterministic", action="store_true",
                    help="run the workloads with --deterministic (slower: the MLP went from ~3.3 to 6-9 ms "
                         "per step on the H200); default off, as in the platform facts")
    a = ap.parse_args(argv)
    if min(a.repeats, a.lstm_rounds, a.op_rounds) < 1:
        die("--repeats, --lstm-rounds and --op-rounds must be at least 1")
    if a.lstm_warmup >= a.lstm_steps:
        die("--lstm-warmup must be less than --lstm-steps")
    only = set(a.only or ("gpt", "mlp", "lstm", "ops"))
    require_gpu()
    pin = None if a.cpu < 0 else a.cpu
    common = ["--seed", str(a.seed)] + (["--deterministic"] if a.deterministic else [])
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="pyobmem-overhead-") as tmp:
        work = Path(tmp)
        traced = ()  # the launcher's default: the shim's launch hooks
        modes = {k: v for k, v in MODES.items() if not (a.no_cupti_rounds and k == "traced_cupti")}
        if "ops" in only:
            out["op_cost"] = op_cost(a.op_rounds, work, pin, a.timeout, traced)
        if "lstm" in only:
            out["lstm_lm"] = bench("lstm_lm", "lstm_lm.py", ["--steps", str(a.lstm_steps), *common], a.lstm_steps,
                                   a.lstm_rounds, a.lstm_warmup, work, a.timeout, pin,
                                   {"untraced": None, "traced": traced})
            out["lstm_lm"]["launcher_options"] = list(traced)
        if "selftime" in only:
            out["lstm_lm_selftime"] = selftime(a.lstm_steps, (out.get("lstm_lm") or {}).get("untraced_step_ms"), work,
                                               a.timeout, pin, common)
        if "gpt" in only:
            out["gpt_small"] = bench("gpt_small", "gpt.py", ["--size", "small", "--steps", str(a.gpt_steps), *common],
                                     a.gpt_steps, a.repeats, a.warmup, work, a.timeout, pin, modes)
        if "mlp" in only:
            out["launch_bound_mlp"] = bench("launch_bound_mlp", "mlp.py", ["--steps", str(a.mlp_steps), *common],
                                            a.mlp_steps, a.repeats, a.warmup, work, a.timeout, pin, modes)
    out["targets"] = TARGETS
    out["repeats"] = a.repeats
    out["deterministic"] = a.deterministic
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    path = a.out_dir / "trace_overhead.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.update(out)  # entries of workloads not run now stay as they were
    doc["meets_targets"] = meets_targets(doc)
    bt.write_json(path, doc)

    print()
    head = (f"{'workload':<18} {'untraced ms':>11} {'traced ms':>10} {'ratio':>7} {'95% CI':>13} {'target':>7} "
            f"{'ops/step':>9} {'+us/op':>7}")
    print(head)
    print("-" * len(head))
    for name, key in (("gpt_small", "gpt_small"), ("launch_bound_mlp", "mlp"), ("lstm_lm", "lstm_lm")):
        r = out.get(name)
        if not isinstance(r, dict) or "runs" not in r:
            continue
        ci = r.get("time_ratio_ci95")
        ci_s = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
        print(f"{name:<18} {fmt(r['untraced_step_ms'], '.3f'):>11} {fmt(r['traced_step_ms'], '.3f'):>10} "
              f"{fmt(r['time_ratio'], '.3f'):>7} {ci_s:>13} {TARGETS[key]:>7.2f} {fmt(r['ops_per_step'], '.1f'):>9} "
              f"{fmt(r['added_us_per_op'], '.2f'):>7}")
    oc = out.get("op_cost")
    if oc:
        print()
        print(f"{'op kind':<18} {'untraced us':>11} {'traced us':>10} {'+us':>7} {'95% CI':>13}")
        for k, v in oc["kinds"].items():
            ci = v["added_us_ci95"]
            print(f"{k:<18} {fmt(v['untraced_us'], '.3f'):>11} {fmt(v['traced_us'], '.3f'):>10} "
                  f"{fmt(v['added_us'], '.3f'):>7} {(f'{ci[0]:.3f}-{ci[1]:.3f}' if ci else '-'):>13}")
        print(f"clock_gettime: {fmt(oc['clock_gettime_ns'], '.1f')} ns per call")
    st = out.get("lstm_lm_selftime")
    if st and st.get("parts"):
        print()
        print(f"lstm_lm under the self-timing shim: {fmt(st['shim_us_per_step'], '.1f')} us of the shim's own per step"
              + (f" ({100 * st['shim_share_of_untraced_step']:.1f}% of the untraced step)"
                 if st.get("shim_share_of_untraced_step") else ""))
        for k, v in st["parts"].items():
            print(f"  {k:<18} {v['calls_per_step']:>8.1f} calls/step {v['ns_each']:>8.1f} ns each "
                  f"{v['us_per_step']:>8.1f} us/step")
    print(f"target added time per launch: <= {TARGETS['us_per_launch']} us")
    return 1 if any(isinstance(r, dict) and r.get("errors") for r in out.values()) else 0


def meets_targets(doc: dict) -> dict:
    """Each target against the figures in doc (None: not measured)."""
    def ratio(name: str, key: str):
        r = doc.get(name) or {}
        return None if r.get("time_ratio") is None else r["time_ratio"] <= TARGETS[key]

    launch = ((doc.get("op_cost") or {}).get("kinds") or {}).get("launch") or {}
    return {
        "gpt_small": ratio("gpt_small", "gpt_small"),
        "mlp": ratio("launch_bound_mlp", "mlp"),
        "lstm_lm": ratio("lstm_lm", "lstm_lm"),
        "us_per_launch": None if launch.get("added_us") is None else launch["added_us"] <= TARGETS["us_per_launch"],
    }


if __name__ == "__main__":
    sys.exit(main())
