"""C16 under swap mode on the real driver: a persistent kernel keeps running on one stream while the
shim swaps blocks used on another stream (tests/gpu/progs/swap_cases.cu, mode c16).

A one-thread kernel spins on stream s1 until the host sets a flag in host-mapped memory (at most
8 s: then it gives up and says so). Meanwhile four 64 MiB blocks under a budget of two (160 MiB) are
touched in turn on the case stream, 20 touches, each synchronising only that stream: every touch
brings its block back and evicts another one. The swap path must wait only on the blocks' own
last-use events (never a device-wide synchronisation, a synchronising free or an unmap that waits
for unrelated work): all 20 touches complete, with their swap-outs released, while the spinner
still runs; only then does the host set the flag. A swap path that waited for the spinner would
have kept the touches from completing until its 8 s time-out."""

import pytest

from gpu_util import build_swap_prog, describe_swaps, record_figure, run_swap, swap_on, swap_rows

ROUNDS = 5


@pytest.fixture(scope="module")
def c16(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("c16")
    return run_swap([build_swap_prog(progs), "c16", ROUNDS], d, budget="160MiB", timeout=180)


@pytest.mark.gpu
def test_c16_swaps_do_not_wait_for_a_persistent_kernel(c16):
    run = c16
    kv = run.kv
    assert kv.get("spinner_started") == "1", f"the spinning kernel never started\n{run.why()}"
    assert "spinner_running_after_other" in kv, run.why()
    figures = {k: kv.get(k) for k in ("other_ms", "spinner_running_after_other", "spinner_timed_out", "touches")}
    assert kv["spinner_running_after_other"] == "1" and kv["spinner_timed_out"] == "0", (
        f"the work on the other stream (with its swaps) completed only after the spinning kernel had stopped: "
        f"{figures}; something on the swap path waited for unrelated work\n{run.why()}"
    )
    assert run.rc == 0 and kv.get("done") == "1", run.why()
    assert kv["dev_errors"] == "0" and kv["host_bad"] == "0", run.why()

    cap, pid = run.cap, run.pid
    swap_on(cap, pid)
    s = cap.swaps
    mine = swap_rows(cap, pid)
    t0, t1 = int(kv["t_spin_start"]), int(kv["t_other_done"])
    w = mine[(s["ts_ns"][mine] >= t0) & (s["ts_ns"][mine] <= t1)]
    outs, ins = w[s["direction"][w] == 0], w[s["direction"][w] == 1]
    figures.update(swap_outs_while_spinning=len(outs), swap_ins_while_spinning=len(ins))
    record_figure("c16_persistent", figures)
    touches = int(kv["touches"])
    # Every touch found its block out (LRU, four blocks in turn, room for two).
    assert len(ins) >= touches - 1, f"{len(ins)} swap-ins while spinning, {touches} touches\n{describe_swaps(cap, pid)}"
    # Swap-outs released (unmapped) while the spinner ran.
    assert len(outs) >= touches - 2, f"{len(outs)} swap-outs while spinning\n{describe_swaps(cap, pid)}"
