"""The daemon drains the ring into the capture: order, drops, stuck slots, being killed, disk full.

A Python producer below writes records into the ring the way the shim does (abi.h's protocol),
and the daemon runs as the launcher starts it: ``python -m pyobmem.daemon`` with the metadata and
``end <status>`` on its stdin.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.capture import read_capture, read_records
from pyobmem.ring import Ring

ROOT = str(Path(__file__).resolve().parents[1])
META = {"argv": ["test"], "note": "daemon test"}


class Producer:
    """One producer process's view of the ring, following abi.h's protocol (single thread)."""

    def __init__(self, path: str):
        self.ring = Ring.open(path)
        self.hdr, self.recs, self.cap = self.ring.header, self.ring.records, self.ring.capacity

    def reserve(self) -> int | None:
        """Claim the next slot; None (and the drop counted) when the ring is full."""
        pos = int(self.hdr["head"][0])
        slot = pos % self.cap
        if int(self.recs["seq"][slot]) != pos:
            self.hdr["dropped"] += 1
            return None
        self.hdr["head"] = pos + 1
        return pos

    def publish(self, pos: int, rec) -> None:
        slot = pos % self.cap
        for name in abi.RECORD_DTYPE.names[1:]:
            self.recs[name][slot] = rec[name]
        self.recs["seq"][slot] = pos + 1  # last: the record is whole when the daemon sees it

    def put(self, rec, wait: bool = False, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            pos = self.reserve() if not wait else self._reserve_waiting()
            if pos is not None:
                self.publish(pos, rec)
                return True
            if not wait or time.monotonic() > deadline:
                return False

    def _reserve_waiting(self) -> int | None:
        pos = int(self.hdr["head"][0])
        if int(self.recs["seq"][pos % self.cap]) != pos:
            time.sleep(0.0005)  # full: a test producer waits instead of dropping
            return None
        self.hdr["head"] = pos + 1
        return pos

    def drained(self) -> bool:
        return int(self.hdr["tail"][0]) == int(self.hdr["head"][0])

    def close(self):
        self.ring.close(unlink=False)


def make_records(n: int, start: int = 0) -> np.ndarray:
    recs = np.zeros(n, dtype=abi.RECORD_DTYPE)
    recs["type"] = abi.Ev.LAUNCH
    recs["pid"] = 4242
    recs["ts_ns"] = np.arange(start, start + n) * 10 + 1
    recs["a"] = np.arange(start, start + n)  # op seq: identifies each record
    recs["b"] = 0xF00D
    recs["e"] = 1
    return recs


def start_daemon(ring_path: str, out: Path, preexec_fn=None, stderr=None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyobmem.daemon", "--ring", ring_path, "--out", str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, preexec_fn=preexec_fn,
    )
    proc.stdin.write(json.dumps(META).encode() + b"\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"ready\n"
    return proc


def end_daemon(proc: subprocess.Popen, status: int) -> int:
    proc.stdin.write(f"end {status}\n".encode())
    proc.stdin.close()
    return proc.wait(30)


def wait_until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def ring(tmp_path):
    r = Ring.create(64, directory=str(tmp_path))
    yield r
    r.close(unlink=True)


def _payload(recs: np.ndarray) -> list:
    return recs[list(abi.RECORD_DTYPE.names[1:])].tolist()


def test_every_record_lands_in_order(ring, tmp_path):
    out = tmp_path / "c.pyobmem"
    daemon = start_daemon(ring.path, out)
    prod = Producer(ring.path)
    sent = make_records(5000)  # 78 times round a ring of 64
    for rec in sent:
        assert prod.put(rec, wait=True)
    assert end_daemon(daemon, 0) == 0
    meta, recs = read_records(str(out))
    assert meta == META
    assert _payload(recs[:-1]) == _payload(sent)
    assert recs["type"][-1] == abi.Ev.CAPTURE_END and int(recs["a"][-1]) == 0
    cap = read_capture(str(out))
    assert cap.complete and cap.exit_status == 0 and cap.dropped == 0
    assert len(cap.ops) == 5000 and cap.ops["seq"].tolist() == list(range(5000))
    assert prod.drained()
    prod.close()


def test_full_ring_drops_are_counted_in_capture_end(ring, tmp_path):
    prod = Producer(ring.path)
    sent = make_records(100)
    written = sum(prod.put(rec) for rec in sent)  # nobody drains yet: 64 fit, 36 are dropped
    assert written == 64 and ring.dropped == 36
    out = tmp_path / "d.pyobmem"
    daemon = start_daemon(ring.path, out)
    wait_until(prod.drained)
    late = make_records(1, start=1000)
    late["type"], late["a"] = abi.Ev.DROPPED, 36  # the shim reports its drops when space returns
    assert prod.put(late[0])
    assert end_daemon(daemon, 7) == 0
    cap = read_capture(str(out))
    assert cap.complete and cap.exit_status == 7
    assert cap.dropped == 36 and cap.drops["count"].tolist() == [36]
    assert cap.ops["seq"].tolist() == list(range(64))
    prod.close()


def test_killed_signal_status_is_recorded(ring, tmp_path):
    out = tmp_path / "s.pyobmem"
    daemon = start_daemon(ring.path, out)
    assert end_daemon(daemon, -signal.SIGKILL) == 0
    cap = read_capture(str(out))
    assert cap.complete and cap.exit_status == -9 and len(cap.ops) == 0


def test_unpublished_slot_is_skipped_and_counted(ring, tmp_path):
    """A producer killed between reserve and publish leaves a slot that would block the ring."""
    prod = Producer(ring.path)
    out = tmp_path / "k.pyobmem"
    daemon = start_daemon(ring.path, out)
    sent = make_records(21)
    for rec in sent[:10]:
        prod.put(rec)
    prod.reserve()  # never published
    for rec in sent[10:20]:
        prod.put(rec)
    prod.reserve()  # never published, and nothing after it
    t0 = time.monotonic()
    assert end_daemon(daemon, 0) == 0
    assert time.monotonic() - t0 < 5
    cap = read_capture(str(out))
    assert cap.ops["seq"].tolist() == list(range(20))
    assert cap.complete and cap.dropped == 2
    prod.close()


def test_daemon_killed_mid_run_leaves_a_readable_capture(ring, tmp_path):
    out = tmp_path / "m.pyobmem"
    daemon = start_daemon(ring.path, out)
    prod = Producer(ring.path)
    for rec in make_records(50):
        prod.put(rec, wait=True)
    wait_until(prod.drained)
    time.sleep(0.05)
    daemon.kill()
    daemon.wait()
    cap = read_capture(str(out))
    assert not cap.complete and cap.exit_status is None
    assert cap.ops["seq"].tolist() == list(range(50))
    assert cap.meta == META
    prod.close()


def test_launcher_gone_daemon_drains_and_exits(ring, tmp_path):
    """End of file on stdin without `end`: the launcher died; drain, no CAPTURE_END, remove the ring."""
    out = tmp_path / "g.pyobmem"
    daemon = start_daemon(ring.path, out)
    prod = Producer(ring.path)
    for rec in make_records(30):
        prod.put(rec)
    daemon.stdin.close()
    assert daemon.wait(10) == 0
    cap = read_capture(str(out))
    assert not cap.complete and cap.ops["seq"].tolist() == list(range(30))
    assert not os.path.exists(ring.path)
    prod.close()


@pytest.mark.parametrize("ending", ["launcher_gone", "end"])
def test_swap_mode_launcher_gone_daemon_removes_ring_and_control_file(tmp_path, ending):
    """Bug: a launcher killed (SIGKILL: no cleanup of its own) left ``<ring>.ctl``, the swap control
    file, in /dev/shm; the daemon removed only the ring. On end of file without ``end`` it now
    removes both; after ``end`` it removes neither (the launcher does, in its finally)."""
    from pyobmem.control import Control

    ring = Ring.create(1 << 10, directory=str(tmp_path))
    ctl = Control.create(ring.path + ".ctl", 0, 4 << 20)
    out = tmp_path / "c.pyobmem"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pyobmem.daemon", "--ring", ring.path, "--out", str(out), "--control", ctl.path,
         "--budget", "1GiB"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )
    daemon.stdin.write(json.dumps(META).encode() + b"\n")
    daemon.stdin.flush()
    assert daemon.stdout.readline() == b"ready\n"
    if ending == "end":
        daemon.stdin.write(b"end 0\n")
    daemon.stdin.close()  # the launcher's end of the pipe: what its death looks like
    assert daemon.wait(30) == 0
    left = sorted(os.listdir(tmp_path))
    if ending == "end":
        assert left == sorted(["c.pyobmem", os.path.basename(ring.path), os.path.basename(ctl.path)])
        assert read_capture(str(out)).complete
    else:
        assert left == ["c.pyobmem"]
        assert not read_capture(str(out)).complete
    ring.close(unlink=True)
    ctl.close(unlink=True)


def test_sigint_is_ignored(ring, tmp_path):
    out = tmp_path / "i.pyobmem"
    daemon = start_daemon(ring.path, out)
    prod = Producer(ring.path)
    prod.put(make_records(1)[0])
    daemon.send_signal(signal.SIGINT)
    time.sleep(0.2)
    assert daemon.poll() is None
    prod.put(make_records(1, start=1)[0])
    assert end_daemon(daemon, 0) == 0
    cap = read_capture(str(out))
    assert cap.complete and cap.ops["seq"].tolist() == [0, 1]
    prod.close()


def test_disk_full_says_one_line_and_keeps_draining(tmp_path):
    ring = Ring.create(256, directory=str(tmp_path))
    out = tmp_path / "f.pyobmem"
    header = 16 + len(json.dumps(META, sort_keys=True))
    limit = header + 10 * abi.RECORD_SIZE + 30  # room for 10 records and part of an 11th

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    daemon = start_daemon(ring.path, out, preexec_fn=small_files, stderr=subprocess.PIPE)
    prod = Producer(ring.path)
    for rec in make_records(200):
        assert prod.put(rec)
        if int(prod.hdr["head"][0]) == 100:
            wait_until(prod.drained)  # the write fails on these...
    wait_until(prod.drained)  # ...and the daemon still frees the slots
    assert end_daemon(daemon, 0) == 0
    err = daemon.stderr.read().decode()
    assert err.count("\n") == 1 and "cannot write the capture" in err
    assert os.path.getsize(out) == header + 10 * abi.RECORD_SIZE  # whole records only
    cap = read_capture(str(out))
    assert not cap.complete and cap.ops["seq"].tolist() == list(range(10))
    prod.close()
    ring.close()


def test_refuses_existing_capture(ring, tmp_path):
    out = tmp_path / "x.pyobmem"
    out.write_bytes(b"keep")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "pyobmem.daemon", "--ring", ring.path, "--out", str(out)],
        input=json.dumps(META).encode() + b"\n", capture_output=True, env=env, timeout=30,
    )
    assert proc.returncode == 1 and proc.stdout.decode().startswith("error: ") and "exists" in proc.stdout.decode()
    assert out.read_bytes() == b"keep"
