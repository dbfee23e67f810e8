"""Pinned and mapped host memory as host blocks, and launches the recorded blocks cannot explain
(issue 10, item 2), on the fake libcuda: tests/fake_cuda/driver.c, scenario "hostmem".

Launches of that scenario, in order (op seq): 1 kernel_a on two host blocks (pinned, allocated
host); 2 kernel_a on the device block and a registered host range; 3 kernel_a on the device-side
alias of the pinned block (FAKE_HOST_ALIAS=1: cuMemHostGetDevicePointer gives another address);
4-6 kernel_a on device memory the shim never saw allocated (fakeAllocHidden) and the device
block; 7-8 kernel_b on a word the driver does not know (0x123456789) and the device block.
"""

from __future__ import annotations

import numpy as np

from test_shim import FUNC_A, KERN_B, accesses, run_driver, word  # noqa: F401  (fake: the fixture)
from test_shim import fake  # noqa: F401

from pyobmem.abi import AllocKind, Ev, LaunchFlag
from pyobmem.capture import decode_records
from pyobmem.commands.summary import attribution, format_short, format_summary, summarize
from pyobmem.export.memory_viz import snapshot
from pyobmem.model.queries import live_bytes, resident_bytes

UNKNOWN = int(LaunchFlag.UNKNOWN_ADDRESS)


def hostmem(fake, tmp_path):
    return run_driver(fake, tmp_path, "hostmem", env={"FAKE_HOST_ALIAS": "1"})


def test_host_memory_recorded_as_host_blocks(fake, tmp_path):
    run = hostmem(fake, tmp_path)
    o = run.out
    assert (o["host_alloc_rc"], o["alloc_host_rc"], o["register_rc"], o["devptr_rc"]) == (0, 0, 0, 0)
    al = run.of(Ev.ALLOC)
    # block ids in allocation order: 1 device, 2 pinned, 3 allocated host, 4 registered, 5 alias
    assert al["a"].tolist() == [1, 2, 3, 4, 5]
    assert al["b"].tolist() == [o["dev"], o["pinned"], o["small"], o["reg"], o["alias"] - 512]
    assert al["c"].tolist() == [4096, 8192, 4096, 16384, 8192]
    assert al["e"].tolist() == [AllocKind.DRIVER] + [AllocKind.HOST] * 4
    assert o["alias"] != o["pinned"] + 512  # the fake's device pointer really differs
    fr = run.of(Ev.FREE)
    # cuMemFreeHost(pinned) frees its alias too; then the other host blocks; the device block last
    assert fr["a"].tolist() == [2, 5, 3, 4, 1]
    assert (o["free_pinned_rc"], o["free_small_rc"], o["unregister_rc"]) == (0, 0, 0)
    assert not len(run.of(Ev.UNTRACKED))


def test_launch_classes_and_one_pointer_query_per_kernel_offset(fake, tmp_path):
    run = hostmem(fake, tmp_path)
    launches = run.of(Ev.LAUNCH)
    assert launches["b"].tolist() == [FUNC_A] * 6 + [KERN_B] * 2
    assert accesses(run, 1) == [word(2, 64), word(3, 0)]
    assert accesses(run, 2) == [word(1, 0), word(4, 8)]
    assert accesses(run, 3) == [word(5, 16)]
    assert [accesses(run, s) for s in (4, 5, 6)] == [[word(1, 0)]] * 3
    flags = [int(f) & UNKNOWN for f in launches["flags"]]
    assert flags == [0, 0, 0, UNKNOWN, UNKNOWN, UNKNOWN, 0, 0]
    # The driver was asked about kernel_a's offset 0 once (three launches) and about kernel_b's
    # offset 0 once (two launches, not an address); never about words in blocks.
    assert run.out["queries_before"] == 0
    assert run.out["queries_hidden"] == 1
    assert run.out["queries_after"] == 2
    notes = [n for n in run.notes() if n.startswith("unknown_address.")]
    assert notes == [f"unknown_address.{FUNC_A:#x}+0=device memory at {run.out['hidden']:#x}, in no recorded block"]


def test_summary_counts_host_only_and_names_unattributed_kernels(fake, tmp_path):
    run = hostmem(fake, tmp_path)
    cap = decode_records(run.records)
    a = attribution(cap)
    assert a["attribution"] == {"attributed": 3, "host_only": 2, "unattributed": 3, "no_addresses": 0}
    assert a["unattributed_kernels"] == [{"kernel": "kernel_a", "launches": 3}]
    assert a["host_only_kernels"] == [{"kernel": "kernel_a", "launches": 2}]
    pid = int(cap.processes["pid"][0])
    assert a["unknown_addresses"] == [{"pid": pid, "kernel": "kernel_a", "offset": 0,
                                       "what": f"device memory at {run.out['hidden']:#x}, in no recorded block"}]
    assert a["traced_by"] == {"hooks": 8, "cupti": 0}
    s = summarize(cap)
    # host blocks are not device memory: the peak is the device block alone
    assert s["allocations"]["peak_live_bytes"] == 4096
    assert s["allocations"]["by_kind"]["host"] == {"count": 4, "bytes": 8192 + 4096 + 16384 + 8192}
    assert int(live_bytes(cap.blocks)[1].max()) == 4096  # the live-bytes step function too
    assert int(resident_bytes(cap)[1].max()) == 4096  # swap mode's resident bytes
    seen = {e["addr"] for trace in snapshot(cap)["device_traces"] for e in trace}
    assert seen == {run.out["dev"]}  # memory_viz: no host block
    text = format_summary(s)
    assert s["launches"]["attributed_pct"] == 37.5  # 3 of 8
    assert ("by kind          3 attributed (device blocks), 2 host-only (pinned host memory), 3 unattributed, "
            "0 without addresses") in text
    assert "traced by        the shim's hooks 8, CUPTI 0 (kernel and graph launches)" in text
    assert "launches: 3 attributed (device blocks)" in format_short(s)
    assert "Unattributed launches (an address in no recorded block), by kernel\n  kernel    launches\n  kernel_a         3" in text


def test_no_host_alias_when_the_device_pointer_is_the_host_address(fake, tmp_path):
    run = run_driver(fake, tmp_path, "hostmem")
    al = run.of(Ev.ALLOC)
    assert al["a"].tolist() == [1, 2, 3, 4]  # no fifth block: the alias is the pinned block itself
    assert run.out["alias"] == run.out["pinned"] + 512
    assert accesses(run, 3) == [word(2, 16)]
    assert np.count_nonzero(run.of(Ev.LAUNCH)["flags"] & UNKNOWN) == 3
