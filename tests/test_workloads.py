"""scripts/workloads: the memory statistics under each PyTorch allocator backend (a stand-in torch
module) and ResNet-50's one-line error where torchvision is missing. The workloads themselves run
on the H200 (scripts/bench_swap.py)."""

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
import _common  # noqa: E402


def fake_torch(backend: str):
    """The torch.cuda calls torch_memory makes; the snapshot refuses as PyTorch does under
    cudaMallocAsync (and counts its calls)."""
    calls = []

    def snapshot():
        calls.append("snapshot")
        if backend != "native":
            raise RuntimeError("cudaMallocAsync does not yet support _snapshot")
        return {"segments": [{"address": 0x7F0000000000, "total_size": 2 << 20}]}

    cuda = types.SimpleNamespace(
        memory_stats=lambda: {"reserved_bytes.all.peak": 6 << 20, "allocation.all.allocated": 12},
        get_allocator_backend=lambda: backend, get_device_name=lambda i: "NVIDIA H200",
        memory=types.SimpleNamespace(_snapshot=snapshot))
    return types.SimpleNamespace(cuda=cuda, __version__="2.11.0"), calls


def test_torch_memory_native_reads_the_segments(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    torch, calls = fake_torch("native")
    m = _common.torch_memory(torch)
    assert calls == ["snapshot"] and m["segments"] == [[0x7F0000000000, 2 << 20]]
    assert m["memory_stats"]["reserved_bytes.all.peak"] == 6 << 20 and m["memory_stats"]["segment.all.allocated"] == 0
    assert m["allocator_backend"] == "native" and m["alloc_conf"] == {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_torch_memory_under_cudamallocasync_takes_no_snapshot(monkeypatch, var):
    """The backend PyTorch reports decides (it parsed either variable): no snapshot, no segments."""
    for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, "backend:cudaMallocAsync")
    torch, calls = fake_torch("cudaMallocAsync")
    m = _common.torch_memory(torch)
    assert calls == [] and m["segments"] is None
    assert m["allocator_backend"] == "cudaMallocAsync" and m["alloc_conf"] == {var: "backend:cudaMallocAsync"}


def test_resnet50_without_torchvision_is_one_line(tmp_path):
    """A torch that imports and sees a GPU, and no torchvision: exit 2 with one line, no traceback."""
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("class cuda:\n    is_available = staticmethod(lambda: True)\n")
    r = subprocess.run([sys.executable, str(WORKLOADS / "resnet50.py"), "--steps", "2"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("resnet50.py: error: torchvision is not importable (No module named 'torchvision')")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_steps_time_is_the_wall_time_since_the_previous_record(monkeypatch, capsys):
    """A loop times each step between its own device syncs; what lies between one step's sync and
    the next (the loss read, the loop's sync, where swap-mode work of the shim's can land) counts
    too: step_ms is the wall time since the previous record, per step between them (a loop that
    records every 2 steps), the first record's the loop's own; sync_ms keeps the loop's."""
    clock = iter([10.0, 10.7, 11.9])
    monkeypatch.setattr(_common, "now", lambda: next(clock))
    rec = _common.Recorder()
    rec.step(0, 1.5, 500.0)
    rec.step(1, 1.25, 510.0)  # 0.7 s after the first record
    rec.step(3, 1.0, 520.0)   # 1.2 s later, two steps
    assert rec.step_ms == [500.0, 700.0, 600.0]
    assert rec.sync_ms == [500.0, 510.0, 520.0]
    assert capsys.readouterr().out.splitlines()[1] == f"step 1 loss {1.25.hex()} time_ms 700.000"
