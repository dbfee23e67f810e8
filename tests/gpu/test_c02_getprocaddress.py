"""C02: cuGetProcAddress asked for itself, for one name at two CUDA versions, and for the
per-thread-stream variant of cuLaunchKernel; allocation and launches through the obtained pointers."""

import pytest

from gpu_util import describe_ops, ival, one_block, op_rows, ops_touching_exactly, run_plain, run_traced, touched
from pyobmem import abi

POINTER_KEYS = {"pid", "a", "b", "fn"}


@pytest.fixture(scope="module")
def c02(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c02")
    exe, mod = progs.build("c02_getproc"), progs.build("kern.fatbin")
    plain = run_plain([exe, mod], d)
    assert plain.rc == 0, plain.why()
    traced = run_traced([exe, mod], d)
    assert traced.rc == 0, traced.why()
    return plain, traced


@pytest.mark.gpu
def test_c02_getprocaddress_self_and_versions(c02):
    plain, traced = c02
    # The premise, on the real driver: the two versions and the two stream modes differ.
    assert plain.kv["self_nonnull"] == "1" and plain.kv["self_call_nonnull"] == "1"
    assert plain.kv["memalloc_v1_v2_differ"] == "1" and plain.kv["launch_ptds_differs"] == "1"
    # Traced: every answer of cuGetProcAddress (return codes, statuses, which pointers differ,
    # the self lookup being callable and stable, unknown names) is the driver's.
    diff = {k: (plain.kv.get(k), traced.kv.get(k)) for k in set(plain.kv) | set(traced.kv)
            if k not in POINTER_KEYS and plain.kv.get(k) != traced.kv.get(k)}
    assert not diff, f"traced run answered differently (plain, traced): {diff}"
    assert traced.kv["wrong_values"] == "0" and traced.kv["done"] == "1"


@pytest.mark.gpu
def test_c02_allocation_and_launches_recorded(c02):
    _, run = c02
    cap, kv, pid = run.cap, run.kv, run.pid
    a, b, fn, n = ival(kv["a"]), ival(kv["b"]), ival(kv["fn"]), int(kv["n"])
    size_a, size_b = int(kv["size_a"]), int(kv["size_b"])
    for addr, size in ((a, size_a), (b, size_b)):
        row = one_block(cap, pid, addr, size)
        assert int(cap.blocks["kind"][row]) == abi.AllocKind.DRIVER
        assert int(cap.blocks["t_free"][row]) > int(cap.blocks["t_alloc"][row])
    # Launch 1 (cuLaunchKernel_ptsz, through the PER_THREAD lookup): a+256, b.
    # Launch 2 (legacy cuLaunchKernel): a, b+1024.
    for want in ([(a, 256), (b, 0)], [(a, 0), (b, 1024)]):
        rows = ops_touching_exactly(cap, pid, want)
        assert len(rows) == 1, f"launches touching exactly {want}: {rows}\n{describe_ops(cap, pid)}"
        op = cap.ops[rows[0]]
        assert int(op["handle"]) == fn and int(op["n_touched"]) == 2 and int(op["grid"]) == n // 256, op
        assert int(op["flags"]) & (abi.LaunchFlag.OPAQUE | abi.LaunchFlag.NO_LAYOUT) == 0, op
    assert len(op_rows(cap, pid)) == 2, describe_ops(cap, pid)
    # cuMemsetD32_v2 over all of a; cuMemcpyDtoH_v2 of n floats from b.
    sets = [int(r) for r in op_rows(cap, pid, abi.Ev.MEMSET) if touched(cap, int(r)) == [(a, 0)]]
    assert len(sets) == 1 and int(cap.ops["bytes"][sets[0]]) == size_a, describe_ops(cap, pid)
    copies = [int(r) for r in op_rows(cap, pid, abi.Ev.MEMCPY) if touched(cap, int(r)) == [(b, 0)]]
    assert len(copies) == 1, describe_ops(cap, pid)
    assert int(cap.ops["bytes"][copies[0]]) == n * 4
    assert int(cap.ops["copy_kind"][copies[0]]) & 0xFF == abi.CopyKind.DTOH


@pytest.mark.gpu
def test_c02_kernel_name(c02):
    _, run = c02
    row = op_rows(run.cap, run.pid)[0]
    assert run.cap.kernel_name(int(row)) == "touch2", run.cap.kernel_names
