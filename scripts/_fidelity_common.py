"""What the fidelity parts share: run a workload (untraced or under pyobmem-run) and read its result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import _bench

if str(_bench.REPO) not in sys.path:
    sys.path.insert(0, str(_bench.REPO))  # pyobmem from this tree, to read the captures

TIMEOUT_S = 300


def run_workload(script: str, args: list[str], work: Path, name: str, traced: bool,
                 launcher_options: tuple[str, ...] = ()) -> tuple[dict, Path | None]:
    """Run scripts/workloads/``script`` with ``args``; under ``python -m pyobmem run`` (its
    defaults plus ``launcher_options``) when ``traced``. Returns (its JSON, the capture or None).
    Raises _bench.BenchError with the tail of its output when it fails or writes no JSON."""
    json_path = work / f"{name}.json"
    capture = work / f"{name}.pyobmem" if traced else None
    json_path.unlink(missing_ok=True)
    cmd = _bench.workload_command(script, args, json_path, capture, launcher_options)
    p = subprocess.run(cmd, cwd=_bench.REPO, env=_bench.child_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    (work / f"{name}.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0 or not json_path.exists():
        tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
        raise _bench.BenchError(f"{name}: {script} exited {p.returncode}: {tail}")
    _, _, doc, errors = _bench.read_steps(p.stdout, json_path)
    if errors or doc is None:
        raise _bench.BenchError(f"{name}: {'; '.join(errors) or 'no JSON'}")
    return doc, capture
