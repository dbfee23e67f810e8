"""What a new user hit with stats / patterns / report / export: tracebacks, the input destroyed by
-f, corrupt records, truncated captures, noisy patterns, units and time origins. On the real
captures of tests/data/ and on copies of them damaged on purpose."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import warnings

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.capture import read_capture, read_header
from pyobmem.cli import build_parser, main
from pyobmem.commands.common import short_name
from pyobmem.commands.patterns import format_patterns, patterns_dict
from pyobmem.commands.stats import stats_dict
from pyobmem.commands.summary import summarize
from pyobmem.model import analyse
from pyobmem.model.inefficiency import leak_cutoff
from pyobmem.model.sanitize import sanitize
from helpers import one_error_line

DATA = os.path.join(os.path.dirname(__file__), "data")
GPT = os.path.join(DATA, "gpt_tiny.pyobmem")
JAX = os.path.join(DATA, "jax.pyobmem")


def _copy(tmp_path, src=GPT, name="cap.pyobmem") -> str:
    dst = tmp_path / name
    shutil.copy(src, dst)
    return str(dst)


def _with_meta(tmp_path, meta_update: dict, src=GPT) -> str:
    """A copy of ``src`` whose metadata JSON has ``meta_update`` applied."""
    meta, off = read_header(src)
    meta.update(meta_update)
    blob = json.dumps(meta).encode()
    with open(src, "rb") as f:
        prefix = f.read(16)
        f.seek(off)
        records = f.read()
    magic, version, _ = struct.unpack("<8sII", prefix)
    dst = tmp_path / "meta.pyobmem"
    dst.write_bytes(struct.pack("<8sII", magic, version, len(blob)) + blob + records)
    return str(dst)


def _corrupt(tmp_path, seed: int, n: int = 40) -> str:
    """A copy of gpt_tiny with ``n`` records given a random 63-bit value in one field."""
    dst = _copy(tmp_path, name=f"bad{seed}.pyobmem")
    _, off = read_header(dst)
    recs = np.fromfile(dst, dtype=abi.RECORD_DTYPE, offset=off)
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(recs) - 1, n, replace=False):  # not the end record
        recs[rng.choice(["ts_ns", "a", "b", "c", "d", "e"])][i] = rng.integers(0, 2**63, dtype=np.int64)
    with open(dst, "r+b") as f:
        f.seek(off)
        f.write(recs.tobytes())
    return dst


# --- 1. errors are one line -----------------------------------------------------------------


def test_output_is_a_directory(tmp_path, capsys):
    d = tmp_path / "somedir"
    d.mkdir()
    for argv in (["report", "-f", GPT, "-o", str(d)], ["export", "-f", "--format", "csv", GPT, "-o", str(d)]):
        assert main(argv) == 1
        one_error_line(capsys.readouterr().err, f"{d} is a directory", exact=False)
    assert list(d.iterdir()) == [] and not list(tmp_path.glob("somedir.tmp*"))


@pytest.mark.parametrize("meta", [
    {"env": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}, {"env": ["a", "b"]}, {"presets": ["x"]},
    {"presets": None}, {"command": 42}, {"command": None, "argv": "python train.py"}, {"argv": [1, 2]},
    {"start_monotonic_ns": "soon"}, {"copy_bandwidth": float("inf")},
])
def test_metadata_of_wrong_types(tmp_path, capsys, meta):
    path = _with_meta(tmp_path, meta)
    assert main(["report", path, "-o", str(tmp_path / "r.html")]) == 0
    assert main(["export", "--format", "memory-viz", path, "-o", str(tmp_path / "m.pickle")]) == 0
    assert main(["stats", path]) == 0
    html = (tmp_path / "r.html").read_text()
    if "command" in meta and meta["command"] is not None:
        assert "42" in html
    assert "Traceback" not in capsys.readouterr().err


def test_corrupt_records_are_left_out_and_said_once(tmp_path, capsys):
    clean = stats_dict(analyse(read_capture(GPT), progress=False))
    for seed in (1, 2, 3):
        path = _corrupt(tmp_path, seed)
        cap, n = sanitize(read_capture(path))
        assert n > 0 and cap.corrupt_records == n
        t = cap.ops["ts_ns"]
        assert np.all(np.diff(t) >= 0) and t[0] >= read_header(path)[0]["start_monotonic_ns"]
        assert np.all(cap.blocks["size"] <= 1 << 50)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no RuntimeWarning (overflow) reaches the user
            for argv in (["stats", path], ["patterns", path], ["report", "-f", path, "-o", str(tmp_path / "r.html")],
                         ["export", "-f", "--format", "perfetto", path, "-o", str(tmp_path / "p.json")],
                         ["export", "-f", "--format", "memory-viz", path, "-o", str(tmp_path / "m.pickle")]):
                assert main(argv) == 0, argv
                out, err = capsys.readouterr()
                said = [x for x in err.splitlines() if "corrupt record" in x]
                assert said == [f"pyobmem: warning: the capture has {n} corrupt records (impossible times "
                                f"or sizes); they were left out"], (argv, err)
                if argv[0] == "stats":
                    # sane figures: nothing longer than the run, nothing larger than the GPU
                    d = stats_dict(analyse(cap, progress=False))
                    assert d["peak_live_bytes"] <= clean["peak_live_bytes"]
                    assert all(b["lifetime_iterations"] is None or 0 <= b["lifetime_iterations"] < 100
                               for b in d["top_blocks"])
                    assert "TiB" not in out
                if argv[0] == "patterns":
                    assert " s (" not in out or all(float(m) < 100 for m in re.findall(r"([\d.]+) s \(", out))
    # a clean capture has no corrupt record and is returned as it is
    cap = read_capture(GPT)
    assert sanitize(cap) == (cap, 0)


# --- 2. -f never destroys the input -----------------------------------------------------------


def test_output_is_another_capture(tmp_path, capsys):
    """-f overwrites an old report or export, never a capture (a slip of -o loses no recording)."""
    path = _copy(tmp_path)
    other = _copy(tmp_path, name="other.pyobmem")
    before = open(other, "rb").read()
    assert main(["report", "-f", path, "-o", other]) == 1
    one_error_line(capsys.readouterr().err, f"{other} is a pyobmem capture; -f never overwrites one: choose another output (-o FILE)")
    assert main(["export", "-f", "--format", "csv", "-o", other, path]) == 1
    one_error_line(capsys.readouterr().err, "is a pyobmem capture", exact=False)
    assert open(other, "rb").read() == before


def test_output_is_the_input(tmp_path, capsys):
    path = _copy(tmp_path)
    before = open(path, "rb").read()
    os.link(path, tmp_path / "hard.pyobmem")
    for out in (path, str(tmp_path / "hard.pyobmem"), str(tmp_path / "." / "cap.pyobmem")):
        assert main(["report", "-f", path, "-o", out]) == 1
        one_error_line(capsys.readouterr().err, "is the capture being read", exact=False)
        for fmt in ("csv", "perfetto", "memory-viz"):
            assert main(["export", "-f", "--format", fmt, "-o", out, path]) == 1
            one_error_line(capsys.readouterr().err, "is the capture being read", exact=False)
    assert open(path, "rb").read() == before


# --- 3. one iteration count and length across the verbs -----------------------------------------


def test_jax_verbs_agree_on_iterations(capsys):
    cap = read_capture(JAX)
    s = summarize(cap)["iteration"]
    st = stats_dict(analyse(cap, progress=False))
    ra = analyse(read_capture(JAX), progress=False)
    pd = patterns_dict(analyse(read_capture(JAX), progress=False))
    assert (s["launches"], s["repeats"]) == (st["period_ops"], st["iterations_found"]) == (11, 19)
    assert (ra.iteration_ops, len(ra.iteration_windows)) == (11, 19)
    lens = ra.iteration_windows[:, 1] - ra.iteration_windows[:, 0]
    assert s["period_ns"] == round(st["iteration_ns"]) == round(float(np.median(lens))) == round(pd["iteration_ns"])


# --- 4. truncated captures ----------------------------------------------------------------------


def test_truncated_capture(tmp_path, capsys):
    path = tmp_path / "trunc.pyobmem"
    path.write_bytes(open(GPT, "rb").read()[:100_000])
    assert main(["stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "iterations: no iteration was found" in out and "ops per iteration" not in out
    a = analyse(read_capture(str(path)), progress=False)
    assert a.iterations.main < 0 and all(r.period_ops >= 2 for r in a.iterations.regimes)
    for argv in (["report", str(path), "-o", str(tmp_path / "r.html")],
                 ["export", "--format", "csv", str(path), "-o", str(tmp_path / "c.csv")]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert len([x for x in err.splitlines() if "incomplete" in x]) == 1, err
        assert "pyobmem: warning: the capture is incomplete" in err
    assert main(["export", "--format", "csv", GPT, "-o", str(tmp_path / "full.csv")]) == 0
    assert "incomplete" not in capsys.readouterr().err


# --- 5. patterns: leaks, duplicates, shares, names, --limit ---------------------------------------


def test_patterns_on_pytorch_are_not_noise(capsys):
    a = analyse(read_capture(GPT), progress=False)
    d = patterns_dict(a)
    kinds = {}
    for f in d["findings"]:
        kinds.setdefault(f["row"], set()).add(f["kind"])
    # never-accessed and leaked are never both given for a block
    assert not any({"never-accessed", "leaked"} <= k for k in kinds.values())
    # a segment still used in the last iterations is not leaked
    cut = leak_cutoff(a.iterations, a.blocks)
    for f in d["findings"]:
        if f["kind"] == "leaked":
            assert a.blocks.last_t[f["row"]] < cut
    last = a.iterations.main_rows()[-1]
    used_at_end = np.flatnonzero((a.blocks.t_free < 0) & (a.blocks.last_t >= a.iterations.t_start[last]))
    assert len(used_at_end) and not any(f["kind"] == "leaked" and f["row"] in used_at_end for f in d["findings"])
    text = format_patterns(d, limit=0, width=120)
    assert max(len(x) for x in text.splitlines()) <= 130  # kernel names cut to the width
    shares = [float(m) for m in re.findall(r"\((\d+)% it\)", text)]
    assert shares and max(shares) < 100  # past one iteration: "(2.0 it)", never "(6608% it)"
    assert "_ZN" not in text


def test_patterns_limit_counts(tmp_path, capsys):
    d = patterns_dict(analyse(read_capture(GPT), progress=False))
    n = len(d["findings"])
    assert n > 3
    rows = lambda text: sum(1 for x in text.splitlines() if x.startswith("  ") and x.split()[0] in  # noqa: E731
                            ("early-allocation", "late-free", "long-idle", "never-accessed", "leaked"))
    assert rows(format_patterns(d, limit=0)) == n and "more" not in format_patterns(d, limit=0)
    t = format_patterns(d, limit=3)
    assert rows(t) == 3 and f"... {n - 3} more" in t
    assert rows(format_patterns(d, limit=n)) == n


def test_short_kernel_names():
    mangled = "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_4abcdEvE"
    assert short_name(mangled, 40, {}) == "at::native::elementwise_kernel"
    dem = {mangled: "void at::native::(anonymous namespace)::elementwise_kernel<128, 2, foo<bar> >(int, float)"}
    assert short_name(mangled, 200, dem) == "at::native::{anon}::elementwise_kernel<128, 2, foo<bar> >"
    assert short_name(mangled, 40, dem) == "elementwise_kernel<128, 2, foo<bar> >"
    assert short_name(mangled, 30, dem) == "elementwise_kernel<128, 2, fo…"
    assert short_name(mangled, 22, dem) == "elementwise_kernel"
    assert len(short_name(mangled, 10, dem)) == 10
    assert short_name("memcpy HTOD", 40, {}) == "memcpy HTOD"


# --- 6. one unit, FILE, time origin ---------------------------------------------------------------


def test_units_metavars_and_time_origin(tmp_path, capsys):
    assert main(["stats", GPT]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\d us\b", out) and "times: t = 0 at the first CUDA event" in out
    d = stats_dict(analyse(read_capture(GPT), progress=False))
    cap = read_capture(GPT)
    first = min(int(cap.ops["ts_ns"].min()), int(cap.blocks["t_alloc"].min()))
    assert d["origin_monotonic_ns"] == first and d["regimes"][0]["start_ns"] == int(
        analyse(cap, progress=False).iterations.t_start[0]) - first
    assert main(["report", GPT, "-o", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "t = 0 at the first CUDA event" in html and "duration (first to last CUDA event)" in html
    sub = build_parser()._subparsers._group_actions[0].choices
    for verb in ("stats", "patterns", "report", "export"):
        assert "FILE" in sub[verb].format_usage(), verb


# --- 7. invented slice lengths are said where users read ------------------------------------------


def test_perfetto_slice_lengths_are_documented():
    sub = build_parser()._subparsers._group_actions[0].choices
    helptext = " ".join(sub["export"].format_help().split())
    assert "length is invented" in helptext and "50 µs" in helptext
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    line = next(x for x in readme.splitlines() if x.startswith("pyobmem export"))
    assert "invented" in line
