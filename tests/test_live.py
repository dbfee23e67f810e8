"""`pyobmem live`: the incremental reader, the figures against the other verbs, the screen without
a terminal, and the view in a real terminal (tmux) on a capture growing under it, and under
`pyobmem-run --live` on the fake driver.

The terminal tests wait for what the screen must show (up to a deadline, never for a time).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from synth import Trace

from pyobmem import abi
from pyobmem.capture import MAGIC, read_capture, read_header, read_records
from pyobmem.commands.summary import summarize
from pyobmem.errors import CaptureError
from pyobmem.live import tail as tail_mod
from pyobmem.live.figures import figures
from pyobmem.live.tail import CaptureTail
from pyobmem.live.view import Reader
from pyobmem.model import analyse, blocks_by_class
from pyobmem.model.sanitize import sanitize
from pyobmem.units import format_bytes

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GPT = DATA / "gpt_tiny.pyobmem"
PY = sys.executable
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def _split(path: Path) -> tuple[bytes, bytes]:
    """(header bytes, record bytes) of a capture file."""
    raw = path.read_bytes()
    offset = read_header(str(path))[1]
    return raw[:offset], raw[offset:]


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYOBMEM_", "XLA_", "PYTORCH_", "CUPY_"))}
    env.pop("LD_PRELOAD", None)
    env.update({"PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", "COLUMNS": "120"})
    env.update(extra or {})
    return env


def pyobmem(*args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "pyobmem", *map(str, args)], cwd=cwd, env=env or _env(), capture_output=True,
                          text=True, timeout=120)


# ------------------------------------------------------------------ the incremental reader


def test_tail_reads_each_record_once_and_waits_for_a_partial_one(tmp_path):
    header, body = _split(GPT)
    n = len(body) // abi.RECORD_SIZE
    path = tmp_path / "g.pyobmem"
    t = CaptureTail(str(path))
    assert len(t.poll()) == 0 and t.waiting  # no file yet
    path.write_bytes(b"")
    assert len(t.poll()) == 0 and t.waiting  # created, header not written yet
    with open(path, "ab") as f:
        f.write(header[:10])
        f.flush()
        assert len(t.poll()) == 0 and t.waiting  # half a header
        f.write(header[10:])
        f.flush()
        assert len(t.poll()) == 0 and not t.waiting and t.meta["argv"][0] == "python3"
        got = []
        cuts = [0, 1000 * 64 + 30, 1000 * 64 + 63, 2500 * 64 + 1, len(body)]  # some in mid-record
        for a, b in zip(cuts, cuts[1:]):
            f.write(body[a:b])
            f.flush()
            recs = t.poll()
            assert len(recs) == b // 64 - len(b"".join(got)) // 64  # only whole records, only new ones
            got.append(recs.tobytes())
            assert len(t.poll()) == 0  # nothing new: nothing read
    assert b"".join(got) == body and len(body) // 64 == n == 3536
    assert t.bytes_read == len(body) and t.behind == 0  # each byte read once


def test_tail_large_file_is_read_over_several_polls(tmp_path, monkeypatch):
    monkeypatch.setattr(tail_mod, "MAX_READ", 1000)
    t = CaptureTail(str(GPT))
    sizes = []
    while True:
        sizes.append(len(t.poll()))
        if not t.behind:
            break
    assert sizes == [1000, 1000, 1000, 536] and t.bytes_read == 3536 * 64


def test_tail_starts_over_when_the_file_is_replaced(tmp_path):
    header, body = _split(GPT)
    path = tmp_path / "g.pyobmem"
    path.write_bytes(header + body[: 100 * 64])
    t = CaptureTail(str(path))
    assert len(t.poll()) == 100 and not t.reset
    # A new run with -f: the same name, a new header (another start time) and fewer records.
    meta = dict(read_header(str(GPT))[0], start_time=2e9)
    blob = json.dumps(meta).encode()
    new_header = struct.pack("<8sII", MAGIC, 1, len(blob)) + blob
    path.write_bytes(new_header + body[: 40 * 64])
    recs = t.poll()
    assert t.reset and len(recs) == 40 and recs.tobytes() == body[: 40 * 64]


@pytest.mark.parametrize("content, message", [
    (b"\x7fELF\x02\x01\x01" + b"\0" * 64, "not a pyobmem capture"),
    (b"PYOB", None),  # a header being written: waited for
    (struct.pack("<8sII", MAGIC, 9, 2) + b"{}", "capture format version 9 is newer than this pyobmem reads (1); upgrade pyobmem"),
])
def test_tail_foreign_or_newer_is_an_error_at_once(tmp_path, content, message):
    path = tmp_path / "x.pyobmem"
    path.write_bytes(content)
    t = CaptureTail(str(path))
    if message is None:
        assert len(t.poll()) == 0 and t.waiting
        return
    with pytest.raises(CaptureError) as e:
        t.poll()
    assert str(e.value) == f"{path}: {message}"


def test_tail_header_never_completed_is_truncated_after_the_grace(tmp_path):
    path = tmp_path / "x.pyobmem"
    path.write_bytes(_split(GPT)[0][:100])
    now = [0.0]
    t = CaptureTail(str(path), clock=lambda: now[0])
    assert len(t.poll()) == 0 and t.waiting
    now[0] = tail_mod.HEADER_GRACE_S - 0.1
    assert len(t.poll()) == 0 and t.waiting
    now[0] = tail_mod.HEADER_GRACE_S
    with pytest.raises(CaptureError) as e:
        t.poll()
    assert str(e.value) == f"{path}: truncated capture (metadata incomplete)"


def test_tail_without_wait_says_why_there_is_nothing(tmp_path):
    with pytest.raises(CaptureError) as e:
        CaptureTail(str(tmp_path / "none.pyobmem"), wait=False).poll()
    assert str(e.value) == f"{tmp_path / 'none.pyobmem'}: cannot read capture: No such file or directory"


# ------------------------------------------------------------------ the figures


def test_figures_of_gpt_tiny_are_the_summary_and_stats_figures():
    cap = read_capture(str(GPT))
    s = summarize(cap)
    f = figures(sanitize(cap)[0])
    assert f.complete and f.exit_status == 0 and f.duration_ns == s["capture"]["duration_ns"] == 731_441_554
    assert f.live_bytes == s["allocations"]["live_at_end"]["bytes"] == 998_246_400  # 952.0 MiB
    assert f.live_blocks == s["allocations"]["live_at_end"]["count"] == 20
    assert f.peak_live_bytes == s["allocations"]["peak_live_bytes"]
    assert f.ops == 1687 and f.launches == s["launches"]["count"] == 1516 and f.blocks == 20
    # stats' blocks by class (every block of gpt_tiny is live at the end)
    by_class = {c: {"count": n, "bytes": b} for c, n, b in f.classes}
    assert by_class == blocks_by_class(analyse(cap, progress=False).blocks)
    assert by_class["persistent"] == {"count": 15, "bytes": 856 << 20}
    assert by_class["never-accessed"] == {"count": 5, "bytes": (96 << 20) + 2048}
    it = f.iteration
    assert it.count == s["iteration"]["repeats"] == 9 and it.period_ops == 151 and it.pid == 2160
    assert it.median_ns == s["iteration"]["period_ns"]
    assert not it.tail_in_iteration and it.tail_ops == 9 and it.last_ns == 10_862_478
    assert [b.label for b in f.largest[:4]] == ["2160:12", "2160:13", "2160:14", "2160:20"]
    assert f.largest[0].size == 198 << 20 and f.largest[0].cls == "persistent" and f.largest[0].kind == "driver"
    assert f.largest[4].idle_ns is None and f.largest[4].cls == "never-accessed"
    assert f.history[-1] == f.live_bytes and max(f.history) == f.peak_live_bytes and len(f.history) == 40
    assert f.dropped == 0 and f.swap is None and f.card_bytes == 150_109_880_320


def test_figures_read_in_pieces_equal_the_figures_of_the_whole_file(tmp_path):
    header, body = _split(GPT)
    path = tmp_path / "g.pyobmem"
    path.write_bytes(header)
    r = Reader(str(path))
    seen = []
    with open(path, "ab") as f:
        for a in range(0, len(body), 700 * 64 + 17):
            f.write(body[a : a + 700 * 64 + 17])
            f.flush()
            r.step(0.0)
            r.compute_now()
            seen.append((r.figures.ops, r.figures.iteration.count if r.figures.iteration else 0, r.figures.complete))
    assert r.figures == figures(sanitize(read_capture(str(path)))[0], 0)  # the file is gpt_tiny again
    assert seen[-1] == (1687, 9, True) and all(not c for _, _, c in seen[:-1])
    assert [o for o, _, _ in seen] == sorted(o for o, _, _ in seen) and seen[0][0] < 300


def _swap_trace(path):
    t = Trace(pid=7, dt_ns=1_000_000)
    t.text(abi.Ev.NOTE, 0, f"device0.total_bytes={1 << 30}")
    a, b = t.alloc(64 << 20), t.alloc(32 << 20)
    for _ in range(6):
        t.launch(0x10, [a])
        t.launch(0x20, [b])
        t.launch(0x30, [a, b])
    t.add(abi.Ev.SWAP_OUT, block_id=a, bytes=64 << 20, duration_ns=5000)
    t.add(abi.Ev.SWAP_IN, flags=int(abi.SwapInCause.LATE), block_id=a, bytes=64 << 20, duration_ns=3000)
    t.add(abi.Ev.SWAP_OUT, block_id=a, bytes=64 << 20, duration_ns=5000)
    t.add(abi.Ev.SWAP_IN, flags=int(abi.SwapInCause.DEMAND), block_id=a, bytes=64 << 20, duration_ns=3000)
    t.add(abi.Ev.SWAP_OUT, block_id=a, bytes=64 << 20, duration_ns=5000)
    meta = {"argv": ["train"], "command": "train", "swap": {"budget": "80MiB", "budget_bytes": 80 << 20}}
    t.write(path, meta=meta)


def test_figures_in_swap_mode_budget_swaps_late(tmp_path):
    _swap_trace(tmp_path / "s.pyobmem")
    f = figures(read_capture(str(tmp_path / "s.pyobmem")))
    w = f.swap
    assert (w.budget, w.budget_bytes) == ("80MiB", 80 << 20)
    assert w.resident_bytes == 32 << 20  # A is out at the end
    assert w.peak_resident_bytes == 96 << 20
    assert (w.out_count, w.out_bytes, w.in_count, w.late, w.demand, w.prefetch_hits) == (3, 192 << 20, 2, 1, 1, 0)
    assert [(b.label, b.out) for b in f.largest] == [("7:1", True), ("7:2", False)]


# ------------------------------------------------------------------ the screen without a terminal


def test_live_without_a_terminal_prints_the_state_once(tmp_path):
    p = pyobmem("live", GPT, cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == ""
    out = p.stdout
    assert "finished: exit status 0; 3,536 records (221.0 KiB) read" in out
    assert "952.0 MiB in 20 blocks" in out and "iterations  9, 151 ops each" in out and "pid 2160" in out
    assert "persistent             15   856.0 MiB" in out and "never-accessed          5    96.0 MiB" in out
    assert re.search(r"2160:12 +198.0 MiB +persistent +driver +306.2 ms +5.7 ms +device", out)
    assert "drops       none" in out and "quit" not in out


def test_live_screen_in_swap_mode(tmp_path):
    _swap_trace(tmp_path / "s.pyobmem")
    out = pyobmem("live", "s.pyobmem", cwd=tmp_path).stdout
    assert "32.0 MiB resident of 80.0 MiB (budget 80MiB; peak 96.0 MiB, over it for" in out
    assert "3 out (192.0 MiB), 2 in (128.0 MiB): 0 prefetch hits" in out
    assert "1 late prefetch, 1 swap-in on demand" in out
    assert "7:1" in out and "host" in out


@pytest.mark.parametrize("content, message", [
    (None, "cannot read capture: No such file or directory"),
    (b"\x7fELF" + b"\0" * 64, "not a pyobmem capture"),
    (b"PYOBCAPT\x01\0\0\0\x40\0\0\0{", "truncated capture (metadata incomplete)"),
])
def test_live_bad_capture_one_line_exit_2(tmp_path, content, message):
    if content is not None:
        (tmp_path / "x.pyobmem").write_bytes(content)
    p = pyobmem("live", "x.pyobmem", cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [f"pyobmem: error: x.pyobmem: {message}"]


def test_run_live_needs_a_terminal(tmp_path):
    code = "import sys; from pyobmem.cli import run_main; sys.exit(run_main())"
    p = subprocess.run([PY, "-c", code, "--live", "true"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert p.returncode == 2 and not list(tmp_path.iterdir())
    assert p.stderr.splitlines() == [
        "pyobmem: error: --live needs a terminal (stdin and stdout); watch from another one with: pyobmem live FILE"]


# ------------------------------------------------------------------ in a real terminal (tmux)


class Tmux:
    """One tmux server of the test's own (a socket in tmp_path) running one 120x40 pane."""

    def __init__(self, tmp_path: Path, env: dict):
        if shutil.which("tmux") is None:
            pytest.skip("tmux is not installed (apt-get install tmux): the live view is tested in a real terminal")
        self.sock, self.env = str(tmp_path / "tmux.sock"), env

    def tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-u", "-S", self.sock, *args], env=self.env, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def start(self, script: Path) -> None:
        self.tmux("new-session", "-d", "-x", "120", "-y", "40", f"sh {script}")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J")  # -J: a wrapped line as one

    def wait_for(self, *texts: str, deadline_s: float = 60.0) -> str:
        """The screen once it shows every one of ``texts`` (fails at the deadline)."""
        end = time.monotonic() + deadline_s
        while True:
            screen = self.screen()
            if all(t in screen for t in texts):
                return screen
            assert time.monotonic() < end, f"the screen never showed {texts}:\n{screen}"
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], env=self.env, capture_output=True, timeout=30)


def _wait_file(path: Path, deadline_s: float = 60.0) -> str:
    end = time.monotonic() + deadline_s
    while not path.exists() or not path.read_text().endswith("\n"):
        assert time.monotonic() < end, f"{path} never written"
        time.sleep(0.1)
    return path.read_text()


def _script(tmp_path: Path, command: str) -> Path:
    """A shell script that runs ``command`` in the pane and writes its exit code and the terminal's
    settings before and after (a view that left the terminal changed shows up as a difference).
    Ctrl-C reaches the whole foreground group: the script traps it, as an interactive shell would
    (a trap, not an ignored SIGINT, which the command would inherit)."""
    script = tmp_path / "pane.sh"
    script.write_text(f"cd {tmp_path}\ntrap : INT\nstty -g > stty.before\n{command}\necho $? > rc\n"
                      "stty -g > stty.after\nsleep 30\n")
    return script


@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_live_in_tmux_follows_a_growing_capture_and_quits_cleanly(tmp_path, quit_key):
    header, body = _split(GPT)
    s = summarize(read_capture(str(GPT)))
    term = Tmux(tmp_path, _env())
    path = tmp_path / "g.pyobmem"
    term.start(_script(tmp_path, f"{PY} -m pyobmem live g.pyobmem"))
    try:
        term.wait_for("waiting for g.pyobmem (the run has not written its capture yet)")
        with open(path, "wb") as f:
            # The daemon's order: the header, then records in batches; here cut in mid-record.
            f.write(header + body[: 1000 * 64 + 40])
            f.flush()
            first = term.wait_for("running: 1,000 records (62.5 KiB) read", "ops (")
            assert "finished" not in first
            f.write(body[1000 * 64 + 40 : -64])  # all but the end record
            f.flush()
            term.wait_for("running: 3,535 records", f"{s['iteration']['repeats']} so far, 151 ops each",
                          "current")
            f.write(body[-64:])
            f.flush()
        live = format_bytes(s["allocations"]["live_at_end"]["bytes"])
        final = term.wait_for("finished: exit status 0; 3,536 records (221.0 KiB) read",
                              f"live at end  {live} in 20 blocks", "iterations  9, 151 ops each")
        assert "persistent             15   856.0 MiB" in final and "2160:12" in final
        term.tmux("send-keys", quit_key)
        assert _wait_file(tmp_path / "rc") == "0\n"
        assert _wait_file(tmp_path / "stty.after") == (tmp_path / "stty.before").read_text()
        assert "pyobmem live" not in term.screen()  # the alternate screen is gone
    finally:
        term.close()


NEEDS_FAKE_DRIVER = pytest.mark.skipif(not (CUDA_INCLUDE / "cuda.h").exists() or shutil.which("gcc") is None,
                                       reason="needs gcc and the CUDA headers")


def _run_live_pane(tmp_path, build_fake_program, steps: int, ms: int) -> Tmux:
    """`pyobmem-run --live -o r.pyobmem driver steps N MS` in a tmux pane, on the fake driver."""
    bindir = build_fake_program("driver", "-ldl", "-lpthread")
    env = _env({"LD_LIBRARY_PATH": str(bindir), "PYOBMEM_CUPTI": "0"})
    term = Tmux(tmp_path, env)
    run = f"{PY} -c 'import sys; from pyobmem.cli import run_main; sys.exit(run_main())'"
    term.start(_script(tmp_path, f"{run} --live -o r.pyobmem {bindir / 'driver'} steps {steps} {ms}"))
    return term


@NEEDS_FAKE_DRIVER
def test_run_live_in_tmux_on_the_fake_driver(tmp_path, build_fake_program):
    term = _run_live_pane(tmp_path, build_fake_program, 30, 20)
    try:
        screen = term.wait_for("finished: exit status 0", "step=29", "done=1")
        s = summarize(read_capture(str(tmp_path / "r.pyobmem")))
        assert s["iteration"]["repeats"] == 30 and s["allocations"]["live_at_end"]["bytes"] == 8 << 20
        assert "iterations  30, 4 ops each" in screen and "live at end  8.0 MiB in 1 block" in screen
        assert f"the command's output goes to {tmp_path / 'r.log'}" in screen
        assert "init_rc" not in screen  # the command's output is in the log, not on the view
        term.tmux("send-keys", "q")
        assert _wait_file(tmp_path / "rc") == "0\n"
        after = term.screen()
        assert f"pyobmem: the command's output is in {tmp_path / 'r.log'}" in after
        assert "pyobmem: iteration: 4 ops per iteration" in after and "(30 iterations" in after
        assert "the live view is closed" not in after
        assert _wait_file(tmp_path / "stty.after") == (tmp_path / "stty.before").read_text()
        log = (tmp_path / "r.log").read_text().splitlines()
        assert [line for line in log if line.startswith("step=")] == [f"step={i}" for i in range(30)]
        assert log[-1] == "done=1"
    finally:
        term.close()


@NEEDS_FAKE_DRIVER
@pytest.mark.parametrize("key, rc", [("q", 0), ("C-c", 130)])
def test_run_live_quit_during_the_run(tmp_path, build_fake_program, key, rc):
    """q closes the view and the run goes on to its end; Ctrl-C stops the run, as without --live."""
    term = _run_live_pane(tmp_path, build_fake_program, 2000, 5)  # 10 s unless stopped
    try:
        term.wait_for("running: ", "current")
        term.tmux("send-keys", key)
        assert _wait_file(tmp_path / "rc") == f"{rc}\n"
        cap = read_capture(str(tmp_path / "r.pyobmem"))
        log = (tmp_path / "r.log").read_text().splitlines()
        after = term.screen()
        if key == "q":
            assert f"pyobmem: the live view is closed; the run goes on (its output: {tmp_path / 'r.log'})" in after
            assert cap.exit_status == 0 and log[-1] == "done=1" and "step=1999" in log
        else:
            assert cap.exit_status == -2 and "done=1" not in log, after  # killed by SIGINT
            assert "the live view is closed" not in after
        assert "capture complete" in after and "pyobmem live" not in after
        assert _wait_file(tmp_path / "stty.after") == (tmp_path / "stty.before").read_text()
    finally:
        term.close()
