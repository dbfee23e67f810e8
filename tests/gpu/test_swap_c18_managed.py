"""C18 under swap mode on the real driver: a 64 MiB managed allocation (cudaMallocManaged) next to
three 64 MiB cudaMalloc blocks under a budget of two (160 MiB), all four touched in turn by kernels
five times, the CPU reading the managed block between passes (tests/gpu/progs/swap_cases.cu, mode
c18). The managed block is reported (a block of kind MANAGED) and never swapped, migrated or
advised by the shim; the cudaMalloc blocks do swap; every word is right on the device and on the
CPU."""

import numpy as np
import pytest

from gpu_util import MiB, build_swap_prog, describe_swaps, ival, one_block, record_figure, run_swap, swap_on, \
    swap_rows
from pyobmem import abi

ROUNDS = 5


@pytest.fixture(scope="module")
def c18(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c18")
    return run_swap([build_swap_prog(progs), "c18", ROUNDS], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c18_managed_results_right(c18):
    run = c18
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    for k in ("dev_errors", "host_bad", "managed_cpu_bad"):
        assert run.kv[k] == "0", (k, run.kv[k], run.why())
    assert int(run.kv["round_3"]) == ROUNDS


@pytest.mark.gpu
def test_c18_managed_reported_never_swapped(c18):
    run = c18
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    m = one_block(cap, pid, ival(kv["managed"]), 64 * MiB)
    assert int(cap.blocks["kind"][m]) == abi.AllocKind.MANAGED, cap.blocks[m]
    assert int(cap.blocks["t_free"][m]) != -1, cap.blocks[m]
    rows = [one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in range(3)]
    assert len(swap_rows(cap, pid, m)) == 0, f"the managed block was swapped\n{describe_swaps(cap, pid)}"
    swapped = {int(b) for b in cap.swaps["block"][swap_rows(cap, pid)]}
    assert swapped <= set(rows), f"unexpected blocks swapped\n{describe_swaps(cap, pid)}"
    ins = [len(swap_rows(cap, pid, r, 1)) for r in rows]
    record_figure("c18_managed", {"swap_ins_per_cudamalloc_block": ins})
    # Three cudaMalloc blocks in turn, room for two: each touch of a pass brings its block back.
    assert all(n >= ROUNDS for n in ins), f"swap-ins per block {ins}\n{describe_swaps(cap, pid)}"
    assert np.all(cap.swaps["bytes"][swap_rows(cap, pid)] == 64 * MiB)
