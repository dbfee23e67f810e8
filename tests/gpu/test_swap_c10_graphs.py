"""C10 under swap mode on the real driver: CUDA graphs launch kernels with no per-kernel hook; the
shim walks the graph at instantiation and, at each graph launch, brings the whole touched set back
first.

- C program (tests/gpu/progs/swap_cases.cu, mode c10): a stream-captured graph moves two of six
  64 MiB blocks one round forward (the round is read from device memory); between replays the four
  other blocks are touched in turn, so under a budget of two blocks (160 MiB) both graph blocks are
  out before every replay after the first.
- PyTorch (tests/gpu/progs/swap_torch_train.py --graph): a training step captured with
  torch.cuda.graph and replayed, six 64 MiB tensors moved forward after every replay, budget
  256 MiB, --min-swap-bytes 2MiB; losses and final parameters bit-identical to the run without
  pyobmem."""

import json
import sys

import numpy as np
import pytest

from gpu_util import MiB, PROGS, build_swap_prog, describe_ops, describe_swaps, ival, one_block, op_rows, \
    out_at, record_figure, run_plain, run_swap, swap_on, swap_rows, touched_blocks
from pyobmem import abi

REPLAYS = 8
TORCH_STEPS = 10


@pytest.fixture(scope="module")
def c10(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c10")
    return run_swap([build_swap_prog(progs), "c10", REPLAYS], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c10_graph_results_right(c10):
    run = c10
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["dev_errors"] == "0" and run.kv["host_bad"] == "0", run.why()
    assert int(run.kv["round_0"]) == int(run.kv["round_1"]) == REPLAYS, run.kv
    assert int(run.kv["round_2"]) == REPLAYS, run.kv


@pytest.mark.gpu
def test_c10_graph_launch_makes_blocks_resident_first(c10):
    run = c10
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    a, b = (one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in (0, 1))
    graphs = op_rows(cap, pid, abi.Ev.GRAPH_LAUNCH)
    assert len(graphs) == REPLAYS, f"{len(graphs)} graph launches\n{describe_ops(cap, pid, 120)}"
    ops_t = np.sort(cap.ops["ts_ns"][cap.ops["pid"] == pid])
    s = cap.swaps
    brought = 0
    for k, g in enumerate(graphs):
        g = int(g)
        t = int(cap.ops["ts_ns"][g])
        f = int(cap.ops["flags"][g])
        assert {a, b} <= touched_blocks(cap, g), (
            f"graph launch {k} does not touch both graph blocks (the instantiate-time walk): "
            f"touched {touched_blocks(cap, g)}, want {a}, {b}; flags {abi.LaunchFlag(f)!r}"
        )
        assert f & int(abi.LaunchFlag.OPAQUE) == 0, f"graph launch {k} is opaque: {abi.LaunchFlag(f)!r}"
        for blk in (a, b):
            assert not out_at(cap, blk, t), (
                f"block row {blk} out at graph launch {k}\n{describe_swaps(cap, pid, swap_rows(cap, pid, blk))}"
            )
        # Brought back for this launch: a SWAP_IN of both since the op before it.
        prev = ops_t[np.searchsorted(ops_t, t) - 1] if np.searchsorted(ops_t, t) > 0 else 0
        ins = swap_rows(cap, pid, direction=1)
        near = {int(s["block"][r]) for r in ins if prev < int(s["ts_ns"][r]) <= t}
        brought += {a, b} <= near
    adopted = int(np.count_nonzero((cap.plans["pid"] == pid) & ~cap.plans["dropped"]))
    record_figure("c10_graph_c", {"graph_launches": len(graphs), "launches_with_both_brought_back": brought,
                                  "plans_adopted": adopted})
    if adopted == 0:
        # LRU: the four direct touches push both graph blocks out before every replay but the first.
        assert brought == REPLAYS - 1, (
            f"both graph blocks were brought back at {brought} of {REPLAYS} graph launches, expected {REPLAYS - 1}\n"
            f"{describe_swaps(cap, pid)}"
        )


@pytest.fixture(scope="module")
def c10u(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c10u")
    return run_swap([build_swap_prog(progs), "c10u", REPLAYS], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c10_exec_node_update_brings_the_new_block_back(c10u):
    # Parameters set in the executable graph (XLA's command buffers do it whenever buffer
    # addresses change) name a block that is out: it must be brought back before the replay.
    run = c10u
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["dev_errors"] == "0" and run.kv["host_bad"] == "0", run.why()
    assert [int(run.kv[f"round_{i}"]) for i in range(6)] == [REPLAYS // 4] * 4 + [REPLAYS] * 2, run.kv
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    blocks = [one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in range(4)]
    graphs = op_rows(cap, pid, abi.Ev.GRAPH_LAUNCH)
    assert len(graphs) == REPLAYS, f"{len(graphs)} graph launches\n{describe_ops(cap, pid, 120)}"
    for r, g in enumerate(graphs):
        want = blocks[int(kv[f"target_{r}"])]
        # the 64 MiB blocks it names (besides, the 8-byte error counter)
        assert touched_blocks(cap, int(g)) & set(blocks) == {want}, (r, touched_blocks(cap, int(g)), want)
        assert not out_at(cap, want, int(cap.ops["ts_ns"][int(g)])), f"block row {want} out at replay {r}"
    record_figure("c10_exec_update", {"graph_launches": len(graphs), "swap_events": len(swap_rows(cap, pid))})


@pytest.fixture(scope="module")
def c26(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c26")
    return run_swap([build_swap_prog(progs), "c26", REPLAYS], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c26_conditional_body_blocks_resident_at_every_replay(c26):
    # C26: the body of an IF node (made by cudaGraphAddNode, captured into) moves blocks 0 and 1;
    # the launch touches the union of the bodies, flagged CONDITIONAL, not OPAQUE.
    run = c26
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["dev_errors"] == "0" and run.kv["host_bad"] == "0", run.why()
    assert int(run.kv["round_0"]) == int(run.kv["round_1"]) == REPLAYS, run.kv
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    a, b = (one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in (0, 1))
    graphs = op_rows(cap, pid, abi.Ev.GRAPH_LAUNCH)
    assert len(graphs) == REPLAYS, f"{len(graphs)} graph launches\n{describe_ops(cap, pid, 120)}"
    for r, g in enumerate(graphs):
        g = int(g)
        f = abi.LaunchFlag(int(cap.ops["flags"][g]))
        assert abi.LaunchFlag.CONDITIONAL in f and abi.LaunchFlag.OPAQUE not in f, (r, f)
        assert {a, b} <= touched_blocks(cap, g), (r, touched_blocks(cap, g), a, b)
        for blk in (a, b):
            assert not out_at(cap, blk, int(cap.ops["ts_ns"][g])), f"block row {blk} out at replay {r}"
    record_figure("c26_conditional", {"graph_launches": len(graphs), "swap_events": len(swap_rows(cap, pid))})


@pytest.fixture(scope="module")
def c10_torch(shim, need_torch, tmp_path_factory):
    d = tmp_path_factory.mktemp("c10_torch")
    env = {"PYTORCH_CUDA_ALLOC_CONF": None}
    cmd = [sys.executable, PROGS / "swap_torch_train.py"]
    args = ["--graph", "--pressure", "6", "--steps", str(TORCH_STEPS)]
    plain = run_plain(cmd + [d / "plain.json", *args], d, env=env, timeout=300)
    assert plain.rc == 0, plain.why()
    swap = run_swap(cmd + [d / "swap.json", *args], d, budget="256MiB", min_swap="2MiB", env=env, timeout=300)
    return plain, swap, d


@pytest.mark.gpu
def test_c10_torch_graph_replay_bit_identical(c10_torch):
    plain, swap, d = c10_torch
    assert swap.rc == 0, swap.why()
    p, s = json.loads((d / "plain.json").read_text()), json.loads((d / "swap.json").read_text())
    assert p["graph_replays"] == s["graph_replays"] == TORCH_STEPS
    assert s["losses"] == p["losses"], f"losses differ under --swap:\n plain {p['losses']}\n swap  {s['losses']}"
    assert s["params_sha256"] == p["params_sha256"], "final parameters differ under --swap"
    assert s["pressure_sha256"] == p["pressure_sha256"], "pressure tensors differ under --swap"


@pytest.mark.gpu
def test_c10_torch_graph_blocks_resident_at_replay(c10_torch):
    _, swap, d = c10_torch
    assert swap.rc == 0, swap.why()
    cap = swap.cap
    pid = json.loads((d / "swap.json").read_text())["pid"]
    swap_on(cap, pid)
    graphs = op_rows(cap, pid, abi.Ev.GRAPH_LAUNCH)
    assert len(graphs) >= TORCH_STEPS, f"{len(graphs)} graph launches\n{describe_ops(cap, pid, 60)}"
    ops_t = np.sort(cap.ops["ts_ns"][cap.ops["pid"] == pid])
    s = cap.swaps
    ins = swap_rows(cap, pid, direction=1)
    brought, opaque = 0, 0
    for g in graphs:
        g = int(g)
        t = int(cap.ops["ts_ns"][g])
        opaque += bool(int(cap.ops["flags"][g]) & int(abi.LaunchFlag.OPAQUE))
        touched = touched_blocks(cap, g)
        out = [blk for blk in touched if out_at(cap, blk, t)]
        assert not out, f"blocks {out} touched by graph launch row {g} were out at its launch\n{describe_swaps(cap, pid)}"
        i = np.searchsorted(ops_t, t)
        prev = int(ops_t[i - 1]) if i > 0 else 0
        brought += any(prev < int(s["ts_ns"][r]) <= t for r in ins)
    outs = swap_rows(cap, pid, direction=0)
    record_figure("c10_graph_torch", {"graph_launches": len(graphs), "opaque_graph_launches": opaque,
                                      "launches_preceded_by_swap_in": brought, "swap_outs": len(outs),
                                      "swap_ins": len(ins)})
    assert len(outs) >= 1 and len(ins) >= 1, f"no swaps under 256 MiB\n{describe_swaps(cap, pid)}"
    # The pressure tensors push the graph's segments out between replays: at least one replay had
    # to bring something back first.
    assert brought >= 1, f"no graph launch was preceded by a swap-in\n{describe_swaps(cap, pid)}"
