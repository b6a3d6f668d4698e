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


# --------------------------------------------------------------------------- scaled error feedback (ef_scale)


def test_ef_scale_one_is_plain_error_feedback():
    import importlib

    ef = importlib.import_module("cconv.memory.error_feedback")  # the module (the package exports the function)
    m = mem.ef_memory(cc.get("qsgd", levels=2), ef_scale=1)
    assert (m.absorb, m.settle, m.hparams) == (ef._absorb, ef._settle, {})  # the same functions
    assert mem.get("ef", cc.get("qsgd"), momentum=0.9, masking=True, ef_scale=1.0).absorb is ef._absorb


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, True, "auto", None])
def test_ef_scale_bad_values(bad):
    with pytest.raises(ValueError, match=r"ef_scale must be a number in \(0, 1\]"):
        mem.ef_memory(cc.topk(ratio=0.1), ef_scale=bad)


@pytest.mark.slow
def test_scaled_error_feedback_invariant_and_input():
    """The compressor sees a (x + e); nothing is lost: decompress(payload) + e_new == x + e_old."""
    a = 0.25
    c = cc.get("qsgd", levels=2)
    wrapped = mem.error_feedback(c, ef_scale=a)
    assert wrapped.name == "ef(qsgd)" and wrapped.hparams["ef_scale"] == a
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 9))
    state = wrapped.init(x)
    for t in range(3):
        key = jax.random.PRNGKey(10 + t)
        old = state.residual
        payload, state = wrapped.compress(x, state, key)
        sent = wrapped.decompress(payload, x)
        np.testing.assert_allclose(np.asarray(sent + state.residual), np.asarray(x + old), rtol=0, atol=2e-6)
        # the payload is the one of C(a (x + e)) with the same key: the wire format is untouched
        ref, _ = c.compress(a * (x + old), c.init(x), key)
        jax.tree.map(np.testing.assert_array_equal, payload, ref)


def test_ef_scale_on_scaled_random_k_is_unscaled_random_k():
    """Scaled random-k (d/k x, omega = d/k - 1) with a = 1/(1 + omega) = k/d is Stich et al.'s
    contractive (unscaled) random-k: the same coordinates, the same values."""
    x = jax.random.normal(jax.random.PRNGKey(3), (40,))
    key = jax.random.PRNGKey(4)
    scaled = mem.error_feedback(cc.get("randomk", ratio=0.25, scaled=True), ef_scale=0.25)
    plain = mem.error_feedback(cc.get("randomk", ratio=0.25, scaled=False))
    (s1, st1), (s2, st2) = (w.compress(x, w.init(x), key) for w in (scaled, plain))
    np.testing.assert_allclose(np.asarray(scaled.decompress(s1, x)), np.asarray(plain.decompress(s2, x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(st1.residual), np.asarray(st2.residual), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_ef_scale_makes_qsgd_a_contraction():
    """E||C(a p) - p||^2 = (a^2 omega_p + (1 - a)^2) ||p||^2 <= (1 - 1/(1 + omega)) ||p||^2 with
    a = 1/(1 + omega) (QSGD is positively homogeneous); Monte Carlo over fixed keys against the
    exact omega_p of the closed form, within 6 standard errors."""
    from cconv.theory import constants as K

    c = cc.get("qsgd", levels=2)
    d = 256
    omega = K.omega(c, (d,))  # min(d/s^2, sqrt(d)/s) = 8
    a = 1.0 / (1.0 + omega)
    p = jax.random.normal(jax.random.PRNGKey(5), (d,))
    keys = jax.random.split(jax.random.PRNGKey(6), 4000)
    err = jax.vmap(lambda k: jnp.sum((c.decompress(c.compress(a * p, c.init(p), k)[0], p) - p) ** 2))(keys)
    ratio = np.asarray(err, np.float64) / float(jnp.sum(p**2))
    om_p = K.omega_x(c, np.asarray(p))
    exact = a * a * om_p + (1 - a) ** 2
    assert abs(ratio.mean() - exact) < 6 * ratio.std() / np.sqrt(len(ratio)) + 1e-6
    assert exact <= 1 - 1 / (1 + omega) < 1 and ratio.mean() < 1
