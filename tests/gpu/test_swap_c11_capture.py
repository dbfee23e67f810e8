"""C11 under swap mode on the real driver: the application captures CUDA graphs (global capture
mode, the strictest) while the shim has swapping to do (tests/gpu/progs/swap_cases.cu, mode c11;
five 64 MiB blocks, budget 160 MiB):

1. the capturing thread launches kernels on two blocks that are out: the shim brings them back
   synchronously on its own stream without touching the capturing stream, and evicts nothing
   while the capture is open (no SWAP_OUT written inside the capture window);
2. while the capture is open, another thread launches kernels on blocks that are out, on a stream
   of its own: the shim swaps for them (its driver calls in relaxed capture mode), and the first
   thread's capture must survive.

Both cudaStreamEndCapture calls must succeed, the captured graphs must run and every word must be
right."""

import numpy as np
import pytest

from gpu_util import build_swap_prog, describe_swaps, record_figure, run_swap, swap_on, swap_rows


@pytest.fixture(scope="module")
def c11(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c11")
    return run_swap([build_swap_prog(progs), "c11"], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c11_capture_not_invalidated(c11):
    run = c11
    kv = run.kv
    assert "capture2_rc" in kv, run.why()
    assert kv["capture1_launch_rc"] == "0" and kv["capture1_rc"] == "0", (
        f"capture on the app's thread while blocks it launches on were out: launch rc {kv['capture1_launch_rc']}, "
        f"cudaStreamEndCapture rc {kv['capture1_rc']} (901 = cudaErrorStreamCaptureInvalidated)\n{run.why()}"
    )
    assert kv["other_thread_done"] == "1" and kv["other_thread_rc"] == "0", run.why()
    assert kv["capture2_launch_rc"] == "0" and kv["capture2_rc"] == "0", (
        f"capture while another thread's launches made the shim swap: launch rc {kv['capture2_launch_rc']}, "
        f"cudaStreamEndCapture rc {kv['capture2_rc']}\n{run.why()}"
    )
    assert run.rc == 0 and kv.get("done") == "1", run.why()
    assert kv["dev_errors"] == "0" and kv["host_bad"] == "0", run.why()
    for i, want in enumerate([2, 2, 1, 1, 1]):
        assert int(kv[f"round_{i}"]) == want, kv


@pytest.mark.gpu
def test_c11_swaps_during_captures(c11):
    run = c11
    cap, kv, pid = run.cap, run.kv, run.pid
    swap_on(cap, pid)
    s = cap.swaps
    mine = swap_rows(cap, pid)

    def window(a, b):
        w = mine[(s["ts_ns"][mine] >= int(kv[a])) & (s["ts_ns"][mine] <= int(kv[b]))]
        return w[s["direction"][w] == 0], w[s["direction"][w] == 1]

    out1, in1 = window("t_c1_begin", "t_c1_end")
    out2, in2 = window("t_c2_begin", "t_c2_end")
    record_figure("c11_capture", {"capture1_swap_outs": len(out1), "capture1_swap_ins": len(in1),
                                  "capture2_swap_outs": len(out2), "capture2_swap_ins": len(in2)})
    # 1: both captured blocks were out and came back during the capture; nothing was evicted then.
    assert len(in1) >= 2, f"expected the two captured blocks brought back during capture 1\n{describe_swaps(cap, pid)}"
    assert len(out1) == 0, f"swap-outs written while capture 1 was open:\n{describe_swaps(cap, pid, out1)}"
    # 2: the other thread's launches made the shim swap while the capture was open.
    assert len(in2) >= 1, f"no swap-in during capture 2: the scenario did not happen\n{describe_swaps(cap, pid)}"
    assert np.all(s["bytes"][mine] == 64 << 20)
