"""C13 under swap mode on the real driver: PyTorch with
PYTORCH_CUDA_ALLOC_CONF=backend:native,expandable_segments:True (the user's own backend: the
per-tensor preset keeps it) maps 2 MiB pages into one large reserved range with the VMM API itself. Those mappings are the
application's: the shim records them (blocks of kind VMM) and never swaps them (it only VMM-backs
and swaps cuMemAlloc blocks). tests/gpu/progs/swap_torch_train.py (eager, four 64 MiB pressure
tensors) under --swap --budget 256MiB --min-swap-bytes 2MiB must give the same losses, parameters
and tensors as without pyobmem, and the capture records the allocator setting."""

import json
import sys

import numpy as np
import pytest

from gpu_util import PROGS, block_rows, describe_swaps, record_figure, run_plain, run_swap, swap_on, swap_rows
from pyobmem import abi

CONF = "backend:native,expandable_segments:True"


@pytest.fixture(scope="module")
def c13(shim, need_torch, tmp_path_factory):
    d = tmp_path_factory.mktemp("c13")
    env = {"PYTORCH_CUDA_ALLOC_CONF": CONF}
    cmd = [sys.executable, PROGS / "swap_torch_train.py"]
    args = ["--pressure", "4", "--steps", "10"]
    plain = run_plain(cmd + [d / "plain.json", *args], d, env=env, timeout=300)
    assert plain.rc == 0, plain.why()
    swap = run_swap(cmd + [d / "swap.json", *args], d, budget="256MiB", min_swap="2MiB", env=env, timeout=300)
    return plain, swap, d


@pytest.mark.gpu
def test_c13_expandable_segments_bit_identical(c13):
    plain, swap, d = c13
    assert swap.rc == 0, swap.why()
    p, s = json.loads((d / "plain.json").read_text()), json.loads((d / "swap.json").read_text())
    assert p["alloc_conf"] == s["alloc_conf"] == CONF
    assert len(p["losses"]) == 10
    assert s["losses"] == p["losses"], f"losses differ under --swap:\n plain {p['losses']}\n swap  {s['losses']}"
    assert s["params_sha256"] == p["params_sha256"] and s["pressure_sha256"] == p["pressure_sha256"]


@pytest.mark.gpu
def test_c13_vmm_blocks_never_swapped(c13):
    _, swap, d = c13
    assert swap.rc == 0, swap.why()
    cap = swap.cap
    pid = json.loads((d / "swap.json").read_text())["pid"]
    swap_on(cap, pid)
    assert cap.meta.get("env", {}).get("PYTORCH_CUDA_ALLOC_CONF") == CONF, cap.meta.get("env")
    rows = block_rows(cap, pid)
    kinds = cap.blocks["kind"][rows]
    vmm = rows[kinds == abi.AllocKind.VMM]
    mine = swap_rows(cap, pid)
    swapped = np.unique(cap.swaps["block"][mine])
    swapped_kinds = {int(cap.blocks["kind"][b]) for b in swapped if b >= 0}
    record_figure("c13_expandable", {
        "vmm_blocks": len(vmm), "vmm_bytes_max_live": int(cap.blocks["size"][vmm].sum()) if len(vmm) else 0,
        "driver_blocks": int(np.count_nonzero(kinds == abi.AllocKind.DRIVER)), "swap_events": len(mine),
        "swapped_block_kinds": sorted(swapped_kinds),
    })
    assert len(vmm) >= 1, f"no VMM blocks recorded with {CONF}: kinds {np.unique(kinds).tolist()}"
    bad = [int(b) for b in swapped if b < 0 or int(cap.blocks["kind"][b]) != abi.AllocKind.DRIVER]
    assert not bad, f"blocks that are not cuMemAlloc blocks were swapped: {bad}\n{describe_swaps(cap, pid)}"
