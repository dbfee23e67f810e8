"""The command line: `pyobmem run` / `pyobmem-run` end to end (no GPU), errors, help.

The run tests use the real shim (`make native`). Where it cannot be built on this machine they
use an empty stand-in library through $PYOBMEM_SHIM, which is enough for everything the launcher
does (environment, ring, daemon, signals, exit codes, metadata) but traces nothing.
"""

from __future__ import annotations

import glob
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyobmem import __version__
from pyobmem.capture import read_capture
from pyobmem.launcher import find_cupti
from helpers import PY, ROOT, clean_env, one_error_line, pyobmem, pyobmem_run



def _build_stub(directory: Path, name: str) -> str:
    src = directory / f"{name}.c"
    src.write_text("int pyobmem_stub_%s;\n" % name.replace("-", "_"))
    so = directory / f"lib{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return str(so)


@pytest.fixture(scope="session")
def shim(tmp_path_factory) -> dict:
    """{"path": the shim the launcher will preload, "env": variables to add for that}."""
    real = ROOT / "pyobmem" / "libpyobmem.so"
    try:
        built = subprocess.run(["make", "-s", "native"], cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        built = False
    if built and real.is_file():
        return {"path": str(real), "env": {}}
    if shutil.which("gcc") is None:
        pytest.skip("the shim cannot be built (make native failed) and there is no gcc for a stand-in")
    stub = _build_stub(tmp_path_factory.mktemp("stub"), "stub-shim")
    return {"path": stub, "env": {"PYOBMEM_SHIM": stub}}


# --- help and usage ------------------------------------------------------------------------------


def test_help(tmp_path):
    top = pyobmem("--help", cwd=tmp_path)
    assert top.returncode == 0 and "run" in top.stdout and "summary" in top.stdout
    run = pyobmem("run", "--help", cwd=tmp_path)
    assert run.returncode == 0
    for flag in ("--output", "--force", "--capacity", "--cupti", "--no-cupti", "--no-presets", "--quiet"):
        assert flag in run.stdout
    short = pyobmem_run("--help", cwd=tmp_path)
    assert short.returncode == 0 and short.stdout.startswith("usage: pyobmem-run [-o FILE]")
    version = pyobmem("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"pyobmem {__version__}"


@pytest.mark.parametrize(
    "args",
    [[], ["frobnicate"], ["run"], ["run", "--"], ["run", "--capacity", "0", "true"], ["summary"]],
)
def test_usage_errors_exit_2(tmp_path, args):
    proc = pyobmem(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("pyobmem")
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


# --- errors before anything runs -----------------------------------------------------------------


def test_unknown_command_exits_127(tmp_path):
    proc = pyobmem_run("no-such-command-pyobmem", "x", cwd=tmp_path)
    assert proc.returncode == 127
    one_error_line(proc.stderr, "no-such-command-pyobmem: command not found")
    assert list(tmp_path.iterdir()) == []  # no capture, nothing run


def test_not_executable_exits_126(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    proc = pyobmem("run", "./script.sh", cwd=tmp_path)
    assert proc.returncode == 126
    one_error_line(proc.stderr, "./script.sh: Permission denied")
    proc = pyobmem("run", "./missing.sh", cwd=tmp_path)
    assert proc.returncode == 127
    one_error_line(proc.stderr, "./missing.sh: No such file or directory")


def test_existing_output_refused_before_running(tmp_path):
    out = tmp_path / "out.pyobmem"
    out.write_bytes(b"keep me")
    proc = pyobmem("run", "-o", "out.pyobmem", PY, "-c", "open('ran', 'w')", cwd=tmp_path)
    assert proc.returncode == 1
    one_error_line(proc.stderr, "out.pyobmem exists; use -f/--force to overwrite it")
    assert not (tmp_path / "ran").exists()
    assert out.read_bytes() == b"keep me"


def test_missing_shim_says_to_run_make(tmp_path):
    proc = pyobmem("run", "true", cwd=tmp_path, env=clean_env({"PYOBMEM_SHIM": str(tmp_path / "nope.so")}))
    assert proc.returncode == 1
    one_error_line(proc.stderr, f"the shim {tmp_path / 'nope.so'} is not built; run `make` in the pyobmem source tree")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content, message",
    [(b"GIF89a and more", "not a pyobmem capture"), (b"PYOB", "truncated capture (header incomplete)")],
)
def test_bad_capture_one_line_exit_2(tmp_path, content, message):
    (tmp_path / "bad.pyobmem").write_bytes(content)
    proc = pyobmem("summary", "bad.pyobmem", cwd=tmp_path)
    assert proc.returncode == 2
    one_error_line(proc.stderr, f"bad.pyobmem: {message}")


def test_missing_capture_exit_2(tmp_path):
    proc = pyobmem("summary", "nope.pyobmem", cwd=tmp_path)
    assert proc.returncode == 2
    one_error_line(proc.stderr, "nope.pyobmem: cannot read capture: No such file or directory")


# --- runs ----------------------------------------------------------------------------------------


def test_print_1_on_a_machine_without_gpu(tmp_path, shim):
    proc = pyobmem_run(PY, "-c", "print(1)", cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1\n"  # the child's output, untouched; ours goes to stderr
    captures = glob.glob(str(tmp_path / "pyobmem-*.pyobmem"))
    assert len(captures) == 1
    name = os.path.basename(captures[0])
    assert name.startswith(f"pyobmem-{os.path.basename(PY)}-") and name[len("pyobmem-") :].split("-")[-1][:-8].isdigit()
    lines = proc.stderr.splitlines()
    assert "pyobmem: no CUDA activity was seen" in lines
    assert f"pyobmem: capture written to {captures[0]}" in lines
    assert not any("next:" in line for line in lines)  # nothing to look at in an empty capture
    # why, when this machine has no driver at all (CI's): one line more
    from pyobmem.commands.run import _driver_present

    said = "pyobmem: no CUDA driver here (libcuda.so.1 cannot be loaded): the command could not use the GPU" in lines
    assert said == (not _driver_present())
    cap = read_capture(captures[0])
    assert cap.complete and cap.exit_status == 0 and len(cap.ops) == 0 and len(cap.blocks) == 0
    summary = pyobmem("summary", captures[0], cwd=tmp_path)
    assert summary.returncode == 0 and "no CUDA activity was seen" in summary.stdout.splitlines()


def test_exit_code_preserved(tmp_path, shim):
    proc = pyobmem("run", "-q", "-o", "c.pyobmem", PY, "-c", "import sys; sys.exit(3)", cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == 3 and proc.stderr == ""
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == 3


def test_force_overwrites(tmp_path, shim):
    out = tmp_path / "c.pyobmem"
    out.write_bytes(b"old")
    proc = pyobmem("run", "-f", "-q", "-o", str(out), "--", PY, "-c", "pass", cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == 0, proc.stderr
    assert read_capture(str(out)).complete


def test_killed_by_signal_dies_by_the_same_signal(tmp_path, shim):
    """The launcher's parent sees the death it would see without pyobmem (not 128 + N)."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    proc = pyobmem("run", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == -signal.SIGTERM
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == -15
    assert "pyobmem: no events dropped; capture complete, command killed by signal 15" in proc.stderr.splitlines()


SLEEPER = "import sys, time; print('ready', flush=True); time.sleep(60)"


def _default_signals() -> None:
    """In the launcher's process before exec: SIGINT, SIGTERM and SIGHUP at their defaults. A test
    run started in the background by a non-interactive shell inherits SIGINT ignored, and an ignored
    signal stays ignored across exec: the launcher would never see the one the test sends."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_to_the_launcher_reach_the_child(tmp_path, shim, sig):
    launcher = subprocess.Popen(
        [PY, "-m", "pyobmem", "run", "-q", "-o", "c.pyobmem", PY, "-c", SLEEPER],
        cwd=tmp_path, env=clean_env(shim["env"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_default_signals,
    )
    assert launcher.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    launcher.send_signal(sig)
    assert launcher.wait(30) == -sig  # the child died of it, and so does the launcher
    assert time.monotonic() - t0 < 10
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.complete and cap.exit_status == -sig


def test_ctrl_c_at_the_terminal_reaches_the_child_once(tmp_path, shim):
    """The terminal sends Ctrl-C to the whole foreground group: the launcher must not add a second."""
    child = (  # takes SIGINTs synchronously, so a second one a moment later is not merged
        "import signal, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
        "print('ready', flush=True)\n"
        "got = [signal.sigwaitinfo({signal.SIGINT})]\n"
        "end = time.monotonic() + 1.0\n"
        "while end > time.monotonic():\n"
        "    info = signal.sigtimedwait({signal.SIGINT}, max(0.0, end - time.monotonic()))\n"
        "    if info: got.append(info)\n"
        "print('sigints', len(got), [(i.si_code, i.si_pid) for i in got], flush=True)\n"
    )
    argv = [PY, "-m", "pyobmem", "run", "-q", "-o", str(tmp_path / "c.pyobmem"), PY, "-c", child]
    env = clean_env(shim["env"])
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover (the child execs)
        os.chdir(tmp_path)
        _default_signals()
        os.execve(PY, argv, env)
    out = b""
    deadline = time.monotonic() + 60
    sent = False
    while time.monotonic() < deadline:
        if not sent and b"ready" in out:
            os.write(fd, b"\x03")
            sent = True
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert b"sigints 1 [(128, 0)]" in out, out  # once, from the terminal (SI_KERNEL)
    assert os.waitstatus_to_exitcode(status) == 0


def test_environment_of_the_child(tmp_path, shim):
    other = _build_stub(tmp_path, "other")
    code = (
        "import os, stat\n"
        "ring = os.environ['PYOBMEM_RING']\n"
        "print(os.environ['LD_PRELOAD'])\n"
        "print(ring)\n"
        "print(oct(stat.S_IMODE(os.stat(ring).st_mode)))\n"
        "print(os.environ.get('XLA_PYTHON_CLIENT_ALLOCATOR'))\n"
        "print(os.environ.get('PYOBMEM_CUPTI'))\n"
    )
    proc = pyobmem("run", "-q", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=clean_env({**shim["env"], "LD_PRELOAD": other}))
    assert proc.returncode == 0, proc.stderr
    preload, ring, mode, xla, cupti = proc.stdout.splitlines()
    assert preload == f"{shim['path']}:{other}"  # prepended, never replaced
    assert ring.startswith("/dev/shm/pyobmem-") and mode == "0o600"
    assert not os.path.exists(ring)  # removed after the run
    assert xla == "platform"
    assert cupti == "0"  # the default: launches traced from the hooks, CUPTI left to the process

    proc = pyobmem("run", "-f", "-q", "--no-cupti", "--no-presets", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=clean_env(shim["env"]))
    preload, _, _, xla, cupti = proc.stdout.splitlines()
    assert preload == shim["path"] and xla == "None" and cupti == "0"  # --no-cupti: the default said explicitly
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.meta["presets"] == {} and cap.meta["cupti"] == "0"

    # --cupti: the libcupti found here ("1": let the shim search), or the user's own choice
    proc = pyobmem("run", "-f", "-q", "--cupti", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.stdout.splitlines()[4] == (find_cupti() or "1")
    proc = pyobmem("run", "-f", "-q", "--cupti", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path,
                   env=clean_env({**shim["env"], "PYOBMEM_CUPTI": "/opt/my/libcupti.so"}))
    assert proc.stdout.splitlines()[4] == "/opt/my/libcupti.so"
    proc = pyobmem("run", "-f", "-q", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path,
                   env=clean_env({**shim["env"], "PYOBMEM_CUPTI": "/opt/my/libcupti.so"}))
    assert proc.stdout.splitlines()[4] == "0"  # without --cupti the variable alone subscribes nothing
    proc = pyobmem("run", "-f", "-q", "--cupti", "--no-cupti", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path,
                   env=clean_env(shim["env"]))
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


@pytest.mark.parametrize("sub, name", [("cuda_cupti", "libcupti.so.12"), ("cu13", "libcupti.so.13")])
def test_cupti_of_pip_installed_cuda_is_found(tmp_path, monkeypatch, sub, name):
    """A machine with pip-installed PyTorch and no toolkit: CUPTI comes from NVIDIA's wheel."""
    lib = tmp_path / "site-packages" / "nvidia" / sub / "lib"
    lib.mkdir(parents=True)
    (lib / name).write_bytes(b"")
    monkeypatch.setattr("site.getsitepackages", lambda: [str(tmp_path / "site-packages")])
    monkeypatch.setattr("site.getusersitepackages", lambda: str(tmp_path / "user"))
    monkeypatch.setattr("sys.path", [])
    assert find_cupti() == str(lib / name)


def test_metadata_records_the_run(tmp_path, shim):
    user_env = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "CUPY_GPU_MEMORY_LIMIT": "50%",
        "CUDA_VISIBLE_DEVICES": "0",
        "UNRELATED": "not recorded",
    }
    before = time.monotonic_ns()
    t0 = time.time()
    proc = pyobmem("run", "-q", "-o", "c.pyobmem", PY, "-c", "pass", cwd=tmp_path, env=clean_env({**shim["env"], **user_env}))
    assert proc.returncode == 0, proc.stderr
    meta = read_capture(str(tmp_path / "c.pyobmem")).meta
    assert meta["argv"] == [PY, "-c", "pass"]
    assert meta["cwd"] == str(tmp_path)
    assert meta["pyobmem_version"] == __version__
    assert before <= meta["start_monotonic_ns"] <= time.monotonic_ns()
    assert t0 <= meta["start_time"] <= time.time()
    assert meta["presets"] == {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    assert meta["env"] == {k: v for k, v in user_env.items() if k != "UNRELATED"}
    assert meta["hostname"] == os.uname().nodename
    assert meta["shim"] == shim["path"]

    # The user's own JAX setting wins over the preset, and is recorded.
    env = clean_env({**shim["env"], "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    code = "import os; print(os.environ.get('XLA_PYTHON_CLIENT_ALLOCATOR'))"
    proc = pyobmem("run", "-f", "-q", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=env)
    assert proc.stdout == "None\n"
    meta = read_capture(str(tmp_path / "c.pyobmem")).meta
    assert meta["presets"] == {} and meta["env"] == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def test_daemon_death_is_reported_and_exit_code_kept(tmp_path, shim):
    """The app carries on when the daemon dies; the launcher says so and keeps the exit code."""
    code = (
        "import os, signal, sys, time\n"
        "ring = os.environ['PYOBMEM_RING']\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'pyobmem.daemon' in cmd and ring.encode() in cmd:\n"
        "        os.kill(int(pid), signal.SIGKILL)\n"
        "        break\n"
        "else:\n"
        "    sys.exit(99)\n"
        "time.sleep(0.3)\n"
        "print('still running', flush=True)\n"
        "sys.exit(5)\n"
    )
    proc = pyobmem("run", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == 5 and proc.stdout == "still running\n"
    lines = proc.stderr.splitlines()
    assert lines[0] == "pyobmem: the capture daemon stopped during the run (status -9); the capture ends there"
    assert "pyobmem: no CUDA activity was seen" in lines
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert not cap.complete


def test_descendants_get_the_same_ring(tmp_path, shim):
    code = (
        "import os, subprocess, sys\n"
        "print(os.environ['PYOBMEM_RING'])\n"
        "sys.stdout.flush()\n"
        "subprocess.run(['sh', '-c', 'echo $PYOBMEM_RING; echo $LD_PRELOAD'])\n"
    )
    proc = pyobmem("run", "-q", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=clean_env(shim["env"]))
    mine, child, preload = proc.stdout.splitlines()
    assert mine == child and preload == shim["path"]


def test_user_xla_setting_of_any_kind_skips_the_jax_preset(tmp_path, shim):
    env = clean_env({**shim["env"], "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"})
    assert pyobmem("run", "-q", "-o", "c.pyobmem", PY, "-c", "0", cwd=tmp_path, env=env).returncode == 0
    assert read_capture(str(tmp_path / "c.pyobmem")).meta["presets"] == {}


def test_default_output_named_after_the_script(tmp_path, shim):
    (tmp_path / "train.py").write_text("print('ok')\n")
    proc = pyobmem("run", PY, "train.py", cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == 0 and proc.stdout == "ok\n"
    assert [p.name.split("-")[1] for p in tmp_path.glob("pyobmem-*.pyobmem")] == ["train"]


def test_output_named_by_the_command_is_refused_even_with_force(tmp_path, shim):
    script = tmp_path / "train.py"
    script.write_text("print('ok')\n")
    proc = pyobmem("run", "-f", "-o", "train.py", PY, "train.py", cwd=tmp_path, env=clean_env(shim["env"]))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "pyobmem: error: train.py is named by the command (train.py); choose another output file\n"
    assert script.read_text() == "print('ok')\n"


def test_output_directory_and_empty_name_refused(tmp_path, shim):
    (tmp_path / "d").mkdir()
    for out, message in (("d", "d is a directory"), ("", "the output file name is empty")):
        proc = pyobmem("run", "-o", out, PY, "-c", "print(1)", cwd=tmp_path, env=clean_env(shim["env"]))
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"pyobmem: error: {message}\n")


def test_script_without_shebang_runs_with_sh(tmp_path, shim):
    script = tmp_path / "job"
    script.write_text("echo from-sh \"$1\"\nexit 4\n")
    script.chmod(0o755)
    proc = pyobmem("run", "-q", "-o", "c.pyobmem", "./job", "arg", cwd=tmp_path, env=clean_env(shim["env"]))
    assert (proc.returncode, proc.stdout) == (4, "from-sh arg\n")
    assert read_capture(str(tmp_path / "c.pyobmem")).exit_status == 4
