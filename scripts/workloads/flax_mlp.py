"""MLP classifier in flax linen (4 x nn.Dense(2048), ReLU, a 10-way head) trained with optax adam in
one jax.jit step, as flax users write it (float32, random data).

``--deterministic`` sets XLA_FLAGS=--xla_gpu_deterministic_ops=true before jax is imported. JAX's
allocator settings (XLA_PYTHON_CLIENT_*) are left to the environment: the pyobmem launcher applies
its preset there.

    python3 scripts/workloads/flax_mlp.py --steps 50 --batch 512
"""

from __future__ import annotations

import os

import _common

IN, HIDDEN, DEPTH, CLASSES = 1024, 2048, 4, 10
LR = 1e-3


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], steps=50)
    p.add_argument("--batch", type=int, default=512)
    args = p.parse_args()

    jax, dev = _common.import_jax(args.deterministic)
    try:
        import flax.linen as nn
        import numpy as np
        import optax
    except ImportError as e:
        _common.fail(f"flax or optax is not importable ({e})")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(DEPTH):
                x = nn.relu(nn.Dense(HIDDEN)(x))
            return nn.Dense(CLASSES)(x)

    model = MLP()
    rng = np.random.default_rng(args.seed)
    xs = jax.device_put(rng.standard_normal((args.steps, args.batch, IN), dtype=np.float32), dev)
    ys = jax.device_put(rng.integers(0, CLASSES, (args.steps, args.batch)).astype(np.int32), dev)
    params = jax.device_put(model.init(jax.random.PRNGKey(args.seed), xs[0]), dev)
    tx = optax.adam(LR)
    opt_state = tx.init(params)

    def loss_fn(params, x, y):
        logits = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rec = _common.Recorder()
    for i in range(args.steps):
        jax.block_until_ready((params, opt_state))
        t0 = _common.now()
        params, opt_state, loss = train_step(params, opt_state, xs[i], ys[i])
        jax.block_until_ready((params, opt_state, loss))
        ms = (_common.now() - t0) * 1e3
        rec.step(i, float(loss), ms)

    import flax

    stats = dev.memory_stats()
    rec.write(args.json, "jax", args, model=f"flax-mlp-{DEPTH}x{HIDDEN}", batch=args.batch,
              memory_stats={k: int(v) for k, v in (stats or {}).items() if isinstance(v, (int, float))},
              device_name=dev.device_kind, jax_version=jax.__version__, flax_version=flax.__version__,
              optax_version=optax.__version__, xla_env={k: v for k, v in os.environ.items() if k.startswith("XLA_")})


if __name__ == "__main__":
    main()
