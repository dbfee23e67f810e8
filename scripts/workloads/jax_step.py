"""Small MLP classifier trained in plain JAX with one jitted step and hand-written SGD (float32).

``--deterministic`` sets XLA_FLAGS=--xla_gpu_deterministic_ops=true before jax is imported. JAX's
allocator settings (XLA_PYTHON_CLIENT_*) are left to the environment: the pyobmem launcher applies
its preset there.

    python3 scripts/workloads/jax_step.py --steps 20 --deterministic
"""

from __future__ import annotations

import os

import _common

IN, HIDDEN, DEPTH, CLASSES = 512, 1024, 4, 10
LR = 0.05


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    jax, dev = _common.import_jax(args.deterministic)
    import jax.numpy as jnp
    import numpy as np

    sizes = [IN] + [HIDDEN] * DEPTH + [CLASSES]
    key = jax.random.PRNGKey(args.seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (fan_in, fan_out), jnp.float32) * (2.0 / fan_in) ** 0.5
        params.append((w, jnp.zeros((fan_out,), jnp.float32)))
    params = jax.device_put(params, dev)

    rng = np.random.default_rng(args.seed)
    xs = jax.device_put(rng.standard_normal((args.steps, args.batch, IN), dtype=np.float32), dev)
    ys = jax.device_put(rng.integers(0, CLASSES, (args.steps, args.batch)).astype(np.int32), dev)

    def loss_fn(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        logp = jax.nn.log_softmax(h @ w + b)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)
        return params, loss

    step = jax.jit(train_step, donate_argnums=0)

    rec = _common.Recorder()
    for i in range(args.steps):
        jax.block_until_ready(params)
        t0 = _common.now()
        params, loss = step(params, xs[i], ys[i])
        jax.block_until_ready((params, loss))
        ms = (_common.now() - t0) * 1e3
        rec.step(i, float(loss), ms)

    stats = dev.memory_stats()
    rec.write(args.json, "jax", args, model=f"mlp-{DEPTH}x{HIDDEN}", batch=args.batch,
              memory_stats={k: int(v) for k, v in (stats or {}).items() if isinstance(v, (int, float))},
              device_name=dev.device_kind, jax_version=jax.__version__,
              xla_env={k: v for k, v in os.environ.items() if k.startswith("XLA_")})


if __name__ == "__main__":
    main()
