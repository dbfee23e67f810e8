"""C17 under swap mode on the real driver: VMM corner cases (tests/gpu/progs/swap_cases.cu, mode c17).

- Three 64 MiB cudaMalloc blocks take turns under a one-block budget (96 MiB): each touch remaps a
  block (new physical memory at the same address): the device must keep its access (the kernels
  read and write it, every word checked).
- The application's own VMM range (cuMemAddressReserve, two cuMemCreate allocations of 32 MiB
  mapped side by side, cuMemSetAccess) is used by the same kernels: it is recorded (two blocks of
  kind VMM) and never swapped; unmapping the whole range in one cuMemUnmap across the two mappings
  returns what the driver returns without pyobmem, and the capture ends both blocks.
- Pinned host memory mapped into the device (cudaHostAlloc, cudaHostAllocMapped) and, where the
  driver supports it, a host-located cuMemCreate allocation: used by kernels, never swapped, never
  VMM-backed by the shim.
Every return code the program prints is the same with and without pyobmem."""

import numpy as np
import pytest

from gpu_util import MiB, block_rows, build_swap_prog, containing_block, describe_swaps, ival, one_block, \
    record_figure, run_plain, run_swap, swap_on, swap_rows
from pyobmem import abi

ROUNDS = 4
POINTERS = {"pid", "blk0", "blk1", "blk2", "app_vmm", "host_mapped", "host_vmm", "failed"}


@pytest.fixture(scope="module")
def c17(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c17")
    exe = build_swap_prog(progs)
    plain = run_plain([exe, "c17", ROUNDS], d, timeout=120)
    swap = run_swap([exe, "c17", ROUNDS], d, budget="96MiB", timeout=180)
    return plain, swap


@pytest.mark.gpu
def test_c17_results_and_codes_as_without_pyobmem(c17):
    plain, run = c17
    assert plain.rc == 0 and plain.kv.get("vmm_done") == "1", f"the program fails without pyobmem\n{plain.why()}"
    assert run.rc == 0 and run.kv.get("vmm_done") == "1", run.why()
    for k in ("dev_errors", "host_bad", "host_mapped_direct_bad", "host_vmm_bad"):
        assert run.kv[k] == "0", (k, run.kv[k], run.why())
    diff = {k: (plain.kv.get(k), run.kv.get(k)) for k in set(plain.kv) | set(run.kv)
            if k not in POINTERS and not k.startswith("t_") and plain.kv.get(k) != run.kv.get(k)}
    assert not diff, f"results or return codes differ (plain, swap): {diff}"
    record_figure("c17_codes", {k: v for k, v in plain.kv.items() if k.endswith("_rc") or k.endswith("_used")})


@pytest.mark.gpu
def test_c17_remapped_blocks_keep_device_access(c17):
    _, run = c17
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    rows = [one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in range(3)]
    remaps = [len(swap_rows(cap, pid, r, 1)) for r in rows]
    record_figure("c17_remaps", {"swap_ins_per_block": remaps})
    # Three blocks in turn, room for one: every touch of a pass is a remap (fill, then ROUNDS passes).
    assert all(n >= ROUNDS for n in remaps), f"swap-ins per block {remaps}\n{describe_swaps(cap, pid)}"
    assert run.kv["dev_errors"] == "0" and run.kv["host_bad"] == "0", run.why()


@pytest.mark.gpu
def test_c17_app_vmm_and_host_memory_never_swapped(c17):
    _, run = c17
    cap, kv, pid = run.cap, run.kv, run.pid
    v, half = ival(kv["app_vmm"]), int(kv["app_vmm_half"])
    r1, r2 = one_block(cap, pid, v, half), one_block(cap, pid, v + half, half)
    for r in (r1, r2):
        assert int(cap.blocks["kind"][r]) == abi.AllocKind.VMM, cap.blocks[r]
        if kv["unmap_whole_rc"] == "0" or kv.get("unmap_halves_rc") == "0":
            assert int(cap.blocks["t_free"][r]) != -1, f"the app's mapping was unmapped but its block never ended: {cap.blocks[r]}"
    swapped = {int(b) for b in cap.swaps["block"][swap_rows(cap, pid)]}
    assert not swapped & {r1, r2}, f"the app's VMM mappings were swapped\n{describe_swaps(cap, pid)}"
    # Host-mapped pinned memory is a host block (not device memory, never VMM-backed); it never moves.
    hm = ival(kv["host_mapped"])
    hr = containing_block(cap, pid, hm)
    assert hr is not None and int(cap.blocks["kind"][hr]) == abi.AllocKind.HOST, cap.blocks[cap.blocks["pid"] == pid]
    assert hr not in swapped, f"the pinned host memory was swapped\n{describe_swaps(cap, pid)}"
    if kv.get("host_vmm_used") == "1":
        hv = ival(kv["host_vmm"])
        rows = [int(r) for r in block_rows(cap, pid, hv)]
        assert not swapped & set(rows), f"the host-located VMM allocation was swapped\n{describe_swaps(cap, pid)}"
        assert all(int(cap.blocks["kind"][r]) == abi.AllocKind.VMM for r in rows), cap.blocks[rows]
    only = {int(b) for b in swapped} - {one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in range(3)}
    assert not only, f"blocks other than the three cudaMalloc blocks swapped: {sorted(only)}\n{describe_swaps(cap, pid)}"
    assert np.all(cap.swaps["bytes"][swap_rows(cap, pid)] == 64 * MiB)
