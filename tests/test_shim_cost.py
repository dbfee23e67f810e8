"""tests/fake_cuda/cost_driver.c through the shim: the op loops that scripts/shim_cost.py counts
instructions on make exactly the records they should (so the counts are of the real paths), and
launches scanned while another thread grows and shrinks the block table (the lock-free lookups of
blocks.c) name exactly their blocks."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.abi import AllocKind, Ev
from pyobmem.ring import Ring

from test_shim import SHIM, pytestmark, word  # noqa: F401 (pytestmark: the same skip)

LIVE = 64


@pytest.fixture(scope="module")
def cost(build_fake_program):
    return build_fake_program("cost_driver", "-ldl", "-lpthread")


def run_cost(d, tmp_path, op, n, live=LIVE):
    r = Ring.create(capacity=1 << 17, directory=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_")}
    env.update(LD_LIBRARY_PATH=str(d), PYOBMEM_CUPTI="0", LD_PRELOAD=str(SHIM), PYOBMEM_RING=r.path)
    try:
        p = subprocess.run([str(d / "cost_driver"), op, str(n), str(live)], env=env, capture_output=True, text=True,
                           timeout=120)
        recs, dropped = r.drain(), r.dropped
    finally:
        r.close()
    assert p.returncode == 0 and "done=1" in p.stdout, (p.stdout, p.stderr)
    assert dropped == 0
    out = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    allocs = recs[recs["type"] == int(Ev.ALLOC)]
    ids = {int(x["b"]): int(x["a"]) for x in allocs}  # ALLOC: a = block id, b = address
    return recs, ids[int(out["a"])], ids[int(out["b"])]


def of(recs, ev):
    return recs[recs["type"] == int(ev)]


def access_words(recs, seqs):
    acc = of(recs, Ev.ACCESS)
    assert np.array_equal(np.sort(acc["a"]), np.sort(seqs))  # one ACCESS record per op here
    return acc


@pytest.mark.parametrize("op", ["launch", "launch_vs_alloc"])
def test_launch_loop_names_its_two_blocks(cost, tmp_path, op):
    n = 50 if op == "launch" else 20000
    recs, a, b = run_cost(cost, tmp_path, op, n)
    launches = of(recs, Ev.LAUNCH)
    assert len(launches) == n
    assert ((launches["e"] & 0xFFFFFFFF) == 2).all()  # blocks touched
    acc = access_words(recs, launches["a"])
    assert (acc["b"] == word(a, 256)).all() and (acc["c"] == word(b, 0)).all()
    assert (acc["d"] == 0).all() and (acc["e"] == 0).all()
    if op == "launch_vs_alloc":  # the other thread's 2 rounds of 4,096 blocks, all freed
        assert len(of(recs, Ev.ALLOC)) == LIVE + 2 * 4096
        assert len(of(recs, Ev.FREE)) == 2 * 4096


def test_launch_ex_loop(cost, tmp_path):
    recs, a, b = run_cost(cost, tmp_path, "launch_ex", 30)
    launches = of(recs, Ev.LAUNCH)
    assert len(launches) == 30
    assert ((launches["flags"] & int(abi.LaunchFlag.EX)) != 0).all()
    acc = access_words(recs, launches["a"])
    # struct {b + 16, a + 1000} then a: two blocks, a first seen at offset 1000
    assert (acc["b"] == word(b, 16)).all() and (acc["c"] == word(a, 1000)).all()


def test_copy_and_set_loops(cost, tmp_path):
    recs, a, b = run_cost(cost, tmp_path, "memcpy_async", 40)
    cp = of(recs, Ev.MEMCPY)
    assert len(cp) == 40
    assert (cp["b"] == word(b, 0)).all() and (cp["c"] == word(a, 0)).all() and (cp["d"] == 4096).all()
    recs, a, b = run_cost(cost, tmp_path, "htod_async", 40)
    cp = of(recs, Ev.MEMCPY)
    assert (cp["b"] == word(a, 64)).all() and (cp["c"] == 0).all() and (cp["d"] == 256).all()
    recs, a, b = run_cost(cost, tmp_path, "memset_async", 40)
    ms = of(recs, Ev.MEMSET)
    assert len(ms) == 40
    assert (ms["b"] == word(b, 0)).all() and (ms["d"] == 4096).all()
    seqs = np.concatenate([ms["a"]])
    assert np.array_equal(seqs, np.arange(1, 41))  # one op seq each, in order


def test_alloc_free_async_loop(cost, tmp_path):
    recs, _, _ = run_cost(cost, tmp_path, "alloc_free_async", 25)
    al = of(recs, Ev.ALLOC)
    asy = al[al["e"] == int(AllocKind.ASYNC)]
    assert len(asy) == 25 and (asy["c"] == 8192).all()
    fr = of(recs, Ev.FREE)
    assert len(fr) == 25
    assert np.array_equal(np.sort(fr["a"]), np.sort(asy["a"]))  # each freed block, once


def test_launch_struct_loop_names_only_its_pointers(cost, tmp_path):
    # 512 bytes of packed arguments with no layout: 64 words scanned, 62 of them no address
    # (rejected by the span check without a lookup), 2 pointers found.
    recs, a, b = run_cost(cost, tmp_path, "launch_struct", 30)
    launches = of(recs, Ev.LAUNCH)
    assert len(launches) == 30
    assert ((launches["e"] & 0xFFFFFFFF) == 2).all() and ((launches["e"] >> 32) == 64).all()
    flags = int(abi.LaunchFlag.OPAQUE | abi.LaunchFlag.NO_LAYOUT)
    assert (launches["flags"] == flags).all()
    acc = access_words(recs, launches["a"])
    assert (acc["b"] == word(a, 256)).all() and (acc["c"] == word(b, 0)).all()


def test_launch_foreach_loop_names_each_block_once(cost, tmp_path):
    # 150 addresses in 120 blocks: past SHIM_TOUCHED_LINEAR (16) blocks the shim finds repeats with
    # an index of block starts; a repeat (the last 30, at other offsets) names nothing new, and each
    # block keeps the offset it was first seen at, in first-seen order.
    recs, a, b = run_cost(cost, tmp_path, "launch_foreach", 20)
    launches = of(recs, Ev.LAUNCH)
    assert len(launches) == 20 and (launches["flags"] == 0).all()
    assert ((launches["e"] & 0xFFFFFFFF) == 120).all() and ((launches["e"] >> 32) == 150).all()
    allocs = of(recs, Ev.ALLOC)
    first = [int(i) for i in np.sort(allocs["a"]) if int(i) not in (a, b)][:120]  # ids of the first live blocks
    want = [word(first[i], 8 * (i % 7)) for i in range(120)]
    acc = of(recs, Ev.ACCESS)
    for seq in launches["a"]:
        mine = acc[acc["a"] == seq]
        assert len(mine) == 30
        assert [int(r[k]) for r in mine for k in ("b", "c", "d", "e")] == want


def test_ring_writes_prefetch_the_next_slots():
    """Each ring group prefetches the 4 slots after it (ring.c, group_end): a slot of the 64 MiB ring
    was last touched a lap ago. gcc 12 dropped the calls of the prefetch helper as side-effect free
    (b428607 to 2026-12-02: no prefetch in the built shim); the helper is always inlined now. The
    launch hook's prefetch before the driver's call (launch_prefetch) is in it too."""
    import re
    import shutil

    if shutil.which("objdump") is None:
        pytest.skip("objdump not found")
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(SHIM)], capture_output=True, text=True,
                         check=True).stdout
    def body(fn):
        m = re.search(rf"^[0-9a-f]+ <{fn}>:\n(.*?)\n\n", dis, re.M | re.S)
        assert m, fn
        return m.group(1)

    for fn in ("ring_write", "ring_write_op"):
        assert len(re.findall(r"\tprefetch", body(fn))) == 4, fn
    hook = body("cuLaunchKernel")
    assert "<ring_prefetch>" in hook and "<params_prefetch>" in hook and "<blocks_prefetch>" in hook
    assert len(re.findall(r"\tprefetch", body("ring_prefetch"))) >= 3  # head and two slots, at least
