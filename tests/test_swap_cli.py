"""Swap mode from the command line: budget errors, ``pyobmem plan`` on the committed captures, the
daemon writing a plan into the control file from a repeating event stream in the ring, and the
summary of swap events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synth import Trace
from test_daemon import Producer, wait_until
from test_planner import BW, MiB, P, _trace

from pyobmem import abi
from pyobmem.capture import read_capture, read_records
from pyobmem.cli import main, run_main
from pyobmem.commands import summary
from pyobmem.control import Control
from pyobmem.ring import Ring

ROOT = str(Path(__file__).resolve().parents[1])
DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("argv,msg", [
    (["--budget", "16GiB", "true"], "--budget needs --swap"),
    (["--swap", "true"], "--swap needs --budget"),
    (["--swap", "--budget", "lots", "true"], "bad budget 'lots'"),
    (["--swap", "--budget", "150%", "true"], "bad budget '150%'"),
    (["--min-swap-bytes", "4MiB", "true"], "--min-swap-bytes needs --swap"),
    (["--swap", "--budget", "1G", "--min-swap-bytes", "0.5", "true"], "bad --min-swap-bytes"),
    (["--swap", "--budget", "1G", "--min-swap-bytes", "0", "true"], "bad --min-swap-bytes '0': must be positive"),
])
def test_run_budget_errors(argv, msg, capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_main(argv) == 2
    err = capfd.readouterr().err
    assert err.startswith("pyobmem: error: ") and msg in err and len(err.splitlines()) == 1
    assert not os.listdir(tmp_path)  # nothing ran, no capture
    assert main(["run"] + argv) == 2


def test_plan_on_committed_captures(capfd):
    # gpt_tiny: 952 MiB live all along; no plan reaches half of it (at least 708 MiB at op 62).
    assert main(["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "0.5GiB"]) == 1
    out, err = capfd.readouterr()
    assert "planned     iteration 4 of 0..8: 160 ops" in out and "peak        952.0 MiB without swapping" in out
    assert err.strip().startswith("pyobmem: error: the budget 512.0 MiB is below what the job needs at one instant: 708.0 MiB")
    # A budget above the peak: nothing to swap.
    assert main(["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "1GiB", "--json"]) == 0
    j = json.loads(capfd.readouterr().out)
    assert j["feasible"] and j["swapped_blocks"] == 0 and j["actions"] == 0 and j["peak_bytes"] == 998246400
    assert j["period_ops"] == 160 and j["time_ratio"] == 1.0
    # JAX: every block is a VMM mapping of XLA's platform allocator: nothing is a candidate.
    assert main(["plan", str(DATA / "jax.pyobmem"), "--budget", "100MiB", "--json"]) == 1
    j = json.loads(capfd.readouterr().out)
    assert not j["feasible"] and j["needed_bytes"] == j["peak_bytes"] == 170052104
    # CuPy: a fraction resolves against the card the shim noted (150109880320 B).
    assert main(["plan", str(DATA / "cupy.pyobmem"), "--budget", "50%", "--json"]) == 0
    j = json.loads(capfd.readouterr().out)
    assert j["budget_bytes"] == 150109880320 // 2 and j["feasible"]


def test_plan_over_the_budget_by_itself_that_swap_mode_keeps_by_eviction(capfd):
    """GPT medium at 50% of its driver peak (the bench's 17.0 GiB): the best plan reaches 19.7 GiB
    by itself, but no op needs more than 7.1 GiB, and the replay counts the shim's evictions beyond
    the plan (the H200 runs stayed under this budget, session 21): a plan and a warning, not an
    error."""
    assert main(["plan", str(DATA / "gpt_medium_tensors.pyobmem"), "--budget", "18286116864", "--json"]) == 0
    out, err = capfd.readouterr()
    j = json.loads(out)
    assert not j["feasible"] and j["kept_by_eviction"]
    assert (j["predicted_peak_bytes"], j["needed_bytes"]) == (21140060620, 7608572364)
    assert j["predicted_time_ratio"] == 1.377893
    assert err == ("pyobmem: warning: no plan fits the budget 17.0 GiB by itself (the best reaches 19.7 GiB); swap "
                   "mode keeps the budget by evicting beyond it, at 1.378x by the replay, which counts those evictions\n")


def test_plan_that_fits_says_the_least_budget_swap_mode_can_keep(capfd):
    """Above the peak, plan names a budget that makes the job swap and the floor no budget goes
    under: what one op needs at once (not the cost model's bound, which the plans found stop far
    above: 7.3 GiB against 19.7 GiB at 50%, a new user's trial of session 22)."""
    assert main(["plan", str(DATA / "gpt_medium_tensors.pyobmem"), "--budget", "75%"]) == 0
    out = capfd.readouterr().out
    assert ("              a budget under 32.8 GiB makes it swap, e.g. --budget 30233MiB (90% of the peak); "
            "none under 7.1 GiB can be kept (what op 494 needs at once)\n") in out


def test_plan_errors(capfd):
    # a number without a unit above 1 is bytes: under 1 MiB it is likely a size without its unit
    assert main(["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "2"]) == 1
    err = capfd.readouterr().err.splitlines()
    assert err[0] == "pyobmem: warning: --budget 2 is 2 bytes (a number without a unit above 1 is bytes); for gibibytes write 2GiB"
    assert err[1].startswith("pyobmem: error: the budget 2 B is below what the job needs at one instant")
    assert main(["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "2MiB"]) == 1
    assert "warning" not in capfd.readouterr().err
    assert main(["plan", str(DATA / "cupy.pyobmem"), "--budget", "x"]) == 2
    assert main(["plan", str(DATA / "cupy.pyobmem"), "--budget", "1G", "--bandwidth", "0"]) == 2
    assert main(["plan", "/nonexistent.pyobmem", "--budget", "1G"]) == 2


def test_plan_synthetic_json(tmp_path, capfd):
    _trace(tmp_path, opaque=False)  # op 10 an ordinary launch: A's window crosses no op that may touch any block
    assert main(["plan", str(tmp_path / "synth.pyobmem"), "--budget", "160MiB", "--bandwidth", str(BW), "--json"]) == 0
    j = json.loads(capfd.readouterr().out)
    assert j["feasible"] and j["predicted_peak_bytes"] == 145 * MiB and j["saved_bytes"] == 64 * MiB
    # X (8 MiB, stream-ordered, live across the iteration: the shim serves it in swap mode) is a
    # candidate too; the greedy takes it first, and pruning drops it again: the plan fits without it.
    assert [(s["out_after"], s["prefetch_before"], s["next_access"]) for s in j["swaps"]] == [(0, 87, 0)]
    assert [(s["block"], s["row"], s["site"]) for s in j["swaps"]] == [("100:1", 0, None)]  # pid:id, as every verb names it


def _three_block_iterations(dt_ns=(10_000,) * 12):
    """One iteration of P launches per entry of ``dt_ns`` (ns between its records), each launch
    touching B, and A at op 0 and C at op 50 (64 MiB each: one of them must be out under 160 MiB):
    records for SwapAgent tests."""
    tr = Trace(dt_ns=10_000)
    A, B, C = (tr.alloc(64 * MiB) for _ in range(3))
    for dt in dt_ns:
        tr.dt_ns = dt
        for p in range(P):
            tr.launch(0x1000 + p, [B] + ([A] if p == 0 else []) + ([C] if p == 50 else []))
    return tr.records()


def _cut(recs, k):
    """Index of iteration k's first record in _three_block_iterations' records."""
    return int(np.flatnonzero(recs["type"] == abi.Ev.LAUNCH)[k * P])


def _adopted(ctl, recs, gen, k):
    """The shim adopting plan ``gen`` at the start of iteration k: its PLAN record (flags 0, ts
    just before that iteration's first launch) and the control file's ``adopted``."""
    ctl.ctl["adopted"] = gen
    tr = Trace()
    tr.rows.clear()
    tr.add(abi.Ev.PLAN, ts=int(recs["ts_ns"][_cut(recs, k)]) - 1, generation=gen, value=1)
    return tr.records()


def _start_daemon(ring_path, out, control_path, budget):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyobmem.daemon", "--ring", ring_path, "--out", str(out), "--control", control_path,
         "--budget", budget],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )
    proc.stdin.write(json.dumps({"argv": ["swap test"], "copy_bandwidth": BW}).encode() + b"\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"ready\n"
    return proc


def test_daemon_writes_a_plan(tmp_path):
    """The synthetic iteration of test_planner, streamed through the ring: the daemon resolves
    the 50% budget from the NOTE (320 MiB card -> 160 MiB), learns the iteration and writes the
    hand-computed plan (generation 1) into the control file. Op 10 is an ordinary launch here: the
    planner takes no window across one that may touch any block (test_no_window_across_...)."""
    cap, ids = _trace(tmp_path, opaque=False)
    tr = Trace(dt_ns=1)
    tr.rows.clear()
    tr.text(abi.Ev.NOTE, 0, f"device0.total_bytes={320 * MiB}")
    note = tr.records()
    note["pid"] = 100
    _, body = read_records(str(tmp_path / "synth.pyobmem"))
    body = body[body["type"] != abi.Ev.CAPTURE_END]
    recs = np.concatenate((note, body))
    ring = Ring.create(1 << 14, directory=str(tmp_path))
    ctl = Control.create(ring.path + ".ctl", 0, 4 * MiB)
    out = tmp_path / "live.pyobmem"
    daemon = _start_daemon(ring.path, out, ctl.path, "50%")
    try:
        prod = Producer(ring.path)
        for rec in recs:
            assert prod.put(rec, wait=True)
        wait_until(lambda: ctl.generation == 1, timeout_s=20)
        assert ctl.budget_bytes == 160 * MiB and ctl.active == 1
        slot = ctl.ctl["plans"][0, 1]
        assert int(slot["pid"]) == 100 and int(slot["period"]) == P and int(slot["budget_bytes"]) == 160 * MiB
        assert slot["template_keys"][:P].tolist() == [0x1000 + p for p in range(P)]
        addr_a = int(cap.blocks["addr"][cap.blocks["block_id"] == ids["A"]][0])
        addr_x = int(cap.blocks["addr"][cap.blocks["block_id"] == ids["X"]][0])
        addr_o = int(cap.blocks["addr"][cap.blocks["block_id"] == ids["O"]][0])
        N = int(abi.SITE_NONE)  # all live across iterations: named by address
        assert int(slot["n_actions"]) == 5  # A's swap-out and prefetch; the three candidates' idle hints
        assert slot["actions"][:5].tolist() == [(0, int(abi.ActionKind.IDLE), 0, addr_a, 64 * MiB, N, 0),
                                                (0, int(abi.ActionKind.IDLE), 0, addr_x, 8 * MiB, N, 0),
                                                (0, int(abi.ActionKind.SWAP_OUT), 0, addr_a, 64 * MiB, N, 0),
                                                (10, int(abi.ActionKind.IDLE), 10, addr_o, 8 * MiB, N, 0),
                                                (87, int(abi.ActionKind.PREFETCH), 0, addr_a, 64 * MiB, N, 0)]
        # the plan as written, beside the capture (live.pyobmem -> live.plans.json), right after the
        # control file (renamed into place: whole once there)
        wait_until(lambda: (tmp_path / "live.plans.json").exists(), timeout_s=20)
        kept = json.loads((tmp_path / "live.plans.json").read_text())["plans"]
        assert [(k["generation"], k["chosen_by_replay"]) for k in kept] == [(1, False)]
        assert [(s["block"], s["addr"], s["out_after"], s["prefetch_before"]) for s in kept[0]["plan"]["swaps"]] == [
            (f"100:{ids['A']}", hex(addr_a), 0, 87)]
        assert kept[0]["plan"]["budget_bytes"] == 160 * MiB and kept[0]["plan"]["actions"] == 2
        # A drop makes the daemon forget the ops before it; with no new iterations, no new plan.
        ctl.ctl["plan_drops"] = 1
        prod.put(recs[-1], wait=True)
        wait_until(prod.drained)
        assert ctl.generation == 1
        prod.close()
    finally:
        daemon.stdin.write(b"end 0\n")
        daemon.stdin.close()
        assert daemon.wait(30) == 0
        ring.close(unlink=True)
        ctl.close(unlink=True)
    assert read_capture(str(out)).complete


def test_summary_of_swap_events(tmp_path):
    tr = Trace()
    a = tr.alloc(64 * MiB)
    tr.launch(0x10, [a])
    tr.text(abi.Ev.NOTE, 0, f"swap.pinned_bytes={64 * MiB}")
    tr.add(abi.Ev.SWAP_OUT, block_id=a, bytes=64 * MiB, duration_ns=1_200_000, stream=5)
    tr.add(abi.Ev.SWAP_IN, flags=abi.SwapInCause.PREFETCH, block_id=a, bytes=64 * MiB, duration_ns=1_300_000, stream=5)
    tr.add(abi.Ev.SWAP_OUT, block_id=a, bytes=64 * MiB)
    tr.add(abi.Ev.SWAP_IN, flags=abi.SwapInCause.LATE, block_id=a, bytes=64 * MiB)
    tr.add(abi.Ev.SWAP_OUT, block_id=a, bytes=64 * MiB)
    tr.add(abi.Ev.SWAP_IN, flags=abi.SwapInCause.DEMAND, block_id=a, bytes=64 * MiB)
    tr.add(abi.Ev.PLAN, generation=1, value=2)
    tr.add(abi.Ev.PLAN, flags=1, generation=1, value=37)
    path = tmp_path / "s.pyobmem"
    tr.write(path, meta={"argv": ["x"], "swap": {"budget": "75%", "budget_bytes": None, "budget_fraction": 0.75,
                                                   "min_swap_bytes": 4 * MiB}})
    cap = read_capture(str(path))
    assert cap.swaps["direction"].tolist() == [0, 1, 0, 1, 0, 1]
    assert cap.swaps["cause"].tolist() == [0, 1, 0, 2, 0, 3]
    assert cap.swaps["block"].tolist() == [0] * 6 and cap.swaps["duration_ns"][:2].tolist() == [1_200_000, 1_300_000]
    assert cap.plans.tolist() == [(cap.plans["ts_ns"][0], 100, 1, 2, False, 0, 0), (cap.plans["ts_ns"][1], 100, 1, 37, True, 0, 0)]
    s = summary.summarize(cap)["swap"]
    assert s["swapped_out"] == {"count": 3, "bytes": 192 * MiB, "blocks": 1, "by_cause": None}  # causes not recorded
    assert s["swapped_in"]["by_cause"] == {"prefetch": {"count": 1, "bytes": 64 * MiB}, "late": {"count": 1, "bytes": 64 * MiB},
                                           "demand": {"count": 1, "bytes": 64 * MiB}}
    assert (s["plans_adopted"], s["plans_dropped"], s["pinned_bytes"], s["budget"]) == (1, 1, 64 * MiB, "75%")
    text = summary.format_short(summary.summarize(cap))
    assert "swap: budget 75%; pinned host memory 64.0 MiB" in text
    assert ("swap: swapped in 192.0 MiB in 3: 1 prefetch hits, 1 late (not back when their op was issued: its stream "
            "waits for the copy), 1 on demand") in text
    assert "swap: plans adopted 1, dropped 1" in text
    assert "Swap mode" in summary.format_summary(summary.summarize(cap))


def test_agent_writes_no_swap_that_lowers_nothing(tmp_path):
    """On the committed GPT tiny capture under 900 MiB (peak 952 MiB; blocks of 4 MiB and more)
    the best plan swaps two blocks and saves 0 B (it lowers one op of the peak, never all):
    following it would only slow the job. The daemon writes that plan's IDLE hints alone (the
    shim's eviction then takes the block whose next access is farthest) and says once that no
    plan fits."""
    from pyobmem.daemon import SwapAgent
    from pyobmem.planner import parse_budget

    data = Path(__file__).parent / "data" / "gpt_tiny.pyobmem"
    meta, recs = read_records(str(data))
    ctl = Control.create(str(tmp_path / "c.ctl"), 900 * MiB, 4 * MiB)
    said = []
    agent = SwapAgent(ctl, parse_budget("900MiB"), meta=meta, warn=said.append)
    agent.feed(recs[recs["type"] != abi.Ev.CAPTURE_END])
    assert agent.tick(now=1e9) is True
    assert agent.plans_written == 1 and ctl.generation == 1 and not agent.last_plan.swaps
    slot = ctl.ctl["plans"][0, int(ctl.active)]
    kinds = slot["actions"][: int(slot["n_actions"])]["kind"]
    assert len(kinds) == len(agent.last_plan.actions) > 0 and set(kinds.tolist()) == {int(abi.ActionKind.IDLE)}
    assert len(said) == 1 and said[0].startswith("pyobmem: swap: no plan fits the budget 900.00 MiB")
    assert said[0].endswith("the shim keeps the budget by evicting on its own beyond it (slower)")
    ctl.close(unlink=True)


def test_agent_keeps_its_plans_beside_the_capture_and_says_once_when_it_cannot(tmp_path):
    """Every plan written is kept in <capture>.plans.json; a file that cannot be written is one line,
    no file holding part of the plans is left, and the plans still reach the control file. An
    earlier capture's file of that name (and its temporary) goes when the run starts."""
    from pyobmem.daemon import SwapAgent, plans_path, remove_plans
    from pyobmem.planner import parse_budget

    assert plans_path("/x/train.pyobmem") == "/x/train.plans.json" and plans_path("run.cap") == "run.cap.plans.json"
    old = tmp_path / "t.plans.json"
    old.write_text("an earlier run's")
    (tmp_path / "t.plans.json.tmp").write_text("a killed run's")
    assert remove_plans(str(old)) and os.listdir(tmp_path) == []
    meta, recs = read_records(str(DATA / "gpt_tiny.pyobmem"))
    recs = recs[recs["type"] != abi.Ev.CAPTURE_END]
    for path, kept in ((str(old), True), (str(tmp_path / "missing" / "t.plans.json"), False)):
        ctl = Control.create(str(tmp_path / "c.ctl"), 900 * MiB, 4 * MiB)
        said = []
        agent = SwapAgent(ctl, parse_budget("900MiB"), meta=meta, warn=said.append)
        agent.plans_file = path
        agent.feed(recs)
        assert agent.tick(now=1e9) is True and ctl.generation == 1
        if kept:
            plans = json.loads(old.read_text())["plans"]
            assert [p["generation"] for p in plans] == [1]
            assert plans[0]["plan"]["idle_hints"] == agent.last_plan.n_hints > 0
        else:
            assert said[-1] == (f"pyobmem: swap: cannot write {path} (No such file or directory); "
                                "the plans are not kept there")
            assert agent.plans_file is None
        ctl.close(unlink=True)
    # a write that fails after one that did (its temporary cannot be made): the file holding the
    # first plan only is removed
    agent.plans_file = str(old)
    (tmp_path / "t.plans.json.tmp").mkdir()
    agent._save()
    assert agent.plans_file is None and not old.exists()
    assert said[-1] == f"pyobmem: swap: cannot write {old} (Is a directory); the plans are not kept there"


def test_agent_says_the_shims_warnings_once_each(tmp_path):
    """A NOTE the shim writes for the user ("swap.warn=...": the budget below one op, device memory
    that cannot grow) is one line on stderr; other notes are not."""
    from pyobmem.daemon import SwapAgent
    from pyobmem.planner import parse_budget

    t = Trace()
    t.text(abi.Ev.NOTE, 0, "swap.warn=the budget (100 bytes) is below what one op needs at once (4194304 bytes "
                           "of swappable blocks); the device goes over it there")
    t.text(abi.Ev.NOTE, 0, "swap.pinned_bytes=4096")
    ctl = Control.create(str(tmp_path / "c.ctl"), 100, MiB)
    said = []
    SwapAgent(ctl, parse_budget("100"), warn=said.append).feed(t.records())
    assert said == ["pyobmem: swap: the budget (100 bytes) is below what one op needs at once (4194304 bytes of "
                    "swappable blocks); the device goes over it there"]
    ctl.close(unlink=True)


def test_agent_keeps_learning_and_replaces_a_wrong_template(tmp_path):
    """H200, GPT medium in swap mode: the daemon planned on the setup's short repeats (periods of 2,
    20, 40 ops) and on the layers after a drop, and then stopped learning; the shim followed those
    templates and dropped them. Now a plan with nothing to do is not written, learning goes on
    after a plan, and a new template replaces the one in force once two ticks in a row found it.
    Here: 40 repeats of a 2-kernel
    setup (fits: not written), then 100-op iterations touching A at op 0 and C at op 50 (one of them
    must be out: written), then
    that iteration with its kernels renumbered (written as generation 2)."""
    from pyobmem.daemon import SwapAgent
    from pyobmem.planner import parse_budget

    def iteration(tr, A, B, C, base):
        for p in range(P):
            tr.launch(base + p, [B] + ([A] if p == 0 else []) + ([C] if p == 50 else []))

    tr = Trace(dt_ns=10_000)
    B = tr.alloc(64 * MiB)
    for _ in range(40):
        tr.launch(0x500, [B])
        tr.launch(0x501, [B])
    setup = len(tr.rows)
    A, C = tr.alloc(64 * MiB), tr.alloc(64 * MiB)  # 192 MiB from here: over the budget
    for _ in range(6):
        iteration(tr, A, B, C, 0x1000)
    first = len(tr.rows)
    for _ in range(20):
        iteration(tr, A, B, C, 0x2000)
    recs = tr.records()
    ctl = Control.create(str(tmp_path / "c.ctl"), 160 * MiB, 4 * MiB)
    agent = SwapAgent(ctl, parse_budget(str(160 * MiB)), meta={"copy_bandwidth": BW}, warn=lambda m: None)
    agent.feed(recs[:setup])
    assert agent.tick(now=1e9) is False and ctl.generation == 0
    assert agent.last_reason == "the job fits the budget: nothing to swap"
    agent.feed(recs[setup:first])
    assert agent.tick(now=2e9) is True and ctl.generation == 1
    assert agent.last_plan.template_keys.tolist() == [0x1000 + p for p in range(P)]
    assert agent.last_plan.feasible and agent.last_plan.swaps  # A or C out at every op
    assert agent.tick(now=3e9) is False  # nothing new
    ctl.ctl["adopted"] = 1  # the shim follows generation 1
    half = first + (len(recs) - first) // 2
    agent.feed(recs[first:half])
    assert agent.tick(now=4e9) is False and ctl.generation == 1  # seen once: a candidate
    assert agent.last_reason == "another iteration seen; replacing the plan if it holds"
    agent.feed(recs[half:])
    assert agent.tick(now=5e9) is True and ctl.generation == 2  # seen again: written
    assert agent.last_plan.template_keys.tolist() == [0x2000 + p for p in range(P)]
    ctl.close(unlink=True)


def test_a_template_started_at_another_op_is_the_same():
    from pyobmem.daemon import _same_cycle

    a = np.array([5, 1, 2, 5, 3], np.uint64)
    assert _same_cycle(a, np.roll(a, 2)) and _same_cycle(a, a)
    assert not _same_cycle(a, np.array([5, 1, 2, 3, 5], np.uint64)) and not _same_cycle(a, a[:4])


def test_agent_refines_its_first_plan_by_the_replay_once(tmp_path, monkeypatch):
    """The first plan of a template is the cost model's cover (seconds); the next tick plans again
    with the replay's choice among candidates (make_plan choose=True, up to PLAN_LIMIT_S) and
    writes it only if its actions differ; later ticks do not choose again."""
    import dataclasses

    from pyobmem import planner
    from pyobmem.daemon import PLAN_LIMIT_S, SwapAgent
    from pyobmem.planner import parse_budget

    calls = []
    real = planner.make_plan

    def make_plan(L, budget, **k):
        calls.append((k.get("choose"), k.get("limit_s")))
        plan = real(L, budget, **k)
        if k.get("choose"):  # a choice that differs from the cover: one action fewer
            plan = dataclasses.replace(plan, actions=plan.actions[:-1])
        return plan

    monkeypatch.setattr(planner, "make_plan", make_plan)
    recs = _three_block_iterations((10_000,) * 24)
    ctl = Control.create(str(tmp_path / "c.ctl"), 160 * MiB, 4 * MiB)
    agent = SwapAgent(ctl, parse_budget(str(160 * MiB)), meta={"copy_bandwidth": BW}, warn=lambda m: None)
    agent.feed(recs[: _cut(recs, 6)])
    assert agent.tick(now=1e9) is True and ctl.generation == 1 and not agent.refined
    first = agent.last_plan
    # the refine waits for TRIAL_STEPS iterations under the plan (the first one left out) ...
    agent.feed(_adopted(ctl, recs, 1, 6))
    agent.feed(recs[_cut(recs, 6) : _cut(recs, 10)])
    assert agent.tick(now=2e9) is False and ctl.generation == 1 and not agent.refined
    assert calls == [(False, None), (False, None)]
    agent.feed(recs[_cut(recs, 10) : _cut(recs, 14)])
    assert agent.tick(now=3e9) is True and ctl.generation == 2 and agent.refined
    assert len(agent.last_plan.actions) == len(first.actions) - 1
    assert agent.last_reason == "plan 2 written (refined by the host-clock replay)"
    # ... and is a trial: as fast as the first plan's (not faster), so the first plan comes back
    agent.feed(_adopted(ctl, recs, 2, 14))
    agent.feed(recs[_cut(recs, 14) :])
    assert agent.tick(now=3e9 + 10) is True and ctl.generation == 3 and agent.refined
    assert np.array_equal(agent.last_plan.actions, first.actions)
    assert agent.last_reason == "the replay's choice (plan 2) undone (not faster): plan 1's actions are back"
    ctl.ctl["adopted"] = 3
    assert agent.tick(now=1e11) is False and ctl.generation == 3  # no new ops: nothing to do
    assert calls == [(False, None), (False, None), (True, PLAN_LIMIT_S)]
    ctl.close(unlink=True)


@pytest.mark.parametrize("faster", [True, False])
def test_agent_keeps_the_replays_choice_only_when_its_iterations_run_faster(tmp_path, monkeypatch, faster):
    """The replay's choice is a trial: after TRIAL_STEPS iterations under it (the first left out)
    it stays when their median is under that of the iterations run under the plan it replaced, else
    that plan is written again; the plans file says which (the trial's figures, ``restores``). On
    the H200 the choice ran GPT medium at 60% of its peak ~17% slower than the cover (session 23)."""
    import dataclasses

    from pyobmem import planner
    from pyobmem.daemon import SwapAgent
    from pyobmem.planner import parse_budget

    real = planner.make_plan

    def make_plan(L, budget, **k):
        plan = real(L, budget, **k)
        return dataclasses.replace(plan, actions=plan.actions[:-1]) if k.get("choose") else plan

    monkeypatch.setattr(planner, "make_plan", make_plan)
    # 10 us between records under the first plan; 9 (faster) or 13 us under the choice
    recs = _three_block_iterations((10_000,) * 14 + ((9_000,) if faster else (13_000,)) * 8)
    ctl = Control.create(str(tmp_path / "c.ctl"), 160 * MiB, 4 * MiB)
    agent = SwapAgent(ctl, parse_budget(str(160 * MiB)), meta={"copy_bandwidth": BW}, warn=lambda m: None)
    agent.plans_file = str(tmp_path / "t.plans.json")
    agent.feed(recs[: _cut(recs, 6)])
    assert agent.tick(now=1e9) is True
    first = agent.last_plan
    agent.feed(_adopted(ctl, recs, 1, 6))
    agent.feed(recs[_cut(recs, 6) : _cut(recs, 14)])
    assert agent.tick(now=2e9) is True and ctl.generation == 2
    assert agent.trial["before_ms"] == pytest.approx(len(first.template_keys) * 2 * 10e-3)  # a launch and its access
    assert agent.next_tick == pytest.approx(2e9 + 1.0)  # judged soon, not after the choice's back-off
    agent.feed(_adopted(ctl, recs, 2, 14))
    agent.feed(recs[_cut(recs, 14) : _cut(recs, 18)])
    assert agent.tick(now=2e9 + 5) is False and agent.trial is not None  # 3 iterations under it: too few
    agent.feed(recs[_cut(recs, 18) :])
    assert agent.tick(now=2e9 + 10) is (not faster) and agent.trial is None
    kept = json.loads((tmp_path / "t.plans.json").read_text())["plans"]
    ms = len(first.template_keys) * 2 * (9e-3 if faster else 13e-3)
    assert kept[1]["trial"] == {"iteration_ms": pytest.approx(ms), "previous_iteration_ms": pytest.approx(ms / 0.9 if faster else ms / 1.3),
                                "kept": faster}
    if faster:
        assert ctl.generation == 2 and len(kept) == 2 and agent.last_reason.startswith("plan 2 (the replay's choice) kept: ")
    else:
        assert ctl.generation == 3 and np.array_equal(agent.last_plan.actions, first.actions)
        assert [(k["generation"], k["chosen_by_replay"], k.get("restores")) for k in kept] == [(1, False, None), (2, True, None),
                                                                                           (3, False, 1)]
        assert agent.last_reason == "the replay's choice (plan 2) undone (not faster): plan 1's actions are back"
    ctl.close(unlink=True)


def test_agent_replacing_a_template_plans_its_cover_first(tmp_path, monkeypatch):
    """A new template found on a tick that would refine the one in force gets the cost model's
    cover (seconds), not the replay's choice: only the template in force is refined, once
    TRIAL_STEPS iterations have run under its own plan, so the new one's choice is tried (and
    judged) in its turn."""
    from pyobmem import planner
    from pyobmem.daemon import SwapAgent
    from pyobmem.planner import parse_budget

    calls = []
    real = planner.make_plan

    def make_plan(L, budget, **k):
        calls.append(k.get("choose"))
        return real(L, budget, **k)

    monkeypatch.setattr(planner, "make_plan", make_plan)

    def iteration(tr, A, B, C, base):
        for p in range(P):
            tr.launch(base + p, [B] + ([A] if p == 0 else []) + ([C] if p == 50 else []))

    tr = Trace(dt_ns=10_000)
    A, B, C = (tr.alloc(64 * MiB) for _ in range(3))
    for _ in range(6):
        iteration(tr, A, B, C, 0x1000)
    first = len(tr.rows)
    for _ in range(30):
        iteration(tr, A, B, C, 0x2000)
    recs = tr.records()
    cut = [first + (len(recs) - first) * i // 3 for i in range(4)]
    ctl = Control.create(str(tmp_path / "c.ctl"), 160 * MiB, 4 * MiB)
    agent = SwapAgent(ctl, parse_budget(str(160 * MiB)), meta={"copy_bandwidth": BW}, warn=lambda m: None)
    agent.feed(recs[:first])
    assert agent.tick(now=1e9) is True and ctl.generation == 1 and not agent.refined
    agent.feed(_adopted(ctl, recs, 1, 6))
    agent.feed(recs[cut[0] : cut[1]])
    assert agent.tick(now=2e9) is False and ctl.generation == 1  # the new template seen once
    agent.feed(recs[cut[1] : cut[2]])
    assert agent.tick(now=3e9) is True and ctl.generation == 2  # seen again: it replaces the plan
    assert agent.last_plan.template_keys.tolist() == [0x2000 + p for p in range(P)] and not agent.refined
    ctl.ctl["adopted"] = 2  # no PLAN record of it yet: no iterations under it, no refine
    agent.feed(recs[cut[2] :])
    assert agent.tick(now=1e10) is False and ctl.generation == 2
    assert calls == [False, False, False, False]
    ctl.close(unlink=True)


def test_agent_undoes_a_choice_not_judged_by_its_deadline(tmp_path, monkeypatch):
    """A trial without TRIAL_STEPS iterations under it by its deadline (TRIAL_LIMIT_S at least: the
    record window may not hold them) ends with the plan it replaced written again."""
    import dataclasses

    from pyobmem import planner
    from pyobmem.daemon import TRIAL_LIMIT_S, SwapAgent
    from pyobmem.planner import parse_budget

    real = planner.make_plan

    def make_plan(L, budget, **k):
        plan = real(L, budget, **k)
        return dataclasses.replace(plan, actions=plan.actions[:-1]) if k.get("choose") else plan

    monkeypatch.setattr(planner, "make_plan", make_plan)
    recs = _three_block_iterations((10_000,) * 24)
    ctl = Control.create(str(tmp_path / "c.ctl"), 160 * MiB, 4 * MiB)
    agent = SwapAgent(ctl, parse_budget(str(160 * MiB)), meta={"copy_bandwidth": BW}, warn=lambda m: None)
    agent.feed(recs[: _cut(recs, 6)])
    assert agent.tick(now=1e9) is True
    agent.feed(_adopted(ctl, recs, 1, 6))
    agent.feed(recs[_cut(recs, 6) : _cut(recs, 14)])
    assert agent.tick(now=2e9) is True and ctl.generation == 2 and agent.trial["deadline"] == 2e9 + TRIAL_LIMIT_S
    agent.feed(_adopted(ctl, recs, 2, 14))
    agent.feed(recs[_cut(recs, 14) : _cut(recs, 16)])
    assert agent.tick(now=2e9 + 5) is False and agent.trial is not None  # one iteration under it (one left out)
    agent.feed(recs[_cut(recs, 16) : _cut(recs, 17)])
    assert agent.tick(now=2e9 + TRIAL_LIMIT_S + 1) is True and ctl.generation == 3 and agent.trial is None
    assert agent.last_reason == ("the replay's choice (plan 2) undone (2 iterations under it by the deadline): "
                                 "plan 1's actions are back")
    ctl.close(unlink=True)


def test_agent_refine_that_fails_keeps_the_first_plan_and_is_not_tried_again(tmp_path, monkeypatch):
    """A refine (the replay's choice) that raises, or gives no plan, leaves the cover in force with
    one warning and is not tried again: the drain waits while the daemon plans."""
    from pyobmem import planner
    from pyobmem.daemon import SwapAgent
    from pyobmem.planner import parse_budget

    real = planner.make_plan
    chose = []

    def make_plan(L, budget, **k):
        chose.append(bool(k.get("choose")))
        if k.get("choose"):
            raise RuntimeError("replay broke")
        return real(L, budget, **k)

    monkeypatch.setattr(planner, "make_plan", make_plan)
    recs = _three_block_iterations((10_000,) * 24)
    said = []
    ctl = Control.create(str(tmp_path / "c.ctl"), 160 * MiB, 4 * MiB)
    agent = SwapAgent(ctl, parse_budget(str(160 * MiB)), meta={"copy_bandwidth": BW}, warn=said.append)
    thirds = [_cut(recs, 6), _cut(recs, 14), len(recs)]
    agent.feed(recs[: thirds[0]])
    assert agent.tick(now=1e9) is True and ctl.generation == 1
    agent.feed(_adopted(ctl, recs, 1, 6))
    agent.feed(recs[thirds[0] : thirds[1]])
    assert agent.tick(now=2e9) is False and agent.refined and ctl.generation == 1
    assert said == ["pyobmem: swap: refining the plan failed (RuntimeError: replay broke); the first plan stays"]
    agent.feed(recs[thirds[1] :])
    assert agent.tick(now=1e10) is False and ctl.generation == 1
    assert chose == [False, True, False]
    ctl.close(unlink=True)


def test_run_names_the_plans_file_after_the_capture(tmp_path, capfd):
    """After a swap run the launcher names the plans file beside the capture, when there is one;
    after a trace it does not (an earlier swap run's file: the daemon removes it at the start)."""
    import shutil

    from pyobmem.commands import run

    cap = tmp_path / "gpt_tiny.pyobmem"
    shutil.copy(DATA / "gpt_tiny.pyobmem", cap)
    run._report(str(cap))
    assert "swap plans" not in capfd.readouterr().err
    (tmp_path / "gpt_tiny.plans.json").write_text('{"plans": []}')
    run._report(str(cap))
    assert "swap plans" not in capfd.readouterr().err
    run._report(str(cap), swap=True)
    lines = capfd.readouterr().err.splitlines()
    at = lines.index(f"pyobmem: capture written to {cap}")
    assert lines[at + 1] == f"pyobmem: swap plans written to {tmp_path / 'gpt_tiny.plans.json'}"
    # the trials of the replay's choice, one line each after it (as call 4 of session 23 wrote them)
    kept = [{"generation": 1, "chosen_by_replay": False},
            {"generation": 2, "chosen_by_replay": True,
             "trial": {"iteration_ms": 743.666, "previous_iteration_ms": 717.536, "kept": False}},
            {"generation": 3, "chosen_by_replay": False, "restores": 1},
            {"generation": 4, "chosen_by_replay": True,
             "trial": {"kept": False, "why": "2 iterations under it by the deadline"}}]
    (tmp_path / "gpt_tiny.plans.json").write_text(json.dumps({"plans": kept}))
    run._report(str(cap), swap=True)
    lines = capfd.readouterr().err.splitlines()
    at = lines.index(f"pyobmem: swap plans written to {tmp_path / 'gpt_tiny.plans.json'}")
    assert lines[at + 1 : at + 3] == [
        "pyobmem: swap plan 2 (the replay's choice) ran 743.7 ms a step against 717.5 before it: undone, the plan "
        "before it restored",
        "pyobmem: swap plan 4 (the replay's choice) undone, the plan before it restored: 2 iterations under it by the "
        "deadline"]
    (tmp_path / "gpt_tiny.plans.json").write_text("not json")  # a file that cannot be read: no lines, no error
    run._report(str(cap), swap=True)
    assert "replay's choice" not in capfd.readouterr().err
