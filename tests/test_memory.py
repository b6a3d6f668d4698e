"""Memory wrappers: the error-feedback invariant for every registered case, DGC's bookkeeping, and
DGC at density 1 == momentum SGD."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R

import cconv.compressors as cc
import cconv.memory as mem

STEPS = 4


@pytest.mark.parametrize("name,hp", R.CASES)
def test_error_feedback_invariant(name, hp):
    """decompress(payload) + e_new == x + e_old for every registered case (generic, several
    shapes and dtypes: tests/registry_cases.py)."""
    R.check_error_feedback(R.subject(name, hp))


@pytest.mark.parametrize(
    "name,hp", [("topk", {"ratio": 0.3}), ("qsgd", {"levels": 2, "bucket": 8}), ("powersgd", {"rank": 1})], ids=str
)
def test_error_feedback_over_steps(name, hp):
    """Over several steps: nothing is lost, only delayed, and the residual is carried over."""
    ef = mem.error_feedback(cc.get(name, **hp))

    @jax.jit
    def run(xs, keys):
        def body(state, inp):
            x, key = inp
            payload, new = ef.compress(x, state, key)
            return new, (ef.decompress(payload, x), state.residual, new.residual)

        return jax.lax.scan(body, ef.init(xs[0]), (xs, keys))[1]

    xs = jax.random.normal(jax.random.PRNGKey(1), (STEPS, 6, 7))
    sent, old, new = (np.asarray(a, np.float64) for a in run(xs, jax.random.split(jax.random.PRNGKey(2), STEPS)))
    lhs, rhs = sent + new, np.asarray(xs, np.float64) + old
    scale = np.abs(rhs).max()
    np.testing.assert_allclose(lhs, rhs, atol=4e-7 * scale, rtol=0)
    np.testing.assert_array_equal(old[1:], new[:-1])  # the residual is carried over
    assert np.all(np.isfinite(new)) and np.abs(new).max() > 0  # something was actually delayed


def test_error_feedback_keeps_dtype_and_zero_start():
    ef = mem.error_feedback(cc.topk(ratio=0.5))
    x = jnp.arange(6, dtype=jnp.bfloat16)
    st = ef.init(x)
    assert st.residual.dtype == jnp.bfloat16 and not np.any(np.asarray(st.residual))
    _, st = ef.compress(x, st, jax.random.PRNGKey(0))
    assert st.residual.dtype == jnp.bfloat16 and st.residual.shape == (6,)


@pytest.mark.parametrize(
    "inner,masking",
    [
        (("topk", {"ratio": 0.25}), True),
        (("topk", {"ratio": 0.25}), False),
        (("dgc", {"ratio": 0.1}), True),
        (("randomk", {"ratio": 0.25, "scaled": False}), True),
    ],
)
def test_dgc_memory_bookkeeping(inner, masking):
    m = 0.9
    c = mem.dgc(cc.get(inner[0], **inner[1]), momentum=m, masking=masking)
    assert not c.unbiased and c.hparams["momentum"] == m

    @jax.jit
    def step(g, state, key):
        payload, new = c.compress(g, state, key)
        return c.decompress(payload, g), new

    g_all = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (5, 40)))
    state = c.init(jnp.asarray(g_all[0]))
    for t in range(5):
        g = jnp.asarray(g_all[t])
        sent, new = step(g, state, jax.random.PRNGKey(t))
        u_pre = m * np.asarray(state.u) + g_all[t]
        v_pre = np.asarray(state.v) + u_pre
        sent, u_new, v_new = np.asarray(sent), np.asarray(new.u), np.asarray(new.v)
        np.testing.assert_allclose(v_new + sent, v_pre, rtol=0, atol=1e-5)  # v bookkeeping
        assert np.all(v_new[sent != 0] == 0)  # sent coords zeroed
        expected_u = np.where(sent != 0, 0.0, u_pre) if masking else u_pre  # factor masking
        np.testing.assert_allclose(u_new, expected_u, rtol=1e-6, atol=1e-6)
        assert 0 < np.count_nonzero(sent) <= round(c.density((40,)) * 40)
        state = new


@pytest.mark.parametrize(
    "inner", [("topk", {"ratio": 1.0}), ("none", {}), ("randomk", {"k": 64}), ("dgc", {"ratio": 1.0})]
)
def test_dgc_at_density_one_is_momentum_sgd(inner):
    """update_t = m * update_{t-1} + g_t exactly (no masking, v flushed every step)."""
    m = 0.8
    c = mem.dgc(cc.get(inner[0], **inner[1]), momentum=m)
    g_all = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (6, 3, 7)))
    step = jax.jit(lambda g, s, k: c.roundtrip(g, s, k))
    state = c.init(jnp.asarray(g_all[0]))
    prev = np.zeros((3, 7))
    for t in range(6):
        upd, state = step(jnp.asarray(g_all[t]), state, jax.random.PRNGKey(t))
        prev = m * prev + g_all[t]
        np.testing.assert_allclose(np.asarray(upd), prev, rtol=1e-5, atol=1e-6)
        assert not np.any(np.asarray(state.v))


@pytest.mark.parametrize("momentum", [-0.1, 1.0, 1.5, True, "0.9"])
def test_dgc_memory_bad_momentum(momentum):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        mem.dgc(cc.topk(ratio=0.1), momentum=momentum)
