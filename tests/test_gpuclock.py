"""CPU tests of the GPU clock samples (native/gpuclock.c) against the fake libcuda, whose GPU
clock advances FAKE_KERNEL_NS (1000) per kernel it runs and nothing else, so the GPU time of a
sample is known exactly: the reference event's host time plus 1000 ns per kernel run since."""

from __future__ import annotations

import numpy as np

from pyobmem.abi import Ev

from test_shim import SHIM, fake, run_driver  # noqa: F401  (fixture)


def _note(run, key):
    from test_shim import texts

    for t in texts(run.of(Ev.NOTE)):
        if t.startswith(key + "="):
            return dict(kv.split("=") for kv in t[len(key) + 1 :].split())
    return None


def test_gpuclock_every_n_ops_none_in_capture(fake, tmp_path):
    run = run_driver(fake, tmp_path, "gpuclock", 10, env={"PYOBMEM_GPU_CLOCK_EVERY": "4"})
    g = run.of(Ev.GPU_TIME)
    # ops 1-10 on 0x77, 11-20 capturing (12, 16, 20 due: skipped), 21-30 on 0x77, 31-40 per-thread
    assert [int(s) for s in g["a"]] == [4, 8, 24, 28, 32, 36, 40]
    assert [int(s) for s in g["b"]] == [0x77, 0x77, 0x77, 0x77, 0x2, 0x2, 0x2]
    t = g["c"].astype(np.int64)
    # kernels run before each sample: 4, 8, 14, 18, 22, 26, 30 (the captured ones never run)
    assert (t - t[0]).tolist() == [0, 4000, 10000, 14000, 18000, 22000, 26000]
    assert run.out["capture_violations"] == 0
    assert run.out["legacy_records"] == 0  # per-thread ops: sampled on CU_STREAM_PER_THREAD
    launches = run.of(Ev.LAUNCH)
    assert all(int(launches[launches["a"] == s]["c"][0]) == int(b) or b == 2 for s, b in zip(g["a"], g["b"]))
    assert _note(run, "gpu_clock") == {"every": "4", "every_max": "4", "pool": "256", "samples": "7", "skipped": "3", "refs": "1",
                                        "ref_rejects": "0"}


def test_gpuclock_reference_timed_after_its_record_is_issued(fake, tmp_path):
    """A record that waits in the driver (20 ms here, FAKE_RECORD_DELAY_US; a full launch queue
    on the H200) is timed from its return: the first sample, op 4's, ran after op 4's launch and
    the reference's 20 ms wait. Timed from before the record, its midpoint put the sample 10 ms
    early, and GPT medium's samples up to 52 ms before their own launches."""
    run = run_driver(fake, tmp_path, "gpuclock", 10,
                     env={"PYOBMEM_GPU_CLOCK_EVERY": "4", "FAKE_RECORD_DELAY_US": "20000"})
    g = run.of(Ev.GPU_TIME)
    launches = run.of(Ev.LAUNCH)
    assert int(g["a"][0]) == 4
    launched = int(launches[launches["a"] == 4]["ts_ns"][0])
    assert int(g["c"][0]) - launched >= 20_000_000
    assert _note(run, "gpu_clock")["refs"] == "1"


def test_gpuclock_off(fake, tmp_path):
    run = run_driver(fake, tmp_path, "gpuclock", 10, env={"PYOBMEM_GPU_CLOCK_EVERY": "0"})
    assert len(run.of(Ev.GPU_TIME)) == 0
    assert _note(run, "gpu_clock") is None
    assert len(run.of(Ev.LAUNCH)) == 40


def test_gpuclock_full_pool_skips_never_waits(fake, tmp_path):
    # 100 kernels on a stream that runs nothing until all are issued: 25 samples due, 8 events
    run = run_driver(fake, tmp_path, "gpuclock_pool", 100,
                     env={"PYOBMEM_GPU_CLOCK_EVERY": "4", "PYOBMEM_GPU_CLOCK_POOL": "8"})
    g = run.of(Ev.GPU_TIME)
    assert [int(s) for s in g["a"]] == [4, 8, 12, 16, 20, 24, 28, 32]
    t = g["c"].astype(np.int64)
    assert (t - t[0]).tolist() == [4000 * i for i in range(8)]
    assert run.out["events_live"] == 8 + 4  # the pool and the reference events, no more
    assert _note(run, "gpu_clock") == {"every": "4", "every_max": "4", "pool": "8", "samples": "8", "skipped": "17", "refs": "1",
                                        "ref_rejects": "0"}


def test_gpuclock_fork_child_starts_its_own(fake, tmp_path):
    # parent: op 1, fork, op 2; child: its own op 1 (its own pool, thread and op seqs)
    run = run_driver(fake, tmp_path, "fork", env={"PYOBMEM_GPU_CLOCK_EVERY": "1"})
    parent, child = run.out["parent_pid"], run.out["child_pid"]
    g = run.of(Ev.GPU_TIME)
    assert [int(s) for s in g[g["pid"] == parent]["a"]] == [1, 2]
    # the child leaves with _exit: its sample is written only if its thread read it back in time
    assert [int(s) for s in g[g["pid"] == child]["a"]] in ([], [1])
    assert set(g["pid"].tolist()) <= {parent, child}


def test_gpuclock_exit_wakes_a_long_nap(fake, tmp_path):
    """The poller naps up to 16 ms (PYOBMEM_GPU_CLOCK_POLL_US asks for more: capped); the exit
    wakes it, so its last pass still reads every sample and writes the note. With a 1 s nap
    sleeping through the 200 ms exit wait, the note and 4 of 5 samples were lost (review, session 6)."""
    env = {"PYOBMEM_GPU_CLOCK_EVERY": "4", "PYOBMEM_GPU_CLOCK_POLL_US": "1000000"}
    run = run_driver(fake, tmp_path, "steps", 5, 20, env=env)
    assert len(run.of(Ev.GPU_TIME)) == 5
    assert _note(run, "gpu_clock") == {"every": "4", "every_max": "4", "pool": "256", "samples": "5", "skipped": "0", "refs": "1",
                                        "ref_rejects": "0"}


def test_gpuclock_interval_follows_the_gpu_time_of_its_ops(fake, tmp_path):
    """PYOBMEM_GPU_CLOCK_EVERY unset: the interval starts at 32 ops and doubles, up to 256, while the
    samples a pass reads are under 1 ms of GPU time apart (scaled to the interval in force): 6 bursts
    of 512 kernels of 1 us (a launch-bound program's). Kernels of 100 us (32 ops: 3.2 ms) keep it at
    32, as GPT medium's ops do."""
    env = {"PYOBMEM_GPU_CLOCK_POLL_US": "1000"}
    run = run_driver(fake, tmp_path, "gpuclock_bursts", 6, 512, 30, env=env)
    seqs = [int(s) for s in run.of(Ev.GPU_TIME)["a"]]
    steps = np.diff([0] + seqs).tolist()
    assert steps[:4] == [32] * 4  # a pass reads at least 4 gaps before it doubles
    assert steps == sorted(steps) and set(steps) <= {32, 64, 128, 256} and steps[-1] == 256
    assert seqs[-1] > 6 * 512 - 256
    note = _note(run, "gpu_clock")
    assert (note["every"], note["every_max"], note["samples"]) == ("32", "256", str(len(seqs)))
    slow = run_driver(fake, tmp_path, "gpuclock_bursts", 2, 512, 30, env=dict(env, FAKE_KERNEL_NS="100000"))
    seqs = [int(s) for s in slow.of(Ev.GPU_TIME)["a"]]
    assert seqs == list(range(32, 1025, 32))
    assert (_note(slow, "gpu_clock")["every"], _note(slow, "gpu_clock")["every_max"]) == ("32", "32")
