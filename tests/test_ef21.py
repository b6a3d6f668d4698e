"""EF21 and EF21-SGDM (``cconv.memory.ef21``): exact SGD with the identity compressor, the
server's g = 1/P sum_i g_i on every worker, linear convergence with top-k on distributed least
squares at the step size of EF21's theorem (where top-k without memory stalls), and the memory
options reaching it from the engine, configs and the drop-in API."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cconv
import cconv.compressors as C
import cconv.memory as M
from cconv.engine import EngineConfig

P = 4
VECTOR = True  # x is one 1-D tensor: compressed only with compress_vectors (1-D tensors are dense by default)


def _run(ex, grads_fn, x0, steps, lr):
    """x_{t+1} = x_t - lr * Exchange(grad_i(x_t)) over P vmapped workers; returns the iterates,
    the updates and the per-step states."""
    step = jax.vmap(lambda g, s, k: ex(g, s, k)[:2], axis_name="data", in_axes=(0, 0, None))

    @jax.jit
    def run(x0):
        state = jax.vmap(ex.init, axis_name="data")(grads_fn(x0))

        def body(carry, t):
            x, state = carry
            avg, state = step(grads_fn(x), state, jax.random.fold_in(jax.random.PRNGKey(3), t))
            return (x - lr * avg[0], state), (x, avg, state["units"][0])

        return jax.lax.scan(body, (x0, state), jnp.arange(steps))[1]

    return run(x0)


def _quadratic(seed=0, d=12, n=20):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((P, n, d)) / math.sqrt(n), jnp.float32)
    b = jnp.asarray(rng.standard_normal((P, n)), jnp.float32)
    grads = jax.vmap(lambda a, bb, x: a.T @ (a @ x - bb), in_axes=(0, 0, None))
    return A, b, lambda x: grads(A, b, x)


@pytest.mark.parametrize("memory", ["ef21", "ef21_sgdm"])
def test_identity_compressor_is_exact_sgd(memory):
    """C = identity: g_i = x_i after every step, so the update is the plain average (EF21) or the
    average of the momentum buffers v_i = beta v_i + (1 - beta) x_i (EF21-SGDM)."""
    _, _, grads = _quadratic()
    ex = cconv.Exchange(C.get("none"), memory=memory, axis_name="data", momentum=0.5, compress_vectors=VECTOR)
    xs, avgs, _ = _run(ex, grads, jnp.zeros(12), 6, 0.1)
    v = np.zeros((P, 12))
    for x, avg in zip(np.asarray(xs), np.asarray(avgs)):
        g = np.asarray(grads(jnp.asarray(x, jnp.float32)), np.float64)
        v = g if memory == "ef21" else 0.5 * v + 0.5 * g
        np.testing.assert_allclose(avg, np.broadcast_to(v.mean(0), avg.shape), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("collective", ["auto", "gtopk"])
def test_shared_estimate_is_the_mean_of_the_workers_estimates(collective):
    """Every worker holds the same g, and g = 1/P sum_i g_i at every step (top-k: the sent parts
    differ per worker; gTop-k: what a worker sent that the global selection dropped is taken
    back out of its g_i, ``Memory.give_back``)."""
    _, _, grads = _quadratic()
    ex = cconv.Exchange(
        C.get("topk", ratio=0.25), memory="ef21", axis_name="data", collective=collective, compress_vectors=VECTOR
    )
    _, avgs, st = _run(ex, grads, jnp.zeros(12), 8, 0.1)
    local, shared = np.asarray(st.local)[:, :, 0], np.asarray(st.shared)[:, :, 0]  # (T, P, d)
    np.testing.assert_array_equal(shared, np.broadcast_to(shared[:, :1], shared.shape))
    np.testing.assert_allclose(shared[:, 0], local.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(avgs)[:, 0], shared[:, 0])  # the update is g
    assert not np.allclose(local[-1, 0], local[-1, 1])  # the workers' estimates differ


def _ef21_step_size(A, k, d):
    """Theorem 1 of Richtárik et al. (2021): gamma = 1 / (L + L~ sqrt(beta / theta)) with
    delta = k / d (top-k), theta = 1 - sqrt(1 - delta), beta = (1 - delta) / (1 - sqrt(1 - delta)),
    L the smoothness of f = 1/P sum f_i and L~^2 = 1/P sum L_i^2."""
    A = np.asarray(A, np.float64)
    Ls = np.array([np.linalg.eigvalsh(a.T @ a).max() for a in A])
    L = np.linalg.eigvalsh(sum(a.T @ a for a in A) / P).max()
    delta = k / d
    theta = 1 - math.sqrt(1 - delta)
    beta = (1 - delta) / theta
    return 1.0 / (L + math.sqrt(np.mean(Ls**2)) * math.sqrt(beta / theta))


@pytest.mark.slow
def test_topk_converges_linearly_on_least_squares_at_the_theorems_step():
    """Distributed least squares (f strongly convex, so PL): EF21 with top-k (delta = k/d) at the
    step size of its theorem drives ||grad f|| down by 10^4 (linear rate), while top-k without
    memory at the same step stalls (its fixed points are not the optimum)."""
    A, _, grads = _quadratic(seed=1)
    gamma = _ef21_step_size(A, 3, 12)
    g0 = float(np.linalg.norm(np.asarray(grads(jnp.zeros(12))).mean(0)))
    out = {}
    for memory in ("ef21", "none"):
        ex = cconv.Exchange(C.get("topk", k=3), memory=memory, axis_name="data", compress_vectors=VECTOR)
        xs, _, _ = _run(ex, grads, jnp.zeros(12), 3000, gamma)
        out[memory] = float(np.linalg.norm(np.asarray(grads(xs[-1])).mean(0))) / g0
    assert out["ef21"] < 1e-4, out
    assert out["none"] > 1e-2, out


def test_engine_config_and_options():
    """The memory names reach EngineConfig and the drop-in API; EF21-SGDM's momentum is checked in
    one line; the state holds g_i and g (and v_i) of the gradient's shape."""
    assert {"ef21", "ef21_sgdm"} <= set(M.MEMORIES)
    EngineConfig(workers=2, compressor=C.get("topk", ratio=0.5), memory="ef21")
    with pytest.raises(ValueError, match="momentum"):
        M.get("ef21_sgdm", C.get("none"), momentum=1.0)
    c = M.ef21_sgdm(C.get("topk", ratio=0.5), momentum=0.8)
    st = c.init(jnp.ones((3, 4)))
    assert [a.shape for a in (st.local, st.shared, st.velocity)] == [(3, 4)] * 3
    assert c.name == "ef21_sgdm(topk)" and c.hparams["momentum"] == 0.8
    assert M.ef21(C.get("topk", ratio=0.5)).init(jnp.ones(5)).velocity.shape == ()


@pytest.mark.parametrize("memory", ["ef21", "ef21_sgdm"])
def test_run_configs_accept_the_memories(memory):
    """``memory: ef21`` / ``ef21_sgdm`` in a run config load and build (names, compressor, engine)."""
    from cconv.experiments import build as B
    from cconv.experiments.config import from_dict

    cfg = from_dict({"compressor": {"name": "topk", "ratio": 0.1}, "memory": memory, "momentum": 0.5})
    B.check_names(cfg)
    assert cfg.memory == memory
