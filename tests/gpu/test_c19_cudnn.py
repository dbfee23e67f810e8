"""C19: no dlopen interposition: cuDNN's sub-libraries load under the shim and a conv2d forward
and backward gives the same bits as without it; the capture says how many untracked ranges
(pointers first seen in a free or launch, never allocated under the shim) there were."""

import json
import sys

import numpy as np
import pytest

from gpu_util import PROGS, live_at, one_block, record_figure, run_plain, run_traced


@pytest.mark.gpu
def test_c19_cudnn_loads(shim, need_torch, tmp_path):
    env = {"PYTORCH_CUDA_ALLOC_CONF": None}
    plain = run_plain([sys.executable, PROGS / "torch_conv.py", tmp_path / "plain.json"], tmp_path, env=env)
    assert plain.rc == 0, plain.why()
    traced = run_traced([sys.executable, PROGS / "torch_conv.py", tmp_path / "traced.json"], tmp_path, env=env)
    assert traced.rc == 0, traced.why()
    p = json.loads((tmp_path / "plain.json").read_text())
    t = json.loads((tmp_path / "traced.json").read_text())
    assert p["cudnn_version"] and t["cudnn_version"] == p["cudnn_version"]
    # cuDNN 9 dlopens its sub-libraries (graph, engines, heuristic, ...) at first use.
    assert any(name.startswith("libcudnn_") for name in p["cudnn_libs"]), p["cudnn_libs"]
    assert t["cudnn_libs"] == p["cudnn_libs"]
    assert t["hashes"] == p["hashes"], "conv2d results differ under pyobmem"

    cap, pid = traced.cap, t["pid"]
    for seg in t["segments"]:
        row = one_block(cap, pid, seg["address"], seg["total_size"])
        assert live_at(cap, row, t["t_snap"])
    untracked = int(np.count_nonzero(cap.untracked["pid"] == pid))
    notes = {k: v for k, v in cap.notes.get(pid, {}).items() if "untracked" in k}
    record_figure("c19_cudnn", {"untracked_ranges": untracked, "untracked_notes": notes,
                                "cudnn_libs": t["cudnn_libs"], "cudnn_version": t["cudnn_version"]})
    # The shim was there from the first CUDA call: nothing pre-existing, nothing untracked.
    assert untracked == 0, cap.untracked[cap.untracked["pid"] == pid].tolist()
    for key, value in notes.items():
        assert int(value) == untracked, (key, value)
