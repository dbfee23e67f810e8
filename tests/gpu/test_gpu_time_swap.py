"""The mechanism of a swap executor acting in GPU time, on the real driver (progs/gpu_time_swap.cu):
the host issues the swap-out, the rest of the work, a stream wait on a flag and the consumer at
once; a helper thread releases the block's memory when the copy out ends and maps it back at the
same address when the GPU reaches the mark, then writes the flag from the host-to-device stream.
Not traced: it checks the driver behaviour the executor will build on (docs/swap.md)."""

import pytest

from gpu_util import ival, record_figure, run_plain

MIB = 1024
SLEEP_MS = 200


@pytest.mark.gpu
def test_swap_in_enacted_in_gpu_time(progs, tmp_path):
    exe = progs.build("gpu_time_swap")
    run = run_plain([exe, str(MIB), str(SLEEP_MS)], tmp_path)
    kv = run.kv
    record_figure("gpu_time_swap", kv)
    assert run.rc == 0 and ival(kv["mismatches"]) == 0, run.why()  # the consumer read the producer's values
    assert float(kv["host_issue_ms"]) < SLEEP_MS / 20  # the host ran ahead: everything issued at once
    # The memory was really given back while the GPU was busy, and mapped again before the end.
    assert float(kv["free_mib_released"]) - float(kv["free_mib_before"]) >= 0.9 * MIB
    assert float(kv["released_at_ms"]) < float(kv["mapped_at_ms"]) < float(kv["wall_ms"])
    assert float(kv["gpu_ms"]) < SLEEP_MS * 1.5  # no serialisation behind the helper thread beyond the copies
