"""What the verbs show of a swap-mode capture: the device-resident bytes against the budget in
``summary`` and the HTML report, swap rows in the CSV, a resident counter in Perfetto; and the
``plan``/``run`` messages for budgets (too large a number, a fraction, no plan that fits)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from synth import Trace

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.cli import main, run_main
from pyobmem.commands import summary
from pyobmem.export import export
from pyobmem.model.queries import resident_bytes
from pyobmem.report import render
from pyobmem.report.swap import swap_facts

MiB = 1 << 20
DATA = Path(__file__).parent / "data"


def _swap_capture(path, budget_bytes: int, free_while_out: bool = False, out_causes=(0, 0)):
    """Block a (64 MiB) and b (32 MiB); a out over [10_000, 20_000 - 3_000), b out from 30_000 to
    the end (or to its free at 40_000). out_causes: the two SWAP_OUT records' flags
    (abi.SwapOutCause; 0: not recorded, as before session 13)."""
    tr = Trace()
    a = tr.alloc(64 * MiB)  # t = 2000
    b = tr.alloc(32 * MiB)  # t = 3000
    tr.launch(0x10, [a, b])
    tr.add(abi.Ev.SWAP_OUT, flags=out_causes[0], block_id=a, bytes=64 * MiB, duration_ns=1_000, stream=7, ts=10_000)
    tr.add(abi.Ev.SWAP_IN, flags=abi.SwapInCause.DEMAND, block_id=a, bytes=64 * MiB, duration_ns=3_000, stream=7, ts=20_000)
    tr.add(abi.Ev.SWAP_OUT, flags=out_causes[1], block_id=b, bytes=32 * MiB, duration_ns=1_000, stream=7, ts=30_000)
    if free_while_out:
        tr.t = 39_000
        tr.free(b)  # t = 40_000
    tr.launch(0x11, [a])
    tr.add(abi.Ev.PLAN, generation=1, value=2, ts=45_000)
    # dropped at position 5: a memset issued where the template has kernel 0x11
    tr.add(abi.Ev.PLAN, flags=1, generation=1, value=5, seen=abi.op_key_copy(abi.Ev.MEMSET, 0), expected=0x11, ts=46_000)
    tr.write(path, meta={"argv": ["x"], "swap": {"budget": str(budget_bytes), "budget_bytes": budget_bytes,
                                                   "budget_fraction": None, "min_swap_bytes": 4 * MiB}})
    return read_capture(str(path))


def test_resident_bytes_is_live_minus_swapped_out(tmp_path):
    cap = _swap_capture(tmp_path / "s.pyobmem", 100 * MiB)
    t, v = resident_bytes(cap)
    steps = dict(zip(t.tolist(), v.tolist()))
    assert steps[2000] == 64 * MiB and steps[3000] == 96 * MiB
    assert steps[10_000] == 32 * MiB  # a released
    assert steps[17_000] == 96 * MiB  # a mapped again: the swap-in's time minus its duration
    assert steps[30_000] == 64 * MiB and v[-1] == 64 * MiB  # b stays out to the end
    assert resident_bytes(cap, pid=12345)[0].tolist() == []


def test_resident_bytes_block_freed_while_out(tmp_path):
    cap = _swap_capture(tmp_path / "s.pyobmem", 100 * MiB, free_while_out=True)
    t, v = resident_bytes(cap)
    assert dict(zip(t.tolist(), v.tolist()))[40_000] == 64 * MiB  # not 32 MiB: b counted once
    assert v.min() >= 0


def test_summary_says_peak_resident_against_the_budget(tmp_path):
    cap = _swap_capture(tmp_path / "s.pyobmem", 100 * MiB)
    s = summary.summarize(cap)
    w = s["swap"]
    assert (w["peak_resident_bytes"], w["over_budget_ns"], w["peak_resident_pid"]) == (96 * MiB, 0, 100)
    text = summary.format_summary(s)
    assert "plans adopted 1, dropped 1 (dropped: the launches stopped matching the plan's iteration)" in text
    assert "1 dropped at op 5 of the iteration: issued memset, the plan expected kernel 0x11" in text
    assert "peak live    96.0 MiB" in text
    assert "on the device: peak 96.0 MiB resident (live blocks minus those swapped out), within the budget" in text
    # A budget the process went over: for how long.
    cap = _swap_capture(tmp_path / "o.pyobmem", 80 * MiB)
    w = swap_facts(cap)
    assert w["over_budget_ns"] == (10_000 - 3000) + (30_000 - 17_000)
    assert "over the budget for 20.0 µs" in summary.format_short(summary.summarize(cap))


def test_why_blocks_went_out_is_reported_when_recorded(tmp_path):
    """Since session 13 a SWAP_OUT record says why (abi.SwapOutCause): the summary, the HTML
    report, the CSV export and swap_facts show it; a capture without it (cause 0) shows none."""
    causes = (abi.SwapOutCause.BUDGET, abi.SwapOutCause.PLANNED)
    cap = _swap_capture(tmp_path / "c.pyobmem", 100 * MiB, out_causes=causes)
    assert cap.swaps["cause"].tolist() == [abi.SwapOutCause.BUDGET, abi.SwapInCause.DEMAND, abi.SwapOutCause.PLANNED]
    w = swap_facts(cap)
    assert w["swapped_out"]["by_cause"] == {"planned": {"count": 1, "bytes": 32 * MiB},
                                            "budget": {"count": 1, "bytes": 64 * MiB},
                                            "room": {"count": 0, "bytes": 0}}
    assert ("swapped out 96.0 MiB in 2 swap-outs (2 blocks): 1 planned, 1 beyond the plan for the budget, "
            "0 for device memory") in summary.format_summary(summary.summarize(cap))
    html = render(cap, generated="now")
    assert "<td>swap-outs: beyond the plan, for the budget</td><td>1 (64.0 MiB)</td>" in html
    assert "<td>swap-outs: planned</td><td>1 (32.0 MiB)</td>" in html
    export(cap, "csv", str(tmp_path / "c.csv"))
    with open(tmp_path / "c.csv") as f:
        assert [r["name"] for r in csv.DictReader(f) if r["event"].startswith("swap_")] == ["budget", "demand", "planned"]
    old = _swap_capture(tmp_path / "o.pyobmem", 100 * MiB)
    assert swap_facts(old)["swapped_out"]["by_cause"] is None
    text = summary.format_summary(summary.summarize(old))
    assert "swapped out 96.0 MiB in 2 swap-outs (2 blocks)\n" in text and "swap-outs: planned" not in render(old, generated="now")


def test_report_shows_swap_mode_and_the_budget_line(tmp_path):
    cap = _swap_capture(tmp_path / "s.pyobmem", 80 * MiB)
    html = render(cap, generated="now")
    assert '<section id="swap"><h2>Swap mode</h2>' in html
    assert "peak resident on the device" in html and "over the budget for 20.0 µs" in html
    assert "on the device (swap mode)" in html and "stroke-dasharray" in html  # resident line, budget line
    assert "late prefetches" in html and "plans adopted / dropped" in html
    # A capture without swap mode: no section, no lines.
    plain = render(read_capture(str(DATA / "gpt_tiny.pyobmem")), generated="now")
    assert "Swap mode" not in plain and "stroke-dasharray" not in plain


def test_csv_and_perfetto_carry_the_swaps(tmp_path):
    cap = _swap_capture(tmp_path / "s.pyobmem", 100 * MiB)
    export(cap, "csv", str(tmp_path / "s.csv"))
    with open(tmp_path / "s.csv") as f:
        rows = list(csv.DictReader(f))
    sw = [r for r in rows if r["event"].startswith("swap_")]
    assert [(r["event"], r["name"], r["time_ns"], r["bytes"], r["stream"]) for r in sw] == [
        ("swap_out", "", "8000", str(64 * MiB), "7"), ("swap_in", "demand", "18000", str(64 * MiB), "7"),
        ("swap_out", "", "28000", str(32 * MiB), "7")]  # ns from the first CUDA event (at 2000)
    assert [int(r["time_ns"]) for r in rows] == sorted(int(r["time_ns"]) for r in rows)
    export(cap, "perfetto", str(tmp_path / "s.json"))
    doc = json.loads((tmp_path / "s.json").read_text())
    res = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "resident bytes (swap mode)"]
    t, v = resident_bytes(cap)
    assert [e["args"]["bytes"] for e in res] == v.tolist()


def test_html_downsampling_keeps_peaks_and_dips():
    from pyobmem.report.html import downsample_minmax

    t = np.arange(100_000, dtype=np.int64)
    v = np.zeros(100_000, np.int64)
    v[5_000], v[70_001] = 10, -10
    ts, vs = downsample_minmax(t, v, max_points=100)
    assert len(ts) <= 201 and vs.max() == 10 and vs.min() == -10 and np.all(np.diff(ts) > 0)


@pytest.mark.parametrize("argv", [
    ["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "1e400"],
    ["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "1G", "--min-swap-bytes", "1e400"],
    ["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "1G", "--bandwidth", "inf"],
    ["run", "--swap", "--budget", "1e400", "true"],
])
def test_huge_numbers_are_one_line_errors(argv, capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert err.startswith("pyobmem: error: bad ") and len(err.splitlines()) == 1
    assert not os.listdir(tmp_path)
    if argv[0] == "run":
        assert run_main(argv[1:]) == 2


def test_plan_messages(capfd, tmp_path):
    # A fraction says of what.
    assert main(["plan", str(DATA / "cupy.pyobmem"), "--budget", "50%"]) == 0
    assert "budget      69.9 GiB (50% of the card's 139.8 GiB, not of the peak);" in capfd.readouterr().out
    # No op needs more than the budget, yet no plan lowers the peak: at op 49 no candidate can be out.
    assert main(["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "900MiB"]) == 1
    out, err = capfd.readouterr()
    assert "ops (launches, copies and sets)" in out
    assert err.startswith("pyobmem: error: no plan fits the budget 900.0 MiB: no plan lowers the peak of 952.0 MiB: "
                          "at op 49 (")
    assert "no candidate block can be off the device" in err and len(err.splitlines()) == 1
    # Below what one op needs: the op, demangled.
    assert main(["plan", str(DATA / "gpt_tiny.pyobmem"), "--budget", "0.5GiB"]) == 1
    err = capfd.readouterr().err
    assert "at op 62 of the iteration (" in err and "_ZN" not in err
    # An incomplete capture is said to be one.
    data = (DATA / "gpt_tiny.pyobmem").read_bytes()
    (tmp_path / "cut.pyobmem").write_bytes(data[: len(data) * 3 // 4])
    main(["plan", str(tmp_path / "cut.pyobmem"), "--budget", "1GiB"])
    assert "the capture is incomplete" in capfd.readouterr().err
