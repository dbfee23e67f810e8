"""C05: CUPTI allows one subscriber per process. pyobmem-run's default traces launches from the
shim's hooks and never subscribes, so the application (or Nsight, torch.profiler) keeps CUPTI.
With --cupti the shim subscribes when CUPTI is free; when the application holds it, the shim traces
from its hooks and says so once, naming the library, its version and the error (C25)."""

import pytest

from gpu_util import RT_FLAGS, RT_NAMES, check_variants, describe_ops, ival, note, one_block, op_rows, ops_touching_exactly, \
    process_row, run_plain, run_traced
from pyobmem import abi

VIA_CUPTI = int(abi.LaunchFlag.VIA_CUPTI)


@pytest.mark.gpu
@pytest.mark.parametrize("run_args, said", [((), "off"), (("--cupti",), "unavailable")], ids=["default", "cupti"])
def test_c05_cupti_taken(shim, progs, cupti_path, tmp_path, run_args, said):
    exe = progs.build("c05_cupti_first")
    plain = run_plain([exe, cupti_path], tmp_path)
    assert plain.rc == 0 and plain.kv["subscribe_rc"] == "0", plain.why()
    callbacks = int(plain.kv["runtime_callbacks"])
    assert callbacks > 0
    run = run_traced([exe, cupti_path], tmp_path, env={"PYOBMEM_CUPTI": cupti_path}, run_args=run_args)
    assert run.rc == 0, run.why()  # 3 would mean the application lost its own subscription
    kv, cap, pid = run.kv, run.cap, run.pid
    assert kv["subscribe_rc"] == "0" and kv["enable_rc"] == "0" and kv["done"] == "1"
    assert kv["wrong_values"] == "0"
    # The application's subscriber still gets every callback it got without pyobmem.
    assert int(kv["runtime_callbacks"]) == callbacks
    assert kv["unsubscribe_rc"] == plain.kv["unsubscribe_rc"]
    value = note(cap, pid, "cupti")
    assert value is not None and value.startswith(said), f"notes: {cap.notes}"
    if said == "unavailable":  # one line: the library's path, its version, the error
        assert "libcupti" in value and "CUPTI version" in value and "CUPTI_ERROR" in value, value
    assert int(cap.processes["source"][process_row(cap, pid)]) == abi.LaunchSource.HOOKS
    a, b = ival(kv["a"]), ival(kv["b"])
    one_block(cap, pid, a, int(kv["size_a"]))
    one_block(cap, pid, b, int(kv["size_b"]))
    rows = ops_touching_exactly(cap, pid, [(a, 0), (b, 0)])
    assert len(rows) == int(kv["launches"]) == len(op_rows(cap, pid)), describe_ops(cap, pid)
    for r in rows:
        assert int(cap.ops["flags"][r]) & VIA_CUPTI == 0, describe_ops(cap, pid)
        assert int(cap.ops["n_touched"][r]) == 2


@pytest.mark.gpu
def test_c05_cupti_active(shim, progs, cupti_path, tmp_path):
    run = run_traced([progs.build("launch_rt")], tmp_path, env={"PYOBMEM_CUPTI": cupti_path}, run_args=("--cupti",))
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    cap, pid = run.cap, run.pid
    value = note(cap, pid, "cupti")
    assert value is not None and value.startswith("active"), f"notes: {cap.notes}"
    flags = {name: (need | VIA_CUPTI, forbid) for name, (need, forbid) in RT_FLAGS.items()}
    check_variants(run, RT_NAMES, flags, stream=ival(run.kv["stream"]))


@pytest.mark.gpu
def test_c05_process_source_says_cupti(shim, progs, cupti_path, tmp_path):
    """The PROCESS record's launch source (abi.h: "launch source of this process") says CUPTI
    when the launches of that process came through CUPTI."""
    run = run_traced([progs.build("launch_rt")], tmp_path, env={"PYOBMEM_CUPTI": cupti_path}, run_args=("--cupti",))
    assert run.rc == 0, run.why()
    cap, pid = run.cap, run.pid
    assert note(cap, pid, "cupti").startswith("active"), cap.notes
    assert all(int(cap.ops["flags"][r]) & VIA_CUPTI for r in op_rows(cap, pid)), describe_ops(cap, pid)
    assert int(cap.processes["source"][process_row(cap, pid)]) == abi.LaunchSource.CUPTI, cap.processes


@pytest.mark.gpu
def test_c05_default_traces_from_hooks(shim, progs, tmp_path):
    """pyobmem-run's default: every launch variant attributed from the hooks, CUPTI never subscribed."""
    run = run_traced([progs.build("launch_rt")], tmp_path)
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    cap, pid = run.cap, run.pid
    assert note(cap, pid, "cupti").startswith("off"), cap.notes
    check_variants(run, RT_NAMES, RT_FLAGS, stream=ival(run.kv["stream"]))
    assert not any(int(cap.ops["flags"][r]) & VIA_CUPTI for r in op_rows(cap, pid)), describe_ops(cap, pid)
    assert int(cap.processes["source"][process_row(cap, pid)]) == abi.LaunchSource.HOOKS
