"""``pyobmem stats`` and ``pyobmem patterns`` on synthetic captures (through the CLI's main)."""

import json

import pytest

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.cli import main
from pyobmem.commands.patterns import patterns_dict
from pyobmem.commands.stats import stats_dict
from pyobmem.model import analyse

from synth import Trace
from test_model_blocks import MiB, N_ITERS, STEP, training_trace


def _write(tmp_path, tr, name="t.pyobmem", **kw):
    path = tmp_path / name
    tr.write(path, **kw)
    return str(path)


def test_stats_json(tmp_path, capsys):
    tr, _ = training_trace()
    path = _write(tmp_path, tr)
    assert main(["stats", path, "--json", "--top", "3", "--bandwidth", "1e12"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["iterations_found"] == N_ITERS and d["period_ops"] == 6 and d["iteration_ns"] == STEP
    assert d["message"] is None and d["micro_period_ops"] is None and d["drops"]["dropped"] == 0
    assert [b["size"] for b in d["top_blocks"]] == [64 * MiB, 32 * MiB, 16 * MiB]
    assert [b["class"] for b in d["top_blocks"]] == ["arena", "persistent", "persistent"]
    assert d["top_blocks"][1]["longest_idle_share"] == 1.0  # M: idle the whole iteration
    assert d["saving"]["curve"][0] == [1.0, 1 * MiB] and d["properties"]["regular"] == 1.0
    assert d["blocks_by_class"]["transient"] == {"count": 6, "bytes": 6 * MiB}


def test_stats_text(tmp_path, capsys):
    tr, _ = training_trace()
    assert main(["stats", _write(tmp_path, tr)]) == 0
    out = capsys.readouterr().out
    assert "iterations: 6 (main: 6 ops per iteration, 100.0 µs, pid 100)" in out
    assert "iteration-scoped      6    24.00 MiB" in out
    assert "properties, tensor level" in out and "properties, block level" in out


def test_no_iteration_and_drops(tmp_path, capsys):
    tr = Trace()
    b = tr.alloc(MiB)
    tr.launch(0x1, [b])
    tr.add(abi.Ev.DROPPED, count=7)
    tr.launch(0x2, [b])
    path = _write(tmp_path, tr, end=False)
    assert main(["stats", path]) == 0
    out = capsys.readouterr().out
    assert "iterations: no iteration was found in the launch stream of pid 100" in out
    assert "warning: 7 events were dropped between" in out and "(around ops 1..1)" in out
    assert "  iterative    n/a" in out and "swap saving bound: n/a (no iteration)" in out
    d = stats_dict(analyse(read_capture(path), progress=False))
    # t = 0 at the first CUDA event (the allocation), not at the process record before it
    assert d["drops"]["where"] == [{"t_ns": 3000, "op": 1, "pid": 100, "count": 7}]
    assert d["properties"]["regular"] is None and d["saving"] is None


def test_patterns(tmp_path, capsys):
    tr, _ = training_trace()
    path = _write(tmp_path, tr)
    assert main(["patterns", path, "--json", "--kind", "long-idle", "--kind", "leaked", "--kind", "never-accessed"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = [(f["kind"], f["bytes"], f["instances"], f["start_pct"], f["end_pct"]) for f in d["findings"]]
    assert got == [
        ("long-idle", 32 * MiB, 1, 50.0, 50.0),  # M: from opt (+50us) to the next opt
        ("long-idle", 16 * MiB, 1, 50.0, 10.0),  # W2: opt -> next fwd2 (60 us)
        ("leaked", 3 * MiB, 1, 30.0, None),  # L: last used by bwd2 of iteration 2
        ("never-accessed", 2 * MiB, 1, None, None),
    ]
    assert d["findings"][0]["kernel_before"] == "kernel 0xa6" and d["findings"][0]["wasted_ns"] == STEP
    assert main(["patterns", path]) == 0
    assert "long-idle" in capsys.readouterr().out


def test_long_idle_is_reported_on_the_clock_it_was_found_on():
    """GPT medium's capture (H200, GPU clock; the host runs up to ~350 ms ahead): a long-idle
    finding lasts more than half the iteration (the threshold, on the GPU clock) and its positions
    are on that clock too, so an iteration-scoped block's span in % is its share of the iteration. The host's times
    gave the first-layer activations 1%..30% and ~50 ms (10% of the iteration)."""
    from pathlib import Path

    a = analyse(read_capture(str(Path(__file__).parent / "data" / "gpt_medium_tensors_s7.pyobmem")), progress=False)
    d = patterns_dict(a, kinds=["long-idle"])
    assert len(d["findings"]) > 10
    for f in d["findings"]:
        assert f["iteration_share"] > 0.5, f
        if f["cls"] == "iteration-scoped":  # (a persistent block's interval may cross iterations)
            # within 8 points: the share is of the median iteration, the positions of their own one
            assert f["end_pct"] - f["start_pct"] == pytest.approx(100 * f["iteration_share"], abs=8.0), f
    top = d["findings"][0]
    assert top["bytes"] == 512 * MiB and top["start_pct"] < 5 and top["end_pct"] > 80


def test_patterns_group_iteration_roles(tmp_path):
    # The activation X is freed 5 us after its last access each iteration: with a 1% slack that
    # is a late free, reported once for the 6 instances.
    tr, _ = training_trace()
    a = analyse(read_capture(_write(tmp_path, tr)), progress=False)
    d = patterns_dict(a, slack_pct=1.0, kinds=["late-free"])
    x = [f for f in d["findings"] if f["bytes"] == 4 * MiB]
    assert len(x) == 1 and x[0]["instances"] == 6 and x[0]["wasted_ns"] == 5_000
    assert (x[0]["start_pct"], x[0]["end_pct"]) == (30.0, 35.0)


def test_bad_flags(tmp_path, capsys):
    tr, _ = training_trace()
    path = _write(tmp_path, tr)
    # bad numbers are usage errors: exit 2 with the usage line, like argparse's own
    for argv, msg in ((["stats", "--bandwidth", "0"], "argument --bandwidth: '0' is not a positive number"),
                      (["stats", "--bandwidth", "nan"], "argument --bandwidth: 'nan' is not a positive number"),
                      (["stats", "--bandwidth", "inf"], "argument --bandwidth: 'inf' is not a positive number"),
                      (["stats", "--top", "-1"], "argument --top: '-1' is not an integer >= 0"),
                      (["patterns", "--slack-pct", "-5"], "argument --slack-pct: '-5' is not a number >= 0"),
                      (["patterns", "--idle-pct", "nan"], "argument --idle-pct: 'nan' is not a number >= 0"),
                      (["patterns", "--limit", "-1"], "argument --limit: '-1' is not an integer >= 0")):
        with pytest.raises(SystemExit) as e:
            main(argv + [path])
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and err.startswith("usage: pyobmem "), (argv, err)
    assert main(["stats", str(tmp_path / "missing.pyobmem")]) == 2
