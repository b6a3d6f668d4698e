"""1-bit Adam (``cconv.engine.onebit_adam``, Tang et al. 2021): Adam on the dense average during
warm-up, then a frozen variance and the momentum averaged as 1 bit with error feedback; its
bytes per step; convergence on distributed least squares next to Adam; bad options."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as PS

from cconv.compressors.packing import packed_size
from cconv.engine import onebit_adam

P, D, N = 4, 12, 20


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((P, N, D)) / math.sqrt(N), jnp.float32)
    b = jnp.asarray(rng.standard_normal((P, N)), jnp.float32)
    return A, b


def _local_loss(p, a, bb):
    return 0.5 * jnp.sum((a @ p["w"] - bb) ** 2)


def _run(tx, A, b, steps, record=()):
    """steps of x <- x + tx(grad_i) over P vmapped workers; returns params, the states at the
    ``record`` steps and the per-step updates."""
    params = {"w": jnp.zeros(D)}
    state = jax.vmap(lambda a: tx.init(params), axis_name="data")(A)

    @jax.jit
    def step(p, st):
        u, st = jax.vmap(lambda a, bb, s: tx.update(jax.grad(_local_loss)(p, a, bb), s), axis_name="data")(A, b, st)
        return optax.apply_updates(p, jax.tree.map(lambda x: x[0], u)), st, u

    states, updates = {}, []
    for t in range(steps):
        params, state, u = step(params, state)
        updates.append(np.asarray(u["w"]))
        if t in record:
            states[t] = state
    return params, states, updates


@pytest.mark.slow  # a traced optimizer run over the warm-up switch (~7 s)
def test_warmup_is_adam_then_the_variance_freezes_and_one_bit_travels():
    A, b = _problem()
    tx = onebit_adam(0.01, warmup_steps=5, axis_name="data")
    _, states, updates = _run(tx, A, b, 8, record=(3, 4, 5, 7))
    # warm-up: optax.adam on the averaged gradient, step for step
    ref, params = optax.adam(0.01), {"w": jnp.zeros(D)}
    st = ref.init(params)
    for t in range(5):
        g = jax.grad(lambda p: jnp.mean(jax.vmap(lambda a, bb: _local_loss(p, a, bb))(A, b)))(params)
        u, st = ref.update(g, st)
        np.testing.assert_allclose(updates[t][0], u["w"], rtol=2e-4, atol=1e-7)
        params = optax.apply_updates(params, u)
    for w in range(1, P):  # every worker applies the same update
        np.testing.assert_array_equal(updates[6][w], updates[6][0])
    nu = {t: np.asarray(states[t].nu["w"]) for t in (4, 5, 7)}
    np.testing.assert_array_equal(nu[5], nu[4])  # frozen from the first compressed step on
    np.testing.assert_array_equal(nu[7], nu[4])
    dense = 2 * (P - 1) / P * 4 * D  # ring all-reduce of D float32
    one_bit = (P - 1) * (packed_size(D, 1) + 4)  # gathered scaled-sign payloads: bits + one scale
    assert float(states[3].traffic["bytes_sent"][0, 0]) == pytest.approx(dense)
    assert float(states[5].traffic["bytes_sent"][0, 0]) == pytest.approx(one_bit)
    assert np.any(np.asarray(states[7].compressed["units"][0].residual) != 0)  # error feedback at work


@pytest.mark.slow
def test_converges_next_to_adam_on_least_squares():
    """Distributed least squares, lr 0.01, 600 steps (warm-up 50): Adam reaches the optimum; 1-bit
    Adam's optimality gap falls below 2 % of its initial value (Tang et al., Theorem 1: Adam's
    rate up to the compression error, which error feedback keeps bounded)."""
    A, b = _problem(1)
    f = lambda w: float(jnp.mean(jax.vmap(lambda a, bb: 0.5 * jnp.sum((a @ w - bb) ** 2))(A, b)))
    xstar = jnp.linalg.lstsq(A.reshape(-1, D), b.reshape(-1))[0]
    gap0 = f(jnp.zeros(D)) - f(xstar)
    params, _, _ = _run(onebit_adam(0.01, warmup_steps=50, axis_name="data"), A, b, 600)
    assert f(params["w"]) - f(xstar) < 0.02 * gap0, (f(params["w"]) - f(xstar)) / gap0


def test_under_shard_map():
    """The same transformation inside jax.shard_map over a 4-device mesh (the switch is a
    lax.cond whose branches hold the collectives)."""
    A, b = _problem()
    tx = onebit_adam(0.01, warmup_steps=2, axis_name="data")
    mesh = jax.make_mesh((P,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:P])
    params = {"w": jnp.zeros(D)}

    def run(a, bb):
        p, st = params, tx.init(params)
        outs = []
        for _ in range(4):
            u, st = tx.update(jax.grad(_local_loss)(p, a[0], bb[0]), st)
            p = optax.apply_updates(p, u)
            outs.append(u["w"][None])
        return jnp.concatenate(outs)[None]

    got = jax.jit(
        jax.shard_map(run, mesh=mesh, in_specs=(PS("data"), PS("data")), out_specs=PS("data"), check_vma=False)
    )(A, b)
    _, _, ref = _run(tx, A, b, 4)
    np.testing.assert_allclose(np.asarray(got)[0], np.stack([r[0] for r in ref]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kw,match",
    [({"b1": 1.0}, "b1"), ({"warmup_steps": 0}, "warmup_steps"), ({"eps": -1.0}, "eps"), ({"vote": "x"}, "vote")],
)
def test_bad_options_are_one_line(kw, match):
    with pytest.raises(ValueError, match=match):
        onebit_adam(0.01, **kw)
