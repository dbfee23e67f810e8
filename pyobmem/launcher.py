"""Run a command under the shim: ring, daemon, environment, signals, exit status.

``launch(Options)`` does the whole run and returns the exit code to exit with; the pieces
(``find_shim``, ``find_cupti``, ``child_environment``, ``resolve_command``) are separate so the
CLI and the tests can use them. User errors raise ``PyobmemError`` before anything runs.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import select
import shlex
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from . import __version__, abi
from .control import SUFFIX, Control
from .errors import PyobmemError
from .planner import DEFAULT_MIN_SWAP_BYTES
from .ranks import split
from .ring import DEFAULT_CAPACITY, Ring

ENV_RING_DIR = "PYOBMEM_RING_DIR"  # directory of the ring file (default /dev/shm; a tmpfs)
ENV_SHIM = "PYOBMEM_SHIM"  # developers: use this shim instead of the one next to the package
SHIM_NAME = "libpyobmem.so"
DAEMON_START_S = 30.0  # the daemon imports numpy and opens the capture
DAEMON_FINISH_S = 30.0  # the daemon drains what is left and closes the capture
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SI_KERNEL = 0x80  # si_code of a signal sent by the kernel, e.g. the terminal's Ctrl-C / Ctrl-\
# Variables that change how frameworks allocate device memory: recorded in the capture.
RECORDED_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TF_GPU_ALLOCATOR", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING")
RECORDED_ENV_PREFIXES = ("XLA_PYTHON_CLIENT_", "CUPY_")


@dataclass(frozen=True)
class Options:
    """What ``pyobmem run`` was asked to do."""

    command: list[str]
    output: str | None = None
    force: bool = False
    capacity: int = DEFAULT_CAPACITY
    cupti: bool = False  # trace launches from CUPTI callbacks (--cupti); default: the shim's hooks
    presets: bool = True
    quiet: bool = False
    swap: bool = False  # swap mode: keep device memory under ``budget`` (docs/swap.md)
    budget: object = None  # pyobmem.planner.Budget
    min_swap_bytes: int | None = None
    tensor_blocks: bool = False  # trace mode: the per-tensor presets of swap mode (every tensor its own block)
    live: bool = False  # watch the run with pyobmem live; the command's output goes to log_path(output)


@dataclass
class Outcome:
    """How a run ended: the command's status (negative: killed by that signal), the capture."""

    status: int
    output: str
    daemon_failed: str | None = None  # one line when the daemon stopped early
    rank_outputs: list = field(default_factory=list)  # (pyobmem.ranks.Rank, path): one capture per rank
    rank_error: str | None = None  # one line when the per-rank captures could not be written
    log: str | None = None  # --live: the file that holds the command's output

    @property
    def exit_code(self) -> int:
        """The shell's convention: the exit code, or 128 + N when killed by signal N."""
        return self.status if self.status >= 0 else 128 - self.status


def find_shim() -> str:
    """The shim library: $PYOBMEM_SHIM, else pyobmem/libpyobmem.so. Raises PyobmemError."""
    path = os.environ.get(ENV_SHIM) or os.path.join(os.path.dirname(os.path.abspath(__file__)), SHIM_NAME)
    if not os.path.isfile(path):
        raise PyobmemError(f"the shim {path} is not built; run `make` in the pyobmem source tree")
    path = os.path.abspath(path)
    if any(c in path for c in " :\t\n"):
        raise PyobmemError(f"the shim path {path!r} contains a space or colon, which LD_PRELOAD cannot express")
    return path


def find_cupti() -> str | None:
    """Path of a libcupti for the shim to try first, or None.

    Looks for the pip wheel (nvidia/cuda_cupti/lib for CUDA 12, nvidia/cu13/lib for CUDA 13, which
    pip-installed PyTorch brings) in this Python's site-packages, then
    $CUDA_HOME/lib64, /usr/local/cuda/lib64 and /usr/local/cuda/extras/CUPTI/lib64.
    """
    sites = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    try:
        sites.append(site.getusersitepackages())
    except AttributeError:
        pass
    sites += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    dirs = [os.path.join(s, "nvidia", sub, "lib") for s in dict.fromkeys(sites) for sub in ("cuda_cupti", "cu13")]
    if os.environ.get("CUDA_HOME"):
        dirs.append(os.path.join(os.environ["CUDA_HOME"], "lib64"))
    dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda/extras/CUPTI/lib64"]
    for d in dirs:
        found = [p for p in glob.glob(os.path.join(d, "libcupti.so*")) if os.path.isfile(p)]
        if found:
            return min(found, key=lambda p: (len(p), p))  # libcupti.so, else the soname link
    return None


def resolve_command(command: list[str]) -> str:
    """The executable ``command[0]`` runs, as a shell would find it. Raises PyobmemError 127/126."""
    name = command[0]
    if "/" in name:
        if not os.path.exists(name):
            raise PyobmemError(f"{name}: No such file or directory", 127)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise PyobmemError(f"{name}: Permission denied", 126)
        return name
    path = shutil.which(name)
    if path is None:
        # A file of that name on PATH that is not executable: the shell says 126.
        for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(d or ".", name)
            if os.path.isfile(candidate):
                raise PyobmemError(f"{name}: Permission denied", 126)
        raise PyobmemError(f"{name}: command not found", 127)
    return path


def default_output(command: list[str]) -> str:
    """``pyobmem-<name>-<pid>.pyobmem`` in the current directory.

    The name is the script's stem for ``python train.py`` (``train``) and the module for
    ``python -m pkg.mod`` (``pkg.mod``), else the command's basename.
    """
    name = os.path.basename(command[0]) or "cmd"
    if name.startswith("python"):
        args = command[1:]
        if len(args) >= 2 and args[0] == "-m":
            name = args[1]
        elif args and not args[0].startswith("-"):
            name = os.path.splitext(os.path.basename(args[0]))[0] or name
    return f"pyobmem-{name}-{os.getpid()}.pyobmem"


TORCH_CONF = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # the first set is the one torch reads
TORCH_BACKEND = "cudaMallocAsync"


def tensor_presets(base: dict) -> tuple[dict, list[str]]:
    """The per-tensor allocation presets for environment ``base``: each framework allocates every
    tensor with the driver's stream-ordered allocator (PyTorch ``backend:cudaMallocAsync``, JAX
    ``cuda_async`` without preallocation, TensorFlow ``cuda_malloc_async``), so that each large
    tensor is one block the shim serves and swaps (docs/swap.md). Returns the variables to set
    (name -> value; a user's PyTorch configuration keeps its options, the backend is added to it)
    and one line per user setting that keeps a framework from them (the user's choice wins)."""
    applied, limited = {}, []
    conf = next((k for k in TORCH_CONF if base.get(k, "").strip()), None)
    if conf is None:
        applied["PYTORCH_CUDA_ALLOC_CONF"] = f"backend:{TORCH_BACKEND}"
    else:
        opts = dict(o.partition(":")[::2] for o in base[conf].replace(" ", "").split(",") if o)
        backend = opts.get("backend")
        if backend is None:
            applied[conf] = f"{base[conf].rstrip(',')},backend:{TORCH_BACKEND}"
        elif backend != TORCH_BACKEND:
            limited.append(f"{conf} sets backend:{backend}; PyTorch's blocks are its segments, and swapping is "
                           "limited to what the driver sees of them")
    wanted = {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
              "TF_GPU_ALLOCATOR": "cuda_malloc_async"}
    # preallocation belongs to the allocator: a user's own XLA allocator keeps XLA's own default
    if base.get("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async") != "cuda_async":
        del wanted["XLA_PYTHON_CLIENT_PREALLOCATE"]
    for name, value in wanted.items():
        if name not in base:
            applied[name] = value
        elif base[name] != value and name != "XLA_PYTHON_CLIENT_PREALLOCATE":
            limited.append(f"{name}={base[name]} is kept; swapping is limited to what the driver sees of that "
                           "framework's blocks")
    return applied, limited


def child_environment(base: dict, shim: str, ring: str, cupti: bool, presets: bool,
                      tensor_blocks: bool = False) -> tuple[dict, dict]:
    """The traced command's environment and the presets applied (name -> value). ``tensor_blocks``
    (swap mode, or ``--tensor-blocks``): the per-tensor presets of :func:`tensor_presets`, else
    today's trace presets (JAX's ``platform`` allocator, case C15)."""
    env = dict(base)
    preload = base.get("LD_PRELOAD", "").strip()
    entries = preload.replace(" ", ":").split(":")
    if shim in entries:  # a nested run, or the user's own preload of the shim: keep it once, first
        preload = ":".join(e for e in entries if e and e != shim)
    env["LD_PRELOAD"] = f"{shim}:{preload}" if preload else shim
    env[abi.ENV_RING] = ring
    # CUPTI is opt-in: by default the shim's hooks trace launches and the process's own CUPTI
    # users (torch.profiler, Nsight) keep their subscription. With it, the user's library wins.
    user_cupti = base.get(abi.ENV_CUPTI, "")
    if not cupti:
        env[abi.ENV_CUPTI] = "0"
    elif user_cupti and user_cupti != "0":
        env[abi.ENV_CUPTI] = user_cupti
    else:
        env[abi.ENV_CUPTI] = find_cupti() or "1"
    applied = {}
    if presets and tensor_blocks:
        applied = tensor_presets(base)[0]
    elif presets:
        # JAX reserves most of the card in one allocation unless told otherwise; any
        # XLA_PYTHON_CLIENT_* setting of the user's (allocator, preallocate, mem fraction) wins.
        if not any(k.startswith("XLA_PYTHON_CLIENT_") for k in base):
            applied["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    env.update(applied)
    return env, applied


def recorded_environment(env: dict) -> dict:
    """The user's allocator-related variables, as set before the presets."""
    return {
        k: v for k, v in sorted(env.items()) if k in RECORDED_ENV or k.startswith(RECORDED_ENV_PREFIXES)
    }


def log_path(output: str) -> str:
    """Where --live puts the command's output: ``run.pyobmem`` -> ``run.log`` beside the capture."""
    return (output[: -len(".pyobmem")] if output.endswith(".pyobmem") else output) + ".log"


def check_output(output: str, force: bool, command: list[str]) -> None:
    """Refuse an output that is a directory or a file the command names, an existing output
    without ``force``, and an output in a missing directory."""
    if not output:
        raise PyobmemError("the output file name is empty")
    if os.path.isdir(output):
        raise PyobmemError(f"{output} is a directory")
    if os.path.exists(output):
        for arg in command:
            if os.path.exists(arg) and os.path.samefile(arg, output):
                raise PyobmemError(f"{output} is named by the command ({arg}); choose another output file")
        if not force:
            raise PyobmemError(f"{output} exists; use -f/--force to overwrite it")
    elif os.path.lexists(output) and not force:
        raise PyobmemError(f"{output} exists; use -f/--force to overwrite it")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise PyobmemError(f"{parent}: no such directory")


def launch(opts: Options) -> Outcome:
    """Trace ``opts.command`` into a capture. Returns the Outcome; raises PyobmemError for user errors."""
    if not opts.command:
        raise PyobmemError("no command to run", 2)
    executable = resolve_command(opts.command)
    output = default_output(opts.command) if opts.output is None else opts.output
    check_output(output, opts.force, opts.command)
    log = log_path(output) if opts.live else None
    if log is not None:
        check_output(log, opts.force, opts.command)
    if opts.budget is not None and not opts.swap:
        raise PyobmemError("--budget needs --swap", 2)
    if opts.swap and opts.budget is None:
        raise PyobmemError("--swap needs --budget SIZE (e.g. 16GiB, or 0.75 / 75% of the card)", 2)
    shim = find_shim()
    output = os.path.abspath(output)
    log = os.path.abspath(log) if log is not None else None

    ring_dir = os.environ.get(ENV_RING_DIR) or "/dev/shm"
    try:
        ring = Ring.create(opts.capacity, directory=ring_dir)
    except OSError as e:
        # The command is not run: a trace was asked for, and a long job run untraced by surprise
        # wastes more than a clear refusal (docs/internals.md, "Faults").
        records = 1 << max(4, (opts.capacity - 1).bit_length())  # as Ring.create rounds it
        mib = (abi.RING_HEADER_SIZE + records * abi.RECORD_SIZE + (1 << 20) - 1) >> 20
        hint = f" (the ring needs {mib} MiB: free space there, or use a smaller --capacity)" if e.errno == errno.ENOSPC else ""
        raise PyobmemError(f"cannot create the event ring in {ring_dir}: {e.strerror}{hint}") from None
    daemon = None
    control = None
    view = None
    log_fd = None
    try:
        if log is not None:
            try:
                log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as e:
                raise PyobmemError(f"cannot write {log}: {e.strerror}") from None
        per_tensor = opts.swap or opts.tensor_blocks
        env, applied = child_environment(dict(os.environ), shim, ring.path, opts.cupti, opts.presets, per_tensor)
        if opts.presets and per_tensor and not opts.quiet:
            for line in tensor_presets(dict(os.environ))[1]:
                _say(f"pyobmem: {line}")
            if applied:
                torch_note = (" (PyTorch then refuses memory snapshots and CUDA-graph trees)"
                              if any(k in applied for k in TORCH_CONF) else "")
                _say("pyobmem: presets, every tensor its own block: "
                     + ", ".join(f"{k}={v}" for k, v in applied.items()) + torch_note
                     + "; --no-presets turns them off")
        swap_meta = None
        if opts.swap:
            min_swap = DEFAULT_MIN_SWAP_BYTES if opts.min_swap_bytes is None else int(opts.min_swap_bytes)
            try:
                control = Control.create(ring.path + SUFFIX, opts.budget.resolve(None) or 0, min_swap)
            except OSError as e:
                raise PyobmemError(f"cannot create the swap control file in {ring_dir}: {e.strerror}") from None
            env[abi.ENV_CONTROL] = control.path
            swap_meta = {
                "budget": opts.budget.text, "budget_bytes": opts.budget.bytes, "budget_fraction": opts.budget.fraction,
                "min_swap_bytes": min_swap, "control": control.path,
            }
        meta = {
            "argv": list(opts.command),
            "command": shlex.join(opts.command),
            "executable": executable,
            "cwd": os.getcwd(),
            "pyobmem_version": __version__,
            "start_time": time.time(),
            "start_time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "start_monotonic_ns": time.monotonic_ns(),
            "presets": applied,
            "blocks": "tensor" if per_tensor and opts.presets else "allocator",
            "env": recorded_environment(os.environ),
            "hostname": socket.gethostname(),
            "shim": shim,
            "cupti": env.get(abi.ENV_CUPTI),
            "ring_capacity": ring.capacity,
            "launcher_pid": os.getpid(),
        }
        if swap_meta is not None:
            meta["swap"] = swap_meta
        daemon = _start_daemon(ring.path, output, opts.force, meta, swap_meta, stderr=log_fd)
        if log is not None:
            view = _start_view(output, log)
        status, daemon_failed = _run_child(executable, opts.command, env, daemon, log_fd)
        # The command has ended: a Ctrl-C now (closing --live's view, an impatient user) must not
        # cut the daemon's drain and leave the capture without its end (bounded by DAEMON_FINISH_S).
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            daemon_failed = _stop_daemon(daemon, status) or daemon_failed
        finally:
            signal.signal(signal.SIGINT, old_int)
        outcome = Outcome(status=status, output=output, daemon_failed=daemon_failed, log=log)
        _split_ranks(outcome, opts.force)
        if view is not None:
            _wait_view(view)
        return outcome
    finally:
        if view is not None and view.poll() is None:
            view.terminate()  # it restores the terminal and exits
            _wait_view(view)
        if log_fd is not None:
            os.close(log_fd)
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        ring.close(unlink=True)
        if control is not None:
            control.close(unlink=True)


def _split_ranks(outcome: Outcome, force: bool) -> None:
    """A distributed job (processes given ranks): one capture per rank next to the merged one
    (pyobmem.ranks). A failure is one line in the outcome; the merged capture is untouched."""
    try:
        outcome.rank_outputs = split(outcome.output, force=force)
    except PyobmemError as e:
        outcome.rank_error = str(e)


def _package_env() -> dict:
    """The environment for a Python process of ours (daemon, view): this package first on its path."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _start_view(output: str, log: str) -> subprocess.Popen:
    """--live: ``pyobmem live`` on the capture in this terminal (in the foreground process group,
    so it reads the keys; started before the run's signals are blocked)."""
    return subprocess.Popen([sys.executable, "-m", "pyobmem", "live", output, "--log", log], env=_package_env())


def _wait_view(view: subprocess.Popen) -> None:
    """Wait until the view is quit; a Ctrl-C reaches it too and ends it (it exits 0)."""
    while True:
        try:
            view.wait()
            return
        except KeyboardInterrupt:
            continue


def _start_daemon(ring_path: str, output: str, force: bool, meta: dict, swap: dict | None = None,
                  stderr: int | None = None) -> subprocess.Popen:
    """Start the daemon in its own session, hand it the metadata, wait for ``ready``. ``stderr``:
    where its warnings go (--live: the log, not the view's screen)."""
    env = _package_env()
    cmd = [sys.executable, "-m", "pyobmem.daemon", "--ring", ring_path, "--out", output]
    if force:
        cmd.append("--force")
    if swap is not None:
        cmd += ["--control", swap["control"], "--budget", swap["budget"]]
    daemon = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True, bufsize=0
    )
    try:
        daemon.stdin.write(json.dumps(meta).encode() + b"\n")
        answer = _read_line(daemon.stdout, DAEMON_START_S)
    except BrokenPipeError:
        answer = b""
    if answer.strip() != b"ready":
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
        text = answer.decode(errors="replace").strip()
        if text.startswith("error: "):
            raise PyobmemError(text[len("error: "):])
        raise PyobmemError("the capture daemon did not start" + (f": {text}" if text else ""))
    return daemon


def _read_line(stream, timeout_s: float) -> bytes:
    fd, buf, deadline = stream.fileno(), b"", time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf


def _run_child(executable: str, argv: list[str], env: dict, daemon: subprocess.Popen,
               log_fd: int | None = None) -> tuple[int, str | None]:
    """Run the command, forwarding signals; returns (status, one line if the daemon died).
    ``log_fd`` (--live): the command's stdout and stderr, its stdin /dev/null (the view has the
    terminal)."""
    waited = set(FORWARDED) | {signal.SIGCHLD}
    # Blocked here, a signal can still land on another thread of ours (numpy's BLAS threads do
    # not block it; seen with --live under load), where the default action or KeyboardInterrupt
    # would end the launcher mid-run: a handler notes it for the loop instead.
    taken: list = []
    saved = {s: signal.signal(s, lambda signo, frame: taken.append(signo)) for s in FORWARDED}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    daemon_failed = None
    try:
        # The child starts with an empty mask and the default dispositions Python changed.
        spawn = dict(setsigmask=(), setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        if log_fd is not None:
            spawn["file_actions"] = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                     (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2)]
        try:
            pid = os.posix_spawn(executable, argv, env, **spawn)
        except OSError as e:
            if e.errno != errno.ENOEXEC:
                raise PyobmemError(f"{argv[0]}: {e.strerror}", 126) from None
            # A script without a #! line: run it with /bin/sh, as a shell (and execvp) would.
            pid = os.posix_spawn("/bin/sh", ["/bin/sh", executable, *argv[1:]], env, **spawn)
        while True:
            info = signal.sigtimedwait(waited, 0.5)
            if info is not None and info.si_signo != signal.SIGCHLD:
                # Ctrl-C / Ctrl-\ at the terminal already reached the child (same process
                # group): forward only what was sent to us alone, so the child gets it once.
                if not (info.si_code == SI_KERNEL and info.si_signo in (signal.SIGINT, signal.SIGQUIT)):
                    _forward(pid, info.si_signo)
            while taken:  # no sender known: SIGINT and SIGQUIT are taken for the terminal's
                signo = taken.pop(0)
                if signo not in (signal.SIGINT, signal.SIGQUIT):
                    _forward(pid, signo)
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(wstatus)
                break
            if daemon_failed is None and daemon.poll() is not None:
                daemon_failed = f"the capture daemon stopped during the run (status {daemon.returncode}); the capture ends there"
        if daemon_failed is None and daemon.poll() is not None:
            daemon_failed = f"the capture daemon stopped during the run (status {daemon.returncode}); the capture ends there"
        return status, daemon_failed
    finally:
        # Discard what was sent to us while we waited: it was forwarded, or it is the child's.
        while signal.sigtimedwait(waited, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for signo, handler in saved.items():
            signal.signal(signo, handler)


def _forward(pid: int, signo: int) -> None:
    try:
        os.kill(pid, signo)
    except ProcessLookupError:
        pass


def _stop_daemon(daemon: subprocess.Popen, status: int) -> str | None:
    """Tell the daemon the run ended with ``status``; wait for it to drain (bounded)."""
    if daemon.poll() is not None:
        return None
    try:
        daemon.stdin.write(f"end {status}\n".encode())
        daemon.stdin.close()
    except BrokenPipeError:
        pass
    try:
        daemon.wait(DAEMON_FINISH_S)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
        return f"the capture daemon did not finish within {DAEMON_FINISH_S:.0f} s; the capture may be incomplete"
    if daemon.returncode != 0:
        return f"the capture daemon failed (status {daemon.returncode}); the capture may be incomplete"
    return None


def _say(line: str) -> None:
    """One line on stderr before the command starts (a closed stderr is not our failure)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
