"""Swap mode on a real training job: scripts/workloads/gpt.py --size tiny --deterministic, run
without pyobmem and under ``--swap`` with a budget of 85% of what the plain run's caching allocator
reserved at its peak (``--min-swap-bytes 2MiB``, so that the allocator's segments, 2 MiB and up, are
all VMM-backed). The losses (float.hex per step) must be bit-identical, the capture must show swaps,
and the device memory the run added, measured by the driver (NVML, sampled every 0.5 ms), must stay
under the budget.

The device memory is measured for the whole device (NVML per-process figures are often empty in a
container): the plain run's peak minus its allocator's reserved peak is the CUDA context and the
module code (the same in both runs); the swap run's peak minus that overhead is what its blocks
occupied. The capture gives the shim's own view of the same quantity for the failure message."""

import json
import sys

import numpy as np
import pytest

from gpu_util import MiB, WORKLOADS, DeviceMemorySampler, describe_swaps, main_pid, record_figure, \
    run_plain, run_swap, step_losses, swap_on, swap_rows
from pyobmem import abi

STEPS = 20
ARGS = ["--size", "tiny", "--steps", str(STEPS), "--deterministic"]
# the caching allocator, chosen by the user (the per-tensor preset keeps it): one cudaMalloc per segment
ENV = {"PYTORCH_CUDA_ALLOC_CONF": "backend:native", "PYTORCH_ALLOC_CONF": None}
MIN_SWAP = 2 * MiB
BUDGET_FRACTION = 0.85
SLACK = 64 * MiB  # measurement noise: context and module memory differ a little run to run


@pytest.fixture(scope="module")
def gpt(shim, need_torch, tmp_path_factory):
    d = tmp_path_factory.mktemp("swap_gpt")
    cmd = [sys.executable, WORKLOADS / "gpt.py", *ARGS]
    sampler = DeviceMemorySampler.open()
    out = {"sampler_why": DeviceMemorySampler.why if sampler is None else ""}
    if sampler:
        with sampler:
            plain = run_plain(cmd + ["--json", d / "plain.json"], d, env=ENV, timeout=300)
        out["plain_added"], out["plain_samples"] = sampler.added, sampler.samples
    else:
        plain = run_plain(cmd + ["--json", d / "plain.json"], d, env=ENV, timeout=300)
    assert plain.rc == 0, plain.why()
    pj = json.loads((d / "plain.json").read_text())
    reserved = int(pj["memory_stats"]["reserved_bytes.all.peak"])
    budget = int(reserved * BUDGET_FRACTION) // MiB * MiB
    swap_cmd = cmd + ["--json", d / "swap.json"]
    if sampler:
        with sampler:
            swap = run_swap(swap_cmd, d, budget=f"{budget // MiB}MiB", min_swap=f"{MIN_SWAP // MiB}MiB", env=ENV,
                            timeout=300)
        out["swap_added"], out["swap_samples"] = sampler.added, sampler.samples
    else:
        swap = run_swap(swap_cmd, d, budget=f"{budget // MiB}MiB", min_swap=f"{MIN_SWAP // MiB}MiB", env=ENV,
                        timeout=300)
    out.update(plain=plain, swap=swap, pj=pj, reserved=reserved, budget=budget, dir=d)
    return out


def residency(cap, pid: int, min_bytes: int) -> dict:
    """The shim's view from the capture: bytes of VMM-backed blocks (DRIVER, >= min_bytes) with
    physical memory over time. A SWAP_OUT is written when the memory is released, duration_ns after
    its copy was issued (the block is "leaving" in between: the executor counts it as gone); a
    SWAP_IN when the new memory is mapped. Returns the peaks of mapped, mapped - leaving, leaving."""
    b = cap.blocks
    rows = np.nonzero((b["pid"] == pid) & (b["kind"] == abi.AllocKind.DRIVER) & (b["size"] >= np.uint64(min_bytes)))[0]
    gran = 2 * MiB
    vsize = {int(r): (int(b["size"][r]) + gran - 1) // gran * gran for r in rows}
    ev = []  # (t, d_mapped, d_leaving)
    s = cap.swaps
    for r in rows:
        r = int(r)
        ev.append((int(b["t_alloc"][r]), vsize[r], 0))
        if int(b["t_free"][r]) != -1:
            prior = np.nonzero((s["block"] == r) & (s["ts_ns"] < b["t_free"][r]))[0]
            if not (len(prior) and int(s["direction"][prior[-1]]) == 0):
                ev.append((int(b["t_free"][r]), -vsize[r], 0))
    for i in swap_rows(cap, pid):
        r = int(s["block"][i])
        if r not in vsize:
            continue
        t = int(s["ts_ns"][i])
        if int(s["direction"][i]) == 0:
            ev += [(t, -vsize[r], -vsize[r]), (t - int(s["duration_ns"][i]), 0, vsize[r])]
        else:
            ev.append((t, vsize[r], 0))
    ev.sort()
    mapped = leaving = 0
    peak = {"mapped": 0, "mapped_minus_leaving": 0, "leaving": 0}
    for _, dm, dl in ev:
        mapped += dm
        leaving += dl
        peak["mapped"] = max(peak["mapped"], mapped)
        peak["mapped_minus_leaving"] = max(peak["mapped_minus_leaving"], mapped - leaving)
        peak["leaving"] = max(peak["leaving"], leaving)
    return peak


@pytest.mark.gpu
def test_swap_gpt_losses_bit_identical(gpt):
    plain, swap = gpt["plain"], gpt["swap"]
    assert swap.rc == 0, swap.why()
    sj = json.loads((gpt["dir"] / "swap.json").read_text())
    assert len(gpt["pj"]["losses"]) == STEPS, gpt["pj"]["losses"]
    assert sj["losses"] == gpt["pj"]["losses"], (
        f"losses differ under --swap (budget {gpt['budget'] // MiB} MiB):\n plain {gpt['pj']['losses']}\n"
        f" swap  {sj['losses']}"
    )
    assert step_losses(swap.proc.stdout) == step_losses(plain.proc.stdout) == gpt["pj"]["losses"]
    # The caching allocator saw the same job: same segments requested.
    assert sj["memory_stats"]["reserved_bytes.all.peak"] == gpt["reserved"], (sj["memory_stats"], gpt["reserved"])


@pytest.mark.gpu
def test_swap_gpt_swapped(gpt):
    swap = gpt["swap"]
    assert swap.rc == 0, swap.why()
    cap = swap.cap
    pid = main_pid(cap)
    swap_on(cap, pid)
    assert cap.meta["swap"]["budget_bytes"] == gpt["budget"] and cap.meta["swap"]["min_swap_bytes"] == MIN_SWAP
    s = cap.swaps
    outs, ins = swap_rows(cap, pid, direction=0), swap_rows(cap, pid, direction=1)
    causes = {c.name: int(np.count_nonzero(s["cause"][ins] == c)) for c in abi.SwapInCause}
    plans = cap.plans[cap.plans["pid"] == pid]
    sj = json.loads((gpt["dir"] / "swap.json").read_text())
    record_figure("swap_gpt_tiny", {
        "budget_bytes": gpt["budget"], "reserved_peak": gpt["reserved"], "swap_outs": len(outs),
        "swap_ins": len(ins), "swap_in_causes": causes, "swapped_out_bytes": int(s["bytes"][outs].sum()),
        "plans_adopted": int(np.count_nonzero(~plans["dropped"])), "plans_dropped": int(np.count_nonzero(plans["dropped"])),
        "step_ms_plain_median": float(np.median(gpt["pj"]["step_ms"][2:])),
        "step_ms_swap_median": float(np.median(sj["step_ms"][2:])),
    })
    assert len(outs) >= 1 and len(ins) >= 1, (
        f"no swaps under a budget of {gpt['budget'] // MiB} MiB (reserved peak {gpt['reserved'] // MiB} MiB)\n"
        f"{describe_swaps(cap, pid)}\n{swap.why()}"
    )
    for r in np.concatenate([outs, ins]):
        b = int(s["block"][r])
        assert b >= 0 and int(cap.blocks["kind"][b]) == abi.AllocKind.DRIVER, cap.blocks[b] if b >= 0 else b
        assert int(s["bytes"][r]) == int(cap.blocks["size"][b]) >= MIN_SWAP, (s[r], cap.blocks[b])


@pytest.mark.gpu
def test_swap_gpt_peak_under_budget(gpt):
    if "swap_added" not in gpt:
        pytest.skip(f"NVML unavailable: {gpt['sampler_why']}")
    swap = gpt["swap"]
    assert swap.rc == 0, swap.why()
    cap = swap.cap
    pid = main_pid(cap)
    budget, reserved = gpt["budget"], gpt["reserved"]
    overhead = gpt["plain_added"] - reserved
    used = gpt["swap_added"] - overhead
    view = residency(cap, pid, MIN_SWAP)
    figures = {
        "budget": budget, "plain_reserved_peak": reserved, "plain_device_added": gpt["plain_added"],
        "context_overhead": overhead, "swap_device_added": gpt["swap_added"], "swap_blocks_peak_measured": used,
        "capture_mapped_peak": view["mapped"], "capture_mapped_minus_leaving_peak": view["mapped_minus_leaving"],
        "capture_leaving_peak": view["leaving"], "samples": [gpt["plain_samples"], gpt["swap_samples"]],
    }
    record_figure("swap_gpt_tiny_memory", figures)
    mib = {k: (round(v / MiB, 1) if isinstance(v, int) and k != "samples" else v) for k, v in figures.items()}
    assert gpt["plain_samples"] > 100 and gpt["swap_samples"] > 100, figures
    assert overhead > 0, f"the plain run added less than its allocator reserved: {mib} (MiB)"
    assert used <= budget + SLACK, (
        f"device memory over the budget: the swap run's blocks took {used / MiB:.1f} MiB at the peak (driver, "
        f"context overhead {overhead / MiB:.1f} MiB taken off), budget {budget / MiB:.0f} MiB. The capture says: "
        f"mapped peak {view['mapped'] / MiB:.1f} MiB, mapped minus swap-outs in flight {view['mapped_minus_leaving'] / MiB:.1f} "
        f"MiB (what the executor keeps under the budget), in flight at most {view['leaving'] / MiB:.1f} MiB. "
        f"All figures (MiB): {mib}"
    )
    assert used < reserved, f"no device memory saved: {mib} (MiB)"
