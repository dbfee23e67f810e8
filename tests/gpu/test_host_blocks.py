"""Pinned and mapped host memory is recorded as host blocks (issue 10): cudaHostAlloc and
cudaHostRegister reach cuMemHostAlloc / cuMemHostRegister_v2, a kernel on pinned memory alone is
host-only, and the results are those of the run without pyobmem."""

import pytest

from gpu_util import containing_block, describe_ops, ival, op_rows, run_plain, run_traced, touched
from pyobmem import abi
from pyobmem.commands.summary import attribution


@pytest.mark.gpu
def test_host_blocks_and_host_only_launches(shim, progs, tmp_path):
    exe = progs.build("host_blocks")
    plain = run_plain([exe], tmp_path)
    assert plain.rc == 0 and plain.kv["wrong_values"] == "0", plain.why()
    run = run_traced([exe], tmp_path)
    assert run.rc == 0 and run.kv["done"] == "1" and run.kv["wrong_values"] == "0", run.why()
    cap, pid, kv = run.cap, run.pid, run.kv
    pinned, reg, reg_dptr, dev = (ival(kv[k]) for k in ("pinned", "reg", "reg_dptr", "dev"))
    rows = {name: containing_block(cap, pid, addr) for name, addr in
            (("pinned", pinned), ("reg", reg), ("reg_dptr", reg_dptr), ("dev", dev))}
    assert None not in rows.values(), (rows, cap.blocks[cap.blocks["pid"] == pid])
    for name in ("pinned", "reg", "reg_dptr"):
        assert int(cap.blocks["kind"][rows[name]]) == abi.AllocKind.HOST, name
    assert int(cap.blocks["kind"][rows["dev"]]) == abi.AllocKind.DRIVER
    assert int(cap.blocks["size"][rows["pinned"]]) == int(kv["pinned_size"])
    launches = op_rows(cap, pid)
    assert len(launches) == 3, describe_ops(cap, pid)
    a = attribution(cap)
    assert a["attribution"] == {"attributed": 1, "host_only": 2, "unattributed": 0, "no_addresses": 0}, a
    assert touched(cap, int(launches[0])) == [(pinned, 0)]
