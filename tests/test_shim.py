"""CPU tests of the shim (native/ -> pyobmem/libpyobmem.so) against a fake libcuda.

tests/fake_cuda/fake_cuda.c is built into <tmp>/libcuda.so.1 and tests/fake_cuda/driver.c
into a program that behaves like a CUDA runtime (dlopen libcuda, entry points through
cuGetProcAddress). Each test runs one driver scenario with the shim preloaded and asserts the
exact records drained from the ring.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.abi import AllocKind, CopyKind, Ev, LaunchFlag, LaunchSource, UntrackedKind
from pyobmem.capture import decode_records
from pyobmem.ring import Ring

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_cuda"
SHIM = ROOT / "pyobmem" / "libpyobmem.so"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"

FUNC_A, KERN_B, FUNC_C = 0x1000, 0x2000, 0x3000
# Records of the notes after cuInit: driver_version, device_count, device0.name,
# device0.total_bytes, device0.cc (one 32-byte chunk each) and the cupti note (two chunks).
NOTE_RECORDS = 7
# Tests that count every record turn the GPU clock's samples off (tests/test_gpuclock.py has them).
NO_GPU_CLOCK = {"PYOBMEM_GPU_CLOCK_EVERY": "0"}

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or not (CUDA_INCLUDE / "cuda.h").exists(), reason="needs gcc and the CUDA headers"
)


@pytest.fixture(scope="session")
def fake(build_fake_program):
    """The fake libcuda and libcupti (conftest.fake_cuda) with the driver program; their directory."""
    return build_fake_program("driver", "-ldl", "-lpthread")


class Run:
    """One driver run: its printed values, exit code and the drained records."""

    def __init__(self, proc, records, dropped):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.out = {}
        for line in proc.stdout.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                self.out[k] = int(v) if v.lstrip("-").isdigit() else v
        self.records = records
        self.dropped = dropped

    def of(self, ev, pid=None):
        r = self.records[self.records["type"] == int(ev)]
        return r if pid is None else r[r["pid"] == pid]

    def notes(self, pid=None):
        return texts(self.of(Ev.NOTE, pid))

    def names(self):
        return {int(k): v for k, v in zip(*texts_by_a(self.of(Ev.KERNEL_NAME)))}


def texts_by_a(recs):
    """Reassemble chunked text records (NOTE / KERNEL_NAME) -> (list of a, list of text)."""
    keys, out, cur = [], [], b""
    for r in recs:
        idx = int(r["flags"]) & 0x7FFF
        if idx == 0:
            cur = b""
        cur += np.array([r["b"], r["c"], r["d"], r["e"]], dtype="<u8").tobytes()
        if int(r["flags"]) & abi.TEXT_LAST:
            keys.append(int(r["a"]))
            out.append(cur.rstrip(b"\0").decode())
    return keys, out


def texts(recs):
    return texts_by_a(recs)[1]


def run_driver(fake, tmp_path, *args, env=None, capacity=1 << 16, ring=True, preload=True, timeout=60):
    r = Ring.create(capacity=capacity, directory=str(tmp_path)) if ring else None
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_")}
    e["LD_LIBRARY_PATH"] = str(fake)
    e["PYOBMEM_CUPTI"] = "0"
    if preload:
        e["LD_PRELOAD"] = str(SHIM)
    if r is not None:
        e["PYOBMEM_RING"] = r.path
    for k, v in (env or {}).items():  # None: unset
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    try:
        proc = subprocess.run([str(fake / "driver"), *map(str, args)], env=e, capture_output=True, text=True,
                              timeout=timeout)
        recs = r.drain() if r is not None else np.empty(0, dtype=abi.RECORD_DTYPE)
        dropped = r.dropped if r is not None else 0
    finally:
        if r is not None:
            r.close()
    run = Run(proc, recs, dropped)
    assert run.rc == 0, (proc.stdout, proc.stderr)
    assert run.out.get("done") == 1
    return run


def word(block, offset):
    return (block << abi.ACCESS_OFFSET_BITS) | offset


def accesses(run, seq):
    """Access words (non-zero) of op `seq`, in record order."""
    acc = run.of(Ev.ACCESS)
    acc = acc[acc["a"] == seq]
    return [int(w) for r in acc for w in (r["b"], r["c"], r["d"], r["e"]) if w]


# ---------------------------------------------------------------- interception (C01, C02, C03)


def test_c01_entry_points_through_get_proc_address(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic")
    # dlsym(libcuda, "cuGetProcAddress_v2") and cuGetProcAddress("cuGetProcAddress") both give ours
    assert run.out["gpa_dlsym_is_export"] == 1
    assert run.out["gpa_self_is_export"] == 1
    pid = int(run.records["pid"][0])
    proc = run.of(Ev.PROCESS)
    assert len(proc) == 1
    assert int(proc["a"][0]) == os.getpid()  # ppid: the test process
    assert int(proc["b"][0]) == 13000
    assert int(proc["c"][0]) == LaunchSource.HOOKS
    assert run.records["type"][0] == Ev.PROCESS  # first record of the process
    assert set(run.records["pid"].tolist()) == {pid}
    # allocations made through cuGetProcAddress pointers are all seen
    a, b = run.out["a"], run.out["b"]
    allocs = run.of(Ev.ALLOC)
    assert allocs["a"].tolist() == [1, 2]
    assert allocs["b"].tolist() == [a, b]
    assert allocs["c"].tolist() == [1 << 20, 4096]
    assert allocs["e"].tolist() == [AllocKind.DRIVER] * 2
    assert allocs["flags"].tolist() == [0, 0]  # device 0
    frees = run.of(Ev.FREE)
    assert frees["a"].tolist() == [2, 1]
    assert frees["b"].tolist() == [b, a]
    assert frees["c"].tolist() == [4096, 1 << 20]
    assert len(run.of(Ev.UNTRACKED)) == 0
    assert run.dropped == 0


def test_c02_get_proc_address_versions_and_passthrough(fake, tmp_path):
    run = run_driver(fake, tmp_path, "unhooked")
    assert run.out["legacy_is_fake"] == 1  # version 3000: the driver's legacy cuMemAlloc, untouched
    assert run.out["modern_is_export"] == 1  # version 12000: our cuMemAlloc_v2
    assert run.out["none"] == 1  # unknown names fail as the driver says
    assert run.out["passthrough_is_fake"] == 1  # known names we do not hook: untouched


def test_c02_ptsz_variant_gets_its_own_wrapper(fake, tmp_path):
    run = run_driver(fake, tmp_path, "async")
    assert run.out["aa_ptsz_is_export"] == 1
    allocs = run.of(Ev.ALLOC)
    assert allocs["b"].tolist() == [run.out["x"], run.out["y"]]
    assert allocs["c"].tolist() == [3000, 5000]
    assert allocs["d"].tolist() == [0x55, 0x66]  # stream
    assert allocs["e"].tolist() == [AllocKind.ASYNC] * 2
    frees = run.of(Ev.FREE)
    assert frees["a"].tolist() == [1, 2]
    assert frees["d"].tolist() == [0x55, 0x66]
    assert frees["e"].tolist() == [AllocKind.ASYNC] * 2


def test_dlsym_rtld_next_from_the_program(fake, tmp_path):
    run = run_driver(fake, tmp_path, "next")
    assert run.out["next_puts_ok"] == 1
    assert run.out["next_missing_null"] == 1


def test_c03_unhooked_family_symbols_noted_once(fake, tmp_path):
    run = run_driver(fake, tmp_path, "unhooked")
    unhooked = sorted(n for n in run.notes() if n.startswith("unhooked="))
    # cuMemcpy3DPeerAsync asked 3 times: one note; the hooked batch copies (12080, 13000): none
    assert unhooked == ["unhooked=cuMemAlloc@3000", "unhooked=cuMemcpy3DPeerAsync@12080"]


def test_c03_launch_variants_attributed(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic")
    launches = run.of(Ev.LAUNCH)
    # kernel_a x2, kernel_b via Ex, opaque C, cooperative; the failed launch is not recorded
    assert launches["b"].tolist() == [FUNC_A, FUNC_A, KERN_B, FUNC_C, FUNC_A]
    seqs = launches["a"].tolist()
    assert seqs == [1, 2, 3, 4, 5]
    # 1: (a+256, 7, b) -> blocks 1 and 2; 2 pointer words scanned (the int is 4 bytes)
    l1 = launches[0]
    assert int(l1["c"]) == 0x77 and int(l1["d"]) == 2 * 3 * 4
    assert int(l1["e"]) == 2 | (2 << 32)
    assert int(l1["flags"]) == 0
    assert accesses(run, 1) == [word(1, 256), word(2, 0)]
    # 2: (b, 1, b+8): one block, first offset kept
    assert int(launches[1]["e"]) == 1 | (2 << 32)
    assert accesses(run, 2) == [word(2, 0)]
    # 3: Ex with a CUkernel: struct {b+16, a+1000}, a -> 3 words, blocks 2 and 1
    l3 = launches[2]
    assert int(l3["flags"]) == LaunchFlag.EX | LaunchFlag.COOPERATIVE
    assert int(l3["c"]) == 0x88 and int(l3["d"]) == 10
    assert int(l3["e"]) == 2 | (3 << 32)
    assert accesses(run, 3) == [word(2, 16), word(1, 1000)]
    # 4: no layout: the extra buffer (16 bytes) is scanned, flagged opaque
    l4 = launches[3]
    assert int(l4["flags"]) == LaunchFlag.NO_LAYOUT | LaunchFlag.OPAQUE
    assert int(l4["e"]) == 1 | (2 << 32)
    assert accesses(run, 4) == [word(2, 100)]
    # 5: cooperative
    assert int(launches[4]["flags"]) == LaunchFlag.COOPERATIVE
    assert accesses(run, 5) == [word(1, 0), word(2, 0)]
    assert run.out["bad_launch_rc"] == 400  # CUDA_ERROR_INVALID_HANDLE, unchanged


def test_c07_layouts_cached_per_handle(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic")
    # kernel_a: 3 params + the terminating INVALID_VALUE = 4 queries, then none for the 2nd launch
    assert run.out["queries_after_first"] == 4
    assert run.out["queries_after_second"] == 4
    names = run.names()
    assert names == {FUNC_A: "kernel_a", KERN_B: "kernel_b_with_a_rather_long_templated_name<float, 128, true>"}
    # one name per handle, long names chunked in 32-byte records
    assert len(run.of(Ev.KERNEL_NAME)) == 1 + 2


@pytest.mark.parametrize("freer", ["cuModuleUnload", "cuLibraryUnload", "cuDevicePrimaryCtxReset"])
def test_c07_reused_handle_gets_its_new_layout(fake, tmp_path, freer):
    """A module unloaded and another loaded: cuModuleGetFunction hands out the same handle for a
    kernel of one pointer (XLA's autotuner does this by the hundred). The cached 3-parameter layout
    would read the argument array's missing entries, a pointer to nowhere (a segmentation fault
    under JAX on the H200): the shim queries a handle again when the driver hands it out after a
    module was unloaded, and only then (a handle asked for again before that is the same kernel)."""
    run = run_driver(fake, tmp_path, "reuse", freer)  # exits 0 (run_driver asserts it): no fault
    assert [run.out[k] for k in ("get3_rc", "launch3_rc", "unload_rc", "get1_rc", "launch1_rc")] == [0, 0, 0, 0, 0]
    assert run.out["regets_queries"] == 0
    launches = run.of(Ev.LAUNCH)
    assert len(launches) == 2 and all(int(f) & LaunchFlag.NO_LAYOUT == 0 for f in launches["flags"])
    assert accesses(run, int(launches["a"][0])) == [word(1, 0), word(2, 0)]  # x and y, as (ptr, int, ptr)
    assert accesses(run, int(launches["a"][1])) == [word(2, 0)]  # y alone: the one parameter of the new kernel


def test_selftime_build_counts_the_shims_parts(fake, tmp_path):
    """`make native SELFTIME=1` builds a shim that times its own parts and prints them at exit: one
    line per part, with the calls the basic scenario makes (5 launches recorded; the driver's call
    timed for those and for one that fails; 3 copies; a ring write per group of records: a launch and
    its accesses are one)."""
    shim = tmp_path / "libpyobmem_selftime.so"
    subprocess.run(["make", "-s", "-B", "native", f"SHIM={shim}", "SELFTIME=1"], cwd=ROOT, check=True,
                   capture_output=True)
    run = run_driver(fake, tmp_path, "basic", env={"LD_PRELOAD": str(shim)})
    calls = {m[0]: int(m[1]) for m in re.findall(r"^pyobmem selftime (\w+) calls=(\d+) ns_each=[\d.]+ total_ms=[\d.]+$",
                                                run.stderr, re.M)}
    assert calls["launch_record"] == len(run.of(Ev.LAUNCH)) == 5
    assert calls["launch_driver"] == 5 + 1 and run.out["bad_launch_rc"] != 0
    assert calls["copy_record"] == len(run.of(Ev.MEMCPY)) == 3
    assert len(run.of(Ev.LAUNCH)) + len(run.of(Ev.MEMCPY)) + len(run.of(Ev.MEMSET)) < calls["ring_write"] < len(run.records)
    # the normal build prints nothing of it
    assert "selftime" not in run_driver(fake, tmp_path, "basic").stderr


def test_foreach_launch_names_every_block(fake, tmp_path):
    # PyTorch's multi_tensor_apply kernels (the optimizer's foreach and fused steps) name up to 150
    # tensors; session 6 found the optimizer's 42 a step TRUNCATED at 64 blocks, which makes the swap
    # executor cancel every swap-out in flight. 150 blocks are named whole; 300 keep the first 256.
    run = run_driver(fake, tmp_path, "foreach")
    assert run.out["launch1_rc"] == 0 and run.out["launch2_rc"] == 0
    launches = run.of(Ev.LAUNCH)
    assert ((launches["e"] & 0xFFFFFFFF)).tolist() == [150, 256]
    assert ((launches["e"] >> 32)).tolist() == [150, 300]  # words scanned
    base = int(abi.LaunchFlag.OPAQUE | abi.LaunchFlag.NO_LAYOUT)
    assert launches["flags"].tolist() == [base, base | int(abi.LaunchFlag.TRUNCATED)]
    first, second = (int(s) for s in launches["a"])
    assert accesses(run, first) == [word(i + 1, 8 * (i % 7)) for i in range(150)]
    assert accesses(run, second) == [word(i + 1, 8 * (i % 7)) for i in range(256)]


def test_copies_and_sets(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic")
    cp = run.of(Ev.MEMCPY)
    assert cp["a"].tolist() == [6, 7, 8]  # op seqs continue after the 5 launches
    assert [int(f) & 0xFF for f in cp["flags"]] == [CopyKind.HTOD, CopyKind.DTOH, CopyKind.DTOD]
    assert cp["b"].tolist() == [word(1, 64), 0, word(2, 0)]
    assert cp["c"].tolist() == [0, word(2, 8), word(1, 0)]
    assert cp["d"].tolist() == [64, 32, 4096]
    ms = run.of(Ev.MEMSET)
    assert ms["a"].tolist() == [9, 10]
    assert ms["b"].tolist() == [word(1, 16), word(2, 0)]
    assert ms["c"].tolist() == [0xAB, 7]
    assert ms["d"].tolist() == [100, 40]
    assert ms["e"].tolist() == [0, 0x99]
    assert ms["flags"].tolist() == [0, abi.COPY_ASYNC]


# ---------------------------------------------------------------- batched copies (cuMemcpyBatchAsync, 3D)

BATCH_FLAGS = CopyKind.OTHER | abi.COPY_ASYNC
BATCH_VARIANTS = ["b12", "b12t", "b13", "b13t", "t12", "t12t", "t13", "t13t"]


def test_batch_copy_entry_points_per_version(fake, tmp_path):
    """12080 and 13000 give different functions (failIdx or not): each is the shim's export of the
    driver's own versioned symbol, so each gets the arguments of its shape (the fake counts which
    real function ran, with which stream and failIdx)."""
    run = run_driver(fake, tmp_path, "batch")
    for v in BATCH_VARIANTS:
        assert run.out[f"{v}_is_export"] == 1, v
        assert run.out[f"{v}_dlsym_is_export"] == 1, v
    # every call reached its own real function: the refused ones too (12.8, 13.0, 3D 12.8)
    assert [run.out[k] for k in ("batch_calls", "batch_calls_ptsz", "batch_calls_v2", "batch_calls_v2_ptsz")] == [
        2, 1, 2, 1]
    assert [run.out[k] for k in ("batch3d_calls", "batch3d_calls_ptsz", "batch3d_calls_v2",
                                 "batch3d_calls_v2_ptsz")] == [2, 1, 1, 1]
    assert run.out["batch_copies"] == 11
    assert run.out["b12_stream"] == 0x77 and run.out["b13_stream"] == 0x78
    # success: failIdx left as it was; failures: the driver's code and index, unchanged
    assert run.out["b12_fail"] == run.out["b12t_fail"] == run.out["t12_fail"] == 12345
    assert run.out["bad12_rc"] == 1 and run.out["bad12_fail"] == 1
    assert run.out["bad13_rc"] == 1
    assert run.out["bad3d_rc"] == 1 and run.out["bad3d_fail"] == 1
    for v in BATCH_VARIANTS:
        assert run.out[f"{v}_rc"] == 0, v
    assert not [n for n in run.notes() if n.startswith("unhooked=")]


def test_batch_copy_records_one_op_with_every_block(fake, tmp_path):
    run = run_driver(fake, tmp_path, "batch")
    cp = run.of(Ev.MEMCPY)
    # one op per successful batch call (8), none for the 3 refused ones
    assert cp["a"].tolist() == list(range(1, 9))
    assert cp["flags"].tolist() == [BATCH_FLAGS] * 8
    # blocks a=1, b=2, c=3; b, c = the first copy's destination and source words
    assert cp["b"].tolist() == [word(1, 64), word(1, 4096), word(3, 0), 0, word(2, 0), 0, word(1, 0), word(2, 1024)]
    assert cp["c"].tolist() == [0, word(2, 0), word(1, 0), word(3, 8), word(1, 1000), word(3, 0), word(2, 512),
                                word(1, 0)]
    # bytes of all copies: 100+200+300; 512; 8; 16; 64*4 + 64; 32*2; 16; 8
    assert cp["d"].tolist() == [600, 512, 8, 16, 320, 64, 16, 8]
    assert cp["e"].tolist() == [0x77, 0x78, 0, 0, 0x79, 0x7A, 0, 0]
    # the other blocks of the batch: ACCESS records with the op's seq (each block once)
    assert accesses(run, 1) == [word(3, 32), word(2, 16)]
    assert accesses(run, 5) == [word(3, 100)]
    assert all(accesses(run, k) == [] for k in (2, 3, 4, 6, 7, 8))
    assert len(run.of(Ev.ACCESS)) == 2
    # the Python side reads them as copies touching those blocks, unchanged
    cap = decode_records(run.records)
    assert cap.ops["type"].tolist() == [Ev.MEMCPY] * 8
    assert cap.ops["bytes"].tolist() == [600, 512, 8, 16, 320, 64, 16, 8]

    def blocks_of(row):
        return sorted(int(cap.blocks["block_id"][b]) for b in cap.accesses["block"][cap.accesses["op"] == row])

    assert [blocks_of(i) for i in range(8)] == [[1, 2, 3], [1, 2], [1, 3], [3], [1, 2, 3], [3], [1, 2], [1, 2]]


def test_batch_copy_same_results_without_shim(fake, tmp_path):
    with_shim = run_driver(fake, tmp_path, "batch")
    without = run_driver(fake, tmp_path, "batch", preload=False, ring=False)
    keys = [k for k in with_shim.out if k.endswith(("_rc", "_fail", "_stream")) or k.startswith("batch")]
    assert len(keys) == 28  # 12 codes, 5 failIdx, 2 streams, 9 fake counters
    assert {k: with_shim.out[k] for k in keys} == {k: without.out[k] for k in keys}


# ---------------------------------------------------------------- return codes and unknown pointers


def test_c12_oom_code_passes_through_unrecorded(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic")
    assert run.out["oom_rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert len(run.of(Ev.ALLOC)) == 2


def test_c12_untracked_free(fake, tmp_path):
    run = run_driver(fake, tmp_path, "untracked")
    assert run.out["free_hidden_rc"] == 0
    assert run.out["free_bogus_rc"] == 1  # CUDA_ERROR_INVALID_VALUE from the driver, unchanged
    assert run.out["free_null_rc"] == 0
    un = run.of(Ev.UNTRACKED)
    assert un["a"].tolist() == [run.out["hidden"]]
    assert un["b"].tolist() == [UntrackedKind.FREE]
    assert len(run.of(Ev.FREE)) == 0


def test_vmm_mappings_are_blocks(fake, tmp_path):
    run = run_driver(fake, tmp_path, "vmm")
    va = run.out["va"]
    mib2 = 2 << 20
    assert run.out["bad_map_rc"] == 1
    allocs = run.of(Ev.ALLOC)
    assert allocs["a"].tolist() == [1, 2]
    assert allocs["b"].tolist() == [va, va + mib2]
    assert allocs["c"].tolist() == [mib2, mib2]
    assert allocs["e"].tolist() == [AllocKind.VMM] * 2
    assert accesses(run, 1) == [word(1, 8), word(2, 24)]
    frees = run.of(Ev.FREE)
    assert frees["a"].tolist() == [1, 2]  # one unmap of 4 MiB frees both mappings
    un = run.of(Ev.UNTRACKED)
    assert un["a"].tolist() == [va + 3 * mib2]
    assert un["b"].tolist() == [UntrackedKind.UNMAP]


def test_c10_graph_launch_touches_node_params(fake, tmp_path):
    run = run_driver(fake, tmp_path, "graph")
    assert run.out["inst_rc"] == 0
    g = run.of(Ev.GRAPH_LAUNCH)
    assert g["a"].tolist() == [1, 2, 3]
    assert g["b"].tolist() == [run.out["exec"], run.out["exec"], 0x5555]
    assert g["c"].tolist() == [0x42, 0x42, 0]
    assert g["d"].tolist() == [2, 2, 0]  # kernel nodes
    assert g["e"].tolist() == [3, 3, 0]  # blocks touched
    assert g["flags"].tolist() == [0, 0, LaunchFlag.OPAQUE | LaunchFlag.NO_LAYOUT]
    # node 1: (a+32, 5, b); node 2: {b+64, b+128}, a; memset node: c+4
    assert accesses(run, 1) == [word(1, 32), word(2, 0), word(3, 4)]
    assert accesses(run, 2) == accesses(run, 1)
    assert len(run.of(Ev.LAUNCH)) == 0


def test_c10_graph_exec_node_updates_change_what_a_launch_touches(fake, tmp_path):
    # XLA updates its command buffers' nodes in the executable graph whenever buffer addresses
    # change; a launch must name the blocks of the parameters in force, not the instantiated ones.
    run = run_driver(fake, tmp_path, "graph_update")
    for key in ("kset_rc", "mset_rc", "cset_rc", "kset1_rc", "gset_rc"):
        assert run.out[key] == 0, key
    assert run.out["bad_rc"] != 0  # the fake refuses memset params for a kernel node
    # NULL parameters: the driver's CUDA_ERROR_INVALID_VALUE (1), no crash
    assert run.out["null_rc"] == 3 * 1 and run.out["null1_rc"] == 1
    g = run.of(Ev.GRAPH_LAUNCH)
    assert g["a"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    # node 1 a b / memset c / child graph d  ->  c+8 d / a+16 / (empty)  ->  b+4 b+8 / a+16  ->  d+32 / a+16
    assert accesses(run, 1) == [word(1, 0), word(2, 0), word(3, 0), word(4, 0)]
    assert accesses(run, 2) == [word(3, 8), word(4, 0), word(1, 16)]
    assert accesses(run, 3) == [word(2, 4), word(1, 16)]
    assert accesses(run, 4) == [word(4, 32), word(1, 16)]
    assert g["e"].tolist() == [4, 3, 2, 2, 0, 0, 0]
    assert g["d"].tolist() == [2, 1, 1, 1, 0, 0, 0]  # kernel nodes
    opaque = LaunchFlag.OPAQUE
    assert [f & opaque for f in g["flags"].tolist()] == [0, 0, 0, 0, opaque, opaque, 0]


def test_c26_conditional_bodies_are_walked_and_forgotten_with_their_graph(fake, tmp_path):
    run = run_driver(fake, tmp_path, "graph_cond")
    assert run.out["add_rc"] == run.out["add1_rc"] == run.out["destroy_rc"] == 0
    g = run.of(Ev.GRAPH_LAUNCH)
    assert g["a"].tolist() == [1, 2, 3, 4]
    # kernel a / IF: then kernel b, else memset c+8 and WHILE: kernel d -- the union of every body
    assert accesses(run, 1) == [word(1, 0), word(2, 0), word(3, 8), word(4, 0)]
    assert g["d"].tolist() == [3, 1, 1, 0]  # kernel nodes, bodies included
    flags = [LaunchFlag(int(f)) for f in g["flags"]]
    assert LaunchFlag.CONDITIONAL in flags[0] and LaunchFlag.OPAQUE not in flags[0], flags
    # after cuGraphDestroy the conditional node is unknown: a new exec of it is opaque
    assert LaunchFlag.OPAQUE in flags[1] and LaunchFlag.CONDITIONAL not in flags[1], flags
    assert accesses(run, 2) == [word(1, 0)]
    # a conditional node destroyed alone (cuGraphDestroyNode) is forgotten too
    assert run.out["ndestroy_rc"] == 0 and accesses(run, 3) == [word(2, 0)] and accesses(run, 4) == []
    assert LaunchFlag.CONDITIONAL in flags[2] and LaunchFlag.OPAQUE in flags[3], flags


# ---------------------------------------------------------------- processes, ring, threads


def test_fork_child_records_with_its_own_pid(fake, tmp_path):
    run = run_driver(fake, tmp_path, "fork")
    parent, child = run.out["parent_pid"], run.out["child_pid"]
    assert run.out["child_status"] == 0
    procs = run.of(Ev.PROCESS)
    assert sorted(procs["pid"].tolist()) == sorted([parent, child])
    cproc = run.of(Ev.PROCESS, child)
    assert int(cproc["a"][0]) == parent
    # the child's block table and op counter start over
    calloc = run.of(Ev.ALLOC, child)
    assert calloc["a"].tolist() == [1]
    assert calloc["b"].tolist() == [run.out["child_c"]]
    cl = run.of(Ev.LAUNCH, child)
    assert cl["a"].tolist() == [1]
    assert int(cl["e"][0]) & 0xFFFFFFFF == 1  # the parent's block is unknown in the child
    pl = run.of(Ev.LAUNCH, parent)
    assert pl["a"].tolist() == [1, 2]
    assert run.of(Ev.ALLOC, parent)["a"].tolist() == [1, 2]


def test_c07_full_ring_drops_counted_exactly(fake, tmp_path):
    n = 5000
    run = run_driver(fake, tmp_path, "flood", n, capacity=16, timeout=30)
    # produced: PROCESS + n ALLOC + n FREE + the cuInit note records
    produced = 1 + 2 * n + NOTE_RECORDS
    written = len(run.records) - len(run.of(Ev.DROPPED))
    assert run.dropped > 0
    assert written + run.dropped == produced
    # DROPPED records report what was lost before them; only the tail after the last can be missing
    assert run.of(Ev.DROPPED)["a"].sum() <= run.dropped


def test_c07_threads_written_plus_dropped_exact(fake, tmp_path):
    threads, per = 8, 10000
    run = run_driver(fake, tmp_path, "threads", threads, per, capacity=1 << 12, timeout=120, env=NO_GPU_CLOCK)
    launches = run.of(Ev.LAUNCH)
    acc = run.of(Ev.ACCESS)
    # every launch is one group (LAUNCH + 1 ACCESS), written or dropped whole
    assert len(launches) == len(acc)
    produced = 1 + NOTE_RECORDS + 1 + 1 + 2 * threads * per  # PROCESS, notes, ALLOC, name, launches
    written = len(run.records) - len(run.of(Ev.DROPPED))
    assert written + run.dropped == produced
    assert sorted(launches["a"].tolist()) == sorted(set(launches["a"].tolist()))


def test_c07_concurrent_drain_reports_drops(fake, tmp_path):
    """A slow consumer drains while 8 threads launch: nothing blocks, losses are reported."""
    threads, per = 8, 20000
    r = Ring.create(capacity=256, directory=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_")}
    env.update(LD_LIBRARY_PATH=str(fake), LD_PRELOAD=str(SHIM), PYOBMEM_RING=r.path, PYOBMEM_CUPTI="0", **NO_GPU_CLOCK)
    try:
        proc = subprocess.Popen([str(fake / "driver"), "threads", str(threads), str(per)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        chunks = []
        while proc.poll() is None:
            chunks.append(r.drain())
        out, err = proc.communicate(timeout=120)
        chunks.append(r.drain())
        recs = np.concatenate(chunks)
        dropped = r.dropped
    finally:
        r.close()
    assert proc.returncode == 0, err
    drops = recs[recs["type"] == Ev.DROPPED]
    written = len(recs) - len(drops)
    assert written + dropped == 1 + NOTE_RECORDS + 1 + 1 + 2 * threads * per
    assert drops["a"].sum() <= dropped
    launches = recs[recs["type"] == Ev.LAUNCH]
    assert len(launches) == len(recs[recs["type"] == Ev.ACCESS])
    assert len(set(launches["a"].tolist())) == len(launches)


def test_c07_threads_no_drops_with_room(fake, tmp_path):
    threads, per = 8, 2000
    run = run_driver(fake, tmp_path, "threads", threads, per, capacity=1 << 16, timeout=120)
    launches = run.of(Ev.LAUNCH)
    assert run.dropped == 0
    assert len(launches) == threads * per
    assert sorted(launches["a"].tolist()) == list(range(1, threads * per + 1))
    assert all(int(w) >> abi.ACCESS_OFFSET_BITS == 1 for w in run.of(Ev.ACCESS)["b"])


# ---------------------------------------------------------------- pass-through


def test_disable_records_nothing(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic", env={"PYOBMEM_DISABLE": "1"})
    assert len(run.records) == 0 and run.dropped == 0
    assert run.out["oom_rc"] == 2 and run.out["free_a_rc"] == 0


def test_no_ring_env_is_pass_through(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic", ring=False)
    assert run.out["init_rc"] == 0 and run.out["oom_rc"] == 2 and run.out["bad_launch_rc"] == 400
    assert run.out["free_a_rc"] == 0 and run.out["free_b_rc"] == 0


def test_bad_ring_path_is_pass_through(fake, tmp_path):
    bogus = tmp_path / "not-a-ring"
    bogus.write_bytes(b"\0" * 8192)
    run = run_driver(fake, tmp_path, "basic", ring=False, env={"PYOBMEM_RING": str(bogus)})
    assert run.out["oom_rc"] == 2
    assert bogus.read_bytes() == b"\0" * 8192


def test_same_results_without_shim(fake, tmp_path):
    with_shim = run_driver(fake, tmp_path, "basic")
    without = run_driver(fake, tmp_path, "basic", preload=False, ring=False)
    keys = ["init_rc", "a", "b", "oom_rc", "ex_rc", "opaque_rc", "coop_rc", "bad_launch_rc", "free_b_rc", "free_a_rc"]
    assert {k: with_shim.out[k] for k in keys} == {k: without.out[k] for k in keys}


@pytest.mark.parametrize("cmd", [[sys.executable, "-c", "print(1)"], ["/bin/true"], ["/bin/echo", "hi"]])
def test_non_cuda_process_unchanged(cmd, tmp_path):
    if not SHIM.exists():
        subprocess.run(["make", "-s", "native"], cwd=ROOT, check=True)
    r = Ring.create(capacity=64, directory=str(tmp_path))
    try:
        base = subprocess.run(cmd, capture_output=True)
        env = dict(os.environ, LD_PRELOAD=str(SHIM), PYOBMEM_RING=r.path)
        shimmed = subprocess.run(cmd, capture_output=True, env=env)
        assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (base.returncode, base.stdout, base.stderr)
        assert len(r.drain()) == 0
    finally:
        r.close()


# ---------------------------------------------------------------- CUPTI (C05, C25)
# CUPTI is opt-in (PYOBMEM_CUPTI "1" or a path; pyobmem-run --cupti): by default the hooks trace
# every launch and libcupti is never loaded, so the process's profilers keep their subscription.


def test_c05_cupti_off_by_default_never_subscribed(fake, tmp_path):
    log = tmp_path / "cupti.log"
    for value in (None, "", "0"):
        env = {"FAKE_CUPTI_LOG": str(log), "LD_LIBRARY_PATH": str(fake)}
        run = run_driver(fake, tmp_path, "basic", env={**env, "PYOBMEM_CUPTI": value})
        assert [n for n in run.notes() if n.startswith("cupti=")] == ["cupti=off (the default; --cupti subscribes)"]
        launches = run.of(Ev.LAUNCH)
        assert launches["b"].tolist() == [FUNC_A, FUNC_A, KERN_B, FUNC_C, FUNC_A]
        assert not any(int(f) & LaunchFlag.VIA_CUPTI for f in launches["flags"])
        assert run.of(Ev.PROCESS)["c"].tolist() == [LaunchSource.HOOKS]
    assert not log.exists()  # no cuptiEnableCallback: nothing subscribed


def test_c05_missing_cupti_noted_once(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic", env={"PYOBMEM_CUPTI": "/nonexistent/libcupti.so"})
    cupti = [n for n in run.notes() if n.startswith("cupti=")]
    assert cupti == ["cupti=unavailable: PYOBMEM_CUPTI library could not be loaded"]
    assert len(run.of(Ev.LAUNCH)) == 5  # launches recorded from the hooks
    assert not any(int(f) & LaunchFlag.VIA_CUPTI for f in run.of(Ev.LAUNCH)["flags"])


def test_cuinit_notes(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic")
    assert run.notes() == [
        "driver_version=13000",
        "device_count=1",
        "device0.name=Fake H200",
        "device0.total_bytes=150754820096",
        "device0.cc=9.0",
        "cupti=off (the default; --cupti subscribes)",
    ]


CUPTI_LAUNCH_CBIDS = {307, 442, 652, 653, 477, 478}  # cuLaunchKernel(_ptsz), Ex(_ptsz), Cooperative(_ptsz)


def test_c05_cupti_active_records_via_callback_once(fake, tmp_path):
    log = tmp_path / "cupti.log"
    run = run_driver(fake, tmp_path, "basic",
                     env={"PYOBMEM_CUPTI": str(fake / "libcupti.so"), "FAKE_CUPTI_LOG": str(log)})
    assert [n for n in run.notes() if n.startswith("cupti=")] == [
        f"cupti=active: {fake / 'libcupti.so'} (CUPTI version 130001)"]
    # exactly the launch callback ids, nothing else
    assert {tuple(map(int, l.split())) for l in log.read_text().splitlines()} == {(c, 1) for c in CUPTI_LAUNCH_CBIDS}
    launches = run.of(Ev.LAUNCH)
    # CUPTI records successful launches at API exit (not the failed one, handle 0); the hooks none
    assert launches["b"].tolist() == [FUNC_A, FUNC_A, KERN_B, FUNC_C, FUNC_A]
    # PROCESS said HOOKS at the first hook, then CUPTI once the subscription started
    assert run.of(Ev.PROCESS)["c"].tolist() == [LaunchSource.HOOKS, LaunchSource.CUPTI]
    assert all(int(f) & LaunchFlag.VIA_CUPTI for f in launches["flags"])
    assert int(launches[2]["flags"]) == LaunchFlag.VIA_CUPTI | LaunchFlag.EX | LaunchFlag.COOPERATIVE
    assert int(launches[4]["flags"]) == LaunchFlag.VIA_CUPTI | LaunchFlag.COOPERATIVE
    assert accesses(run, 1) == [word(1, 256), word(2, 0)]
    assert accesses(run, 3) == [word(2, 16), word(1, 1000)]
    assert accesses(run, 4) == [word(2, 100)]
    assert run.out["bad_launch_rc"] == 400


def test_c05_cupti_taken_falls_back_to_hooks(fake, tmp_path):
    run = run_driver(fake, tmp_path, "basic",
                     env={"PYOBMEM_CUPTI": str(fake / "libcupti.so"), "FAKE_CUPTI_BUSY": "1"})
    # one line naming the library's path, its version and the error (C25)
    assert [n for n in run.notes() if n.startswith("cupti=")] == [
        f"cupti=unavailable: {fake / 'libcupti.so'} (CUPTI version 130001): cuptiSubscribe: "
        "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
    ]
    launches = run.of(Ev.LAUNCH)
    assert launches["b"].tolist() == [FUNC_A, FUNC_A, KERN_B, FUNC_C, FUNC_A]
    assert not any(int(f) & LaunchFlag.VIA_CUPTI for f in launches["flags"])
    assert accesses(run, 1) == [word(1, 256), word(2, 0)]
