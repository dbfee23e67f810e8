"""C15 under swap mode on the real driver: JAX (scripts/workloads/jax_step.py --deterministic).

- With the launcher's per-tensor presets (XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async,
  XLA_PYTHON_CLIENT_PREALLOCATE=false, applied because the environment sets neither): the capture
  records them, the losses are bit-identical to a run without pyobmem with the same allocator
  setting, and no arena-like block is swapped.
- With a user setting that keeps XLA's arena (XLA_PYTHON_CLIENT_ALLOCATOR=bfc,
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.05: the BFC allocator reserves 5% of the card in one allocation
  at start, and the user's allocator wins over the preset): under a 1 GiB budget, below the arena,
  the arena (a block of at least 1 GiB touched by at least half of the launches) is never swapped
  out whole, and the losses are bit-identical to the plain run with the same setting.
"""

import importlib.util
import json
import sys

import numpy as np
import pytest

from gpu_util import WORKLOADS, block_rows, describe_swaps, main_pid, op_rows, record_figure, run_plain, run_swap, \
    swap_on, swap_rows, touched_blocks
from pyobmem import abi

STEPS = 8
XLA_VARS = ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")
GiB = 1 << 30
XLA_PRESETS = {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@pytest.fixture(scope="module")
def need_jax():
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")


def _runs(d, plain_env: dict, swap_env: dict, budget: str):
    cmd = [sys.executable, WORKLOADS / "jax_step.py", "--steps", str(STEPS), "--deterministic"]
    plain = run_plain(cmd + ["--json", d / "plain.json"], d, env=plain_env, timeout=300)
    assert plain.rc == 0, plain.why()
    swap = run_swap(cmd + ["--json", d / "swap.json"], d, budget=budget, env=swap_env, timeout=300)
    assert swap.rc == 0, swap.why()
    return plain, swap, json.loads((d / "plain.json").read_text()), json.loads((d / "swap.json").read_text())


def arena_like(cap, pid: int, min_bytes: int = GiB, share: float = 0.5) -> list[int]:
    """Block rows of ``pid`` of at least ``min_bytes`` touched by at least ``share`` of its launches."""
    launches = list(op_rows(cap, pid)) + list(op_rows(cap, pid, abi.Ev.GRAPH_LAUNCH))
    if not launches:
        return []
    hits: dict[int, int] = {}
    for r in launches:
        for b in touched_blocks(cap, int(r)):
            hits[b] = hits.get(b, 0) + 1
    return [b for b, n in hits.items() if int(cap.blocks["size"][b]) >= min_bytes and n >= share * len(launches)]


@pytest.fixture(scope="module")
def c15_preset(shim, need_jax, tmp_path_factory):
    d = tmp_path_factory.mktemp("c15_preset")
    clean = {k: None for k in XLA_VARS}
    return _runs(d, {**clean, **XLA_PRESETS}, clean, "512MiB")


@pytest.mark.gpu
def test_c15_jax_preset_bit_identical(c15_preset):
    plain, swap, pj, sj = c15_preset
    assert len(pj["losses"]) == STEPS
    assert sj["losses"] == pj["losses"], f"losses differ under --swap:\n plain {pj['losses']}\n swap  {sj['losses']}"
    cap = swap.cap
    presets = cap.meta.get("presets") or {}
    assert {k: presets.get(k) for k in XLA_PRESETS} == XLA_PRESETS, presets
    assert {k: sj["xla_env"].get(k) for k in XLA_PRESETS} == XLA_PRESETS, sj["xla_env"]
    pid = main_pid(cap)
    swap_on(cap, pid)
    arenas = arena_like(cap, pid)
    rows = block_rows(cap, pid)
    kinds = {abi.AllocKind(int(k)).name: int(n) for k, n in zip(*np.unique(cap.blocks["kind"][rows], return_counts=True))}
    mine = swap_rows(cap, pid)
    record_figure("c15_jax_preset", {"block_kinds": kinds, "arena_like": len(arenas), "swap_events": len(mine)})
    swapped_arenas = [b for b in arenas if len(swap_rows(cap, pid, b, 0))]
    assert not swapped_arenas, f"arena-like blocks swapped out: {swapped_arenas}\n{describe_swaps(cap, pid)}"


@pytest.fixture(scope="module")
def c15_arena(shim, need_jax, tmp_path_factory):
    d = tmp_path_factory.mktemp("c15_arena")
    env = {**{k: None for k in XLA_VARS}, "XLA_PYTHON_CLIENT_ALLOCATOR": "bfc", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.05"}
    return _runs(d, env, env, "1GiB")


@pytest.mark.gpu
def test_c15_jax_arena_never_swapped_whole(c15_arena):
    plain, swap, pj, sj = c15_arena
    assert sj["losses"] == pj["losses"], f"losses differ under --swap:\n plain {pj['losses']}\n swap  {sj['losses']}"
    cap = swap.cap
    xla = [k for k in cap.meta.get("presets") or {} if k.startswith("XLA_")]
    assert not xla, f"the presets must not override the user's XLA allocator: {cap.meta.get('presets')}"
    pid = main_pid(cap)
    swap_on(cap, pid)
    arenas = arena_like(cap, pid)
    rows = block_rows(cap, pid)
    big = sorted(((int(cap.blocks["size"][r]), int(cap.blocks["kind"][r])) for r in rows), reverse=True)[:5]
    mine = swap_rows(cap, pid)
    record_figure("c15_jax_arena", {
        "arena_like": [(int(cap.blocks["size"][b]), abi.AllocKind(int(cap.blocks["kind"][b])).name) for b in arenas],
        "largest_blocks": big, "swap_events": len(mine),
        "jax_bytes_limit": sj.get("memory_stats", {}).get("bytes_limit"),
    })
    assert arenas, f"no arena-like block (>= 1 GiB, touched by half the launches); largest blocks {big}"
    swapped = {b: len(swap_rows(cap, pid, b, 0)) for b in arenas}
    assert not any(swapped.values()), (
        f"arena-like blocks swapped out whole (block row: swap-outs): {swapped}\n{describe_swaps(cap, pid)}"
    )
