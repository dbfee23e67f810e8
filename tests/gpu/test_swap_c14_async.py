"""C14 under swap mode on the real driver: stream-ordered allocation.

- C program (tests/gpu/progs/swap_cases.cu, mode c14): 2000 cycles of cudaMallocAsync (two in
  three) or cudaMallocFromPoolAsync from a user pool (one in three), 1 to 16 MiB each, written,
  checked and freed with cudaFreeAsync on the stream, next to two 64 MiB cudaMalloc blocks that
  take turns under a one-block budget (96 MiB). Every allocation must succeed (no false out of
  memory), every check pass; each async allocation is one block of kind ASYNC, freed. Swap mode
  serves the stream-ordered blocks of at least --min-swap-bytes (4 MiB) from its own VMM blocks
  (docs/swap.md "Stream-ordered blocks"): they count against the budget and may be swapped like the
  cudaMalloc ones; the user pool (device-located, not exportable) is served too.
- PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (tests/gpu/progs/swap_torch_train.py,
  four 64 MiB pressure tensors, budget 128 MiB, --min-swap-bytes 2MiB): the same losses, parameters
  and tensors as without pyobmem. Every tensor is its own block, and the pressure tensors, which
  take turns under a budget of two, are swapped out and back (until this allocator, nothing of
  torch's could be: its memory was the driver's pool)."""

import json
import sys

import numpy as np
import pytest

from gpu_util import PROGS, block_rows, build_swap_prog, describe_swaps, ival, one_block, record_figure, \
    run_plain, run_swap, swap_on, swap_rows, MiB
from pyobmem import abi

CYCLES = 2000


@pytest.fixture(scope="module")
def c14(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c14")
    return run_swap([build_swap_prog(progs), "c14", CYCLES], d, budget="96MiB", timeout=180)


@pytest.mark.gpu
def test_c14_async_allocations_no_false_oom(c14):
    run = c14
    kv = run.kv
    assert "async_fail" in kv, run.why()
    assert kv["async_fail"] == "0", (
        f"{kv['async_fail']} of {CYCLES} stream-ordered allocations failed (first rc {kv['async_first_fail_rc']})\n"
        f"{run.why()}"
    )
    assert int(kv["async_from_pool"]) + int(kv["async_from_default"]) == CYCLES
    assert run.rc == 0 and kv.get("done") == "1", run.why()
    assert kv["dev_errors"] == "0" and kv["host_bad"] == "0", run.why()


@pytest.mark.gpu
def test_c14_async_blocks_tracked_and_the_large_ones_swappable(c14):
    run = c14
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    assert cap.dropped == 0, f"{cap.dropped} events dropped"
    rows = block_rows(cap, pid)
    async_rows = rows[cap.blocks["kind"][rows] == abi.AllocKind.ASYNC]
    unfreed = [int(r) for r in async_rows if int(cap.blocks["t_free"][r]) == -1]
    sizes = np.sort(cap.blocks["size"][async_rows])
    want = np.sort(np.array([((c % 16) + 1) * MiB + (c % 7) * 4096 for c in range(CYCLES)], dtype=np.uint64))
    a, b = one_block(cap, pid, ival(kv["blk0"]), 64 * MiB), one_block(cap, pid, ival(kv["blk1"]), 64 * MiB)
    mine = swap_rows(cap, pid)
    swapped = {int(x) for x in cap.swaps["block"][mine]}
    ins = {blk: len(swap_rows(cap, pid, blk, 1)) for blk in (a, b)}
    record_figure("c14_async", {"async_blocks": len(async_rows), "async_unfreed": len(unfreed),
                                "swap_events": len(mine), "swap_ins_blk0_blk1": list(ins.values()),
                                "untracked_frees": int(np.count_nonzero(cap.untracked["pid"] == pid))})
    assert len(async_rows) == CYCLES, f"{len(async_rows)} ASYNC blocks for {CYCLES} stream-ordered allocations"
    assert np.array_equal(sizes, want), "ASYNC block sizes differ from what was allocated"
    assert not unfreed, f"{len(unfreed)} ASYNC blocks never freed, e.g. {cap.blocks[unfreed[:5]]}"
    # whatever moved is a block the shim serves: the two cudaMalloc blocks or stream-ordered
    # blocks of at least 4 MiB (each checked by its kernel after the swap: dev_errors above)
    small = [blk for blk in swapped - {a, b} if int(cap.blocks["size"][blk]) < 4 * MiB
             or int(cap.blocks["kind"][blk]) != abi.AllocKind.ASYNC]
    assert not small, f"blocks the shim does not serve swapped:\n{describe_swaps(cap, pid)}"
    # The two blocks took turns 20 times under a one-block budget: each touch brought its block back.
    assert ins[a] + ins[b] >= CYCLES // 100 - 1, f"swap-ins {ins}\n{describe_swaps(cap, pid)}"


@pytest.fixture(scope="module")
def c14_torch(shim, need_torch, tmp_path_factory):
    d = tmp_path_factory.mktemp("c14_torch")
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    cmd = [sys.executable, PROGS / "swap_torch_train.py"]
    args = ["--pressure", "4", "--steps", "10"]
    plain = run_plain(cmd + [d / "plain.json", *args], d, env=env, timeout=300)
    assert plain.rc == 0, plain.why()
    swap = run_swap(cmd + [d / "swap.json", *args], d, budget="128MiB", min_swap="2MiB", env=env, timeout=300)
    return plain, swap, d


@pytest.mark.gpu
def test_c14_torch_cuda_malloc_async_bit_identical(c14_torch):
    plain, swap, d = c14_torch
    assert swap.rc == 0, (
        "torch with backend:cudaMallocAsync failed under --swap (a false out-of-memory would show here)\n" + swap.why()
    )
    p, s = json.loads((d / "plain.json").read_text()), json.loads((d / "swap.json").read_text())
    assert p["allocator_backend"] == s["allocator_backend"] == "cudaMallocAsync", (p["allocator_backend"],
                                                                                   s["allocator_backend"])
    assert s["losses"] == p["losses"], f"losses differ under --swap:\n plain {p['losses']}\n swap  {s['losses']}"
    assert s["params_sha256"] == p["params_sha256"] and s["pressure_sha256"] == p["pressure_sha256"]
    cap = swap.cap
    pid = s["pid"]
    swap_on(cap, pid)
    rows = block_rows(cap, pid)
    kinds = cap.blocks["kind"][rows]
    mine = swap_rows(cap, pid)
    record_figure("c14_torch_async", {"async_blocks": int(np.count_nonzero(kinds == abi.AllocKind.ASYNC)),
                                      "driver_blocks": int(np.count_nonzero(kinds == abi.AllocKind.DRIVER)),
                                      "swap_events": len(mine)})
    assert np.count_nonzero(kinds == abi.AllocKind.ASYNC) >= 1, f"no ASYNC blocks: kinds {np.unique(kinds).tolist()}"
    moved = [int(b) for b in np.unique(cap.swaps["block"][mine]) if b >= 0]
    kinds_moved = {int(cap.blocks["kind"][b]) for b in moved}
    big = [b for b in moved if int(cap.blocks["size"][b]) == 64 * MiB]
    assert kinds_moved <= {abi.AllocKind.ASYNC, abi.AllocKind.DRIVER}, describe_swaps(cap, pid)
    # the four 64 MiB pressure tensors (stream-ordered) take turns under a budget of two
    assert len(big) >= 2 and all(int(cap.blocks["kind"][b]) == abi.AllocKind.ASYNC for b in big), (
        f"pressure tensors not swapped:\n{describe_swaps(cap, pid)}")
