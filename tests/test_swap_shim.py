"""CPU tests of the shim's swap mode (native/swap.c) against the fake libcuda.

tests/fake_cuda/fake_vmm.inc gives the fake driver real bytes behind VMM mappings, queued
streams and events (the shim's own stream only runs when the driver calls fakeAdvance), stream
capture and counters of everything a swapper must never do. tests/fake_cuda/swap_driver.c plays a
training loop: it prints its pid and waits at numbered sync points, where the test writes plans
for that pid into the control file (numpy, pyobmem.abi.CONTROL_DTYPE), as the daemon would.
Every test asserts exact records, bytes and counters.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.abi import ActionKind, AllocKind, Ev, SwapInCause, SwapOutCause
from pyobmem.ring import Ring

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_cuda"
SHIM = ROOT / "pyobmem" / "libpyobmem.so"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"

FUNC_A, KERN_B, FUNC_C, FUNC_T = 0x1000, 0x2000, 0x3000, 0x5000
KEY_SET = abi.op_key_copy(Ev.MEMSET, 0)
MIB = 1 << 20
GRAN = 2 * MIB
LEN = 4 * MIB + 100  # swap_driver.c: LEN
VMM_BASE = 0x20000000000

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or not (CUDA_INCLUDE / "cuda.h").exists(), reason="needs gcc and the CUDA headers"
)


@pytest.fixture(scope="session")
def fake(build_fake_program):
    """The fake libcuda and libcupti (conftest.fake_cuda) with the swap driver; their directory."""
    return build_fake_program("swap_driver", "-ldl")


# ---------------------------------------------------------------- the control file, as the daemon writes it


def make_control(path: Path, budget: int = 0, min_swap: int = MIB) -> Path:
    c = np.zeros(1, dtype=abi.CONTROL_DTYPE)
    c["magic"] = abi.CONTROL_MAGIC
    c["abi_version"] = abi.ABI_VERSION
    c["budget_bytes"] = budget
    c["min_swap_bytes"] = min_swap
    c.tofile(path)
    return path


def control(path: Path):
    return np.memmap(path, dtype=abi.CONTROL_DTYPE, mode="r+", shape=(1,))


def write_plan(path: Path, pid: int, gen: int, keys, actions):
    """Double buffer: fill plans[1 - active], then flip active."""
    c = control(path)
    slot = 1 - int(c["active"][0])
    p = c["plans"][0, slot]
    p["pid"] = pid
    p["period"] = len(keys)
    p["template_keys"][: len(keys)] = keys
    p["n_actions"] = len(actions)
    for i, (at, kind, addr, size, *more) in enumerate(actions):
        # more: (until,) or (until, (site position, ordinal)) for a tensor named by its site
        p["actions"][i]["at"] = at
        p["actions"][i]["kind"] = int(kind)
        p["actions"][i]["until"] = more[0] if more else 0
        p["actions"][i]["addr"] = addr
        p["actions"][i]["size"] = size
        site = more[1] if len(more) > 1 else None
        p["actions"][i]["site_at"] = abi.SITE_NONE if site is None else site[0]
        p["actions"][i]["site_ord"] = 0 if site is None else site[1]
    p["generation"] = gen
    c["plans"][0, slot] = p
    c["active"] = slot
    c.flush()


class Run:
    def __init__(self, rc, stdout, stderr, records, ctl):
        self.rc, self.stdout, self.stderr, self.records = rc, stdout, stderr, records
        self.out = {}
        for line in stdout.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                self.out[k] = int(v) if v.lstrip("-").isdigit() else v
        self.control = ctl

    def of(self, ev):
        return self.records[self.records["type"] == int(ev)]

    def notes(self):
        out, cur = [], b""
        for r in self.of(Ev.NOTE):
            if int(r["flags"]) & 0x7FFF == 0:
                cur = b""
            cur += np.array([r["b"], r["c"], r["d"], r["e"]], dtype="<u8").tobytes()
            if int(r["flags"]) & abi.TEXT_LAST:
                out.append(cur.rstrip(b"\0").decode())
        return out

    def block_id(self, addr):
        a = self.of(Ev.ALLOC)
        return int(a["a"][a["b"] == addr][-1])

    def swaps(self, ev, addr=None):
        s = self.of(ev)
        return s if addr is None else s[s["a"] == self.block_id(addr)]


def run_swap(fake, tmp_path, scenario, *args, budget=0, min_swap=MIB, plans=None, env=None, ctl=True,
             cupti=False, timeout=60):
    """Run swap_driver with the shim and a control file; plans: {sync point: fn(path, pid, out)}."""
    ring = Ring.create(capacity=1 << 16, directory=str(tmp_path))
    path = make_control(tmp_path / "control", budget, min_swap) if ctl else None
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_") and not k.startswith("FAKE_")}
    e.update(LD_LIBRARY_PATH=str(fake), LD_PRELOAD=str(SHIM), PYOBMEM_RING=ring.path,
             PYOBMEM_CUPTI=str(fake / "libcupti.so") if cupti else "0")
    if path is not None:
        e["PYOBMEM_CONTROL"] = str(path)
    e.update(env or {})
    err = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([str(fake / "swap_driver"), scenario, *map(str, args)], env=e, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    lines, out, pid = [], {}, None
    try:
        for line in proc.stdout:
            lines.append(line)
            k, _, v = line.strip().partition("=")
            out[k] = int(v) if v.lstrip("-").isdigit() else v
            if k == "pid":
                pid = int(v)
            if k == "sync":
                fn = (plans or {}).get(int(v))
                if fn is not None:
                    fn(path, pid, out)
                proc.stdin.write("\n")
                proc.stdin.flush()
        proc.wait(timeout=timeout)
        recs = ring.drain()
    finally:
        if proc.poll() is None:
            proc.kill()
        ring.close()
    err.seek(0)
    ctl_now = np.array(control(path)) if path is not None else None
    run = Run(proc.returncode, "".join(lines), err.read(), recs, ctl_now)
    assert run.rc == 0, (run.stdout, run.stderr)
    assert run.out.get("done") == 1, run.stdout
    return run


def no_misbehaviour(run, ctx_syncs=0, app_syncs=0):
    """What a swapper must never do (C11, C16), as counted by the fake driver. ``ctx_syncs``,
    ``app_syncs``: the application's own cuCtxSynchronize and stream syncs."""
    for k in ("faults", "unsafe_unmaps", "legacy_async", "capture_violations"):
        assert run.out[k] == 0, (k, run.stdout)
    assert (run.out["ctx_syncs"], run.out["app_syncs"]) == (ctx_syncs, app_syncs), run.stdout


def roundtrip_plan(path, pid, out):
    a = out["a"]
    write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B],
               [(0, ActionKind.PREFETCH, a, LEN), (1, ActionKind.SWAP_OUT, a, LEN)])


# ---------------------------------------------------------------- VMM backing and byte-exact round trips


@pytest.mark.parametrize("cupti", [False, True], ids=["hooks", "cupti"])
def test_block_swapped_out_and_in_20_times_keeps_every_byte(fake, tmp_path, cupti):
    run = run_swap(fake, tmp_path, "roundtrip", 20, plans={1: roundtrip_plan}, cupti=cupti)
    a, b, t = run.out["a"], run.out["b"], run.out["t"]
    # VMM-backed: addresses in the reserved range, one allocation each, kind DRIVER as the app asked
    assert all(VMM_BASE <= x < 0x30000000000 for x in (a, b, t))
    allocs = run.of(Ev.ALLOC)
    assert allocs["b"].tolist() == [a, b, t]
    assert allocs["c"].tolist() == [LEN, LEN, 2 * MIB]
    assert allocs["e"].tolist() == [AllocKind.DRIVER] * 3
    assert run.out["bad_a"] == 0 and run.out["bad_b"] == 0
    ida = run.block_id(a)
    outs = run.swaps(Ev.SWAP_OUT)
    assert outs["a"].tolist() == [ida] * 20
    assert outs["flags"].tolist() == [SwapOutCause.PLANNED] * 20  # the plan's SWAP_OUT action
    assert outs["b"].tolist() == [LEN] * 20
    ins = run.swaps(Ev.SWAP_IN)
    assert ins["a"].tolist() == [ida] * 20
    # iterations 1..19 prefetch: odd ones land before the consumer (hit), even ones late;
    # the final read-back brings the 20th swap-out back on demand
    causes = ins["flags"].tolist()
    assert causes == [SwapInCause.PREFETCH if i % 2 else SwapInCause.LATE for i in range(1, 20)] + [
        SwapInCause.DEMAND]
    # late consumers waited on the copy event (blocked), the final DtoH too
    assert run.out["blocked_waits"] >= 10
    # one stream per copy engine: every swap-out on one, every swap-in on the other (no handoffs
    # here: the fake numbers the shim's streams 0x5010, 0x5020, 0x5030 in the order it makes them,
    # the swap-outs', the swap-ins', the handoff swap-ins')
    assert set(outs["d"].tolist()) == {0x5010} and set(ins["d"].tolist()) == {0x5020}
    assert run.out["htod_streams"] == 1 << 2  # the copies themselves: on 0x5020 only
    assert outs["d"][0] != 0 and ins["d"][0] != 0 and outs["d"][0] != ins["d"][0]
    no_misbehaviour(run)
    # plan adopted once (gen 1, 2 actions); the final read-back copies leave the template: one drop
    plan = run.of(Ev.PLAN)
    assert [(int(r["a"]), int(r["b"]), int(r["flags"])) for r in plan] == [(1, 2, 0), (1, 0, 1)]
    assert int(run.control["adopted"][0]) == 1
    assert int(run.control["plan_drops"][0]) == 1
    # free: unmapped, released and the range freed (C17: exactly what was mapped)
    assert (run.out["free_a_rc"], run.out["free_b_rc"], run.out["free_t_rc"]) == (0, 0, 0)
    assert run.out["after_free_handles"] == 0 and run.out["after_free_reservations"] == 0
    assert run.of(Ev.FREE)["b"].tolist() == [a, b, t]
    # the pool: one chunk, noted
    assert run.out["pinned_bytes"] == 1 << 30
    assert "swap.pinned_bytes=1073741824" in run.notes()
    # where the host's time went, noted at exit: 20 planned swap-outs, no eviction, one map per
    # block and swap-in, each a cuMemCreate (no budget here: no spare handles are kept)
    waits = dict(kv.split("=") for n in run.notes() if n.startswith("swap.waits=") for kv in n[len("swap.waits="):].split())
    assert (waits["planned_outs"], waits["evictions"], waits["handoffs"]) == ("20", "0", "0")
    assert waits["maps"].split("/")[0] == "23" and waits["creates"] == "23" and waits["drains"].startswith("0/")
    # the allocation path and the VMM calls by kind (NOTE swap.host): 3 blocks allocated and freed
    host = dict(kv.split("=") for n in run.notes() if n.startswith("swap.host=") for kv in n[len("swap.host="):].split())
    assert set(host) == {"allocs", "frees", "create", "access", "release", "lock_waits", "releaser"}, host
    assert host["allocs"].split("/")[0] == "3" and host["frees"].split("/")[0] == "3"
    calls = {k: int(host[k].split("/")[0]) for k in ("create", "access", "release")}
    assert calls == {"create": 23, "access": 23, "release": 23}, host  # every map creates; 20 outs + 3 frees release
    # the bytes released (NOTE swap.releases): 20 swap-outs of a (6 MiB mapped) and the frees of a,
    # b (6 MiB) and t (2 MiB) at the end. Those three count as made while a swap-in was not
    # complete: the read-back ran the fake's host-to-device stream only up to the block's own copy
    # event, and the latest swap-in's event (recorded after it) is still queued: what the shim
    # sees; on a GPU that record completes right after the copy
    rel = [n for n in run.notes() if n.startswith("swap.releases=")]
    assert rel == ["swap.releases=bytes=134MiB h2d_busy=3/14MiB"], rel


def test_c16_no_synchronising_calls(fake, tmp_path):
    """The executor never synchronises the device or an application stream, never unmaps memory
    a queued op still uses, never works on the legacy stream (fake driver counters)."""
    run = run_swap(fake, tmp_path, "roundtrip", 6, plans={1: roundtrip_plan})
    assert len(run.of(Ev.SWAP_OUT)) == 6
    assert run.out["app_syncs"] == 0
    assert run.out["ctx_syncs"] == 0
    assert run.out["unsafe_unmaps"] == 0
    assert run.out["legacy_async"] == 0
    assert run.out["faults"] == 0


def test_no_control_file_traces_as_today(fake, tmp_path):
    run = run_swap(fake, tmp_path, "roundtrip", 3, ctl=False)
    assert all(x < VMM_BASE for x in (run.out["a"], run.out["b"], run.out["t"]))  # the real allocator
    assert len(run.of(Ev.SWAP_OUT)) == len(run.of(Ev.SWAP_IN)) == len(run.of(Ev.PLAN)) == 0
    assert not [n for n in run.notes() if n.startswith("swap")]
    assert run.out["create_calls"] == 0 and run.out["pinned_bytes"] == 0
    launches = run.of(Ev.LAUNCH)
    assert launches["b"].tolist() == [KERN_B, FUNC_A, KERN_B] * 3


def test_bad_control_file_means_no_swap(fake, tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\0" * abi.CONTROL_DTYPE.itemsize)
    run = run_swap(fake, tmp_path, "roundtrip", 1, ctl=False, env={"PYOBMEM_CONTROL": str(bad)})
    assert "swap=off: control file has a wrong magic or version" in run.notes()
    assert run.out["a"] < VMM_BASE
    assert run.out["create_calls"] == 0


def test_small_blocks_use_the_real_allocator(fake, tmp_path):
    run = run_swap(fake, tmp_path, "roundtrip", 1, min_swap=8 * MIB)
    assert all(x < VMM_BASE for x in (run.out["a"], run.out["b"], run.out["t"]))
    assert run.out["create_calls"] == 0


# ---------------------------------------------------------------- field cases


def test_c17_remap_regrants_access(fake, tmp_path):
    def plan(path, pid, out):
        a = out["a"]
        write_plan(path, pid, 1, [KERN_B, KERN_B, FUNC_A],
                   [(1, ActionKind.PREFETCH, a, 2 * MIB), (2, ActionKind.SWAP_OUT, a, 2 * MIB)])

    run = run_swap(fake, tmp_path, "remap", plans={1: plan})
    assert run.out["set_access_rc"] == 0
    assert run.out["access_before"] == 0b11  # device 0 (ours) and device 1 (the app's peer)
    assert run.out["access_out"] == -1  # unmapped while out
    assert run.out["access_after"] == 0b11  # granted again on remap
    assert run.out["bad_a"] == 0
    # the prefetch landed before its consumer; the read-back after the next swap-out is on demand
    assert run.swaps(Ev.SWAP_IN, run.out["a"])["flags"].tolist() == [SwapInCause.PREFETCH, SwapInCause.DEMAND]
    no_misbehaviour(run)


def test_c17_map_failure_leaves_block_resident(fake, tmp_path):
    def plan(path, pid, out):
        b = out["b"]
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, b, 2 * MIB)])

    run = run_swap(fake, tmp_path, "mapfail", plans={1: plan}, env={"FAKE_FAIL_MAP": "1,3"})
    # allocation: the map failed halfway (reserve and create done): both undone, real allocator used
    assert run.out["a"] < VMM_BASE
    assert run.out["after_fail_handles"] == 0
    assert run.out["after_fail_reservations"] == 0
    assert run.out["after_fail_mappings"] == 0
    assert run.out["b"] >= VMM_BASE
    # swap-in: the map failed: the op is refused with the driver's code, nothing half-mapped,
    # the host copy kept; the next op brings the block back with every byte
    assert run.out["b_out"] == 1
    assert run.out["swapin_fail_rc"] == 999  # CUDA_ERROR_UNKNOWN from the fake cuMemMap
    assert run.out["b_still_out"] == 1
    assert run.out["swapin_ok_rc"] == 0
    assert run.out["bad_b"] == 0
    assert run.out["map_calls"] == 4
    assert run.swaps(Ev.SWAP_IN, run.out["b"])["flags"].tolist() == [SwapInCause.DEMAND]
    # the refused launch is not recorded: b's launches are the 2 that ran
    la = run.of(Ev.LAUNCH)
    assert la["b"].tolist() == [KERN_B, FUNC_A, KERN_B, FUNC_A]
    assert any(n.startswith("swap: a block could not be brought back (CUresult 999)") for n in run.notes())
    no_misbehaviour(run)


def test_foreach_launch_does_not_cancel_swap_outs(fake, tmp_path):
    # Session 6's H200 capture: the optimizer's foreach launches named more than 64 blocks, were
    # TRUNCATED, and the shim cancelled every swap-out still copying (~188 a step at 50%). Now a
    # launch naming 150 blocks is named whole: a's swap-out goes on in both iterations, and a comes
    # back on demand (at iteration 2's op 0, at the read-back).
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_T], [(0, ActionKind.SWAP_OUT, out["a"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "foreach", plans={1: plan})
    a = run.out["a"]
    assert run.out["foreach0_rc"] == run.out["foreach1_rc"] == 0
    la = run.of(Ev.LAUNCH)
    foreach = la[la["b"] == FUNC_T]
    assert (foreach["e"] & 0xFFFFFFFF).tolist() == [150, 150]
    assert not (foreach["flags"] & abi.LaunchFlag.TRUNCATED).any()
    assert run.swaps(Ev.SWAP_OUT, a)["a"].size == 2
    assert run.swaps(Ev.SWAP_IN, a)["flags"].tolist() == [SwapInCause.DEMAND] * 2
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_c08_opaque_block_never_swapped(fake, tmp_path):
    def plan(path, pid, out):
        a, b = out["a"], out["b"]
        write_plan(path, pid, 1, [KERN_B, FUNC_C], [
            (0, ActionKind.SWAP_OUT, a, 2 * MIB), (0, ActionKind.SWAP_OUT, b, 2 * MIB),
            (1, ActionKind.SWAP_OUT, a, 2 * MIB)])

    run = run_swap(fake, tmp_path, "opaque", plans={1: plan})
    a, b = run.out["a"], run.out["b"]
    # iteration 1: a and b swapped out after op 0; the opaque op names a (now never swapped) and
    # may touch anything: b comes back first (demand). Iteration 2: only b goes out, comes back.
    assert run.swaps(Ev.SWAP_OUT, a)["a"].size == 1  # before any opaque op touched it
    assert run.swaps(Ev.SWAP_OUT, b)["a"].size == 2
    assert run.swaps(Ev.SWAP_IN, b)["flags"].tolist() == [SwapInCause.DEMAND] * 2
    assert run.swaps(Ev.SWAP_IN, a)["flags"].tolist() == [SwapInCause.DEMAND]
    la = run.of(Ev.LAUNCH)
    assert (la["flags"][la["b"] == FUNC_C] & abi.LaunchFlag.OPAQUE).all()
    assert run.out["a_mapped"] == 1
    assert run.out["bad_a"] == 0 and run.out["bad_b"] == 0
    no_misbehaviour(run)


def test_c11_no_swap_during_capture(fake, tmp_path):
    def plan(path, pid, out):
        a = out["a"]
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, a, 2 * MIB)])

    run = run_swap(fake, tmp_path, "capture", plans={1: plan})
    a = run.out["a"]
    assert run.out["a_out"] == 1
    assert run.out["captured_rc"] == 0
    # brought back before the launch was captured, synchronously on the shim stream
    assert run.out["a_in_during_capture"] == 1
    # the planned swap-out after the captured op (position 1) was not done
    assert run.out["a_in_after_capture"] == 1
    assert run.swaps(Ev.SWAP_OUT, a)["a"].size == 1
    assert run.swaps(Ev.SWAP_IN, a)["flags"].tolist() == [SwapInCause.DEMAND]
    assert run.out["capture_violations"] == 0  # no event recorded on / waited by the capturing stream
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_c18_managed_never_swapped(fake, tmp_path):
    def plan(path, pid, out):
        m, x = out["m"], out["x"]
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [
            (1, ActionKind.SWAP_OUT, m, 4 * MIB), (1, ActionKind.SWAP_OUT, x, 2 * MIB),
            (0, ActionKind.PREFETCH, m, 4 * MIB)])

    run = run_swap(fake, tmp_path, "never", plans={1: plan})
    assert run.out["managed_rc"] == 0 and run.out["ipc_rc"] == 0
    allocs = run.of(Ev.ALLOC)
    assert int(allocs["e"][allocs["b"] == run.out["m"]][0]) == AllocKind.MANAGED
    assert run.out["m"] < VMM_BASE  # never VMM-backed
    assert len(run.of(Ev.SWAP_OUT)) == 0 and len(run.of(Ev.SWAP_IN)) == 0
    assert run.out["creates_during_plan"] == 0
    assert run.out["x_mapped"] == 1  # the IPC-exported block stays resident
    no_misbehaviour(run)


def test_c10_graph_launch_brings_blocks_back(fake, tmp_path):
    def plan(path, pid, out):
        a = out["a"]
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, a, 2 * MIB)])

    run = run_swap(fake, tmp_path, "graph", plans={1: plan})
    assert run.out["a_out"] == 1
    assert run.out["graph_rc"] == 0
    assert run.swaps(Ev.SWAP_IN, run.out["a"])["flags"].tolist() == [SwapInCause.DEMAND]
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_c10_graph_node_set_in_the_exec_brings_its_new_block_back(fake, tmp_path):
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, out["a"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "graph_update", plans={1: plan})
    assert run.out["a_out"] == 1
    assert run.out["set_rc"] == 0 and run.out["graph_rc"] == 0
    assert run.swaps(Ev.SWAP_IN, run.out["a"])["flags"].tolist() == [SwapInCause.DEMAND]
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_c10_node_set_to_a_block_that_is_out_brings_it_back_first(fake, tmp_path):
    # the driver checks memcpy and memset nodes' pointers (XLA on the H200: "Failed to set memcpy
    # D2D node params: CUDA_ERROR_INVALID_VALUE" when the block was out)
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, out["a"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "graph_set_out", plans={1: plan})
    assert run.out["a_out"] == 1
    assert run.out["inst_rc"] == 0  # a graph with a memset node on a, instantiated while a is out
    assert run.out["set_rc"] == 0
    assert len(run.swaps(Ev.SWAP_IN, run.out["a"])) == 1  # brought back by the instantiate
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_c26_conditional_graph_brings_back_its_bodies_blocks_only(fake, tmp_path):
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, out["a"], 2 * MIB),
                                                    (1, ActionKind.SWAP_OUT, out["u"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "graph_cond", plans={1: plan})
    assert run.out["a_out"] == run.out["u_out"] == 1
    assert run.out["add_rc"] == 0 and run.out["graph_rc"] == 0
    assert run.swaps(Ev.SWAP_IN, run.out["a"])["flags"].tolist() == [SwapInCause.DEMAND]
    assert run.out["bad_a"] == 0
    assert run.out["u_still_out"] == 1  # an opaque graph would have brought u back too
    no_misbehaviour(run)


# ---------------------------------------------------------------- plan following


def test_plan_prefetch_resync_mismatch_and_new_generation(fake, tmp_path):
    def plan1(path, pid, out):
        a = out["a"]
        write_plan(path, pid, 1, [KERN_B, FUNC_A, KEY_SET],
                   [(0, ActionKind.PREFETCH, a, 2 * MIB), (1, ActionKind.SWAP_OUT, a, 2 * MIB)])

    def plan2(path, pid, out):
        c = control(path)
        assert int(c["adopted"][0]) == 1 and int(c["plan_drops"][0]) == 1  # what the daemon sees
        a = out["a"]
        write_plan(path, pid, 2, [KERN_B, FUNC_A, KEY_SET], [(1, ActionKind.SWAP_OUT, a, 2 * MIB)])

    run = run_swap(fake, tmp_path, "plan", plans={1: plan1, 2: plan2})
    a = run.out["a"]
    plan = run.of(Ev.PLAN)
    # gen 1 adopted (2 actions), dropped at position 1 of iteration 4 (memset where a launch of
    # kernel_a was expected), gen 2 adopted (1 action); the final read-back copy drops gen 2
    assert [(int(r["a"]), int(r["b"]), int(r["flags"])) for r in plan] == [
        (1, 2, 0), (1, 1, 1), (2, 1, 0), (2, 0, 1)]
    assert int(run.control["adopted"][0]) == 2
    assert int(run.control["plan_drops"][0]) == 2
    # swap-outs after op 1 of iterations 1, 2 (the resync at b kept the plan), 3, and gen 2's
    outs = run.swaps(Ev.SWAP_OUT, a)
    assert outs["a"].size == 4
    # prefetches at the start of iterations 2 and 3 (advanced before the consumer: hits); the
    # one at the start of iteration 4 is consumed, not advanced, after the drop (late); the
    # final read-back brings gen 2's swap-out back on demand
    assert run.swaps(Ev.SWAP_IN, a)["flags"].tolist() == [
        SwapInCause.PREFETCH, SwapInCause.PREFETCH, SwapInCause.LATE, SwapInCause.DEMAND]
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_plan_for_another_pid_is_ignored(fake, tmp_path):
    def plan(path, pid, out):
        roundtrip_plan(path, pid + 1, out)

    run = run_swap(fake, tmp_path, "roundtrip", 3, plans={1: plan})
    assert len(run.of(Ev.PLAN)) == 0 and len(run.of(Ev.SWAP_OUT)) == 0
    assert int(run.control["adopted"][0]) == 0


# ---------------------------------------------------------------- budget, OOM, pinned pool, no daemon


def test_budget_evicts_least_recently_used_idle_block(fake, tmp_path):
    run = run_swap(fake, tmp_path, "budget", budget=3 * GRAN)
    b, c = run.out["b"], run.out["c"]
    assert run.out["b_out"] == 1 and run.out["c_in"] == 1
    assert run.out["c_out"] == 1
    # allocating d evicts b, allocating e evicts c (a was touched after them); bringing b back on
    # demand keeps the budget too: a, now the least recently used, goes; bringing c back, d goes
    # (the swap-in waits for that swap-out: the device stays under the budget)
    outs = run.of(Ev.SWAP_OUT)
    assert outs["a"].tolist() == [run.block_id(b), run.block_id(c), run.block_id(run.out["a"]), run.block_id(run.out["d"])]
    assert outs["flags"].tolist() == [SwapOutCause.BUDGET] * 4  # no plan: every one the budget's
    ins = run.of(Ev.SWAP_IN)
    assert ins["a"].tolist() == [run.block_id(b), run.block_id(c)]
    assert ins["flags"].tolist() == [SwapInCause.DEMAND] * 2
    # both swap-ins counted with their time, most of it in hold_budget (each waits for a swap-out)
    note = next(n for n in run.notes() if n.startswith("swap.app_syncs="))
    n, total, held = map(int, re.search(r" demands=(\d+)/(\d+)us held=(\d+)us$", note).groups())
    assert n == 2 and 0 < held <= total, note
    assert run.out["bad_b"] == 0 and run.out["bad_c"] == 0
    # daemon-less: no plan ever written, none adopted, nothing dropped
    assert len(run.of(Ev.PLAN)) == 0
    assert int(run.control["adopted"][0]) == 0 and int(run.control["plan_drops"][0]) == 0
    no_misbehaviour(run)


def out_after_op_a(size):
    """A plan callback for run_swap: block a (``size`` bytes) goes out after op_a, in iterations of
    [op_b, op_a, op_b]."""
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B], [(1, ActionKind.SWAP_OUT, out["a"], size)])
    return plan


def test_a_swap_out_for_device_memory_is_recorded_as_such(fake, tmp_path):
    """swap_driver.c scenario_room, no budget and a device of two 2 MiB blocks: a goes out by
    the plan; reading it back finds the device full (c took a's memory), so b goes out for it
    (make_room), then c for b and a for c. Each SWAP_OUT record says why (its flags:
    abi.SwapOutCause)."""
    run = run_swap(fake, tmp_path, "room", plans={1: out_after_op_a(2 * MIB)}, env={"FAKE_DEVICE_BYTES": str(2 * GRAN)})
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    outs = run.swaps(Ev.SWAP_OUT)
    a, b, c = (run.block_id(run.out[k]) for k in "abc")
    assert outs["a"].tolist() == [a, b, c, a]
    assert outs["flags"].tolist() == [SwapOutCause.PLANNED] + [SwapOutCause.ROOM] * 3
    no_misbehaviour(run)


def test_oom_code_passed_unchanged_when_nothing_can_be_evicted(fake, tmp_path):
    env = {"FAKE_DEVICE_BYTES": str(2 * GRAN)}
    run = run_swap(fake, tmp_path, "oom", budget=GRAN, env=env)
    assert run.out["oom_rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY, as the real allocator said
    assert run.out["c"] == 0
    # a went out when b's allocation needed room, came back for op_c(a); nothing goes out while
    # an opaque op is between its begin and its launch (another thread's eviction could unmap
    # what it is about to touch), and once opaque a and b are never swapped: c finds nothing
    assert len(run.of(Ev.SWAP_OUT)) == 1 and len(run.of(Ev.SWAP_IN)) == 1
    assert len(run.of(Ev.ALLOC)) == 2
    assert run.out["handles"] == 2 and run.out["reservations"] == 2  # the failed try left nothing
    # and the same program without the shim fails the same way
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYOBMEM_")}
    e.update(LD_LIBRARY_PATH=str(fake), **env)
    p = subprocess.run([str(fake / "swap_driver"), "oom"], env=e, input="\n", capture_output=True, text=True,
                       timeout=30)
    assert "oom_rc=2" in p.stdout.splitlines()


def test_pinned_pool_exhaustion_degrades_to_fewer_swapped_blocks(fake, tmp_path):
    def plan(path, pid, out):
        acts = [(2, ActionKind.SWAP_OUT, out[f"x{i}"], 2 * MIB) for i in range(3)]
        write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B], acts)

    run = run_swap(fake, tmp_path, "pool", plans={1: plan}, env={"FAKE_HOST_BYTES": str(5 * MIB)})
    # chunks tried from 1 GiB down: 4 MiB fits (two blocks), then 2 MiB more would pass 5 MiB
    assert run.out["pinned_bytes"] == 4 * MIB
    assert [run.out[f"x{i}_out"] for i in range(3)] == [1, 1, 0]
    assert [run.out[f"bad_x{i}"] for i in range(3)] == [0, 0, 0]
    notes = run.notes()
    assert "swap.pinned_bytes=4194304" in notes
    assert sum(n.startswith("swap: pinned host memory exhausted") for n in notes) == 1
    no_misbehaviour(run)


# ---------------------------------------------------------------- batched copies (cuMemcpyBatchAsync, 3D)

KEY_COPY_OTHER = abi.op_key_copy(Ev.MEMCPY, abi.CopyKind.OTHER)


@pytest.mark.parametrize("variant", ["12080", "13000", "12080pt", "13000pt", "12080pt0", "3d12080", "3d13000",
                                     "3d12080pt", "3d13000pt0"])
def test_batch_copy_brings_every_touched_block_back(fake, tmp_path, variant):
    """a and b are out when one batch copy reads a and writes b: both come back (demand) before
    the real call, the batch's stream waits for them, and every byte lands, through each entry
    point (12.8's shape with failIdx, 13.0's without, per-thread twins, 1D and 3D)."""
    def plan(path, pid, out):
        a, b = out["a"], out["b"]
        write_plan(path, pid, 1, [KERN_B, FUNC_A],
                   [(1, ActionKind.SWAP_OUT, a, 2 * MIB), (1, ActionKind.SWAP_OUT, b, 2 * MIB)])

    run = run_swap(fake, tmp_path, "batch", variant, plans={1: plan})
    a, b = run.out["a"], run.out["b"]
    assert run.out["have_fn"] == 1
    assert run.out["a_out"] == 1 and run.out["b_out"] == 1
    assert run.out["batch_rc"] == 0
    assert run.out["batch_fail"] == 12345  # failIdx (12.8) left as the driver left it
    assert run.out["a_in"] == 1 and run.out["b_in"] == 1  # mapped before the real call
    assert run.out["host2_before"] == 0  # queued behind the swap-in copies, not run before them
    assert run.out["bad_host2"] == 0 and run.out["bad_b"] == 0 and run.out["bad_a"] == 0
    assert run.out["batch_copies"] == 3
    assert run.out["batch_stream"] == (2 if variant.endswith("pt0") else 0x77)  # CU_STREAM_PER_THREAD or S1
    assert run.swaps(Ev.SWAP_OUT, a)["a"].size == 1 and run.swaps(Ev.SWAP_OUT, b)["a"].size == 1
    assert run.swaps(Ev.SWAP_IN, a)["flags"].tolist() == [SwapInCause.DEMAND]
    assert run.swaps(Ev.SWAP_IN, b)["flags"].tolist() == [SwapInCause.DEMAND]
    # one MEMCPY op for the batch, after both swap-ins: the first copy's words (host -> b+1MiB),
    # all bytes, the stream as passed; a (the other block) in an ACCESS record of the same seq
    recs = run.records
    cp_idx = np.flatnonzero((recs["type"] == Ev.MEMCPY) & (recs["d"] == MIB + 8192))
    assert len(cp_idx) == 1
    cp = recs[cp_idx[0]]
    ida, idb = run.block_id(a), run.block_id(b)
    assert int(cp["flags"]) == abi.CopyKind.OTHER | abi.COPY_ASYNC
    assert int(cp["b"]) == (idb << abi.ACCESS_OFFSET_BITS) | MIB and int(cp["c"]) == 0
    assert int(cp["e"]) == (0 if variant.endswith("pt0") else 0x77)
    acc = recs[(recs["type"] == Ev.ACCESS) & (recs["a"] == cp["a"])]
    assert [int(w) for r in acc for w in (r["b"], r["c"], r["d"], r["e"]) if w] == [ida << abi.ACCESS_OFFSET_BITS]
    ins = np.flatnonzero(recs["type"] == Ev.SWAP_IN)
    assert ins[:2].max() < cp_idx[0]
    # the batch is not in the plan's template [kernel_b, kernel_a]: the plan is dropped there
    plans = run.of(Ev.PLAN)
    assert [(int(r["a"]), int(r["flags"])) for r in plans][:2] == [(1, 0), (1, 1)]
    no_misbehaviour(run)


# ---------------------------------------------------------------- pointer tables (C08, C09)


def _names(run, *keys):
    return {run.block_id(run.out[k]): k for k in keys}


def _swap_seq(run, *keys):
    """SWAP_OUT / SWAP_IN records in ring order, as ("out", name) / ("in", name, cause)."""
    names = _names(run, *keys)
    seq = []
    for r in run.records:
        if int(r["type"]) == Ev.SWAP_OUT:
            seq.append(("out", names[int(r["a"])]))
        elif int(r["type"]) == Ev.SWAP_IN:
            seq.append(("in", names[int(r["a"])], int(r["flags"])))
    return seq


D = SwapInCause.DEMAND
# swap_driver.c ptrtable with a pinned: a, b, c, d are 4 blocks under a budget of 3. The table's
# copy into d evicts b (the least recently used but a); the first op, on b, brings it back and
# evicts c. From then on each op (rounds c d b c d b c d b c d, read-backs b c d; a's read-back
# finds it resident) brings its block back and evicts the least recently used swappable one, the
# block the next op touches: c -> d, d -> b, b -> c. a is never chosen. The block brought back
# takes the memory of the one evicted for it while that one's copy out still runs (a handoff: no
# wait on the host); the evicted block's SWAP_OUT record is written then.
_NEXT = {"c": "d", "d": "b", "b": "c"}
PINNED_ROUNDS = [("out", "b"), ("out", "c"), ("in", "b", D)] + [
    ev for y in "cdb" * 4 + "cd" for ev in (("out", _NEXT[y]), ("in", y, D))]


@pytest.mark.parametrize("variant,mode", [("ptr", "sync"), ("ptr", "async"), ("middle", "sync"), ("middle", "async"),
                                          ("edge", "sync")])
def test_pointer_table_copy_pins_the_block_it_points_into(fake, tmp_path, variant, mode):
    """A small host-to-device copy whose words point into a swap block (its start, its middle, or
    the last word of a 64 KiB table) pins that block (C08, C09): a is out when the table is
    copied; it comes back before the copy returns (DEMAND) and is never swapped out again,
    although under a budget of 3 blocks one of the 4 must be out at each op and a is the least
    recently used one each time: b, c and d take turns instead."""
    run = run_swap(fake, tmp_path, "ptrtable", variant, mode, budget=3 * GRAN)
    assert run.out["a_out_before"] == 1 and run.out["table_rc"] == 0
    assert run.out["a_in_after_table"] == 1
    assert run.out["a_in_after_rounds"] == 1
    seq = _swap_seq(run, "a", "b", "c", "d")
    assert seq[0] == ("out", "a")  # evicted for d
    assert [e for e in seq if e[1] == "a"] == [("out", "a"), ("in", "a", D)]  # back for the table, for good
    assert [e for e in seq if e[1] != "a"] == PINNED_ROUNDS
    # the swap-in of a happened before the table's copy was issued: the MEMCPY (HTOD, into d)
    # follows it in the ring
    recs = run.records
    cp = np.flatnonzero((recs["type"] == Ev.MEMCPY) & ((recs["flags"] & 0xFF) == abi.CopyKind.HTOD)
                        & (recs["d"] == (65536 if variant == "edge" else 64)))
    assert len(cp) == 1
    assert int(recs["flags"][cp[0]]) == abi.CopyKind.HTOD | (abi.COPY_ASYNC if mode == "async" else 0)
    a_in = np.flatnonzero((recs["type"] == Ev.SWAP_IN) & (recs["a"] == run.block_id(run.out["a"])))
    assert a_in[0] < cp[0]
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"], run.out["bad_table"]) == (0, 0, 0, 0)
    no_misbehaviour(run)


# a not pinned: it stays out while b, c, d fit the budget; the read-backs rotate the others,
# each taking the memory of the block evicted for it
UNPINNED = [("out", "a"), ("out", "b"), ("in", "a", D), ("out", "c"), ("in", "b", D), ("out", "d"), ("in", "c", D),
            ("out", "a"), ("in", "d", D)]


@pytest.mark.parametrize("variant,mode", [("data", "sync"), ("data", "async"), ("large", "sync"),
                                          ("large", "async"), ("unaligned", "sync")])
def test_copy_that_is_no_pointer_table_pins_nothing(fake, tmp_path, variant, mode):
    """Ordinary data (small integers, -1, no device address), a copy larger than 64 KiB (a's
    address in its first word: not scanned), a table at an address not 8-byte aligned (not
    scanned): nothing is pinned. a stays out through the rounds and is swapped like any block
    after it is read back (out again for the read-back of d)."""
    run = run_swap(fake, tmp_path, "ptrtable", variant, mode, budget=3 * GRAN)
    assert run.out["a_out_before"] == 1 and run.out["table_rc"] == 0
    assert run.out["a_in_after_table"] == 0
    assert run.out["a_in_after_rounds"] == 0
    assert _swap_seq(run, "a", "b", "c", "d") == UNPINNED
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"], run.out["bad_table"]) == (0, 0, 0, 0)
    assert run.out["device_peak"] == 3 * GRAN
    no_misbehaviour(run)


def test_pinning_a_block_that_is_out_keeps_the_physical_budget(fake, tmp_path):
    """swap_never (pointer tables, IPC, NCCL) brings a block that is out back after making room:
    the device never holds more than the 3-block budget."""
    run = run_swap(fake, tmp_path, "ptrtable", "ptr", "sync", budget=3 * GRAN)
    assert run.out["a_in_after_table"] == 1
    assert run.out["device_peak"] == 3 * GRAN


# ---------------------------------------------------------------- the physical budget (hold_budget)


def hold_plan(path, pid, out):
    write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, out["a"], 2 * MIB)])


@pytest.mark.parametrize("order", ["d2h_first", "h2d_first"])
def test_allocation_and_demand_swap_in_wait_for_swap_outs_in_flight(fake, tmp_path, order):
    """Budget 3 blocks. The planned swap-out of a is in flight (its copy queued on the shim
    stream, never run by the fake on its own) when d is allocated: b, c, d fit the bytes the
    executor counts, but a's memory is still there, and d (a cuMemAlloc block, usable at once on
    any stream) cannot wait for a copy on the GPU: the allocation waits for a's copy first (a
    released before d's ALLOC). Then op_a needs a back: d is evicted, and a takes d's memory
    while d's copy out still runs (a handoff): no wait on the host, the swap-in's copy ordered
    after d's on the GPU, so d's bytes survive whichever copy stream the fake runs first. The
    device (the fake's high-water mark of physical and legacy memory) never holds more than 3
    blocks."""
    env = {"FAKE_ADVANCE_REVERSE": "1"} if order == "h2d_first" else None
    run = run_swap(fake, tmp_path, "hold", budget=3 * GRAN, plans={1: hold_plan}, env=env)
    assert run.out["a_leaving"] == 1  # in flight: still mapped after op 1
    assert run.out["a_out_after_alloc"] == 1  # no fakeAdvance in between: the shim waited
    assert run.out["peak_after_alloc"] == 3 * GRAN
    # d is still mapped (its copy out queued), its memory a's
    assert run.out["d_out_after_demand"] == 0 and run.out["a_in_after_demand"] == 1
    assert run.out["peak_after_demand"] == 3 * GRAN
    assert run.out["device_peak"] == 3 * GRAN
    assert _swap_seq(run, "a", "b", "c", "d") == [
        ("out", "a"),  # waited for by the allocation of d
        ("out", "d"), ("in", "a", D),  # the demand swap-in takes d's memory, d's copy out still running
        ("out", "a"), ("in", "d", D)]  # d's read-back takes a's (iteration 2's swap-out of a cancelled by its own)
    recs = run.records
    ida, idd = run.block_id(run.out["a"]), run.block_id(run.out["d"])
    out_a = np.flatnonzero((recs["type"] == Ev.SWAP_OUT) & (recs["a"] == ida))
    alloc_d = np.flatnonzero((recs["type"] == Ev.ALLOC) & (recs["a"] == idd))
    assert out_a[0] < alloc_d[0]
    # the plan was followed through iteration 2 (dropped only by the read-backs)
    assert [(int(r["a"]), int(r["b"]), int(r["flags"])) for r in run.of(Ev.PLAN)] == [(1, 1, 0), (1, 0, 1)]
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"], run.out["bad_d"]) == (0, 0, 0, 0)
    # a, b and c: d maps a's handle (a spare, the budget had room), the swap-ins take the
    # evicted blocks' memory; no cuMemCreate after the first three
    assert run.out["create_calls"] == 3
    waits = dict(kv.split("=") for n in run.notes() if n.startswith("swap.waits=") for kv in n[len("swap.waits="):].split())
    assert waits["handoffs"] == "2" and waits["drains"].startswith("1/")
    # both swap-ins wait for a copy out on their own stream, so that swap-ins queued behind them
    # do not (the roundtrip test's swap-ins, none a handoff, run on 0x5020)
    assert set(run.swaps(Ev.SWAP_IN)["d"].tolist()) == {0x5030}
    assert run.out["htod_streams"] == 1 << 3  # the copies themselves: on 0x5030 only
    assert set(run.swaps(Ev.SWAP_OUT)["d"].tolist()) == {0x5010}
    no_misbehaviour(run)


# ---------------------------------------------------------------- the budget counts every device block


@pytest.mark.parametrize("variant", ["small", "async", "pitch"])
def test_blocks_not_vmm_backed_count_against_the_budget(fake, tmp_path, variant):
    """A 512 KiB block the shim does not VMM-back (cuMemAlloc below min_swap_bytes, served by the
    real allocator; cuMemAllocAsync; cuMemAllocPitch) puts the device over a budget of 3 swap
    blocks: the next op evicts a, the least recently used. Freed, it no longer counts: bringing
    a back evicts nothing."""
    run = run_swap(fake, tmp_path, "others", variant, budget=3 * GRAN)
    assert run.out["x_rc"] == 0 and run.out["x"] < VMM_BASE
    kind = {"small": AllocKind.DRIVER, "async": AllocKind.ASYNC, "pitch": AllocKind.PITCH}[variant]
    allocs = run.of(Ev.ALLOC)
    assert allocs["c"].tolist() == [2 * MIB] * 3 + [MIB // 2]
    assert int(allocs["e"][-1]) == kind
    assert run.out["a_out"] == 1 and run.out["b_in"] == 1 and run.out["c_in"] == 1
    assert run.out["x_free_rc"] == 0
    assert run.out["b_in_end"] == 1 and run.out["c_in_end"] == 1
    assert _swap_seq(run, "a", "b", "c") == [("out", "a"), ("in", "a", D)]
    # the real allocator's block is made before anything can be evicted for it (the shim
    # evicts at the next op): the device held 3 blocks + 512 KiB until a's copy completed
    assert run.out["device_peak"] == 3 * GRAN + MIB // 2
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


@pytest.mark.parametrize("hints", [True, False], ids=["idle_hints", "lru"])
def test_eviction_under_a_plan_takes_the_block_idle_the_longest(fake, tmp_path, hints):
    """Iteration [op_b(a), op_a(b, c)], budget 3 blocks, then d is allocated at position 0 (next:
    op_b(a)). The IDLE hints say a is used now and b, c are idle until position 1: d evicts b.
    Without hints the shim falls back to LRU and evicts a, which the very next op needs."""

    def plan(path, pid, out):
        a, b, c = out["a"], out["b"], out["c"]
        acts = [(0, ActionKind.IDLE, a, 2 * MIB, 0), (1, ActionKind.IDLE, b, 2 * MIB, 1),
                (1, ActionKind.IDLE, c, 2 * MIB, 1)] if hints else []
        write_plan(path, pid, 1, [KERN_B, FUNC_A], acts)

    run = run_swap(fake, tmp_path, "belady", budget=3 * GRAN, plans={1: plan})
    assert run.out["d"] != 0
    expect = (0, 1, 0) if hints else (1, 0, 0)
    assert (run.out["a_out"], run.out["b_out"], run.out["c_out"]) == expect
    plans = run.of(Ev.PLAN)
    assert plans["flags"][0] == 0 and plans["b"][0] == 0  # adopted (no swap action; hints are not counted)
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


@pytest.mark.parametrize("query", ["attr", "range"])
def test_pointer_query_brings_a_block_back(fake, tmp_path, query):
    """cuPointerGetAttribute / cuMemGetAddressRange on a block that is out (no mapping: the driver
    would refuse the pointer, and Triton checks every pointer argument this way) bring it back
    first: the query succeeds, the block is in, every byte intact."""
    run = run_swap(fake, tmp_path, "ptrquery", query, budget=3 * GRAN)
    assert run.out["a_out"] == 1
    assert run.out["query_rc"] == 0 and run.out["a_in"] == 1
    ins = run.of(Ev.SWAP_IN)
    assert ins["flags"].tolist()[:1] == [SwapInCause.DEMAND]
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


@pytest.mark.parametrize("releaser", ["on", "off"])
def test_release_thread_frees_memory_while_the_host_is_idle(fake, tmp_path, releaser):
    """A swap-out whose copy has ended is released by the shim's thread while the application
    makes no CUDA call (a host waiting in loss.item()); with PYOBMEM_RELEASER=0 only at its next
    op. Either way a comes back whole on demand."""
    env = {"PYOBMEM_RELEASER": "0"} if releaser == "off" else {}
    run = run_swap(fake, tmp_path, "release", budget=3 * GRAN, env=env)
    assert run.out["x_rc"] == 0
    if releaser == "off":
        assert run.out["a_mapped_before"] == 1 and run.out["a_out_while_idle"] == 0
    else:  # released by the thread, before the 200 ms without a call ended (perhaps even sooner)
        assert run.out["a_out_while_idle"] == 1
    assert run.out["a_out_after_op"] == 1
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_poll_queries_the_oldest_swap_out_in_flight_only(fake, tmp_path):
    """Every op polls the swap-outs in flight, and they complete in issue order (one copy
    stream): five copies out held in the queue cost each of ten ops one cuEventQuery (the
    oldest), not five; once the stream has run, one poll finds the five done, and the next has
    nothing to query. Every byte comes back."""
    run = run_swap(fake, tmp_path, "pollfifo", budget=3 * GRAN,
                   env={"PYOBMEM_RELEASER": "0", "PYOBMEM_GPU_CLOCK_EVERY": "0"})
    assert len(run.of(Ev.SWAP_OUT)) >= 5  # a, b, c, x0, x1 gave their memory to x0..x4
    assert run.out["queries_held"] == 10
    assert run.out["queries_done"] == 5
    assert run.out["queries_after"] == 0
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


def outqueue_plan(path, pid, out):
    write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B],
               [(1, ActionKind.SWAP_OUT, out[k], 96 * MIB) for k in "abc"])


AHEAD_128 = {"PYOBMEM_OUT_AHEAD_MIB": "128"}  # the scenarios' piece counts are for 128 MiB in flight


@pytest.mark.parametrize("ahead, at_op, after_poll", [(None, 6, 6), ("128", 3, 6), ("64", 1, 3), ("12", 1, 3), ("x", 6, 6)])
def test_swap_outs_are_issued_while_little_is_in_flight(fake, tmp_path, ahead, at_op, after_poll):
    """The copy engine runs every stream's copies in submission order (an application's
    loss.item() waited 48 ms behind a 2.8 GB swap-out on the H200): three planned swap-outs of
    96 MiB go to the engine as 64 MiB pieces while under PYOBMEM_OUT_AHEAD_MIB are in flight
    (default 512: all six pieces; 128: three, the other three once those are done; at least one
    piece: 64 and 12 issue one, and one poll after it is done two more; not a number: the
    default). The blocks are out, and come back whole."""
    env = {"PYOBMEM_OUT_AHEAD_MIB": ahead} if ahead else None
    run = run_swap(fake, tmp_path, "outqueue", budget=1 << 40, plans={1: outqueue_plan}, env=env)
    assert (run.out["pieces_at_op"], run.out["pieces_after_poll"]) == (at_op, after_poll)
    assert (run.out["a_out"], run.out["c_out"]) == (1, int(after_poll == 6))  # 64: c still queued
    assert len(run.swaps(Ev.SWAP_OUT)) == 3
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


@pytest.mark.parametrize("hold", ["on", "off"])
@pytest.mark.parametrize("sync", ["ctxsync", "streamsync"])
def test_an_application_sync_waits_for_no_swap_out_queued_behind_it(fake, tmp_path, sync, hold):
    """A cuCtxSynchronize, and a cuStreamSynchronize of the legacy stream, also wait for copies
    other threads issue while they wait (the fake's as the H200's: loss.item() at the end of
    each GPT medium step at 75% waited 40.7 ms while the release thread fed the optimizer state's
    queued swap-outs to the engine; 2.5 ms with this). While the application is in one, the queue
    waits: the three pieces in flight end in the sync, none is issued during it, the other three
    after it. With PYOBMEM_SYNC_HOLD=0 the release thread feeds the sync the other three. Every
    byte comes back."""
    env = dict(AHEAD_128, **({"PYOBMEM_SYNC_HOLD": "0"} if hold == "off" else {}))
    run = run_swap(fake, tmp_path, "outqueue", sync, budget=1 << 40, plans={1: outqueue_plan}, env=env)
    assert run.out["pieces_at_op"] == 3
    assert run.out["pieces_fed_in_sync"] == (0 if hold == "on" else 3)
    assert run.out["pieces_after_poll"] == 6
    assert len(run.swaps(Ev.SWAP_OUT)) == 3
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    note = [n for n in run.notes() if n.startswith("swap.app_syncs=")]
    assert len(note) == 1 and note[0].startswith("swap.app_syncs=1/") and f" hold={hold} near_sync=0 cache_handles=0 demands=3/" in note[0]  # the read-backs
    # the application's own sync; the shim makes none
    no_misbehaviour(run, ctx_syncs=int(sync == "ctxsync"), app_syncs=int(sync == "streamsync"))


@pytest.mark.parametrize("out, second", [(70, 3), (30, 6)])
def test_swap_outs_shortly_before_the_latest_host_sync_keep_little_in_flight(fake, tmp_path, out, second):
    """An application's host sync waits for the swap-outs in flight (loss.item() at 75% on the H200
    waited ~13 ms a step longer with 512 MiB in flight than with 128, session 14). The shim keeps
    the plan position of the latest sync: within min(48, P / 4) = 25 ops before it, at most 128 MiB
    go to the engine ahead. Three 96 MiB swap-outs after op 70 of a 100-op iteration whose
    stream is synced after op 90: the first iteration (no sync seen yet) issues all six pieces,
    the second three; after op 30 (60 ops before) six both times. The blocks come back whole."""
    keys = [FUNC_A] + [KERN_B] * 99

    def plan(path, pid, o):
        acts = [(out, ActionKind.SWAP_OUT, o[k], 96 * MIB) for k in "abc"]
        acts += [(out, ActionKind.IDLE, o[k], 96 * MIB, 91 + i) for i, k in enumerate("abc")]
        write_plan(path, pid, 1, keys, acts)

    run = run_swap(fake, tmp_path, "syncwindow", str(out), budget=1 << 40, plans={1: plan},
                   env={"PYOBMEM_GPU_CLOCK_EVERY": "0"})
    assert (run.out["pieces_1"], run.out["pieces_2"]) == (6, second)
    # the first iteration's three, and those of the second done before ops 91-93 name them again
    assert len(run.swaps(Ev.SWAP_OUT)) >= 4
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    note = next(n for n in run.notes() if n.startswith("swap.app_syncs="))
    assert note.startswith("swap.app_syncs=2/") and (" near_sync=0" in note) == (second == 6), note
    no_misbehaviour(run, app_syncs=2)


def test_a_handed_over_swap_out_is_released_before_an_older_one_still_copying(fake, tmp_path):
    """Swap-outs complete in the order of their last piece on the device-to-host stream, not of
    their first: a (192 MiB) has two pieces in flight when y takes b's memory, so b's whole copy
    is issued behind them and a's last piece behind b. Once b's copy has run, the next poll
    unmaps b's range although a, whose first piece came first, still copies (ordered by the
    first piece, the poll stopped at a and left b mapped until a ended). Every byte comes back."""
    n = 192 * MIB

    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B],
                   [(1, ActionKind.SWAP_OUT, out["a"], n), (1, ActionKind.SWAP_OUT, out["b"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "handfifo", budget=1 << 40, plans={1: plan},
                   env=dict(AHEAD_128, PYOBMEM_GPU_CLOCK_EVERY="0"))
    assert (run.out["pieces_at_op"], run.out["pieces_at_handoff"], run.out["pieces_after_poll"]) == (2, 3, 4)
    assert run.out["b_given"] == 1
    assert (run.out["ran_a"], run.out["ran_b"]) == (6, 3)
    assert run.out["b_out"] == 1 and run.out["a_leaving"] == 1
    assert run.out["a_out"] == 1
    assert len(run.swaps(Ev.SWAP_OUT, run.out["a"])) == 1 and len(run.swaps(Ev.SWAP_OUT, run.out["b"])) == 1
    assert (run.out["bad_a"], run.out["bad_b"]) == (0, 0)
    no_misbehaviour(run)


HANDIDLE_PLANS = {
    # a (needed at op 2) and b (at op 90) planned out after op 0: a is older but needed soon
    "skips_needed_soon": [(0, "SWAP_OUT", "a"), (0, "SWAP_OUT", "b"), (0, "IDLE", "a", 2), (0, "IDLE", "b", 90)],
    # b out after op 0, a after op 1, neither needed within 25 ops: b is the oldest, a first in the table
    "takes_the_oldest": [(0, "SWAP_OUT", "b"), (1, "SWAP_OUT", "a"), (0, "IDLE", "b", 90), (1, "IDLE", "a", 90)],
}


@pytest.mark.parametrize("case", sorted(HANDIDLE_PLANS))
def test_a_handoff_takes_the_oldest_swap_out_not_needed_soon(fake, tmp_path, case):
    """A map takes the memory of the oldest swap-out still leaving that no op needs soon by the
    plan's IDLE hints (within min(64, P / 4) = 25 ops of this 100-op iteration). y, allocated
    after op 1, takes b's memory in both cases: skips_needed_soon, not older a's, which op 2 needs;
    takes_the_oldest, not a's, first in the block table (what leaving_of took before out_order).
    Op 2 then names a, whose swap-out is cancelled, its copy still queued: a is never out and never
    comes back on demand (the H200 run before this rule: 4-6 handoffs an iteration of blocks the
    next op named, the host waiting 3-47 ms for each)."""
    keys = [FUNC_A] + [KERN_B] * 99

    def plan(path, pid, out):
        write_plan(path, pid, 1, keys, [(at, ActionKind[kind], out[name], 2 * MIB, *until)
                                        for at, kind, name, *until in HANDIDLE_PLANS[case]])

    run = run_swap(fake, tmp_path, "handidle", budget=1 << 40, plans={1: plan},
                   env={"PYOBMEM_RELEASER": "0", "PYOBMEM_GPU_CLOCK_EVERY": "0"})
    assert len(run.swaps(Ev.SWAP_OUT, run.out["b"])) == 1
    assert len(run.swaps(Ev.SWAP_OUT, run.out["a"])) == 0  # its memory was not handed to y
    assert len(run.swaps(Ev.SWAP_IN, run.out["a"])) == 0
    assert (run.out["bad_a"], run.out["bad_b"]) == (0, 0)
    no_misbehaviour(run)


def test_managed_memory_does_not_count_against_the_budget(fake, tmp_path):
    run = run_swap(fake, tmp_path, "others", "managed", budget=3 * GRAN)
    assert run.out["x_rc"] == 0
    assert int(run.of(Ev.ALLOC)["e"][-1]) == AllocKind.MANAGED
    assert run.out["a_out"] == 0 and run.out["b_in"] == 1 and run.out["c_in"] == 1
    assert len(run.of(Ev.SWAP_OUT)) == 0 and len(run.of(Ev.SWAP_IN)) == 0
    assert run.out["device_peak"] == 3 * GRAN  # the fake leaves managed memory out too
    assert run.out["pinned_bytes"] == 0  # nothing ever went out: no pinned pool
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


def test_free_of_a_block_whose_cancelled_swap_out_is_still_queued(fake, tmp_path):
    """a's swap-out is cancelled (an op touches it) while its copy out is still queued on the shim
    stream; freeing a then must wait for that copy before unmapping the memory it reads (the
    real driver would fault: the copy reads unmapped memory)."""
    run = run_swap(fake, tmp_path, "cancelfree", budget=3 * GRAN, env={"PYOBMEM_RELEASER": "0"})
    assert run.out["x_rc"] == 0
    assert run.out["a_mapped_before"] == 1 and run.out["a_mapped_after_cancel"] == 1
    assert run.out["free_a_rc"] == 0
    assert run.out["bad_b"] == 0 and run.out["bad_c"] == 0
    no_misbehaviour(run)


# ---------------------------------------------------------------- tensors named by their allocation site


@pytest.mark.parametrize("prefetch_at", [2, 3], ids=["before", "at_consumer"])
def test_tensors_named_by_site(fake, tmp_path, prefetch_at):
    """swap_driver.c scenario_sites: the plan names the tensor allocated first after op 0 (site
    (0, 0)); every iteration's x is a new block at another address, and each is the one swapped
    out after op 1 and prefetched before op 2 (landing before op 3 uses it), its bytes intact. y (site (0, 1)) is not in the
    plan; q sits at site (0, 2), which the plan names with another size: never bound.
    Prefetched before op 3, its consumer (the plan of a host running far ahead of the GPU): a
    planned swap-in all the same, late, not one on demand."""
    KEY_HTOD, KEY_DTOH = (abi.op_key_copy(Ev.MEMCPY, k) for k in (abi.CopyKind.HTOD, abi.CopyKind.DTOH))

    def plan(path, pid, out):
        write_plan(path, pid, 1, [KEY_HTOD, KEY_SET, KERN_B, FUNC_A, KEY_DTOH], [
            (1, ActionKind.SWAP_OUT, 0, LEN, 0, (0, 0)),
            (prefetch_at, ActionKind.PREFETCH, 0, LEN, 0, (0, 0)),
            (1, ActionKind.SWAP_OUT, 0, LEN, 0, (0, 2)),
        ])

    iters = 4
    run = run_swap(fake, tmp_path, "sites", iters, plans={1: plan})
    assert run.out["bad"] == 0
    xs = [run.out[f"x{i}"] for i in range(iters)]
    ys = [run.out[f"y{i}"] for i in range(iters)]
    assert xs[1] == ys[0] and xs[2] == ys[1]  # x is another block every iteration
    # One swap-out and one planned prefetch per iteration, each of that iteration's x (block ids:
    # the i-th ALLOC record at x's address, counting earlier iterations' x and y there).
    outs, ins = run.of(Ev.SWAP_OUT), run.of(Ev.SWAP_IN)
    assert len(outs) == iters and len(ins) == iters
    allocs = run.of(Ev.ALLOC)
    x_ids = [int(allocs["a"][(allocs["b"] == xs[i])][sum(xs[k] == xs[i] or ys[k] == xs[i] for k in range(i))])
             for i in range(iters)]
    assert outs["a"].tolist() == x_ids and ins["a"].tolist() == x_ids
    assert ins["flags"].tolist() == [SwapInCause.PREFETCH if prefetch_at == 2 else SwapInCause.LATE] * iters
    no_misbehaviour(run)


def test_sync_at_a_recurring_first_key_is_tentative(fake, tmp_path):
    """swap_driver.c scenario_anchor: the template's first kernel recurs at position 2, followed
    there by the same kernel as at position 1 (two ops in common with the start). Joining
    mid-iteration there, the shim syncs tentatively, meets a memset where op 2 was expected and
    waits for the iteration's start again: no drop. A sync stays tentative for 3 ops (the two in
    common, and one), so in the first whole iteration a is not swapped out after op 1: it goes out
    in the second and third."""
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B, FUNC_A, KEY_SET], [(1, ActionKind.SWAP_OUT, out["a"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "anchor", plans={1: plan})
    plans = run.of(Ev.PLAN)
    # adopted (1 action); the final read-back of a (a copy where op 0 was expected) drops it
    assert [(int(r["a"]), int(r["flags"])) for r in plans] == [(1, 0), (1, 1)]
    assert len(run.swaps(Ev.SWAP_OUT, run.out["a"])) == 2
    assert run.out["bad_a"] == 0
    no_misbehaviour(run)


def test_a_template_never_in_step_is_dropped(fake, tmp_path):
    """swap_driver.c scenario_nosync: syncs that are all tentative and all given up would leave
    the daemon waiting for ever. After 2 x 4 + 2 ops out of step (two iterations and the
    tentative window) the 11th op drops the plan, naming its first key."""
    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A, KERN_B, KEY_SET], [])

    run = run_swap(fake, tmp_path, "nosync", plans={1: plan})
    plans = run.of(Ev.PLAN)
    assert [(int(r["a"]), int(r["b"]), int(r["flags"])) for r in plans] == [(1, 0, 0), (1, 0, 1)]
    drop = abi.view(plans[1:], Ev.PLAN)[0]
    assert (int(drop["seen"]), int(drop["expected"])) == (KERN_B, KERN_B)
    assert int(run.control["plan_drops"][0]) == 1
    no_misbehaviour(run)


# ---------------------------------------------------------------- memory handed over while its copy out runs


@pytest.mark.parametrize("order", ["d2h_first", "h2d_first"])
def test_block_whose_memory_was_handed_over_comes_back_under_the_budget(fake, tmp_path, order):
    """swap_driver.c scenario_handoff, query: b's memory went to a while b's copy out was still
    queued; a pointer query on b then brings it back (bring_back): after its copy out ends it is
    out like any block, and its swap-in keeps the budget (c goes for it, its memory b's). The
    device never holds more than the 3-block budget."""
    env = {"PYOBMEM_RELEASER": "0", **({"FAKE_ADVANCE_REVERSE": "1"} if order == "h2d_first" else {})}
    run = run_swap(fake, tmp_path, "handoff", "query", budget=3 * GRAN, env=env)
    assert run.out["a_out"] == 1 and run.out["b_given"] == 1
    assert run.out["peak_after_handoff"] == 3 * GRAN
    assert run.out["query_rc"] == 0 and run.out["b_in"] == 1
    assert run.out["peak_after_query"] == 3 * GRAN
    assert _swap_seq(run, "a", "b", "c", "d")[:5] == [
        ("out", "a"), ("out", "b"), ("in", "a", D), ("out", "c"), ("in", "b", D)]
    assert run.out["device_peak"] == 3 * GRAN
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"], run.out["bad_d"]) == (0, 0, 0, 0)
    no_misbehaviour(run)


def test_freeing_the_block_that_took_memory_still_mapped_keeps_the_budget(fake, tmp_path):
    """swap_driver.c scenario_handoff, free: a took b's memory while b's copy out was queued; a
    is freed once that copy has run (the free waits for a's swap-in, ordered after it), but
    b's range, unmapped only at the next release, still holds the memory: releasing a's handle
    gives nothing back until then. x, allocated next, must find the memory gone, not come on
    top of it: the device never holds more than the 3-block budget."""
    run = run_swap(fake, tmp_path, "handoff", "free", budget=3 * GRAN, env={"PYOBMEM_RELEASER": "0"})
    assert run.out["a_out"] == 1 and run.out["b_given"] == 1
    assert run.out["free_a_rc"] == 0
    assert run.out["peak_after_free"] == 3 * GRAN
    assert run.out["device_peak"] == 3 * GRAN
    assert (run.out["bad_b"], run.out["bad_c"], run.out["bad_d"], run.out["bad_x"]) == (0, 0, 0, 0)
    no_misbehaviour(run)


@pytest.mark.parametrize("order", ["d2h_first", "h2d_first"])
def test_stream_ordered_block_served_with_memory_still_copying_out_waits_on_its_stream(fake, tmp_path, order):
    """swap_driver.c scenario_handoff_ordered: y (cuMemAllocAsync on S1) evicts a and takes its
    memory while a's copy out is queued; the memset of y issued at once on S1 runs only after
    that copy (S1 waits for a's copy event on the GPU, the host does not): a's bytes reach the
    host intact, y holds the memset's. No wait on the host, no cuMemCreate after a, b, c's."""
    env = {"PYOBMEM_RELEASER": "0", **({"FAKE_ADVANCE_REVERSE": "1"} if order == "h2d_first" else {})}
    run = run_swap(fake, tmp_path, "handoff_ordered", budget=3 * GRAN, env=env)
    assert run.out["a_given"] == 1
    assert run.out["peak_after_alloc"] == 3 * GRAN and run.out["device_peak"] == 3 * GRAN
    assert (run.out["bad_y"], run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0, 0)
    # y first; then each read-back brings its block back with the memory of the one evicted for it
    assert _swap_seq(run, "a", "b", "c", "y") == [
        ("out", "a"), ("out", "b"), ("in", "a", D), ("out", "c"), ("in", "b", D), ("out", "y"), ("in", "c", D)]
    waits = dict(kv.split("=") for n in run.notes() if n.startswith("swap.waits=") for kv in n[len("swap.waits="):].split())
    assert (waits["handoffs"], waits["creates"], waits["drains"]) == ("4", "3", "0/0us")
    no_misbehaviour(run)


def test_an_ops_own_block_still_copying_out_keeps_its_memory(fake, tmp_path):
    """swap_driver.c scenario_ownleaving: b and c are copying out (the budget lowered to 2 blocks
    at sync 1) when op_a(a, 0, b) needs a back and b. a takes c's memory, not b's: b's swap-out
    is cancelled (no SWAP_OUT record, no swap-in), and the host waits only once, for a's copy
    out before e's allocation (a cuMemAlloc block)."""

    def lower(path, pid, out):
        c = control(path)
        c["budget_bytes"] = 2 * GRAN
        c.flush()

    run = run_swap(fake, tmp_path, "ownleaving", budget=4 * GRAN, plans={1: lower}, env={"PYOBMEM_RELEASER": "0"})
    assert run.out["a_out"] == 1 and run.out["b_leaving"] == 1 and run.out["c_leaving"] == 1
    assert run.out["b_in"] == 1
    seq = _swap_seq(run, "a", "b", "c", "d", "e")
    assert seq[:3] == [("out", "a"), ("out", "c"), ("in", "a", D)]
    assert ("in", "b", D) not in seq and seq.index(("out", "b")) > seq.index(("in", "c", D))  # out again at c's read-back
    waits = dict(kv.split("=") for n in run.notes() if n.startswith("swap.waits=") for kv in n[len("swap.waits="):].split())
    assert waits["drains"].startswith("1/") and waits["handoffs"] == "4"
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"], run.out["bad_d"], run.out["bad_e"]) == (0,) * 5
    no_misbehaviour(run)


def test_swap_in_on_a_spare_handle_does_not_wait_for_swap_outs_in_flight(fake, tmp_path):
    """swap_driver.c scenario_sparewait: a's memory is a spare handle (the budget had room when
    it was released) and b's planned swap-out is still copying when op_b(a) needs a back. The
    spare is counted already: mapping it puts nothing more on the device (c, a, and b's memory
    until its copy ends: 3 blocks), so the host does not wait for b's copy (b still mapped after
    the swap-in, no drain). The device peak is the 512 KiB block's moment, 3 blocks + 512 KiB."""

    def plan(path, pid, out):
        write_plan(path, pid, 1, [KERN_B, FUNC_A], [(1, ActionKind.SWAP_OUT, out["b"], 2 * MIB)])

    run = run_swap(fake, tmp_path, "sparewait", budget=3 * GRAN, plans={1: plan}, env={"PYOBMEM_RELEASER": "0"})
    assert run.out["x_rc"] == 0 and run.out["x_free_rc"] == 0 and run.out["a_out"] == 1
    assert run.out["b_leaving"] == 1
    assert run.out["a_in"] == 1 and run.out["b_leaving_after"] == 1
    assert _swap_seq(run, "a", "b", "c") == [("out", "a"), ("in", "a", D), ("out", "b"), ("in", "b", D)]
    waits = dict(kv.split("=") for n in run.notes() if n.startswith("swap.waits=") for kv in n[len("swap.waits="):].split())
    assert waits["drains"] == "0/0us"
    assert run.out["device_peak"] == 3 * GRAN + MIB // 2
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


def test_swap_in_at_the_budget_maps_the_spare_handle_of_its_size(fake, tmp_path):
    """swap_driver.c scenario_sparewait full: the device is at the budget (b, c and a's memory
    kept as a spare) when op_b(a) needs a back. The spare is the memory a maps: it is not given
    back first as cached memory (and created again): no cuMemRelease, no cuMemCreate after a, b
    and c's, nothing else evicted."""
    run = run_swap(fake, tmp_path, "sparewait", "full", budget=3 * GRAN, env={"PYOBMEM_RELEASER": "0"})
    assert run.out["a_out"] == 1 and run.out["a_in"] == 1
    assert _swap_seq(run, "a", "b", "c") == [("out", "a"), ("in", "a", D)]
    assert run.out["create_calls"] == 3
    assert run.out["device_peak"] == 3 * GRAN + MIB // 2
    assert (run.out["bad_a"], run.out["bad_b"], run.out["bad_c"]) == (0, 0, 0)
    no_misbehaviour(run)


def test_a_fork_child_writes_no_swap_waits_note(fake, tmp_path):
    """swap_driver.c scenario_forkexit: a child forked after the parent swapped (a data loader's
    worker) exits normally; it traced, it did not swap, and the one swap.waits NOTE is the
    parent's, written at its own exit."""
    run = run_swap(fake, tmp_path, "forkexit", budget=3 * GRAN)
    assert run.out["child_status"] == 0 and run.out["bad_b"] == 0
    waits = [n for n in run.notes() if n.startswith("swap.waits=")]
    assert len(waits) == 1 and " evictions=1 " in waits[0]
    no_misbehaviour(run)


def test_the_slow_call_log_names_each_call_and_the_blocks_named_while_out(fake, tmp_path):
    """PYOBMEM_SLOW_LOG (native/swap_slow.c) with a threshold of 0: a line for every executor call
    of the round trip, with its pid, and one for each op that names the block while it is out."""
    log = tmp_path / "slow.tsv"
    run = run_swap(fake, tmp_path, "roundtrip", 4, plans={1: roundtrip_plan},
                   env={"PYOBMEM_SLOW_LOG": str(log), "PYOBMEM_SLOW_US": "0"})
    header, *rows = [line.split("\t") for line in log.read_text().splitlines()]
    assert header[:6] == ["pid", "t_ns", "call", "pos", "us", "after"] and len(header) == 20
    assert all(len(r) == 20 and int(r[0]) == run.out["pid"] for r in rows)
    calls = [r[2] for r in rows]
    assert [int(r[18]) for r in rows if r[2] == "alloc"] == [LEN, LEN, 2 * MIB]
    assert [int(r[18]) for r in rows if r[2] == "free"] == [LEN, LEN, 2 * MIB]
    assert calls.count("op") == calls.count("op_end") > 0
    assert sorted(set(calls)) == ["alloc", "free", "named_out", "op", "op_end", "outside"]
    # a (6 MiB mapped): three consumers (plan position 1) name it while its prefetch copies, 3 ops
    # (an iteration) after it was last named, and the read-back (off the plan) while it is out, 2
    # ops after the last consumer
    named = [(int(r[3]), r[5], int(r[18]), int(r[19])) for r in rows if r[2] == "named_out"]
    assert named == [(1, "in_pending", 3 * GRAN, 3)] * 3 + [(-1, "out", 3 * GRAN, 2)], named
    # the plan's swap-out of a runs at the end of the op at position 1, in each of the 4 iterations
    ends = [(int(r[3]), int(r[16]), int(r[17])) for r in rows if r[2] == "op_end"]
    assert sorted(set(ends)) == [(-1, 0, 0), (0, 0, 0), (1, 0, 1), (2, 0, 0)]
    assert sum(e[2] for e in ends) == 4
    # the stretches between calls: each after the call that ended it, the launch's after "op"
    assert {r[5] for r in rows if r[2] == "outside"} <= {"op", "op_end", "alloc", "free"}
    assert any(r[2] == "outside" and r[5] == "op" for r in rows)


def test_the_slow_call_log_keeps_calls_under_its_threshold_out(fake, tmp_path):
    """A threshold of 10 s: no call or stretch is that long, and the named_out lines stay."""
    log = tmp_path / "slow.tsv"
    run_swap(fake, tmp_path, "roundtrip", 4, plans={1: roundtrip_plan},
             env={"PYOBMEM_SLOW_LOG": str(log), "PYOBMEM_SLOW_US": "10000000"})
    rows = [line.split("\t") for line in log.read_text().splitlines()[1:]]
    assert [r[2] for r in rows] == ["named_out"] * 4


def test_a_slow_call_log_that_cannot_be_written_is_said_once(fake, tmp_path):
    run = run_swap(fake, tmp_path, "roundtrip", 2, plans={1: roundtrip_plan},
                   env={"PYOBMEM_SLOW_LOG": str(tmp_path / "missing" / "slow.tsv")})
    warn = [n for n in run.notes() if "slow-call log" in n]
    assert warn == [f"swap.warn=the slow-call log {tmp_path / 'missing' / 'slow.tsv'} cannot be written; no log"]
    assert len(run.of(Ev.SWAP_OUT)) == 2
