"""What the CLI tests share: a clean environment, the two entry points run as subprocesses, and the
check that an error is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# Variables of the caller that would change what the launcher or the shim does.
FOREIGN = ("PYOBMEM_", "XLA_", "PYTORCH_", "CUPY_")


def clean_env(extra: dict | None = None, drop=()) -> dict:
    """os.environ without pyobmem's, the frameworks' allocator variables and LD_PRELOAD; the
    source tree on PYTHONPATH; ``drop`` removed, ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = str(ROOT)
    for k in drop:
        env.pop(k, None)
    env.update(extra or {})
    return env


def pyobmem(*args, cwd, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    """``python -m pyobmem ARGS`` in ``cwd`` (text output captured)."""
    return subprocess.run([PY, "-m", "pyobmem", *map(str, args)], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def pyobmem_run(*args, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    """The ``pyobmem-run`` entry point (the package need not be installed: run_main is called)."""
    code = "import sys; from pyobmem.cli import run_main; sys.exit(run_main())"
    return subprocess.run([PY, "-c", code, *map(str, args)], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(stderr: str, text: str, *, exact: bool = True) -> None:
    """stderr is the one line ``pyobmem: error: TEXT`` (``exact=False``: a line holding TEXT)."""
    lines = [x for x in stderr.splitlines() if x]
    if exact:
        assert lines == [f"pyobmem: error: {text}"], stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("pyobmem: error: ") and text in lines[0], stderr
