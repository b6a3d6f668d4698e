"""Single-process simulations that check the convergence statements in ``theory/convergence.md``.

P workers are simulated with ``jax.vmap`` (no collectives, no engine), and independent repetitions
with a second ``vmap``, so that expectations are estimated with known standard errors.  The
compressors and the error-feedback wrapper are the real ones (``cconv.compressors``,
``cconv.memory.error_feedback``).

* ``least_squares``: f(x) = 1/(2n) ||A x - b||^2, strongly convex; a stochastic gradient samples
  ``batch`` rows uniformly, g = a_i (a_i^T x - b_i) averaged.
* ``compressed_sgd``: x <- x - mean_w C_w(gamma_t g_w) with or without error feedback
  (p_w = gamma_t g_w + e_w; send C(p_w); e_w <- p_w - C(p_w)), Stich, Cordonnier & Jaggi (2018),
  Karimireddy et al. (2019).
* ``local_sgd``: every worker takes H local steps x_w <- x_w - gamma_t g_w, then the models are
  averaged (Stich 2019); H = 1 is mini-batch SGD.
* ``karimireddy_counterexample``: f(x) = 1/2 (<a_1,x>^2 + <a_2,x>^2) with a_{1,2} = +-(1,-1) + eps(1,1),
  one a_i sampled per step (Karimireddy et al. 2019, Counterexample 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv.memory import error_feedback


class Problem(NamedTuple):
    A: jax.Array
    b: jax.Array
    x_star: jax.Array
    f_star: float
    L: float  # smoothness of f: largest eigenvalue of A^T A / n
    mu: float  # strong convexity: smallest eigenvalue


def least_squares(key, n: int = 512, d: int = 20, cond: float = 10.0, noise: float = 0.5) -> Problem:
    """A random least-squares problem with Hessian eigenvalues spread over [1, cond] (roughly).

    Generated in float64 NumPy from ``key`` (x*, f*, L, mu exact), used in float32.
    """
    rng = np.random.default_rng(
        np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key, np.uint32)
    )
    A = rng.standard_normal((n, d)) * np.sqrt(np.linspace(1.0, cond, d))
    b = A @ rng.standard_normal(d) + noise * rng.standard_normal(n)
    x_star = np.linalg.lstsq(A, b, rcond=None)[0]
    eig = np.linalg.eigvalsh(A.T @ A / n)
    f_star = 0.5 * np.mean((A @ x_star - b) ** 2)
    return Problem(
        jnp.asarray(A, jnp.float32),
        jnp.asarray(b, jnp.float32),
        jnp.asarray(x_star, jnp.float32),
        float(f_star),
        float(eig[-1]),
        float(eig[0]),
    )


def loss(p: Problem, x: jax.Array) -> jax.Array:
    return 0.5 * jnp.mean((p.A @ x - p.b) ** 2)


def stochastic_grad(p: Problem, x: jax.Array, idx: jax.Array) -> jax.Array:
    """Mini-batch gradient on rows ``idx`` (drawn uniformly with replacement by the caller)."""
    a = p.A[idx]
    return a.T @ (a @ x - p.b[idx]) / idx.shape[0]


def stich_schedule(mu: float, a: float, scale: float = 4.0) -> Callable:
    """gamma_t = scale / (mu (a + t)) (Stich 2019 uses scale 4; Stich et al. 2018 uses 8)."""
    return lambda t: scale / (mu * (a + t))


def _one_method(p: Problem, comp, lr: Callable, idx, ckeys, x0, avg_a: float | None):
    """One method of ``compressed_sgd`` on given draws: ``idx`` (steps, workers, batch) sample
    indices and ``ckeys`` (steps, workers) compression keys; (f(x_t) - f*, f(x_bar_t) - f*) per step."""
    workers, d = idx.shape[1], x0.shape[0]
    states = jax.vmap(comp.init)(jnp.zeros((workers, d))) if comp is not None else None

    def step(carry, inp):
        x, states, xs, ws = carry
        t, idx_t, keys_t = inp
        u = lr(t) * jax.vmap(lambda i: stochastic_grad(p, x, i))(idx_t)
        if comp is not None:

            def comp_one(ui, si, ki):
                payload, si = comp.compress(ui, si, ki)
                return comp.decompress(payload, ui), si

            u, states = jax.vmap(comp_one)(u, states, keys_t)
        x = x - jnp.mean(u, axis=0)
        w = 1.0 if avg_a is None else (avg_a + t) ** 2
        xs, ws = (x, 1.0) if avg_a is None else (xs + w * x, ws + w)
        return (x, states, xs, ws), (loss(p, x) - p.f_star, loss(p, xs / ws) - p.f_star)

    init = (x0, states, jnp.zeros(d), jnp.zeros(()))
    ts = jnp.arange(idx.shape[0], dtype=jnp.float32)
    _, (last, avg) = jax.lax.scan(step, init, (ts, idx, ckeys))
    return last, avg


def compressed_sgd(
    p: Problem,
    methods: dict,
    *,
    workers: int,
    steps: int,
    lr: Callable,
    key,
    reps: int,
    batch: int = 1,
    x0=None,
    avg_a: float | None = None,
) -> dict:
    """Distributed SGD with compressed updates, several methods on the *same* random draws.

    ``methods``: name -> (Compressor or None, ef: bool[, lr]) where an optional third entry
    overrides ``lr`` (a function of the step t) for that method.  Each step every worker w draws a
    mini-batch, u_w = gamma_t g_w; with a compressor u_w <- C(u_w) (``ef``: with error feedback,
    via ``cconv.memory.error_feedback``); x <- x - mean_w u_w.
    Returns name -> (f(x_t) - f*, f(x_bar_t) - f*), arrays of shape (reps, steps), where x_bar_t
    is the weighted average sum_s w_s x_s / sum_s w_s with w_s = (avg_a + s)^2 (Stich et al.
    2018; ``avg_a=None``: x_bar_t = x_t).  One compilation for all methods.
    """
    d, n = p.A.shape[1], p.A.shape[0]
    x0 = jnp.zeros(d) if x0 is None else jnp.asarray(x0, jnp.float32)
    comps = {}
    for name, spec in methods.items():
        c, ef = spec[0], spec[1]
        comps[name] = (None if c is None else (error_feedback(c) if ef else c), spec[2] if len(spec) > 2 else lr)

    def one_run(key):
        k_idx, k_c = jax.random.split(key)
        idx = jax.random.randint(k_idx, (steps, workers, batch), 0, n)  # all draws up front
        ckeys = jax.random.split(k_c, (steps, workers))
        return {name: _one_method(p, comp, f, idx, ckeys, x0, avg_a) for name, (comp, f) in comps.items()}

    return jax.jit(jax.vmap(one_run))(jax.random.split(key, reps))


def local_sgd(
    p: Problem, configs: dict, *, steps: int, lr: Callable, key, reps: int, batch: int = 1, avg_a: float | None = None
) -> dict:
    """Local SGD (Stich 2019) for several configurations in one compilation.

    ``configs``: name -> (workers P, local steps H[, lr]) (an optional lr overrides ``lr``).

    Every worker takes H steps x_w <- x_w - gamma_t g_w, then the models are averaged; H = 1 is
    mini-batch SGD with P*batch samples.  Returns name -> dict of arrays over repetitions:
    ``err``: f(x_bar) - f* at the end, x_bar the (avg_a + t)^2-weighted average of the averaged
    models (or the final model if avg_a is None); ``dev``: the mean over synchronisations of the
    workers' spread (1/P) sum_w ||x_w - mean_w x_w||^2 just before averaging; ``dev_norm``: the
    same divided by gamma_t^2 H^2 (Stich 2019, Lemma 3.3 bounds it by 4 G^2); ``g2``: the mean of
    ||g_w||^2 along the run (an estimate of G^2).
    """
    d, n = p.A.shape[1], p.A.shape[0]

    def one_config(workers, h, lr, key):
        idx = jax.random.randint(key, (steps, workers, batch), 0, n)

        def step(carry, inp):
            xw, xs, ws, dev, devn, g2 = carry
            t, idx_t = inp
            g = jax.vmap(lambda x, i: stochastic_grad(p, x, i))(xw, idx_t)
            gamma = lr(t)
            xw = xw - gamma * g
            sync = (t.astype(jnp.int32) + 1) % h == 0
            mean = jnp.mean(xw, axis=0)
            spread = jnp.mean(jnp.sum((xw - mean) ** 2, axis=1))
            dev = dev + jnp.where(sync, spread, 0.0)
            devn = devn + jnp.where(sync, spread / (gamma**2 * h**2), 0.0)
            xw = jnp.where(sync, jnp.broadcast_to(mean, xw.shape), xw)
            w = 0.0 if avg_a is None else (avg_a + t) ** 2
            g2 = g2 + jnp.mean(jnp.sum(g * g, axis=1))
            return (xw, xs + w * mean, ws + w, dev, devn, g2), None

        init = (jnp.zeros((workers, d)), jnp.zeros(d), jnp.zeros(()), 0.0, 0.0, 0.0)
        ts = jnp.arange(steps, dtype=jnp.float32)
        (xw, xs, ws, dev, devn, g2), _ = jax.lax.scan(step, init, (ts, idx))
        xbar = jnp.mean(xw, axis=0) if avg_a is None else xs / ws
        syncs = steps // h
        return {"err": loss(p, xbar) - p.f_star, "dev": dev / syncs, "dev_norm": devn / syncs, "g2": g2 / steps}

    def one_run(key):
        return {name: one_config(c[0], c[1], c[2] if len(c) > 2 else lr, key) for name, c in configs.items()}

    return jax.jit(jax.vmap(one_run))(jax.random.split(key, reps))


def karimireddy_counterexample(eps: float = 0.5) -> Problem:
    """Counterexample 1 of Karimireddy et al. (2019): sign(grad f_i(x)) is always +-(1, -1)."""
    A = jnp.array([[1.0 + eps, -1.0 + eps], [-1.0 + eps, 1.0 + eps]])
    # f(x) = 1/2 sum_i <a_i, x>^2 = (n/2) * mean, so use the least-squares form with b = 0 scaled
    eig = np.linalg.eigvalsh(np.asarray(A.T @ A / 2, np.float64))
    return Problem(A, jnp.zeros(2), jnp.zeros(2), 0.0, float(eig[-1]), float(eig[0]))
