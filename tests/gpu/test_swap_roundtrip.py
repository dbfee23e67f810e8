"""Swap mode on the real driver: 20 round trips. Four 64 MiB cudaMalloc blocks under a budget that
holds two (160 MiB), each moved one round forward by a kernel in turn (the kernel checks the
previous round of every word, errors counted in device memory), 20 times; at the end the host
copies every block back and checks every word (tests/gpu/progs/swap_cases.cu, mode roundtrip).

What the executor promises (native/swap.c): blocks of at least --min-swap-bytes are VMM-backed;
before a plan exists, a launch touching a block that is out brings it back first (SWAP_IN cause
DEMAND) and evicts the least recently used idle blocks to keep the budget. With four blocks taken
in turn and room for two, every touch of the loop finds its block out: 80 demand swap-ins.

The same test runs on stream-ordered blocks (``async``: cudaMallocAsync on the stream, freed with
cudaFreeAsync), which swap mode serves from its own VMM blocks like cudaMalloc ones (kind ASYNC)."""

import numpy as np
import pytest

from gpu_util import MiB, build_swap_prog, describe_swaps, ival, one_block, record_figure, run_swap, \
    swap_on, swap_rows
from pyobmem import abi

ROUNDS = 20
BUDGET = 160 * MiB
NAMES = ["blk0", "blk1", "blk2", "blk3"]


KIND = {"malloc": abi.AllocKind.DRIVER, "async": abi.AllocKind.ASYNC}


@pytest.fixture(scope="module", params=["malloc", "async"])
def roundtrip(request, shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"swap_roundtrip_{request.param}")
    run = run_swap([build_swap_prog(progs), "roundtrip", ROUNDS, request.param], d, budget="160MiB", timeout=180)
    run.variant = request.param
    return run


@pytest.mark.gpu
def test_swap_roundtrip_results_right(roundtrip):
    run = roundtrip
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["dev_errors"] == "0", f"words wrong when a kernel read them: {run.kv['dev_errors']}\n{run.why()}"
    assert run.kv["host_bad"] == "0", f"words wrong at the end: {run.kv['host_bad']}\n{run.why()}"
    assert int(run.kv["touches"]) == 4 * ROUNDS
    for i in range(4):
        assert int(run.kv[f"round_{i}"]) == ROUNDS, run.kv


@pytest.mark.gpu
def test_swap_roundtrip_swaps(roundtrip):
    run = roundtrip
    cap, kv, pid = run.cap, run.kv, run.pid
    assert run.rc == 0, run.why()
    swap_on(cap, pid)
    assert cap.meta["swap"]["budget_bytes"] == BUDGET, cap.meta["swap"]
    rows = {name: one_block(cap, pid, ival(kv[name]), 64 * MiB) for name in NAMES}
    for name, r in rows.items():
        assert int(cap.blocks["kind"][r]) == KIND[run.variant], (name, cap.blocks[r])
    s = cap.swaps
    mine = swap_rows(cap, pid)
    # Only the four blocks move (the 8-byte error counter is far under --min-swap-bytes), whole.
    others = [int(r) for r in mine if int(s["block"][r]) not in rows.values()]
    assert not others, f"swap events of other blocks:\n{describe_swaps(cap, pid, others)}"
    assert np.all(s["bytes"][mine] == 64 * MiB), describe_swaps(cap, pid)
    t0, t1 = int(kv["t_loop_start"]), int(kv["t_loop_end"])
    in_loop = mine[(s["ts_ns"][mine] >= t0) & (s["ts_ns"][mine] <= t1)]
    outs = in_loop[s["direction"][in_loop] == 0]
    ins = in_loop[s["direction"][in_loop] == 1]
    demand = ins[s["cause"][ins] == abi.SwapInCause.DEMAND]
    adopted = cap.plans[(cap.plans["pid"] == pid) & ~cap.plans["dropped"]]
    per_block = {name: (len(swap_rows(cap, pid, r, 0)), len(swap_rows(cap, pid, r, 1))) for name, r in rows.items()}
    out_ms = s["duration_ns"][swap_rows(cap, pid, direction=0)] / 1e6
    record_figure(f"swap_roundtrip_{run.variant}", {
        "swap_outs_in_loop": len(outs), "swap_ins_in_loop": len(ins), "demand_ins_in_loop": len(demand),
        "per_block_out_in": per_block, "plans_adopted": len(adopted),
        "swap_out_ms_median": float(np.median(out_ms)) if len(out_ms) else None,
        "loop_s": (t1 - t0) / 1e9,
    })
    for name, (n_out, n_in) in per_block.items():
        assert n_out >= 1 and n_in >= 1, f"{name} never went out and back: {per_block}\n{describe_swaps(cap, pid)}"
    if len(adopted) == 0:
        # LRU only: each of the 80 touches finds its block out and brings it back, evicting one.
        assert len(demand) == 4 * ROUNDS == len(ins), (
            f"{len(demand)} demand swap-ins ({len(ins)} in all) during the loop, expected {4 * ROUNDS}\n"
            f"{describe_swaps(cap, pid)}"
        )
        assert len(outs) >= 4 * ROUNDS - 1, f"{len(outs)} swap-outs during the loop\n{describe_swaps(cap, pid)}"
    else:
        # A plan was adopted mid-run: any policy needs >= 2 swap-ins per round (4 blocks in turn, room for 2).
        assert len(ins) >= 2 * ROUNDS and len(outs) >= 2 * ROUNDS, (
            f"{len(ins)} swap-ins, {len(outs)} swap-outs under plan(s) {adopted.tolist()}\n{describe_swaps(cap, pid)}"
        )
