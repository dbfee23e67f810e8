#!/bin/sh
# pyobmem demo (`make demo`): trace a tiny GPT training run and summarise the capture.
# Without an NVIDIA GPU it records an empty capture of a CPU-only command and says so.
# Expects pyobmem-run and pyobmem on PATH (make demo puts the venv first).
set -eu
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
CAPTURE=demo.pyobmem

have_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    [ -n "$(nvidia-smi -L 2>/dev/null)" ] || return 1
    "$PY" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' >/dev/null 2>&1
}

if ! have_gpu; then
    pyobmem-run -f -o "$CAPTURE" -- "$PY" -c "print('no GPU workload')"
    pyobmem summary "$CAPTURE"
    echo "pyobmem demo: no NVIDIA GPU on this machine; the capture above is empty. Run 'make demo' on a CUDA machine to trace scripts/workloads/gpt.py."
    exit 0
fi

if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    echo "pyobmem demo: PyTorch is not importable here, so scripts/workloads/gpt.py cannot run; install torch (with CUDA) and run 'make demo' again." >&2
    exit 1
fi

pyobmem-run -f -o "$CAPTURE" -- "$PY" scripts/workloads/gpt.py --size tiny --steps 20 --deterministic
pyobmem summary "$CAPTURE"
