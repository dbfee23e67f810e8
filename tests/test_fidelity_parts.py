"""The fidelity parts ``attribution`` and ``profiler`` (scripts/_fidelity_*.py) turn what their
workloads wrote and captured into the figures of bench/results/fidelity.json. The workloads need a
GPU; here the capture is the fake driver's "hostmem" scenario (tests/test_hostmem.py) and the
workload JSON is given, so the figures are known exactly."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace


from test_shim import fake, run_driver  # noqa: F401  (fake: the fixture)

from pyobmem.capture import CaptureWriter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import _fidelity_attribution  # noqa: E402
import _fidelity_common  # noqa: E402
import _fidelity_profiler  # noqa: E402


def hostmem_capture(fake, tmp_path, name: str, env: dict | None = None) -> Path:
    run = run_driver(fake, tmp_path, "hostmem", env={"FAKE_HOST_ALIAS": "1", **(env or {})})
    path = tmp_path / f"{name}.pyobmem"
    w = CaptureWriter(str(path), {"argv": ["hostmem"]})
    w.write(run.records)
    w.finish(0, 0, int(run.records["ts_ns"].max()) if len(run.records) else 0)
    w.close()
    return path


def test_attribution_part_figures(fake, tmp_path, monkeypatch):
    capture = hostmem_capture(fake, tmp_path, "flax_mlp")
    calls = []

    def fake_run(script, args, work, name, traced, launcher_options=()):
        calls.append((script, args, name, traced, launcher_options))
        return {"losses": ["0x1p+0"] * 50}, capture

    monkeypatch.setattr(_fidelity_common, "run_workload", fake_run)
    out = _fidelity_attribution.run(SimpleNamespace(work=tmp_path))["flax_mlp"]
    assert calls == [("flax_mlp.py", ["--steps", "50", "--batch", "512"], "flax_mlp", True, ())]  # the defaults
    assert {k: out[k] for k in ("launches", "attributed", "host_only", "unattributed", "no_addresses")} == {
        "launches": 8, "attributed": 3, "host_only": 2, "unattributed": 3, "no_addresses": 0}
    assert out["unattributed_pct"] == 37.5
    assert out["unattributed_kernels"] == [{"kernel": "kernel_a", "launches": 3}]
    assert out["host_only_kernels"] == [{"kernel": "kernel_a", "launches": 2}]
    assert [u["what"].split()[0] for u in out["unknown_addresses"]] == ["device"]
    assert out["traced_by"] == {"hooks": 8, "cupti": 0} and out["steps"] == 50


def test_profiler_part_figures(fake, tmp_path, monkeypatch):
    captures = {"profiled_traced": hostmem_capture(fake, tmp_path, "traced"),
                "profiled_cupti": hostmem_capture(fake, tmp_path, "cupti",
                                                  env={"PYOBMEM_CUPTI": str(fake / "libcupti.so")})}
    kernels = {"profiled_plain": 125, "profiled_traced": 125, "profiled_cupti": 0}
    options = {}

    def fake_run(script, args, work, name, traced, launcher_options=()):
        assert script == "torch_profiled.py" and args == ["--steps", "5"]
        options[name] = (traced, launcher_options)
        return {"profiler_kernels": kernels[name]}, captures.get(name)

    monkeypatch.setattr(_fidelity_common, "run_workload", fake_run)
    out = _fidelity_profiler.run(SimpleNamespace(work=tmp_path))
    assert options == {"profiled_plain": (False, ()), "profiled_traced": (True, ()),
                       "profiled_cupti": (True, ("--cupti",))}
    assert (out["kernels_without_pyobmem"], out["kernels_with_pyobmem"], out["kernels_with_pyobmem_cupti"]) == (125, 125, 0)
    assert out["ok"] is True
    assert out["pyobmem"]["traced_by"] == {"hooks": 8, "cupti": 0}
    assert out["pyobmem"]["cupti_note"] == "off (the default; --cupti subscribes)"
    assert out["pyobmem_cupti"]["traced_by"] == {"hooks": 0, "cupti": 8}
    assert out["pyobmem_cupti"]["cupti_note"].startswith(f"active: {fake / 'libcupti.so'}")
    assert out["pyobmem"]["attribution"]["unattributed"] == out["pyobmem_cupti"]["attribution"]["unattributed"] == 3
