"""C26 beyond the C program of test_swap_c10_graphs.py: JAX's lax.while_loop and lax.cond, which
XLA runs as conditional nodes of its command buffers (CUDA graphs) when XLA_FLAGS asks for WHILE
and CONDITIONAL command buffers. Under swap mode at a budget below what the six states need
(150 MB, each state 2 x 16 MiB), the graph launches that hold conditional nodes are flagged
CONDITIONAL (not OPAQUE), blocks go out and come back between them, and the final states are
bit-identical to a run without pyobmem (deterministic ops: without them XLA's autotuning may pick
other kernels from one process to the next, session 9's first spike)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gpu_util import main_pid, op_rows, record_figure, run_plain, run_swap, swap_on, swap_rows
from pyobmem import abi

PROG = Path(__file__).parent / "progs" / "jax_cond_loop.py"
XLA_ENV = {
    "XLA_FLAGS": "--xla_gpu_deterministic_ops=true --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CONDITIONAL,WHILE"
                 " --xla_gpu_graph_min_graph_size=1",
    "XLA_PYTHON_CLIENT_ALLOCATOR": None, "XLA_PYTHON_CLIENT_PREALLOCATE": None, "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
}


@pytest.fixture(scope="module")
def c26_jax(shim, tmp_path_factory):
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    d = tmp_path_factory.mktemp("c26_jax")
    plain_env = {**XLA_ENV, "XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    plain = run_plain([sys.executable, PROG, d / "plain.json"], d, env=plain_env, timeout=300)
    assert plain.rc == 0, plain.why()
    swap = run_swap([sys.executable, PROG, d / "swap.json"], d, budget="150000000", env=XLA_ENV, timeout=300)
    assert swap.rc == 0, swap.why()
    return swap, json.loads((d / "plain.json").read_text()), json.loads((d / "swap.json").read_text())


@pytest.mark.gpu
def test_c26_jax_while_and_cond_in_command_buffers_under_swap(c26_jax):
    swap, plain, swapped = c26_jax
    assert swapped["hashes"] == plain["hashes"]
    cap = swap.cap
    pid = main_pid(cap)
    swap_on(cap, pid)
    graphs = op_rows(cap, pid, abi.Ev.GRAPH_LAUNCH)
    flags = [abi.LaunchFlag(int(cap.ops["flags"][r])) for r in graphs]
    conditional = [f for f in flags if abi.LaunchFlag.CONDITIONAL in f]
    assert conditional, f"no graph launch with conditional nodes among {len(graphs)}"
    assert not any(abi.LaunchFlag.OPAQUE in f for f in conditional)
    outs, ins = swap_rows(cap, pid, direction=0), swap_rows(cap, pid, direction=1)
    assert len(outs) > 0 and len(ins) > 0
    record_figure("c26_jax", {"graph_launches": len(graphs), "conditional": len(conditional),
                              "swap_outs": len(outs), "swap_ins": len(ins)})
