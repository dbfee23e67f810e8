"""Bad input and faults: the traced application must never change its results, crash, hang or see
a CUDA error it would not have had; pyobmem's own failures are one clear line and an exit code.

CPU only. CUDA applications are simulated with the fake libcuda of tests/fake_cuda and the
programs in tests/fault_progs (built once per session); runs go through the real launcher
(`python -m pyobmem run`), daemon and shim. Decisions taken here (also in docs/internals.md):

- /dev/shm full or not writable: the command is not run; one error line, exit 1, no capture.
- A process that outlives the traced command is left alone (not killed, not blocked); what it
  does after the command ended is not in the capture, which ends with the command.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyobmem import abi
from pyobmem.abi import Ev
from pyobmem.capture import read_capture
from pyobmem.ring import Ring
from helpers import PY, ROOT, clean_env, one_error_line, pyobmem

PROGS = ROOT / "tests" / "fault_progs"
FAKE = ROOT / "tests" / "fake_cuda"
SHIM = ROOT / "pyobmem" / "libpyobmem.so"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
NOTE_RECORDS = 7  # the cuInit notes of the fake driver with PYOBMEM_CUPTI=0 (see test_shim.py)

pytestmark = pytest.mark.skipif(
    not (CUDA_INCLUDE / "cuda.h").exists() or subprocess.run(["which", "gcc"], capture_output=True).returncode,
    reason="needs gcc and the CUDA headers",
)


@pytest.fixture(scope="session")
def bins(tmp_path_factory) -> Path:
    """Build the shim, the fake libcuda, the fault program, the ring harness, a static binary."""
    subprocess.run(["make", "-s", "native"], cwd=ROOT, check=True)
    d = tmp_path_factory.mktemp("faults")
    inc = ["-I", str(CUDA_INCLUDE)]
    flags = ["-O1", "-g", "-Wall", "-Wextra", "-Werror"]
    subprocess.run(
        ["gcc", *flags, "-fPIC", "-shared", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1", *inc,
         "-o", str(d / "libcuda.so.1"), str(FAKE / "fake_cuda.c"), "-lpthread"], check=True,
    )
    subprocess.run(["gcc", *flags, *inc, "-o", str(d / "faults"), str(PROGS / "faults.c"), "-ldl"], check=True)
    subprocess.run(
        ["gcc", *flags, "-Wno-unused-function", *inc, "-I", str(ROOT / "native"), "-I", str(ROOT / "pyobmem" / "include"),
         "-o", str(d / "ring_harness"), str(PROGS / "ring_harness.c")], check=True,
    )
    (d / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("static hello"); return 9;}\n')
    static = subprocess.run(["gcc", "-static", "-o", str(d / "hello_static"), str(d / "hello.c")], capture_output=True)
    if static.returncode:
        (d / "hello_static").unlink(missing_ok=True)
    return d


def _env(extra: dict | None = None) -> dict:
    return clean_env({"PYOBMEM_CUPTI": "0", **(extra or {})})


def cuda_env(bins: Path, extra: dict | None = None) -> dict:
    return _env({"LD_LIBRARY_PATH": str(bins), **(extra or {})})


def kv(text: str) -> dict:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def of(cap, ev):
    from pyobmem.capture import read_records

    recs = read_records(cap.path)[1]
    return recs[recs["type"] == int(ev)]


# ------------------------------------------------------------------ no GPU, static, setuid


def test_no_gpu_probe_runs_as_without_pyobmem(bins, tmp_path):
    """No libcuda at all: the dlsym probes answer as without the shim, summary says no CUDA."""
    plain = subprocess.run([bins / "faults", "dl"], capture_output=True, text=True, env=_env())
    traced = pyobmem("run", "-o", "c.pyobmem", bins / "faults", "dl", cwd=tmp_path, env=_env())
    assert (traced.returncode, traced.stdout) == (plain.returncode, plain.stdout) == (0, plain.stdout)
    assert "default_cuinit=0 err=undefined symbol: cuInit" in plain.stdout.splitlines()
    assert "pyobmem: no CUDA activity was seen" in traced.stderr.splitlines()
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == 0 and len(cap.processes) == 0 and len(cap.blocks) == 0


def test_static_binary_runs_unchanged(bins, tmp_path):
    if not (bins / "hello_static").exists():
        pytest.skip("no static libc to link against")
    proc = pyobmem("run", "-o", "c.pyobmem", bins / "hello_static", cwd=tmp_path, env=_env())
    assert proc.returncode == 9 and proc.stdout == "static hello\n"
    assert "pyobmem: no CUDA activity was seen" in proc.stderr.splitlines()
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == 9 and len(cap.processes) == 0


def test_secure_execution_binary_runs_unchanged(bins, tmp_path):
    """A setgid program runs in secure-execution mode: ld.so ignores the shim; nothing breaks."""
    prog = tmp_path / "sgid"
    src = tmp_path / "sgid.c"
    src.write_text(
        "#include <stdio.h>\n#include <string.h>\n#include <sys/auxv.h>\n"
        "int main(void){char l[512]; int shim=0; FILE*f=fopen(\"/proc/self/maps\",\"r\");\n"
        "while(fgets(l,sizeof l,f)) if(strstr(l,\"libpyobmem\")) shim=1;\n"
        "printf(\"secure=%lu shim=%d\\n\", getauxval(AT_SECURE), shim); return 4;}\n"
    )
    subprocess.run(["gcc", "-o", str(prog), str(src)], check=True)
    try:
        os.chown(prog, -1, 65534)
        os.chmod(prog, 0o2755)
    except PermissionError:
        pytest.skip("cannot make a setgid binary here")
    probe = subprocess.run([prog], capture_output=True, text=True)
    if "secure=1" not in probe.stdout:
        pytest.skip("setgid does not give secure-execution mode here (nosuid mount or same group)")
    proc = pyobmem("run", "-o", "c.pyobmem", prog, cwd=tmp_path, env=_env())
    assert proc.returncode == 4 and proc.stdout == "secure=1 shim=0\n"
    assert "pyobmem: no CUDA activity was seen" in proc.stderr.splitlines()


# ------------------------------------------------------------------ the dlsym interposer


def test_dlsym_and_dlvsym_answer_as_without_the_shim(bins, tmp_path):
    """RTLD_NEXT / RTLD_DEFAULT / a handle, found or not, and dlvsym: same values, same dlerror().

    Bugs fixed: dlsym(RTLD_NEXT, missing) returned NULL with dlerror() clear (a program checking
    dlerror, as dlsym(3) says to, took NULL for the symbol's value); dlsym(RTLD_DEFAULT, "cuInit")
    without a driver left another message ("libcuda.so: cannot open ...")."""
    env = cuda_env(bins)
    plain = subprocess.run([bins / "faults", "dl"], capture_output=True, text=True, env=env)
    shimmed = subprocess.run([bins / "faults", "dl"], capture_output=True, text=True,
                             env={**env, "LD_PRELOAD": str(SHIM)})
    assert plain.returncode == shimmed.returncode == 0
    assert kv(shimmed.stdout) == kv(plain.stdout)
    out = kv(plain.stdout)
    assert out["next_missing"] == "0 err=undefined symbol: pyobmem_no_such_symbol"
    assert out["default_missing"] == "0 err=undefined symbol: pyobmem_no_such_symbol"
    assert out["default_cuinit"] == "0 err=undefined symbol: cuInit"
    assert out["next_puts"] == "1 err=none" and out["next_puts_same"] == "1"
    assert out["libm_cos"] == "1 err=none" and out["dlvsym_next_dlsym"] == "1 err=none"


def test_dlsym_of_cuda_with_a_driver_loaded_gives_the_hooks(bins, tmp_path):
    """With libcuda loaded (the fault program's own dlopen), the interposer still answers hooks."""
    proc = pyobmem("run", "-o", "c.pyobmem", bins / "faults", "child", 4096, cwd=tmp_path, env=cuda_env(bins))
    assert proc.returncode == 0, proc.stderr
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.blocks["size"].tolist() == [4096] and (cap.blocks["t_free"] >= 0).all()


# ------------------------------------------------------------------ processes, fds, cwd, preload


def test_many_processes_one_ring(bins, tmp_path):
    """fork without exec, fork+exec, posix_spawn, and an orphan outliving the traced command."""
    marker, gate = tmp_path / "orphan.done", tmp_path / "gate"
    t0 = time.monotonic()
    proc = pyobmem("run", "-o", "c.pyobmem", bins / "faults", "procs", marker, gate, cwd=tmp_path, env=cuda_env(bins))
    assert time.monotonic() - t0 < 30  # the launcher does not wait for the orphan
    out = kv(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert (out["fork_status"], out["exec_status"], out["spawn_status"], out["main_rc"]) == ("0", "0", "0", "0")
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == 0 and cap.dropped == 0
    # one block per process, each freed; the orphan's comes after the end: not in the capture
    sizes = sorted(cap.blocks["size"].tolist())
    assert sizes == [1000, 1001, 1002, 1003]
    assert (cap.blocks["t_free"] >= 0).all()
    assert len(set(cap.blocks["pid"].tolist())) == 4
    main = int(cap.blocks["pid"][cap.blocks["size"] == 1000][0])
    assert sorted(cap.processes["pid"].tolist()) == sorted(set(cap.blocks["pid"].tolist()))
    assert set(cap.processes["ppid"][cap.processes["pid"] != main].tolist()) == {main}
    # the orphan carries on unaffected after the launcher is gone
    gate.write_text("go")
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the orphan never finished"
        time.sleep(0.02)
    assert marker.read_text() == "0\n"
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"pyobmem-{os.getuid()}-") and _launcher_gone(p)]


def _launcher_gone(name: str) -> bool:
    try:
        os.kill(int(name.split("-")[2]), 0)
        return False
    except ProcessLookupError:
        return True
    except (ValueError, IndexError, PermissionError):
        return False


def test_child_closing_all_fds_and_changing_cwd(bins, tmp_path):
    proc = pyobmem("run", "-o", "c.pyobmem", bins / "faults", "closefds", 12345, cwd=tmp_path, env=cuda_env(bins))
    assert proc.returncode == 0, proc.stderr
    assert kv(proc.stdout)["closefds_rc"] == "0"
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.blocks["size"].tolist() == [12345] and (cap.blocks["t_free"] >= 0).all()
    assert len(cap.processes) == 1


def test_existing_ld_preload_kept_shim_first(bins, tmp_path):
    libs = []
    for name in ("one", "two"):
        (tmp_path / f"{name}.c").write_text(f"int pyobmem_fault_{name};\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / f"lib{name}.so"), str(tmp_path / f"{name}.c")],
                       check=True)
        libs.append(str(tmp_path / f"lib{name}.so"))
    code = "import os; print(os.environ['LD_PRELOAD'])"
    for given, expected in [
        (f"{libs[0]}:{libs[1]}", f"{SHIM}:{libs[0]}:{libs[1]}"),
        (f"{libs[0]} {libs[1]}", f"{SHIM}:{libs[0]} {libs[1]}"),  # ld.so takes spaces too: kept as given
        (f"{libs[0]}:{SHIM}", f"{SHIM}:{libs[0]}"),  # a nested run: the shim once, first
    ]:
        proc = pyobmem("run", "-f", "-q", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path,
                       env=cuda_env(bins, {"LD_PRELOAD": given}))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected
    # and the traced CUDA program still works with other libraries preloaded after the shim
    proc = pyobmem("run", "-f", "-o", "c.pyobmem", bins / "faults", "child", 777, cwd=tmp_path,
                   env=cuda_env(bins, {"LD_PRELOAD": ":".join(libs)}))
    assert proc.returncode == 0, proc.stderr
    assert read_capture(str(tmp_path / "c.pyobmem")).blocks["size"].tolist() == [777]


# ------------------------------------------------------------------ the ring: full, wrapping, stuck


def test_full_ring_through_the_launcher_counted_exactly(bins, tmp_path):
    n = 3000
    proc = pyobmem("run", "--capacity", 16, "-o", "c.pyobmem", bins / "faults", "child", 64, cwd=tmp_path,
                   env=cuda_env(bins))
    assert proc.returncode == 0
    # the fault program's flood: through the test driver of test_shim (n alloc/free pairs)
    drv = tmp_path / "driver"
    subprocess.run(["gcc", "-I", str(CUDA_INCLUDE), "-o", str(drv), str(FAKE / "driver.c"), "-ldl", "-lpthread"],
                   check=True)
    proc = pyobmem("run", "-f", "--capacity", 16, "-o", "c.pyobmem", drv, "flood", n, cwd=tmp_path, env=cuda_env(bins))
    assert proc.returncode == 0, proc.stderr
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    produced = 1 + 2 * n + NOTE_RECORDS  # PROCESS, n ALLOC + n FREE, the notes
    from pyobmem.capture import read_records

    recs = read_records(cap.path)[1]
    written = int(np.isin(recs["type"], [Ev.PROCESS, Ev.ALLOC, Ev.FREE, Ev.NOTE]).sum())
    assert cap.complete and written + cap.dropped == produced
    assert int(cap.drops["count"].sum()) <= cap.dropped


def test_ring_wrapping_many_times_keeps_order_and_counts(bins, tmp_path):
    """20000 records through a 16-slot ring drained as they come: >1000 laps of the sequence
    numbers; the records arrive in order, and what arrived plus what was dropped is exact."""
    n = 20000
    ring = Ring.create(16, directory=str(tmp_path))
    try:
        w = _harness(bins, ring, "write", n, 20)
        chunks = []
        while w.poll() is None:
            chunks.append(ring.drain())
        out = w.communicate(timeout=60)[0]
        chunks.append(ring.drain())
        got = np.concatenate(chunks)
        dropped = ring.dropped
        head, tail = int(ring.header["head"][0]), int(ring.header["tail"][0])
    finally:
        ring.close()
    data = got[got["type"] == Ev.LAUNCH]
    drops = got[got["type"] == Ev.DROPPED]
    assert out == f"written={len(data)}\n"
    assert len(data) + dropped == n
    assert len(data) > 16 * 500  # it really wrapped, hundreds of times
    assert head == tail == len(got)
    assert np.all(np.diff(data["a"].astype(np.int64)) > 0)  # in order, none twice
    assert int(drops["a"].sum()) <= dropped


def _harness(bins, ring, *args, **kw):
    return subprocess.Popen([bins / "ring_harness", ring.path, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, **kw)


def test_producer_stopped_past_the_stuck_timeout_does_not_wedge_the_ring(bins, tmp_path):
    """A producer stopped between reserve and publish (SIGSTOP, a debugger) longer than the
    daemon's stuck timeout: the daemon skips its slot; when it resumes, its late publish must not
    set the slot's sequence back, or no producer could ever reserve that slot again (bug: every
    event after one more lap of the ring was dropped)."""
    ring = Ring.create(16, directory=str(tmp_path))
    try:
        stalled = _harness(bins, ring, "stall", 0)
        assert stalled.stdout.readline() == "reserved=0\n"
        w = _harness(bins, ring, "write", 5)
        assert w.communicate(timeout=30)[0] == "written=5\n"
        got = ring.drain(stuck_timeout_s=10.0)
        assert len(got) == 0  # the first look at a stuck slot starts its clock
        time.sleep(0.05)
        got = ring.drain(stuck_timeout_s=0.01)
        assert ring.skipped == 1 and got["a"].tolist() == [1, 2, 3, 4, 5]
        stalled.stdin.write("go\n")
        stalled.stdin.flush()
        assert stalled.communicate(timeout=30)[0] == "written=0\n"
        assert ring.drain(stuck_timeout_s=0.01).size == 0  # the late record is not read: it was counted as skipped
        # Many laps after the late publish: every record still gets through a drained ring.
        total = 0
        for _ in range(20):
            w = _harness(bins, ring, "write", 10)
            assert w.communicate(timeout=30)[0] == "written=10\n"
            total += len(ring.drain())
        assert total == 200 and ring.dropped == 0
    finally:
        ring.close()


def test_producer_killed_holding_a_slot_daemon_does_not_stall(bins, tmp_path):
    """A producer SIGKILLed between reserve and publish: the daemon skips the slot after its
    stuck timeout, keeps every later record and counts the lost one in CAPTURE_END."""
    ring = Ring.create(64, directory=str(tmp_path))
    out = tmp_path / "c.pyobmem"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    daemon = subprocess.Popen([PY, "-m", "pyobmem.daemon", "--ring", ring.path, "--out", str(out)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        daemon.stdin.write(json.dumps({"argv": ["t"]}).encode() + b"\n")
        daemon.stdin.flush()
        assert daemon.stdout.readline() == b"ready\n"
        die = _harness(bins, ring, "die")
        assert die.wait(30) == -signal.SIGKILL
        for _ in range(10):  # 10 x 20 = 200 records through a 64-slot ring: the daemon keeps draining
            w = _harness(bins, ring, "write", 20)
            assert w.communicate(timeout=30)[0].startswith("written=")
            time.sleep(0.05)
        t0 = time.monotonic()
        daemon.stdin.write(b"end 0\n")
        daemon.stdin.close()
        assert daemon.wait(30) == 0
        assert time.monotonic() - t0 < 10
    finally:
        if daemon.poll() is None:
            daemon.kill()
        ring.close()
    cap = read_capture(str(out))
    launches = of(cap, Ev.LAUNCH)
    assert cap.complete and len(launches) + cap.dropped == 200 + 1
    assert set(launches["a"].tolist()) <= set(range(1, 21))  # the writers' records only, none from the dead slot
    assert cap.dropped >= 1  # the killed producer's slot


# ------------------------------------------------------------------ /dev/shm, the daemon, the launcher


def test_dev_shm_full_refuses_clearly(bins, tmp_path):
    """Bug: a full tmpfs took the ring's ftruncate and the launcher died of SIGBUS (exit 135)
    writing the ring, leaving a 64 MiB file behind. Now: one line, exit 1, nothing run."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        proc = pyobmem("run", "-o", "c.pyobmem", PY, "-c", "open('ran', 'w')", cwd=tmp_path,
                       env=_env({"PYOBMEM_RING_DIR": str(small)}))
        assert proc.returncode == 1
        one_error_line(proc.stderr, f"cannot create the event ring in {small}: No space left on device "
                             "(the ring needs 65 MiB: free space there, or use a smaller --capacity)")
        assert os.listdir(small) == []
        assert not (tmp_path / "ran").exists() and not (tmp_path / "c.pyobmem").exists()
        # a ring that fits runs normally
        proc = pyobmem("run", "--capacity", 4096, "-o", "c.pyobmem", PY, "-c", "print(2)", cwd=tmp_path,
                       env=_env({"PYOBMEM_RING_DIR": str(small)}))
        assert proc.returncode == 0 and proc.stdout == "2\n"
    finally:
        subprocess.run(["umount", str(small)])


def test_ring_directory_unusable_refuses_clearly(tmp_path):
    proc = pyobmem("run", "-o", "c.pyobmem", PY, "-c", "open('ran', 'w')", cwd=tmp_path,
                   env=_env({"PYOBMEM_RING_DIR": str(tmp_path / "missing")}))
    assert proc.returncode == 1
    one_error_line(proc.stderr, f"cannot create the event ring in {tmp_path / 'missing'}: No such file or directory")
    assert not (tmp_path / "ran").exists()


def _daemon_pids(ring_path: str) -> list:
    pids = []
    for pid in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"pyobmem.daemon" in cmd and ring_path.encode() in cmd:
            pids.append(int(pid))
    return pids


def test_daemon_killed_application_unaffected(bins, tmp_path):
    """kill -9 the daemon mid-run: the CUDA application finishes with the same output and exit
    code, the launcher says so once, the capture keeps what was written."""
    drv = tmp_path / "driver"
    subprocess.run(["gcc", "-I", str(CUDA_INCLUDE), "-o", str(drv), str(FAKE / "driver.c"), "-ldl", "-lpthread"],
                   check=True)
    normal = pyobmem("run", "-q", "-o", "n.pyobmem", drv, "basic", cwd=tmp_path, env=cuda_env(bins))
    assert normal.returncode == 0 and "done=1" in normal.stdout
    script = tmp_path / "run.sh"
    killer = (
        "import os, signal\n"
        "for pid in os.listdir('/proc'):\n"
        "    try: cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    except OSError: continue\n"
        "    if b'pyobmem.daemon' in cmd and os.environ['PYOBMEM_RING'].encode() in cmd: os.kill(int(pid), 9)\n"
    )
    script.write_text(f"#!/bin/sh\n{drv} flood 200 >/dev/null\n{PY} -c \"$KILLER\"\nsleep 0.2\nexec {drv} basic\n")
    script.chmod(0o755)
    proc = pyobmem("run", "-o", "c.pyobmem", script, cwd=tmp_path, env=cuda_env(bins, {"KILLER": killer}))
    assert proc.returncode == 0 and proc.stdout == normal.stdout  # every return code and value the same
    lines = proc.stderr.splitlines()
    assert lines[0] == "pyobmem: the capture daemon stopped during the run (status -9); the capture ends there"
    assert sum("capture daemon" in line for line in lines) == 1
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert not cap.complete and len(cap.blocks) >= 1


def test_launcher_sigkilled_child_carries_on_ring_removed(bins, tmp_path):
    marker = tmp_path / "child.done"
    code = (f"import time; print('ready', flush=True); time.sleep(1.0); open({str(marker)!r}, 'w').write('ok')")
    launcher = subprocess.Popen([PY, "-m", "pyobmem", "run", "-o", "c.pyobmem", PY, "-c", code], cwd=tmp_path,
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert launcher.stdout.readline() == b"ready\n"
    rings = [p for p in os.listdir("/dev/shm") if p.startswith(f"pyobmem-{os.getuid()}-{launcher.pid}-")]
    assert len(rings) == 1
    launcher.kill()
    launcher.wait(10)
    deadline = time.monotonic() + 30
    while not marker.exists() or os.path.exists(f"/dev/shm/{rings[0]}"):
        assert time.monotonic() < deadline, (marker.exists(), rings)
        time.sleep(0.05)
    assert marker.read_text() == "ok"
    assert _daemon_pids(f"/dev/shm/{rings[0]}") == []
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert not cap.complete


def test_launcher_sigkilled_in_swap_mode_leaves_no_ring_nor_control_file(bins, tmp_path):
    """Bug: `pyobmem run --swap` SIGKILLed left the control file ``<ring>.ctl`` behind (the daemon
    removed only the ring). The child carries on; when it ends, the daemon removes both from
    PYOBMEM_RING_DIR (docs/swap.md, "Mechanism")."""
    rings = tmp_path / "rings"
    rings.mkdir()
    marker = tmp_path / "child.done"
    code = f"import time; print('ready', flush=True); time.sleep(1.0); open({str(marker)!r}, 'w').write('ok')"
    launcher = subprocess.Popen([PY, "-m", "pyobmem", "run", "--swap", "--budget", "1GiB", "-o", "c.pyobmem", PY,
                                 "-c", code], cwd=tmp_path, env=_env({"PYOBMEM_RING_DIR": str(rings)}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert launcher.stdout.readline() == b"ready\n"
        names = sorted(os.listdir(rings))
        assert len(names) == 2 and names[0].startswith(f"pyobmem-{os.getuid()}-{launcher.pid}-")
        assert names[1] == names[0] + ".ctl"
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 30
        while not marker.exists() or os.listdir(rings):
            assert time.monotonic() < deadline, (marker.exists(), os.listdir(rings))
            time.sleep(0.05)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert marker.read_text() == "ok"
    deadline = time.monotonic() + 30
    while _daemon_pids(str(rings / names[0])):  # the daemon exits once both are removed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not read_capture(str(tmp_path / "c.pyobmem")).complete


def test_stderr_closed_keeps_the_exit_code(tmp_path):
    """`pyobmem-run cmd 2>&1 | head`: bug: the launcher's summary hit EPIPE and it exited 1."""
    r, w = os.pipe()
    os.close(r)
    proc = subprocess.run([PY, "-m", "pyobmem", "run", "-o", "c.pyobmem", PY, "-c", "import sys; sys.exit(7)"],
                          cwd=tmp_path, env=_env(), stdout=w, stderr=w, timeout=120)
    os.close(w)
    assert proc.returncode == 7
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == 7


def test_child_output_piped_to_head(tmp_path):
    """The child dies of SIGPIPE as it would without pyobmem; the launcher says 128+13."""
    sh = f"{PY} -m pyobmem run -q -o c.pyobmem seq 1 1000000 | head -n 1; echo \"rc=${{PIPESTATUS[0]}}\""
    proc = subprocess.run(["bash", "-c", sh], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.stdout == "1\nrc=141\n"
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == -signal.SIGPIPE


def test_ctrl_c_reaches_the_cuda_child_once_and_the_capture_completes(bins, tmp_path):
    argv = [PY, "-m", "pyobmem", "run", "-q", "-o", str(tmp_path / "c.pyobmem"), str(bins / "faults"), "loop"]
    env = cuda_env(bins)
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover (the child execs)
        os.chdir(tmp_path)
        os.execve(PY, argv, env)
    out, sent = b"", False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not sent and b"ready=1" in out:
            time.sleep(0.2)
            os.write(fd, b"\x03")
            sent = True
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace").replace("\r", "")
    assert "sigints=1\n" in text, text
    assert os.waitstatus_to_exitcode(status) == 0
    loops = int(re.search(r"loops=(\d+)", text).group(1))
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == 0
    # one block per completed loop, plus one if the signal came between an alloc and its free;
    # what the ring dropped (if the daemon fell behind) is counted
    assert loops <= len(cap.blocks) + cap.dropped and len(cap.blocks) <= loops + 1, (loops, len(cap.blocks), cap.dropped)


# ------------------------------------------------------------------ CUPTI


@pytest.mark.parametrize("cupti, note", [
    ("/nonexistent/libcupti.so", "unavailable: PYOBMEM_CUPTI library could not be loaded"),
])
def test_cupti_missing_traced_from_hooks_said_once(bins, tmp_path, cupti, note):
    proc = pyobmem("run", "--cupti", "-o", "c.pyobmem", bins / "faults", "child", 100, cwd=tmp_path,
                   env=cuda_env(bins, {"PYOBMEM_CUPTI": cupti}))
    assert proc.returncode == 0, proc.stderr
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    (pid,) = cap.processes["pid"].tolist()
    assert cap.notes[pid]["cupti"] == note
    texts = [r for r in of(cap, Ev.NOTE) if bytes(np.array([r["b"]], "<u8").tobytes()).startswith(b"cupti=")]
    assert len(texts) == 1
    assert cap.processes["source"].tolist() == [abi.LaunchSource.HOOKS]
    assert cap.blocks["size"].tolist() == [100]


@pytest.mark.parametrize("flag, note, subscribed", [
    ([], "off (the default; --cupti subscribes)", False),
    (["--no-cupti"], "off (the default; --cupti subscribes)", False),
    (["--cupti"], "active: {lib} (CUPTI version 130001)", True),
])
def test_cupti_only_with_the_cupti_flag(bins, tmp_path, flag, note, subscribed):
    """pyobmem-run's default traces from the hooks and leaves CUPTI to the process's own profilers,
    even when PYOBMEM_CUPTI names a library; --cupti subscribes."""
    lib, log = tmp_path / "libcupti.so", tmp_path / "cupti.log"
    subprocess.run(["gcc", "-O1", "-fPIC", "-shared", "-I", str(CUDA_INCLUDE), "-o", str(lib), str(FAKE / "fake_cupti.c"),
                    "-ldl"], check=True)
    proc = pyobmem("run", *flag, "-o", "c.pyobmem", bins / "faults", "child", 100, cwd=tmp_path,
                   env=cuda_env(bins, {"PYOBMEM_CUPTI": str(lib), "FAKE_CUPTI_LOG": str(log)}))
    assert proc.returncode == 0, proc.stderr
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    (pid,) = cap.processes["pid"].tolist()
    assert cap.notes[pid]["cupti"] == note.format(lib=lib)
    assert log.exists() == subscribed
    assert cap.meta["cupti"] == (str(lib) if subscribed else "0")


# ------------------------------------------------------------------ bad captures, usage


def _capture_bytes(version: int, meta: bytes, tail: bytes = b"") -> bytes:
    return struct.pack("<8sII", b"PYOBCAPT", version, len(meta)) + meta + tail


@pytest.mark.parametrize("content, message", [
    (_capture_bytes(2, b"{}"), "capture format version 2 is newer than this pyobmem reads (1); upgrade pyobmem"),
    (_capture_bytes(1, b'{"argv": ["x"]}')[:-3], "truncated capture (metadata incomplete)"),
    (_capture_bytes(1, b"[1, 2]"), "corrupt capture metadata"),  # bug: AttributeError traceback
    (_capture_bytes(1, b'"text"'), "corrupt capture metadata"),
    (_capture_bytes(0, b"{}"), "corrupt capture (format version 0)"),
    (_capture_bytes(1, b"\xff\xfe"), "corrupt capture metadata"),
    (b"", "not a pyobmem capture"),
    (b"\x7fELF\x02\x01\x01" + b"\0" * 64, "not a pyobmem capture"),
])
def test_bad_capture_one_line_exit_2(tmp_path, content, message):
    (tmp_path / "bad.pyobmem").write_bytes(content)
    proc = pyobmem("summary", "bad.pyobmem", cwd=tmp_path, env=_env())
    assert proc.returncode == 2
    one_error_line(proc.stderr, f"bad.pyobmem: {message}")


def test_capture_cut_mid_record_reads_to_the_last_whole_one(tmp_path):
    recs = np.zeros(3, dtype=abi.RECORD_DTYPE)
    recs["type"] = Ev.ALLOC
    recs["a"] = [1, 2, 3]
    recs["c"] = [10, 20, 30]
    (tmp_path / "cut.pyobmem").write_bytes(_capture_bytes(1, b"{}", recs.tobytes()[:-10]))
    cap = read_capture(str(tmp_path / "cut.pyobmem"))
    assert not cap.complete and cap.blocks["size"].tolist() == [10, 20]


def test_unknown_command_127_and_existing_output_refused(tmp_path):
    proc = pyobmem("run", "no-such-command-pyobmem-x", cwd=tmp_path, env=_env())
    assert proc.returncode == 127
    one_error_line(proc.stderr, "no-such-command-pyobmem-x: command not found")
    (tmp_path / "c.pyobmem").write_bytes(b"keep")
    proc = pyobmem("run", "-o", "c.pyobmem", PY, "-c", "open('ran', 'w')", cwd=tmp_path, env=_env())
    assert proc.returncode == 1
    one_error_line(proc.stderr, "c.pyobmem exists; use -f/--force to overwrite it")
    assert (tmp_path / "c.pyobmem").read_bytes() == b"keep" and not (tmp_path / "ran").exists()
