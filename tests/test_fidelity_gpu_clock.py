"""scripts/_fidelity_gpu_clock.py without a GPU: the workload run is replaced by one that writes a
synthetic capture (iterations of 6 µs on the host, 9 µs on the GPU clock) and step lines of 9 µs."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import _bench  # noqa: E402
import _fidelity_gpu_clock as part  # noqa: E402

from synth import Trace  # noqa: E402


def _fake_run(samples: bool):
    def run(cmd, **kw):
        cap = Path(cmd[cmd.index("-o") + 1])
        tr = Trace()
        blk = tr.alloc(1 << 20)
        for _ in range(8):
            for h in (0x1000, 0x2000, 0x3000):
                tr.launch(h, [blk])
        if samples:
            for i in range(8):
                tr.gpu_time(3 * i + 1, 1_000_000 + 9_000 * i)
            tr.gpu_time(24, 1_000_000 + 9_000 * 7 + 6_000)
        tr.write(cap)
        out = "".join(f"step {i} loss {float(1.0).hex()} time_ms 0.009\n" for i in range(12))
        return subprocess.CompletedProcess(cmd, 0, out, "")
    return run


def test_part_reports_both_clocks(tmp_path, monkeypatch):
    monkeypatch.setattr(part.subprocess, "run", _fake_run(True))
    r = part.run(SimpleNamespace(work=tmp_path))
    assert r["step_ms_measured"] == 0.009
    assert r["iteration_ms_gpu"] == 0.009 and r["iteration_ms_host"] == 0.006
    assert r["gpu_vs_measured"] == 0.0 and r["host_vs_measured"] == pytest.approx(-1 / 3, abs=1e-4)
    assert r["within_3pct"] is True
    assert r["samples"] == 9 and r["model_clock"] == "gpu" and r["ops_per_iteration"] == 3


def test_part_without_samples_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(part.subprocess, "run", _fake_run(False))
    with pytest.raises(_bench.BenchError, match="no GPU clock"):
        part.run(SimpleNamespace(work=tmp_path))
