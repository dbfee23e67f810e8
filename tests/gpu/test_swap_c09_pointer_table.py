"""C09 under swap mode on the real driver: a pointer table (the addresses of four 64 MiB blocks)
is written to a small device buffer by a host-to-device cudaMemcpy, and a kernel that receives only
the table moves every block of it one round forward (batched GEMM, torch.cat and multi-tensor
kernels read such arrays). A fifth block is touched directly each round, and a scratch block is
allocated, so that under a budget of two blocks (160 MiB) table blocks are out when the table
kernel runs (tests/gpu/progs/swap_cases.cu, mode c09).

Either the shim learns the table from the copy (the blocks it names are brought back for the
launch), or it treats the launch as touching unknown blocks (opaque: everything back first); both
keep the results right, which is what is asserted, together with every table block being resident
at every table launch."""

import pytest

from gpu_util import MiB, build_swap_prog, describe_ops, describe_swaps, ival, one_block, ops_named, out_at, \
    record_figure, run_swap, swap_on, swap_rows
from pyobmem import abi

ROUNDS = 5


@pytest.fixture(scope="module")
def c09(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c09")
    return run_swap([build_swap_prog(progs), "c09", ROUNDS], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c09_pointer_table_results_right(c09):
    run = c09
    assert run.rc == 0 and run.kv.get("done") == "1", (
        "c09: the program failed. Its table kernel reaches four blocks only through a pointer table copied "
        "to the device; if the shim swapped one of them out without knowing, the kernel faults (illegal "
        f"address) or its writes are lost. The shim must learn the table or treat the launch as opaque (C09).\n"
        f"{run.why()}"
    )
    assert run.kv["dev_errors"] == "0" and run.kv["host_bad"] == "0", run.why()
    for i in range(4):
        assert int(run.kv[f"round_{i}"]) == 2 * ROUNDS, run.kv


@pytest.mark.gpu
def test_c09_table_blocks_resident_at_every_table_launch(c09):
    run = c09
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    rows = [one_block(cap, pid, ival(kv[f"blk{i}"]), 64 * MiB) for i in range(4)]
    launches = ops_named(cap, pid, "table_step")
    assert launches, f"no table_step launch in the capture\n{describe_ops(cap, pid, 80)}\n{run.why()}"
    t = cap.ops["ts_ns"]
    out_when = {i: [int(r) for r in launches if out_at(cap, rows[i], int(t[r]))] for i in range(4)}
    flags = sorted({int(cap.ops["flags"][r]) for r in launches})
    outs = swap_rows(cap, pid, direction=0)
    record_figure("c09_pointer_table", {
        "table_launches": len(launches), "launch_flags": [str(abi.LaunchFlag(f)) for f in flags],
        "table_blocks_out_at_launch": {i: len(v) for i, v in out_when.items()}, "swap_outs": len(outs),
        "table_blocks_swapped_out": {i: len(swap_rows(cap, pid, rows[i], 0)) for i in range(4)},
    })
    assert len(outs) >= ROUNDS, f"only {len(outs)} swap-outs: no pressure\n{describe_swaps(cap, pid)}"
    bad = {i: v for i, v in out_when.items() if v}
    assert not bad, (
        f"table blocks out at table launches (block index: op rows): {bad}; launch flags "
        f"{[str(abi.LaunchFlag(f)) for f in flags]}\n{describe_swaps(cap, pid)}"
    )
    assert len(launches) == ROUNDS, describe_ops(cap, pid, 80)
