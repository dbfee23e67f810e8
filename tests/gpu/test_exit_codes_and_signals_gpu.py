"""The launcher preserves a CUDA program's exit status (code or signal), and the capture, written
by the daemon, records it and stays readable with the events up to the end."""

import signal
import sys

import pytest

from gpu_util import PROGS, ival, one_block, run_traced

CASES = {
    "exit7": ({7}, 7),
    "sigkill": ({-signal.SIGKILL, 128 + signal.SIGKILL}, -signal.SIGKILL),
    "sigterm": ({-signal.SIGTERM, 128 + signal.SIGTERM}, -signal.SIGTERM),
}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(CASES))
def test_exit_codes_and_signals_gpu(shim, need_torch, tmp_path, mode):
    launcher_codes, status = CASES[mode]
    run = run_traced([sys.executable, PROGS / "torch_exit.py", mode], tmp_path, timeout=300)
    assert run.rc in launcher_codes, f"{mode}: launcher exit {run.rc}, expected one of {launcher_codes}\n{run.why()}"
    cap = run.cap
    assert cap.complete, "the daemon did not finish the capture"
    assert cap.exit_status == status, (cap.exit_status, status)
    row = one_block(cap, run.pid, ival(run.kv["ptr"]), int(run.kv["size"]))
    assert int(cap.blocks["t_free"][row]) == -1
