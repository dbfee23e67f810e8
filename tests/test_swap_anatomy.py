"""scripts/swap_anatomy.py on the committed unswapped GPT medium trace (session 10, GPU clock
samples every 32 ops): against itself it finds no extra GPU time and no handoffs; copies of its
Capture with GPU clock samples moved, or swap records added, give the figures they were built
to give; bad input is one error line."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import swap_anatomy as sa  # noqa: E402

from pyobmem import abi  # noqa: E402
from pyobmem.capture import SWAP_IN, SWAP_OUT, SWAPS_DTYPE  # noqa: E402

DATA = ROOT / "tests" / "data"
TRACE = str(DATA / "gpt_medium_tensors_s10.pyobmem")
MIB = 1 << 20


@pytest.fixture(scope="module")
def run():
    return sa.load_run(TRACE)


def test_iterations_are_anchored_at_the_device_to_host_copies(run):
    assert run.n_iterations == 3
    assert run.anchors.tolist() == [2361, 3822, 5283, 6744]
    assert [run.op_name(int(p)) for p in run.anchors] == ["memcpy DTOH"] * 4
    assert len(run.sample_pos) == 223  # of the capture's 251 samples, those on the main sequence
    assert sa.forward_end(run, 1) == 494  # the loss's allocation: the peak of live bytes


def test_an_iteration_against_itself_has_no_extra_gpu_time(run):
    g = sa.gpu_extra(run, 1, run, 1)
    assert len(g["samples"]) == 45
    assert all(s["extra_ms"] == 0.0 and s["cum_ms"] == 0.0 for s in g["samples"])
    assert all(s["lead_ms"] == s["trace_lead_ms"] for s in g["samples"])
    assert g["segments"] == [] and g["total_extra_ms"] == 0.0 and g["extra_in_iteration_ms"] == 0.0
    assert g["iteration_gpu_ms"] == {"trace": [509.526, 508.965], "swap": [509.526, 508.965]}


def test_another_unswapped_iteration_is_within_a_millisecond(run):
    g = sa.gpu_extra(run, 1, run, 0)
    assert g["total_extra_ms"] == 0.53
    cum = {s["pos"]: s["cum_ms"] for s in g["samples"]}
    # Everywhere but the forward/backward boundary, where the loss's GPU time falls between the
    # samples of one iteration and not the other's (module docstring, known limits).
    assert max(abs(v) for p, v in cum.items() if not 490 <= p < 530) < 2.5
    assert cum[498] == 25.184
    seg = {s["pos"]: s["extra_ms"] for s in g["segments"]}
    assert seg[498] == 27.481 and seg[525] == -25.939


def test_a_late_sample_is_extra_gpu_time_from_its_segment_on(run):
    cap = run.capture
    g = cap.gpu_times.copy()
    a = run.window(1)[0]
    late = run.pos_of_row[g["op"]] >= a + 500
    g["t_gpu"][late] += 5_000_000
    swap = sa.make_run(dataclasses.replace(cap, gpu_times=g))
    res = sa.gpu_extra(run, 1, swap, 1)
    first = int(run.sample_pos[np.searchsorted(run.sample_pos, a + 500)]) - a
    assert [(s["pos"], s["extra_ms"]) for s in res["segments"]] == [(first, 5.0)]
    for s in res["samples"]:
        shifted = s["pos"] >= first
        assert s["cum_ms"] == (5.0 if shifted else 0.0)
        assert s["lead_ms"] - s["trace_lead_ms"] == pytest.approx(5.0 if shifted else 0.0, abs=1e-6)
    assert res["total_extra_ms"] == 5.0 and res["extra_in_iteration_ms"] == 5.0
    assert res["iteration_gpu_ms"]["swap"] == [509.526, 513.965]


def test_the_unswapped_trace_has_no_handoffs_and_no_swaps(run):
    h = sa.handoffs(run, 0)
    assert h == {"handoffs": [], "count": 0, "soon": 64, "needed_soon": 0, "needed_next_op": 0,
                 "back_on_demand": 0, "run_count": 0, "shim_count": None}
    e = sa.copy_engine(run, 0, fwd_end=494)
    assert e["out"]["count"] == 0 and e["in"]["count"] == 0 and e["in"]["by_consumer"] == []
    assert e["out"]["forward_idle_ms"] == 0.0
    b = sa.swap_buckets(run, 0)
    assert b["buckets"] == [] and b["out"]["count"] == 0 and b["in"]["count"] == 0
    assert b["host_ms"] == 511.303


def test_host_gaps_of_the_trace(run):
    gaps = sa.host_gaps(run, 0)
    assert len(gaps) == 60
    assert round(sum(g["gap_ms"] for g in gaps), 3) == 373.321
    longest = max(gaps, key=lambda g: g["gap_ms"])
    # the optimizer's end: the host frees the step's tensors, then reads the loss back
    assert (longest["pos"], longest["gap_ms"], longest["frees"]) == (1460, 245.993, 293)
    assert longest["next_op"] == "memcpy DTOH"
    g = next(g for g in gaps if g["pos"] == 1286)
    assert g["gap_ms"] == 16.335 and g["allocs"] == [[0.023, 12288], [0.04, 138412032], [0.046, 96]]
    assert all(x["swap_outs"] == 0 and x["swap_ins"] == 0 for x in gaps)
    near = sa.host_gaps(run, 0, lo=1280, hi=1300, min_gap_ms=10)
    assert [(g["pos"], g["gap_ms"]) for g in near] == [(1286, 16.335), (1293, 15.653), (1294, 18.721)]



def _slow_log(path, rows) -> str:
    """A slow-call log (native/swap_slow.c's format) of ``rows``: (pid, t_ns, call, pos, us, after,
    {part: us}, bytes); gzip-compressed when ``path`` ends in .gz."""
    import gzip
    lines = ["\t".join(sa.SLOW_COLUMNS)]
    for pid, t, call, pos, us, after, parts, nbytes in rows:
        waits = [str(parts.get(p, 0)) for p in sa.SLOW_PARTS]
        lines.append("\t".join(map(str, [pid, t, call, pos, us, after, *waits, 1 if parts else 0, 0, nbytes, 0])))
    text = "\n".join(lines) + "\n"
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text + f"{lines[1][:20]}")  # and a last line cut off where the process died
    return str(path)


@pytest.mark.parametrize("name", ["slow.tsv", "slow.tsv.gz"])
def test_host_gaps_with_the_slow_call_log(run, tmp_path, name):
    """Each gap holds the slow-call log's lines of the main process that began in it."""
    a = run.window(0)[0]
    t0, t1 = int(run.ts[a + 1286]), int(run.ts[a + 1287])  # the 16.335 ms gap
    path = _slow_log(tmp_path / name, [
        (run.pid, t0 + 20_000, "alloc", 1287, 15_000, "-", {"free_wait": 14_100, "map": 250}, 138412032),
        (run.pid + 1, t0 + 30_000, "op", 1287, 9_000, "-", {"drain": 9_000}, 0),  # another process
        (run.pid, t1 + 5, "op", 1288, 2_000, "-", {}, 0),  # the next gap's
    ])
    slow = sa.read_slow_log(path, run.pid)
    assert [(c["call"], c["ms"], c["parts"]) for c in slow] == [
        ("alloc", 15.0, {"free_wait": 14.1, "map": 0.25}), ("op", 2.0, {})]
    g = next(g for g in sa.host_gaps(run, 0, lo=1280, hi=1290, slow=slow) if g["pos"] == 1286)
    assert [(c["call"], c["ms_into"], c["bytes"]) for c in g["calls"]] == [("alloc", 0.02, 138412032)]
    line = sa.format_gaps([g], 1.0, None)[-1]
    assert line.strip() == "+0.02 alloc 132 MiB: 15.00 ms (free_wait 14.10, map 0.25, 1 evictions)"


def test_the_slow_call_logs_columns_are_the_shims():
    """SLOW_COLUMNS is native/swap_slow.c's HEADER, column for column."""
    define = (ROOT / "native" / "swap_slow.c").read_text().split("#define HEADER", 1)[1]
    define = define[:define.index('\\n"') + 3]  # the macro's string literals, to the one ending in \n
    header = "".join(re.findall(r'"([^"]*)"', define))
    assert tuple(header.removesuffix("\\n").split("\\t")) == sa.SLOW_COLUMNS


def test_a_file_that_is_no_slow_call_log_is_one_error(run, capsys, tmp_path):
    bad = tmp_path / "x.tsv"
    bad.write_text("t\tcall\n")
    assert _error(capsys, [TRACE, TRACE, "--section", "gaps", "--slow-log", str(bad)]) == (
        1, f"swap_anatomy: error: {bad}: not a slow-call log (PYOBMEM_SLOW_LOG): its header is not the shim's")
    assert _error(capsys, [TRACE, TRACE, "--section", "gaps", "--slow-log", str(tmp_path / "none.tsv")])[1].startswith(
        f"swap_anatomy: error: {tmp_path / 'none.tsv'}: cannot read the slow-call log (")
    garbled = tmp_path / "garbled.tsv"
    garbled.write_text("\t".join(sa.SLOW_COLUMNS) + "\n" + "\t".join([str(run.pid), "x"] + ["0"] * 18) + "\n")
    assert _error(capsys, [TRACE, TRACE, "--section", "gaps", "--slow-log", str(garbled)]) == (
        1, f"swap_anatomy: error: {garbled}:2: not a slow-call log line (a field is not a number)")
    real = str(DATA / "gpt_medium_s50.slow.tsv.gz")  # of process 1269; the trace's main process is another
    assert "no line of process" in _error(capsys, [TRACE, TRACE, "--section", "gaps", "--slow-log", real])[1]
    assert _error(capsys, [TRACE, TRACE, "--section", "gpu", "--slow-log", real]) == (
        1, "swap_anatomy: error: --slow-log is shown in the gaps section: add gaps to --section")

def _with_swaps(cap, rows):
    """A copy of ``cap`` whose swap events are ``rows``: (ts_ns, block row, bytes, direction, cause,
    duration_ns)."""
    s = np.zeros(len(rows), SWAPS_DTYPE)
    for i, (ts, blk, nbytes, direction, cause, dur) in enumerate(rows):
        s[i] = (ts, cap.blocks["pid"][blk], blk, cap.blocks["block_id"][blk], nbytes, direction, cause, dur, 0)
    return dataclasses.replace(cap, swaps=s)


@pytest.fixture(scope="module")
def handoff_run(run):
    """Iteration 1 of the trace with a handoff before position 300: a 32 MiB allocation (block row
    4891, made 22 us after op 299's issue) takes the memory of a 32 MiB swap-out of block row 4875,
    which op 300 reads and which comes back on demand. A 16 MiB swap-out recorded at the same time
    is followed by the same allocation, of another size: no handoff."""
    cap = run.capture
    a = run.window(1)[0]
    t_alloc = int(cap.blocks["t_alloc"][4891])
    assert run.ts[a + 299] < t_alloc - 10_000 and t_alloc + 1000 < run.ts[a + 300]
    assert cap.blocks["size"][4891] == cap.blocks["size"][4875] == 32 * MIB
    assert 4875 in cap.accesses["block"][cap.accesses["op"] == run.seq_rows[a + 300]]
    other = int(np.flatnonzero(cap.blocks["size"] == 16 * MIB)[0])
    return sa.make_run(_with_swaps(cap, [
        (t_alloc - 10_000, 4875, 32 * MIB, SWAP_OUT, 0, 2_000_000),
        (t_alloc - 10_000, other, 16 * MIB, SWAP_OUT, 0, 2_000_000),
        (t_alloc + 1000, 4875, 32 * MIB, SWAP_IN, 3, 1_000_000),
    ]))


def test_a_handoff_of_a_block_the_next_op_needs(handoff_run):
    h = sa.handoffs(handoff_run, 1)
    assert h["handoffs"] == [{"pos": 300, "bytes": 32 * MIB, "block": "732:4876", "to_block": "732:4892",
                              "to_bytes": 32 * MIB, "next_use": 300, "ops_to_use": 0, "back_cause": "demand",
                              "back_pos": 300}]
    assert (h["count"], h["needed_soon"], h["needed_next_op"], h["back_on_demand"], h["run_count"]) == (1, 1, 1, 1, 1)
    assert sa.handoffs(handoff_run, 1, lo=301)["count"] == 0
    assert sa.handoffs(handoff_run, 0)["count"] == 0


def test_blocks_an_op_names_in_one_iteration_only(run):
    """Unswapped, the pool hands a freed tensor's address to the next one at once, so words left
    in launch parameters point into live blocks often: in iteration 1 of the trace, 717 (op,
    block) pairs at 435 ops that iterations 0 and 2 do not have there, op 8 (a copy kernel)
    naming the 32 MiB tensor allocated at position 5 among them. Op 0 (loss.item()'s copy) reads
    the loss of the step before, another block in each iteration, the same tensor: not one."""
    t = sa.stray_touches(run, 1)
    assert (t["neighbours"], t["touches"], len(t["ops"]), t["ops"][:4]) == ([0, 2], 717, 435, [5, 8, 16, 50])
    assert (t["demand_ins"], t["demand_at_stray"]) == (0, 0)
    assert sa.stray_touches(run, 0)["neighbours"] == [1] and sa.stray_touches(run, 0)["touches"] == 603
    assert sa.stray_touches(run, 1, hi=100)["touches"] == 6
    # iterations of other lengths (a step that copied to the host twice): nothing to compare with
    odd = dataclasses.replace(run, anchors=np.array([2361, 3800, 5283, 6744]))
    t = sa.stray_touches(odd, 1)
    assert (t["neighbours"], t["touches"], t["why"]) == ([], 0, "no iteration next to 1 holds its 1483 ops")
    assert sa.format_touches(t) == ["none compared: no iteration next to 1 holds its 1483 ops"]


def test_a_demand_swap_in_of_a_block_named_in_one_iteration_only(run, handoff_run):
    """A demand swap-in of the tensor op 8 names in iteration 1 only counts as one at such a
    touch; handoff_run's, of a block op 300 reads in every iteration, does not."""
    cap = run.capture
    a = run.window(1)[0]
    assert cap.block_label(4553) == "732:4554" and 4553 in cap.accesses["block"][cap.accesses["op"] == run.seq_rows[a + 8]]
    stray = sa.make_run(_with_swaps(cap, [(int(run.ts[a + 8]) - 1000, 4553, 32 * MIB, SWAP_IN, 3, 1_000_000)]))
    t = sa.stray_touches(stray, 1)
    assert (t["demand_ins"], t["demand_at_stray"]) == (1, 1)
    assert t["demand"] == [{"pos": 8, "block": "732:4554", "bytes": 32 * MIB, "op": run.op_name(a + 8)}]
    t = sa.stray_touches(handoff_run, 1)
    assert (t["demand_ins"], t["demand_at_stray"]) == (1, 0)


def test_swap_events_by_bucket_and_by_consumer(handoff_run):
    b = sa.swap_buckets(handoff_run, 1)
    assert b["out"] == {"count": 2, "gib": 0.047, "causes": {}} and b["in"] == {"count": 1, "gib": 0.031, "causes": {"demand": 1}}
    [row] = b["buckets"]
    assert (row["lo"], row["hi"], row["out"], row["in"], row["out_mean_ms"]) == (300, 350, 2, 1, 2.0)
    assert row["causes"] == {"demand": 1}
    e = sa.copy_engine(handoff_run, 1, fwd_end=494)
    assert e["out"]["count"] == 2 and e["out"]["gib"] == 0.047 and e["out"]["forward_idle_ms"] == 0.0
    [c] = e["in"]["by_consumer"]
    assert (c["lo"], c["hi"], c["count"], c["causes"]) == (300, 350, 1, {"demand": 1})
    assert c["queue_ms"] == 0.61  # alone in the queue: 32 MiB at 55 GB/s
    assert sa.copy_engine(handoff_run, 1, bandwidth=27.5e9, fwd_end=494)["in"]["by_consumer"][0]["queue_ms"] == 1.22


def test_swap_out_causes_by_bucket_when_recorded(run):
    """Captures since session 13 say why each block went out (abi.SwapOutCause): the buckets
    count them and the text puts them before the swap-ins' causes."""
    cap = run.capture
    a = run.window(1)[0]
    t = int(run.ts[a + 310])
    other = int(np.flatnonzero(cap.blocks["size"] == 16 * MIB)[0])
    r = sa.make_run(_with_swaps(cap, [(t, 4875, 32 * MIB, SWAP_OUT, abi.SwapOutCause.PLANNED, 2_000_000),
                                      (t, other, 16 * MIB, SWAP_OUT, abi.SwapOutCause.BUDGET, 2_000_000)]))
    b = sa.swap_buckets(r, 1)
    assert b["out"]["causes"] == {"planned": 1, "budget": 1}
    assert [row["out_causes"] for row in b["buckets"]] == [{"planned": 1, "budget": 1}]
    lines = sa.format_buckets(b, 50)
    assert lines[0].startswith("iteration host time") and "swap-outs 2 (0.05 GiB: planned 1 budget 1)" in lines[0]
    assert lines[1].endswith("causes (outs / ins)") and lines[2].endswith("planned 1 budget 1 / -")


def test_host_costs_from_the_shims_exit_notes(run):
    """The whole run's host time from NOTE swap.waits and swap.host (session 14's 60% run on the
    H200, its VMM calls written with their counts as the shim does since): counts, ms and us per
    call. A trace has neither note; a value cut off at the ring's note limit is left out."""
    assert sa.host_costs(run) is None
    assert sa.format_host(None)[0].startswith("no NOTE swap.waits or swap.host")
    notes = {run.pid: {
        "swap.waits": "ops=41901/5889223us drains=3594/1658587us maps=20370/3347234us creates=18175 "
                      "unmaps=19358/1523532us releases=8110 evictions=4009 planned_outs=7840 handoffs=508 "
                      "free_waits=1530/4147214us rounds=274 round_pending=0MB",
        "swap.host": "allocs=30149/14693425us frees=30144/107975us create=18175/572485us access=20370/2664453us "
                     "release=8110/845614us lock_waits=4378/274246us releaser=14110/510425us"}}
    h = sa.host_costs(dataclasses.replace(run, capture=dataclasses.replace(run.capture, notes=notes)))
    rows = {r["what"].strip(): r for r in h["rows"]}
    assert h["notes"] == ["swap.waits", "swap.host"] and len(rows) == 12
    assert rows["cuMemSetAccess"] == {"what": "  cuMemSetAccess", "count": 20370, "ms": 2664.5, "us_each": 130.8}
    assert (rows["cuMemCreate"]["count"], rows["cuMemCreate"]["us_each"]) == (18175, 31.5)
    assert (rows["cuMemRelease"]["count"], rows["cuMemRelease"]["us_each"]) == (8110, 104.3)
    assert rows["waits for pending frees"]["ms"] == 4147.2
    assert rows["allocation path, its waits included"]["us_each"] == 487.4
    # a capture before session 14: swap.waits alone; a swap.host cut off in its releaser value
    old = {run.pid: {"swap.waits": notes[run.pid]["swap.waits"], "swap.host": "allocs=1/2us releaser=14110/51"}}
    h = sa.host_costs(dataclasses.replace(run, capture=dataclasses.replace(run.capture, notes=old)))
    assert h["notes"] == ["swap.waits", "swap.host"] and len(h["rows"]) == 6  # ops, allocs, drains, free waits, maps, unmaps
    assert [r["what"] for r in h["rows"]][:2] == ["executor: ops begun and ended", "allocation path, its waits included"]
    assert "cuMemSetAccess" in "\n".join(sa.format_host(sa.host_costs(
        dataclasses.replace(run, capture=dataclasses.replace(run.capture, notes=notes)))))


def test_cli_text_and_json(capsys):
    assert sa.main([TRACE, TRACE, "--iteration", "1", "--trace-iteration", "1", "--section", "gpu,handoffs"]) == 0
    out = capsys.readouterr().out
    assert "total extra GPU time 0.0 ms (0.0 ms to the iteration's last sample)" in out
    assert ("0 handoffs; 0 of blocks needed within 64 ops (0 by the very next op); 0 came back on demand; "
            "whole run 0 (the shim counted -)") in out
    assert sa.main([TRACE, TRACE, "--json", "--section", "gpu,gaps,buckets"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["iteration"], res["trace_iteration"], res["ops"], res["swap_iterations"]) == (0, 1, 1461, 3)
    assert res["gpu"]["total_extra_ms"] == 0.53 and len(res["gaps"]) == 60
    assert "engine" not in res and "handoffs" not in res
    assert sa.main([TRACE, TRACE, "--iteration", "1", "--section", "touches"]) == 0
    assert ("717 (op, block) pairs at 435 ops that iterations 0, 2 do not have there (stale parameter words?); "
            "0 of 0 demand swap-ins are of such a block") in capsys.readouterr().out


def _error(capsys, argv) -> tuple[int, str]:
    rc = sa.main(argv)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return rc, err.strip()


def test_errors_are_one_line(capsys, tmp_path):
    foreign = tmp_path / "foreign.pyobmem"
    foreign.write_bytes(b"not a capture at all\n")
    assert _error(capsys, [TRACE, str(foreign)]) == (2, f"swap_anatomy: error: {foreign}: not a pyobmem capture")
    assert _error(capsys, [TRACE, TRACE, "--iteration", "3"]) == (
        1, f"swap_anatomy: error: --iteration 3 out of range: {TRACE} has 3 iterations (0-2)")
    tiny = str(DATA / "gpt_tiny.pyobmem")  # 9 iterations of 151 ops, no GPU clock
    assert _error(capsys, [tiny, tiny]) == (
        1, f"swap_anatomy: error: {tiny}: no GPU clock (record with the shim's GPU clock on: "
        "PYOBMEM_GPU_CLOCK_EVERY, default 32)")
    assert _error(capsys, [TRACE, tiny]) == (
        1, f"swap_anatomy: error: no common anchor: iteration 1 of {TRACE} holds 1461 ops between its "
        f"device-to-host copies, iteration 6 of {tiny} 151 (not the same workload?)")
    plain = str(DATA / "trainer_plain.pyobmem")  # one loss read back in the whole run
    assert _error(capsys, [TRACE, plain]) == (
        1, f"swap_anatomy: error: {plain}: no iteration anchor: its main process copies to the host 1 "
        "time(s), an iteration needs one device-to-host copy (loss.item()) at each end")
    with pytest.raises(SystemExit) as e:
        sa.main([TRACE, TRACE, "--section", "gpu,bogus"])
    assert e.value.code == 2 and "sections are gpu,gaps,handoffs,touches,engine,buckets" in capsys.readouterr().err


def test_a_real_slow_call_log():
    """1.5 s (about two steps) of the slow-call log of GPT medium at 50% on the H200 (session 25,
    call 3; bench/results/swap_logs/session25): the waits of the long calls are the budget's
    waits for the GPU to reach pending frees (cache_trim_waiting), the longest in the backward
    pass at plan position 671."""
    path = str(DATA / "gpt_medium_s50.slow.tsv.gz")
    with pytest.raises(sa.AnatomyError, match=r"no line of process 1 \(the SWAP capture's main process\); "
                       r"it holds those of 1269"):
        sa.read_slow_log(path, 1)
    slow = sa.read_slow_log(path, 1269)
    calls = {c: sum(x["call"] == c for x in slow) for c in ("op", "alloc", "free", "outside", "named_out")}
    assert calls == {"op": 93, "alloc": 48, "free": 1, "outside": 9, "named_out": 1092}
    long = [c for c in slow if c["call"] in ("op", "alloc")]
    worst = max(long, key=lambda c: c["ms"])
    assert (worst["call"], worst["pos"], worst["ms"], worst["parts"]["free_wait"]) == ("op", 671, 34.905, 34.44)
    assert round(sum(c["parts"].get("free_wait", 0) for c in long), 3) == 270.083
    assert round(sum(c["ms"] for c in long), 3) == 499.785
    states = [c["after"] for c in slow if c["call"] == "named_out"]
    assert (states.count("out"), states.count("out_pending_given"), states.count("in_pending")) == (1083, 5, 4)
