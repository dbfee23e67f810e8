"""Fidelity part ``profiler``: torch.profiler keeps its GPU activities under pyobmem-run.

scripts/workloads/torch_profiled.py wraps 5 training steps in
torch.profiler.profile(activities=[CPU, CUDA]); run untraced, under pyobmem-run's defaults (launches
traced from the shim's hooks, CUPTI left to the process) and under ``--cupti`` (pyobmem holds the
subscription: Kineto's GPU activities may be lost, as they were under the old default).
``kernels_without_pyobmem``, ``kernels_with_pyobmem`` (must be > 0), ``kernels_with_pyobmem_cupti``,
and what the capture says: launches, how they were traced, the cupti note.
"""

from __future__ import annotations

import sys

import _fidelity_common

ARGS = ["--steps", "5"]


def run(args) -> dict:
    from pyobmem.capture import read_capture
    from pyobmem.commands.summary import summarize

    plain, _ = _fidelity_common.run_workload("torch_profiled.py", ARGS, args.work, "profiled_plain", traced=False)
    traced, capture = _fidelity_common.run_workload("torch_profiled.py", ARGS, args.work, "profiled_traced", traced=True)
    cupti, cupti_capture = _fidelity_common.run_workload("torch_profiled.py", ARGS, args.work, "profiled_cupti",
                                                         traced=True, launcher_options=("--cupti",))
    out = {"kernels_without_pyobmem": plain["profiler_kernels"], "kernels_with_pyobmem": traced["profiler_kernels"],
           "kernels_with_pyobmem_cupti": cupti["profiler_kernels"]}
    for key, path in (("pyobmem", capture), ("pyobmem_cupti", cupti_capture)):
        cap = read_capture(str(path))
        la = summarize(cap)["launches"]
        notes = [n.get("cupti") for n in cap.notes.values() if n.get("cupti")]
        out[key] = {"launches": la["count"], "traced_by": la["traced_by"], "attribution": la["attribution"],
                    "cupti_note": notes[0] if notes else None}
    out["ok"] = out["kernels_with_pyobmem"] > 0
    if not out["ok"]:
        print("profiler: torch.profiler got no GPU kernels under pyobmem-run's defaults", file=sys.stderr, flush=True)
    return out
