"""A budget below what the job needs, on the real driver: an iterative program whose first kernel
of each iteration needs three 64 MiB blocks at once (192 MiB), then a fourth block alone, for 3 s
(tests/gpu/progs/swap_cases.cu, mode lowbudget), under --budget 100MiB. The daemon learns the
iteration, finds that no plan fits and says once, in one line, which size the job needs at one op
("no plan fits the budget 100.00 MiB: the job needs at least 192.00 MiB at one op ..."); it may
then write the best plan it found, and the shim evicts on its own beyond it (above the budget
where one op needs more); the results stay right.

A bad --budget value (one line, exit 2, nothing run) is tested on the CPU:
tests/test_swap_cli.py::test_run_budget_errors."""

import re
import subprocess
import sys

import pytest

from gpu_util import MiB, build_swap_prog, child_env, describe_swaps, record_figure, run_swap, swap_on, swap_rows

BUDGET = "100MiB"
NEEDS = re.compile(r"no plan fits the budget ([\d.]+ \w+): the job needs at least ([\d.]+) (\w+) at one op")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


@pytest.fixture(scope="module")
def low(shim, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("swap_budget")
    return run_swap([build_swap_prog(progs), "lowbudget", "3.0"], d, budget=BUDGET, timeout=180), d


@pytest.mark.gpu
def test_swap_budget_below_need_says_needed_size(low):
    run, d = low
    assert run.rc == 0 and run.kv.get("done") == "1", run.why()
    assert run.kv["dev_errors"] == "0" and run.kv["host_bad"] == "0", run.why()
    lines = [line for line in run.proc.stderr.splitlines() if "no plan fits the budget" in line]
    # The same learning on the capture afterwards (pyobmem plan), for the message when the run said nothing.
    plan = subprocess.run([sys.executable, "-m", "pyobmem", "plan", str(d / "swap.pyobmem"), "--budget", BUDGET],
                          capture_output=True, text=True, env=child_env(), timeout=120)
    record_figure("swap_budget_below_need", {"iterations": run.kv.get("iterations"), "daemon_lines": lines,
                                             "plan_rc": plan.returncode, "plan_err": plan.stderr.strip()[-400:]})
    assert lines, (
        f"no line from the daemon saying which size the job needs\n"
        f"--- pyobmem plan on the capture (rc {plan.returncode}):\n{plan.stdout[-2000:]}\n{plan.stderr[-1000:]}\n"
        f"{run.why()}"
    )
    # Said once (the daemon then follows the best plan it found, if any, and the shim evicts beyond it).
    assert len(lines) == 1, lines
    for line in lines:
        assert line.startswith("pyobmem: swap: "), line
        m = NEEDS.search(line)
        assert m, line
        assert m.group(1) == "100.00 MiB", line
        needed = float(m.group(2)) * UNITS[m.group(3)]
        # Blocks 0, 1 and 2 are needed together; the rest (block 3, the small buffers) can be out then.
        assert 192 * MiB <= needed < 193 * MiB, line
    assert plan.returncode == 1 and "192.0 MiB" in plan.stderr, (plan.returncode, plan.stdout[-2000:], plan.stderr)


@pytest.mark.gpu
def test_swap_budget_below_need_shim_keeps_going(low):
    run, _ = low
    cap, pid = run.cap, run.pid
    swap_on(cap, pid)
    outs, ins = swap_rows(cap, pid, direction=0), swap_rows(cap, pid, direction=1)
    its = int(run.kv["iterations"])
    record_figure("swap_budget_below_need_swaps", {"iterations": its, "swap_outs": len(outs), "swap_ins": len(ins)})
    assert its >= 50, run.kv
    # Every iteration brings blocks 0, 1, 2 back for the three-block kernel, then block 3 (evicting them).
    assert len(ins) >= its, f"{len(ins)} swap-ins for {its} iterations\n{describe_swaps(cap, pid)}"
