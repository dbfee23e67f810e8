"""Fidelity part ``attribution``: how the launches of a flax/optax training loop are attributed
(scripts/workloads/flax_mlp.py, 50 steps, batch 512, under pyobmem-run's defaults).

``flax_mlp``: ``launches`` (kernel launches), ``attributed``, ``host_only`` (pinned host memory
only, e.g. XLA's DelayKernel semaphore), ``unattributed`` (an argument word the driver knows as an
address in no recorded block; goal <= 1% of launches), ``no_addresses``, ``unattributed_pct``,
the kernels of the unattributed and host-only launches, what the driver said of each address in no
block, ``traced_by`` (hooks / CUPTI) and ``graph_launches``; pyobmem.commands.summary.attribution.
"""

from __future__ import annotations

import _bench
import _fidelity_common

STEPS, BATCH = 50, 512


def run(args) -> dict:
    from pyobmem.capture import read_capture
    from pyobmem.commands.summary import summarize

    doc, capture = _fidelity_common.run_workload(
        "flax_mlp.py", ["--steps", str(STEPS), "--batch", str(BATCH)], args.work, "flax_mlp", traced=True)
    la = summarize(read_capture(str(capture)))["launches"]
    a = la["attribution"]
    if not la["count"]:
        raise _bench.BenchError(f"flax_mlp: no launches in {capture}")
    return {"flax_mlp": {
        "launches": la["count"], **a, "unattributed_pct": round(100.0 * a["unattributed"] / la["count"], 3),
        "unattributed_kernels": la["unattributed_kernels"], "host_only_kernels": la["host_only_kernels"],
        "unknown_addresses": la["unknown_addresses"], "traced_by": la["traced_by"],
        "graph_launches": la["graph_launches"], "steps": len(doc["losses"]), "batch": BATCH, "capture": str(capture),
    }}
