"""Shared tiny problem for the engine tests: a 2-layer tanh MLP on a fixed regression batch.

Small enough that a step compiles in well under a second on 2 CPU cores; parameters include a
matrix (PowerSGD compresses it), a bias and a thin matrix, so the filters have something to do.
"""

import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(params, model_state, batch, key):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    out = (h @ params["w2"])[:, 0]
    loss = jnp.mean((out - batch["y"]) ** 2)
    # model_state: a running mean of the inputs (stands in for BatchNorm statistics).
    new_state = {"mean": 0.9 * model_state["mean"] + 0.1 * batch["x"].mean(0)}
    return loss, (new_state, {"mae": jnp.mean(jnp.abs(out - batch["y"]))})


def make_params(din=6, hidden=16, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "w1": jax.random.normal(k1, (din, hidden)) * 0.5,
        "b1": jnp.zeros((hidden,)),
        "w2": jax.random.normal(k2, (hidden, 1)) * 0.5,
    }


def make_model_state(din=6):
    return {"mean": jnp.zeros((din,))}


def make_batch(step, n=32, din=6):
    """A deterministic global batch (rows differ between steps and between workers)."""
    rng = np.random.default_rng(1000 + step)
    x = rng.normal(size=(n, din)).astype(np.float32)
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2]
    return {"x": jnp.asarray(x), "y": jnp.asarray(y.astype(np.float32))}


@jax.jit
def _grad(params, rows):
    return jax.grad(lambda p: loss_fn(p, make_model_state(), rows, None)[0])(params)


def worker_grad(params, step, w, workers):
    """Worker w's own gradient at ``step`` (its rows of the global batch), computed directly."""
    b = make_batch(step)
    n = b["x"].shape[0] // workers
    return _grad(params, {k: v[w * n : (w + 1) * n] for k, v in b.items()})


def run(trainer, steps, start_key=0):
    """Train ``steps`` steps; returns (state, list of metrics dicts as floats)."""
    state = trainer.init()
    hist = []
    for t in range(steps):
        state, m = trainer.step(state, make_batch(t), jax.random.PRNGKey(start_key + t))
        hist.append({k: float(v) for k, v in m.items()})
    return state, hist
