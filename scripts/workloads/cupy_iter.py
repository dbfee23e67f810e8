"""Logistic regression by gradient descent in CuPy: matmuls, ElementwiseKernels and reductions.

Device memory comes from CuPy's default MemoryPool, given a counting allocator so that the JSON can
say how many device allocations CuPy itself made (and at which addresses).

    python3 scripts/workloads/cupy_iter.py --steps 50 --deterministic
"""

from __future__ import annotations

import os

import _common

N, D = 1 << 16, 1024
LR, L2 = 0.5, 1e-4
MAX_LISTED = 10000


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=50)
    args = p.parse_args()
    if args.deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = _common.CUBLAS_WORKSPACE_CONFIG
    try:
        import cupy as cp
        import numpy as np
    except ImportError as e:
        _common.fail(f"CuPy is not importable ({e})")
    try:
        n_dev = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver or device
        _common.fail(f"no CUDA GPU available to CuPy ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if n_dev < 1:
        _common.fail("no CUDA GPU available to CuPy")

    counts = {"n": 0, "bytes": 0}
    listed: list[list[int]] = []

    def counting_malloc(size: int):
        mem = cp.cuda.memory.Memory(size)  # one cudaMalloc, as MemoryPool's default allocator does
        counts["n"] += 1
        counts["bytes"] += size
        if len(listed) < MAX_LISTED:
            listed.append([int(mem.ptr), int(size)])
        return cp.cuda.memory.MemoryPointer(mem, 0)

    pool = cp.cuda.MemoryPool(counting_malloc)
    cp.cuda.set_allocator(pool.malloc)

    sigmoid_loss = cp.ElementwiseKernel(
        "float32 z, float32 y", "float32 r, float32 l",
        """
        float p = 1.0f / (1.0f + expf(-z));
        r = p - y;
        l = -(y * logf(p + 1e-7f) + (1.0f - y) * logf(1.0f - p + 1e-7f));
        """,
        "pyobmem_sigmoid_loss",
    )
    sgd_update = cp.ElementwiseKernel(
        "float32 g, float32 lr, float32 l2", "float32 w",
        "w = w - lr * (g + l2 * w)",
        "pyobmem_sgd_update",
    )
    sum_kernel = cp.ReductionKernel("float32 x", "float32 s", "x", "a + b", "s = a", "0", "pyobmem_sum")

    rs = cp.random.RandomState(args.seed)
    X = rs.standard_normal((N, D), dtype=cp.float32)
    w_true = rs.standard_normal((D,), dtype=cp.float32) / np.float32(D ** 0.5)
    y = ((X @ w_true + 0.5 * rs.standard_normal((N,), dtype=cp.float32)) > 0).astype(cp.float32)
    w = cp.zeros((D,), dtype=cp.float32)
    r = cp.empty((N,), dtype=cp.float32)
    lvec = cp.empty((N,), dtype=cp.float32)
    stream = cp.cuda.get_current_stream()

    rec = _common.Recorder()
    for i in range(args.steps):
        stream.synchronize()
        t0 = _common.now()
        z = X @ w
        sigmoid_loss(z, y, r, lvec)
        loss = sum_kernel(lvec) / np.float32(N)
        g = (X.T @ r) / np.float32(N)
        sgd_update(g, np.float32(LR), np.float32(L2), w)
        stream.synchronize()
        ms = (_common.now() - t0) * 1e3
        rec.step(i, float(loss), ms)

    rec.write(args.json, "cupy", args, model="logistic-regression", n=N, d=D,
              device_allocations=counts["n"], device_alloc_bytes=counts["bytes"],
              allocations=listed, allocations_listed_all=counts["n"] <= MAX_LISTED,
              pool_used_bytes=int(pool.used_bytes()), pool_total_bytes=int(pool.total_bytes()),
              cupy_version=cp.__version__)


if __name__ == "__main__":
    main()
