"""One vocabulary across the verbs (issue 11), on the committed H200 captures: the same block id,
iteration number, time origin and budget meaning in stats, patterns, plan, the report, the
exports and summary; plans no worse than none; kernel names without return types; the small
things (JSON table names, byte totals, drop hints, help, follow-up lines)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil

import numpy as np
import pytest

from pyobmem import abi, planner
from pyobmem.capture import CaptureWriter, read_capture, read_records
from pyobmem.cli import build_parser, build_run_parser, main
from pyobmem.commands import run as run_command
from pyobmem.commands.common import function_name, short_name, _demangle_all
from pyobmem.report import render

from synth import Trace

DATA = os.path.join(os.path.dirname(__file__), "data")
GPT = os.path.join(DATA, "gpt_tiny.pyobmem")
CUPY = os.path.join(DATA, "cupy.pyobmem")
BIG = "2160:12"  # gpt_tiny's 198 MiB block at 0x7f2fc8000000 (capture row 11, the shim's block 12)
ORIGIN = 132545301911  # gpt_tiny's first CUDA event (CLOCK_MONOTONIC ns): its first allocation


def _out(capsys, argv, code=0):
    assert main(argv) == code
    return capsys.readouterr()


@pytest.fixture(scope="module")
def gpt_html():
    return render(read_capture(GPT), generated="now")


# --- one block id ------------------------------------------------------------------------------


def test_one_block_id_in_every_verb(capsys, tmp_path, gpt_html):
    cap = read_capture(GPT)
    row = int(np.flatnonzero(cap.blocks["addr"] == 0x7F2FC8000000)[0])
    assert (row, cap.block_label(row), int(cap.blocks["size"][row])) == (11, BIG, 198 << 20)
    # stats: the largest block, text and JSON
    out = _out(capsys, ["stats", GPT]).out
    assert re.search(r"^  2160:12  198\.00 MiB +persistent", out, re.M)
    top = json.loads(_out(capsys, ["stats", "--json", GPT]).out)["top_blocks"][0]
    assert (top["block"], top["row"], top["size"]) == (BIG, 11, 198 << 20)
    # patterns: a block column, and "block" in JSON ("row": the capture row)
    out = _out(capsys, ["patterns", GPT]).out
    assert re.search(r"^  kind +block +bytes +instances", out, re.M)
    assert re.search(r"^  long-idle +2160:12 +198\.00 MiB +1 +persistent +13\.706 ms \(1\.1 it\)", out, re.M)
    found = [f for f in json.loads(_out(capsys, ["patterns", "--json", GPT]).out)["findings"] if f["block"] == BIG]
    assert [(f["kind"], f["row"], f["bytes"]) for f in found] == [("long-idle", 11, 198 << 20)]
    # plan: the block the best plan would swap (rejected: it saves nothing)
    res = _out(capsys, ["plan", GPT, "--budget", "800MiB"], 1)
    assert "the best one found swaps 4 blocks (2160:12, 2160:1, 2160:13, 2160:14) and saves 0 B at 1.856x" in res.out
    j = json.loads(_out(capsys, ["plan", GPT, "--budget", "800MiB", "--json"], 1).out)
    assert j["rejected"]["blocks"] == [BIG, "2160:1", "2160:13", "2160:14"]
    # CSV: alloc and accesses of the block
    csv_path = tmp_path / "g.csv"
    _out(capsys, ["export", GPT, "--format", "csv", "-o", str(csv_path)])
    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["addr"] == "0x7f2fc8000000"]
    assert {r["block"] for r in rows} == {BIG}
    assert [r["event"] for r in rows].count("alloc") == 1 and [r["event"] for r in rows].count("access") == 32
    # Perfetto: the block's track
    pf = tmp_path / "g.json"
    _out(capsys, ["export", GPT, "--format", "perfetto", "-o", str(pf)])
    tracks = [e for e in json.loads(pf.read_text())["traceEvents"] if e.get("cat") == "block"]
    assert tracks[0]["args"]["block"] == BIG and tracks[0]["name"] == "block 2160:12 198.0 MiB persistent"
    # memory_viz: the block's root frame
    mv = tmp_path / "g.pickle"
    _out(capsys, ["export", GPT, "--format", "memory-viz", "-o", str(mv)])
    import pickle

    seg = next(s for s in pickle.loads(mv.read_bytes())["segments"] if s["address"] == 0x7F2FC8000000)
    assert seg["blocks"][0]["frames"][-1]["name"] == "block 2160:12: persistent, 32 accesses"
    # report: the access map and the swap candidates
    assert "<title>block 2160:12 198.0 MiB persistent</title>" in gpt_html
    assert "<tr><td>2160:12</td><td class=n>198.0 MiB</td>" in gpt_html


# --- one iteration numbering -------------------------------------------------------------------


def test_one_iteration_numbering(capsys, gpt_html):
    from pyobmem.model import analyse

    out = _out(capsys, ["stats", GPT]).out
    assert "swap saving bound (iteration 4 of 0..8, peak 952.00 MiB, 55.0 GB/s each way):" in out
    assert json.loads(_out(capsys, ["stats", "--json", GPT]).out)["saving"]["iteration"] == 4
    assert "<td>analysed iteration</td><td class=n>iteration 4 of 0..8, 12.9 ms, peak 952.0 MiB live</td>" in gpt_html
    res = _out(capsys, ["plan", GPT, "--budget", "1GiB"])
    assert "  planned     iteration 4 of 0..8: 160 ops (launches, copies and sets), 12.9 ms" in res.out
    assert json.loads(_out(capsys, ["plan", GPT, "--budget", "1GiB", "--json"]).out)["iteration"] == 4
    # The same iteration: the report's window is the main regime's iteration 4.
    cap = read_capture(GPT)
    a = analyse(cap)
    it = a.iterations
    k = it.main_rows()[4]
    assert a.window == (int(it.t_start[k]), int(it.t_end[k]))
    assert (a.window[0] - ORIGIN, a.window[1] - ORIGIN) == (672_598_131, 685_472_078)


# --- one time origin ---------------------------------------------------------------------------


def test_csv_times_count_from_the_first_cuda_event(capsys, tmp_path):
    cap = read_capture(GPT)
    d = json.loads(_out(capsys, ["stats", "--json", GPT]).out)
    assert d["origin_monotonic_ns"] == ORIGIN == int(cap.blocks["t_alloc"][0])
    out = tmp_path / "g.csv"
    _out(capsys, ["export", GPT, "--format", "csv", "-o", str(out)])
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    t = [int(r["time_ns"]) for r in rows]
    assert t[0] == 0 and rows[0]["event"] == "alloc" and rows[0]["block"] == "2160:1"
    first_launch = next(r for r in rows if r["event"] in ("launch", "memcpy", "memset"))
    assert int(first_launch["time_ns"]) == int(cap.ops["ts_ns"][0]) - ORIGIN == 4_696_212
    assert max(t) == 731_441_554  # the summary's duration: 731.4 ms
    assert "duration  731.4 ms" in _out(capsys, ["summary", GPT]).out


# --- one meaning of a budget -------------------------------------------------------------------


@pytest.mark.parametrize("text,expect", [("1", (None, 1.0)), ("0.75", (None, 0.75)), ("75%", (None, 0.75)),
                                         ("2", (2, None)), ("123456", (123456, None))])
def test_a_bare_number_is_one_thing(text, expect):
    b = planner.parse_budget(text)
    assert (b.bytes, b.fraction) == expect


def test_a_bare_number_above_1_that_is_no_whole_byte_count_says_the_rule(capsys):
    err = _out(capsys, ["plan", GPT, "--budget", "1.5"], 2).err
    assert err == f"pyobmem: error: bad budget '1.5': {planner.BARE_NUMBER}\n"
    assert "a fraction of the card when at most 1 (0.75; 1 is the whole card), else whole bytes" in err


def test_a_share_is_of_the_card_and_plan_says_already_fits(capsys):
    out = _out(capsys, ["plan", GPT, "--budget", "75%"]).out
    assert "  budget      104.9 GiB (75% of the card's 139.8 GiB, not of the peak);" in out
    assert "  predicted   already fits (peak 952.0 MiB): nothing to swap" in out
    assert ("              a budget under 952.0 MiB makes it swap, but no plan lowers the peak of 952.0 MiB: "
            "at op 49 (") in out
    out = _out(capsys, ["plan", GPT, "--budget", "1"]).out
    assert "  budget      139.8 GiB (100% of the card's 139.8 GiB, not of the peak);" in out
    out = _out(capsys, ["plan", CUPY, "--budget", "50%"]).out
    assert "  predicted   already fits (peak 289.7 MiB): nothing to swap" in out
    # Said in the help of both verbs that take a budget.
    for parser, verb in ((build_parser(), ["plan", "--help"]), (build_parser(), ["run", "--help"])):
        with pytest.raises(SystemExit):
            parser.parse_args(verb)
        text = " ".join(capsys.readouterr().out.split())
        assert "a share of the card's memory, not of the job's peak: 75%, or a number up to 1 (0.75; 1: the whole card)" in text


# --- no plan worse than none -------------------------------------------------------------------


def test_a_budget_no_plan_reaches_on_allocator_blocks_suggests_tracing_tensors(capsys):
    """JAX traced with XLA's own VMM mappings (tests/data/jax.pyobmem, no per-tensor presets):
    the one line says why and what to trace instead; a per-tensor capture's line does not."""
    err = _out(capsys, ["plan", os.path.join(DATA, "jax.pyobmem"), "--budget", "50MiB"], 1).err
    assert err.startswith("pyobmem: error: the budget 50.0 MiB is below what the job needs at one instant: 162.2 MiB")
    assert err.rstrip().endswith("for PyTorch, JAX or TensorFlow, trace with `pyobmem run --tensor-blocks` (what swap "
                                 "mode does) to plan their tensors")
    err = _out(capsys, ["plan", os.path.join(DATA, "gpt_tiny_async.pyobmem"), "--budget", "1MiB"], 1).err
    assert "below what the job needs" in err and "--tensor-blocks" not in err


def test_plan_lists_its_swaps_in_the_order_they_go_out_up_to_the_limit(capsys):
    out = _out(capsys, ["plan", os.path.join(DATA, "gpt_tiny_async.pyobmem"), "--budget", "600MiB", "--limit", "3"], 1).out
    table = out[out.index("  block "):].splitlines()
    assert [int(r.split()[4]) for r in table[1:4]] == [8, 9, 47]  # out after op, ascending
    assert table[4:] == ["  ... 2 more swaps (--limit 0, --json)"]
    out = _out(capsys, ["plan", os.path.join(DATA, "gpt_tiny_async.pyobmem"), "--budget", "600MiB", "--limit", "0"], 1).out
    assert "more swaps" not in out and len(out[out.index("  block "):].splitlines()) == 1 + 5


def test_plan_shows_no_plan_worse_than_none_and_says_why(capsys):
    res = _out(capsys, ["plan", GPT, "--budget", "800MiB"], 1)
    out = res.out
    assert "block         address" not in out  # no swap table
    assert "  swapped     0 blocks, 0 B; 0 actions per iteration, 43 idle hints for eviction" in out
    assert "  time        1.000x the iteration by the cost model (GPU time, memory at the GPU's time; prefetch stalls " \
           "0 ns per iteration)" in out
    assert "  candidates  6 blocks, 838.0 MiB" in out
    assert "  excluded    11 blocks: under 4.00 MiB (18.0 MiB)\n              3 blocks: never accessed (96.0 MiB)" in out
    assert "  reachable   at best 952.0 MiB at op 49" in out
    assert "  predicted   none: no plan lowers the peak of 952.0 MiB: at op 49 (at::native::" in out
    assert res.err.startswith("pyobmem: error: no plan fits the budget 800.0 MiB: no plan lowers the peak of 952.0 MiB")
    assert len(res.err.splitlines()) == 1
    j = json.loads(_out(capsys, ["plan", GPT, "--budget", "800MiB", "--json"], 1).out)
    assert j["swaps"] == [] and j["actions"] == 0 and j["saved_bytes"] == 0 and j["time_ratio"] == 1.0
    assert j["excluded"] == {"under 4.00 MiB": {"blocks": 11, "bytes": 18876416},
                             "never accessed": {"blocks": 3, "bytes": 100663296}}
    assert (j["reach_bytes"], j["reach_at"], j["needed_bytes"]) == (998246400, 49, 742393856)
    assert j["rejected"] == {"blocks": [BIG, "2160:1", "2160:13", "2160:14"], "saved_bytes": 0, "time_ratio": 1.855688,
                             "why": "saves nothing: worse than no plan"}


# --- kernel names ------------------------------------------------------------------------------


def test_function_name_strips_return_types():
    assert function_name("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(int, float const*)") \
        == "internal::gemvx::kernel<int, float>"
    assert function_name("void at::native::{anon}::k<(bool)1, {lambda()#1}>(int) const") == \
        "at::native::{anon}::k<(bool)1, {lambda()#1}>"
    assert function_name("void Foo::operator()(int)") == "Foo::operator()"


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt")
def test_cupy_gemv_kernel_named_without_its_return_type(capsys):
    cap = read_capture(CUPY)
    name = next(n for n in cap.kernel_names.values() if "gemvx" in n)
    dem = _demangle_all([name])
    assert dem[name].startswith("std::enable_if<!(false), void>::type internal::gemvx::kernel<")
    assert short_name(name, 60, dem) == "internal::gemvx::kernel<int, int, float, float, float, floa…"
    err = _out(capsys, ["plan", CUPY, "--budget", "200MiB"], 1).err
    assert "at op 5 of the iteration (internal::gemvx::kernel<int, int, float, float, float, floa…); " in err
    assert "enable_if" not in err


# --- the report's candidates against plan ------------------------------------------------------


def test_report_candidates_show_how_they_differ_from_plan(gpt_html):
    from pyobmem.model import analyse
    from pyobmem.report.analysis import candidates

    c = candidates(analyse(read_capture(GPT)))[0]
    # The bound takes the block's one cyclic window on both sides of the iteration, each with a
    # full copy of stall; within the iteration it is out 6.04 + 2.69 ms; plan swaps it with 0 ns.
    assert (c["block"], c["windows"], c["out_ns"], c["stall_ns"], c["from_ratio"]) == (BIG, 2, 8_726_982, 7_549_746, 1.293)
    assert ("<tr><td>2160:12</td><td class=n>198.0 MiB</td><td>persistent</td><td class=n>3</td>"
            "<td class=n>12.4 ms</td><td class=n>2</td><td class=n>8.73 ms</td><td class=n>15.1 ms</td>"
            "<td class=n>7.55 ms</td><td class=n>1.29x</td><td>may swap it</td></tr>") in gpt_html
    # a sub-block (tensor) of a segment: plan would move its whole block
    assert ("<tr><td>2160:13+0 B</td><td class=n>24.5 MiB</td>" in gpt_html
            and "<td>may swap the whole 198.0 MiB block</td>" in gpt_html)
    assert "The bound is the model's ceiling, not a plan" in gpt_html
    assert "<code>pyobmem plan FILE --budget SIZE</code> is what swap mode would do" in gpt_html


# --- small things ------------------------------------------------------------------------------


def test_stats_json_names_its_tables_as_the_text(capsys):
    d = json.loads(_out(capsys, ["stats", "--json", GPT]).out)
    blocks = {k: v for k, v in d["blocks_by_class"].items() if v["count"]}
    assert blocks == {"persistent": {"count": 15, "bytes": 856 << 20}, "never-accessed": {"count": 5, "bytes": (96 << 20) + 2048}}
    assert sum(v["count"] for v in d["sub_blocks_by_class"].values()) == d["sub_blocks"] == 215
    assert "segments_by_class" not in d
    out = _out(capsys, ["stats", GPT]).out
    assert ("blocks by class (whole allocations; bytes summed over the run, not live at once: peak live 952.00 MiB):\n"
            "  class           count  bytes (sum)\n  --------------  -----  -----------\n"
            "  persistent         15   856.00 MiB") in out
    assert "sub-blocks by class (215 sub-blocks; bytes summed over the run, not live at once: peak live 952.00 MiB):" in out


def test_report_class_totals_say_they_are_sums(gpt_html):
    assert "<td>persistent blocks (bytes summed over the run)</td><td class=n>15 (856.0 MiB)</td>" in gpt_html


def test_dropped_events_say_how_to_avoid_them(tmp_path, capsys):
    meta, recs = read_records(GPT)
    recs = recs[recs["type"] != abi.Ev.CAPTURE_END].copy()
    drop = recs[-1:].copy()
    drop["type"], drop["a"] = abi.Ev.DROPPED, 25
    path = tmp_path / "drops.pyobmem"
    w = CaptureWriter(str(path), meta, force=True)
    w.write(np.concatenate([recs, drop]))
    w.finish(dropped=25, exit_status=0, ts_ns=int(drop["ts_ns"][0]) + 1)
    w.close()
    hint = "the event ring was full: run pyobmem-run again with a --capacity larger than its 1,048,576 records (e.g. --capacity 2097152)"
    assert read_capture(str(path)).dropped == 25
    out = _out(capsys, ["summary", str(path)]).out
    assert f"  dropped   25 events; untracked frees 0, unmaps 0\n            {hint}\n" in out
    assert f"({hint})" in _out(capsys, ["stats", str(path)]).out
    assert f"({hint})" in _out(capsys, ["patterns", str(path)]).out
    assert f"To avoid it, {hint}." in render(read_capture(str(path)), generated="now")


def test_run_help_examples_name_their_own_program(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "example: pyobmem run -o train.pyobmem python train.py --epochs 1 (then: pyobmem summary train.pyobmem)" in text
    assert "pyobmem-run -o" not in text
    with pytest.raises(SystemExit):
        build_run_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "example: pyobmem-run -o train.pyobmem python train.py --epochs 1 (then: pyobmem summary train.pyobmem)" in text


def test_no_next_line_for_an_empty_capture(tmp_path, capsys):
    empty = tmp_path / "empty.pyobmem"
    Trace().write(empty)
    run_command._report(str(empty))
    err = capsys.readouterr().err.splitlines()
    no_driver = [] if run_command._driver_present() else [
        "pyobmem: no CUDA driver here (libcuda.so.1 cannot be loaded): the command could not use the GPU"]
    assert err == ["pyobmem: no CUDA activity was seen", "pyobmem: no events dropped; capture complete, exit status 0",
                   f"pyobmem: capture written to {empty}", *no_driver]  # nothing to look at: no next: line
    run_command._report(GPT)
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"pyobmem: next: pyobmem stats {GPT}   or   pyobmem report {GPT} -o report.html"


def test_the_same_capture_twice_is_read_once_with_a_warning(capsys, tmp_path):
    other = tmp_path / "same.pyobmem"
    os.symlink(CUPY, other)
    res = _out(capsys, ["summary", CUPY, CUPY, str(other)])
    assert res.err == f"pyobmem: warning: {CUPY} is given 3 times (as {CUPY}, {other}); it is read once\n"
    assert res.out.startswith(f"Capture {CUPY}\n")  # one capture: the full summary, no rank table
    res = _out(capsys, ["summary", CUPY, GPT])
    assert res.err == "" and res.out.startswith("2 captures")


def test_export_memory_viz_prints_the_follow_up_command(capsys, tmp_path):
    out = tmp_path / "c u.pickle"
    err = _out(capsys, ["export", CUPY, "--format", "memory-viz", "-o", str(out)]).err
    assert err == (f"wrote {out} (open it at pytorch.org/memory_viz, or run: python -m torch.cuda._memory_viz stats "
                   f"'{out}')\n")


def test_report_memory_chart_of_one_iteration(gpt_html):
    assert gpt_html.count("<svg") == 5
    assert "<h3>One iteration: iteration 4 of 0..8</h3>" in gpt_html
    assert "(t = 672.6 ms to 685.5 ms from the first CUDA event;" in gpt_html
    zoom = gpt_html[gpt_html.index("<h3>One iteration"):]
    zoom = zoom[zoom.index("<svg"): zoom.index("</svg>")]
    assert "time from the start of iteration 4 of 0..8 (ms)" in zoom


def test_already_fits_says_which_budget_would_make_it_swap(tmp_path, capsys):
    from test_planner import BW, _trace

    # Peak 209 MiB; the one 64 MiB block that could leave (A) is idle only across the opaque launch
    # at op 10, which may touch any block: the planner takes no such window, so no plan lowers the peak.
    _trace(tmp_path)
    out = _out(capsys, ["plan", str(tmp_path / "synth.pyobmem"), "--budget", "1GiB", "--bandwidth", str(BW)]).out
    assert ("  predicted   already fits (peak 209.0 MiB): nothing to swap\n"
            "              a budget under 209.0 MiB makes it swap, but no plan lowers the peak of 209.0 MiB: "
            "at op 40 (kernel 0x1028)") in out
    # X (8 MiB, stream-ordered, live across the iteration) is a candidate: the shim serves it in swap mode
    assert "  candidates  2 blocks, 72.0 MiB\n  excluded    1 block: under 4.00 MiB (1.0 MiB)\n" in out
    res = _out(capsys, ["plan", str(tmp_path / "synth.pyobmem"), "--budget", "188MiB", "--bandwidth", str(BW)], 1)
    assert "  predicted   none: the budget is below the 209.0 MiB the job needs at op 40" in res.out
    assert res.err.startswith("pyobmem: error: the budget 188.0 MiB is below what the job needs at one instant: 209.0 MiB")


def test_report_candidates_say_why_plan_leaves_a_block():
    from pyobmem.model import analyse
    from pyobmem.report.analysis import candidates

    # JAX's platform allocator maps every buffer itself: the bound may move them, plan never.
    c = candidates(analyse(read_capture(os.path.join(DATA, "jax.pyobmem"))))
    assert [(x["block"], x["plan"]) for x in c] == [(b, "no: not VMM-backable (not cuMemAlloc)")
                                                    for b in ("2581:61", "2581:62", "2581:25")]


def test_one_iteration_number_with_deviating_steps(capsys, tmp_path):
    """A trainer that logs every 10 steps (H200 capture): 30 steps, 4 deviating. stats, plan and the
    report number the analysed step among all 30 (a new user saw "iteration 13 of 0..25" in plan
    and the report for stats' iteration 15: they counted the template-following steps only)."""
    cap = os.path.join(DATA, "trainer_log_every_10.pyobmem")
    assert "swap saving bound (iteration 15 of 0..29," in _out(capsys, ["stats", cap]).out
    assert "  planned     iteration 15 of 0..29: 94 ops" in _out(capsys, ["plan", cap, "--budget", "200MiB"], 1).out
    _out(capsys, ["report", cap, "-o", str(tmp_path / "r.html")])
    html = (tmp_path / "r.html").read_text()
    assert set(re.findall(r"iteration \d+ of 0\.\.\d+", html)) == {"iteration 15 of 0..29"}
    assert "iterations found</td><td class=n>30 (4 deviating from the template)" in html


def test_reachable_is_a_bound_of_the_plan(capsys):
    """plan's "reachable" is the least peak any plan can reach: never above the plan it shows (a
    new user saw 330.1 MiB reachable beside a 302.1 MiB plan: the bound left out the budget hold)."""
    cap = os.path.join(DATA, "trainer_log_every_10.pyobmem")
    res = _out(capsys, ["plan", cap, "--budget", "200MiB", "--json"], 1)
    j = json.loads(res.out)
    # over the budget (302.1 MiB) with the allocators' blocks, not tensors: no claim on swap mode
    assert not j["kept_by_eviction"] and res.err.startswith("pyobmem: error: no plan fits the budget 200.0 MiB")
    assert j["reach_bytes"] <= j["predicted_peak_bytes"] < j["peak_bytes"]
