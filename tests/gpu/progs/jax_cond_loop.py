"""C26 on JAX: a jitted step whose lax.while_loop and lax.cond XLA runs as conditional nodes of a
command buffer (XLA_FLAGS of tests/gpu/test_swap_c26_jax.py), over six independent states of
16 MiB so that a small budget swaps the idle ones out between steps. Writes the SHA-256 of each
final state (json, argv[1]): bit-identical results with and without swap mode."""
import hashlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def step(w, x):
    def body(c):
        i, w = c
        return i + 1, jnp.tanh(w @ x) * 0.5 + w * 0.5

    _, w = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, w))
    return jax.lax.cond(w.sum() > 0, lambda w: w * 0.9, lambda w: w * 1.1 + 0.01, w)


n, k = 2048, 6
keys = jax.random.split(jax.random.PRNGKey(0), 2 * k)
ws = [jax.random.normal(keys[2 * i], (n, n), jnp.float32) * 0.02 for i in range(k)]
xs = [jax.random.normal(keys[2 * i + 1], (n, n), jnp.float32) * 0.02 for i in range(k)]
for _ in range(6):
    for i in range(k):
        ws[i] = step(ws[i], xs[i])
with open(sys.argv[1], "w") as f:
    json.dump({"hashes": [hashlib.sha256(np.asarray(w).tobytes()).hexdigest() for w in ws]}, f)
