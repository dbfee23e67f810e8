"""CSV export: one row per event, exact rows for a small trace, counts for a training loop."""

import csv

import pytest

from pyobmem import abi
from pyobmem.capture import read_capture
from pyobmem.errors import PyobmemError
from pyobmem.export import export
from pyobmem.export.csv import COLUMNS

from synth import Trace
from test_report import htod, training_trace


def _read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_exact_rows(tmp_path):
    t = Trace()  # dt 1000 ns; PROCESS record at 1000
    a = t.alloc(4096)  # 2000, addr 0x7f0000000000
    t.text(abi.Ev.KERNEL_NAME, 0xAB, "my_kernel")  # 3000
    t.launch(0xAB, [a], [64], stream=7)  # LAUNCH 4000, ACCESS 5000
    htod(t, a, 4096)  # MEMCPY 6000
    t.free(a)  # 7000
    t.write(tmp_path / "s.pyobmem")
    cap = read_capture(str(tmp_path / "s.pyobmem"))
    export(cap, "csv", str(tmp_path / "s.csv"))
    rows = _read(tmp_path / "s.csv")
    assert rows[0] == list(COLUMNS)
    # t = 0 at the first CUDA event (the allocation at 2000); block: pid:block id, as in every verb
    assert rows[1:] == [
        ["0", "100", "alloc", "", "", "0", "100:1", "0x7f0000000000", "4096", "", ""],
        ["2000", "100", "launch", "1", "my_kernel", "7", "", "", "", "", ""],
        ["2000", "100", "access", "1", "my_kernel", "7", "100:1", "0x7f0000000000", "4096", "64", ""],
        ["4000", "100", "memcpy", "2", "memcpy HTOD", "0", "", "", "", "", "4096"],
        ["4000", "100", "access", "2", "memcpy HTOD", "0", "100:1", "0x7f0000000000", "4096", "0", ""],
        ["5000", "100", "free", "", "", "0", "100:1", "0x7f0000000000", "4096", "", ""],
    ]


def test_csv_row_count_is_event_count(tmp_path):
    t, _ = training_trace(iterations=4)
    t.write(tmp_path / "t.pyobmem")
    cap = read_capture(str(tmp_path / "t.pyobmem"))
    export(cap, "csv", str(tmp_path / "t.csv"))
    rows = _read(tmp_path / "t.csv")[1:]
    events = len(cap.blocks) + int((cap.blocks["t_free"] >= 0).sum()) + len(cap.ops) + len(cap.accesses)
    # 4 long-lived blocks + 4 per iteration, all of those freed; 7 ops and 18 accesses per iteration
    assert (len(cap.blocks), len(cap.ops), len(cap.accesses)) == (20, 28, 72)
    assert len(rows) == events == 20 + 16 + 28 + 72
    assert [int(r[0]) for r in rows] == sorted(int(r[0]) for r in rows)


def test_csv_refuses_existing_output(tmp_path):
    t, _ = training_trace(iterations=2)
    t.write(tmp_path / "t.pyobmem")
    cap = read_capture(str(tmp_path / "t.pyobmem"))
    out = tmp_path / "t.csv"
    out.write_text("keep me")
    with pytest.raises(PyobmemError, match="exists; use -f/--force") as err:
        export(cap, "csv", str(out))
    assert err.value.exit_code == 1 and out.read_text() == "keep me"
    export(cap, "csv", str(out), force=True)
    assert out.read_text().startswith("time_ns,pid,event")
    assert not list(tmp_path.glob("*.tmp*"))


def test_cli_export_verbs(tmp_path):
    """``pyobmem export``: an unknown format is one usage line (exit 2); an existing output is
    refused without -f (exit 1, one line, no traceback)."""
    import os
    import subprocess
    import sys

    t, _ = training_trace(iterations=2)
    t.write(tmp_path / "t.pyobmem")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def pyobmem(*args):
        return subprocess.run([sys.executable, "-m", "pyobmem", *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)

    r = pyobmem("export", "t.pyobmem", "--format", "svg")
    assert r.returncode == 2 and "invalid choice: 'svg'" in r.stderr
    r = pyobmem("export", "t.pyobmem", "--format", "csv")
    assert r.returncode == 0 and (tmp_path / "t.csv").exists()
    r = pyobmem("export", "t.pyobmem", "--format", "csv")
    assert r.returncode == 1 and r.stderr == "pyobmem: error: t.csv exists; use -f/--force to overwrite it\n"
    assert pyobmem("export", "t.pyobmem", "--format", "csv", "-f").returncode == 0
    # -o -: the same rows on standard output, no file named "-", nothing said on stderr
    r = pyobmem("export", "t.pyobmem", "--format", "csv", "-o", "-")
    assert r.returncode == 0 and r.stdout == (tmp_path / "t.csv").read_text() and r.stderr == ""
    assert not (tmp_path / "-").exists()
    r = pyobmem("report", "t.pyobmem", "-o", "r.html")
    assert r.returncode == 0 and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
