"""C12: frees of pointers the shim never saw allocated go to the real free with the real result
and leave an UNTRACKED record; optional NULL outputs are never dereferenced; invalid frees return
exactly the driver's error codes."""

import numpy as np
import pytest

from gpu_util import block_rows, describe_ops, ival, one_block, run_plain, run_traced
from pyobmem import abi

POINTER_KEYS = {"pid", "graph_node_addr", "capture_addr", "tracked_addr", "bogus_addr"}


@pytest.fixture(scope="module")
def c12(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c12")
    exe = progs.build("c12_untracked")
    plain = run_plain([exe], d)
    assert plain.rc == 0 and plain.kv.get("done") == "1", plain.why()
    traced = run_traced([exe], d)
    return plain, traced


@pytest.mark.gpu
def test_c12_untracked_free_and_null_outputs(c12):
    plain, run = c12
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    p = plain.kv
    assert "drv_bogus_free_rc" in p, plain.why()
    # The premise on the real driver.
    assert p["graph_node_free_rc"] == "0" and p["capture_free_rc"] == "0" and p["capture_value_ok"] == "1"
    assert p["gpa_null_status_rc"] == "0" and p["gpa_null_status_ok"] == "1"
    # (an unknown name with a NULL symbolStatus: the driver's answer, whatever it is, is compared below)
    assert p["range_null_base_ok"] == "1" and p["range_null_size_ok"] == "1"
    assert p["drv_bogus_free_rc"] != "0" and p["drv_double_free_rc"] != "0" and p["rt_bogus_free_rc"] != "0"
    # Traced: every return code and check is the same (pointers differ run to run).
    diff = {k: (p.get(k), run.kv.get(k)) for k in set(p) | set(run.kv)
            if k not in POINTER_KEYS and p.get(k) != run.kv.get(k)}
    assert not diff, f"return codes differ (plain, traced): {diff}"


@pytest.mark.gpu
def test_c12_graph_node_free_is_untracked(c12):
    _, run = c12
    cap, kv, pid = run.cap, run.kv, run.pid
    addr, caddr = ival(kv["graph_node_addr"]), ival(kv["capture_addr"])
    u = cap.untracked
    mine = (u["pid"] == pid) & (u["kind"] == abi.UntrackedKind.FREE)
    at_addr = np.nonzero(mine & (u["addr"] == np.uint64(addr)))[0]
    assert len(at_addr) >= 1, f"no UNTRACKED FREE at the graph node's {addr:#x}; all: {u.tolist()}"
    t_graph_free = int(u["ts_ns"][at_addr[0]])
    early = [r for r in block_rows(cap, pid, addr) if int(cap.blocks["t_alloc"][r]) < t_graph_free]
    assert not early, f"the graph memory node allocation became a block: {cap.blocks[early]}"
    # The stream-captured cudaMallocAsync (the graph pool may hand out the same address again):
    # either an async block that is freed, or an untracked free; exactly one of the two.
    as_block = [r for r in block_rows(cap, pid, caddr) if int(cap.blocks["t_free"][r]) != -1]
    as_untracked = np.count_nonzero(mine & (u["addr"] == np.uint64(caddr))) - (1 if caddr == addr else 0)
    assert (len(as_block), as_untracked) in ((1, 0), (0, 1)), (as_block, as_untracked, u.tolist())
    if caddr != addr:
        assert len(at_addr) == 1, u.tolist()


@pytest.mark.gpu
def test_c12_double_free_keeps_block_consistent(c12):
    _, run = c12
    cap, kv, pid = run.cap, run.kv, run.pid
    row = one_block(cap, pid, ival(kv["tracked_addr"]), int(kv["tracked_size"]))
    assert int(cap.blocks["t_free"][row]) != -1, cap.blocks[row]
    bogus = ival(kv["bogus_addr"])
    assert not np.any((cap.blocks["pid"] == pid) & (cap.blocks["addr"] >= np.uint64(bogus))
                      & (cap.blocks["addr"] < np.uint64(bogus + (1 << 21)))), describe_ops(cap, pid)
