"""Contraction E||C(x) - x||^2 <= (1 - delta) ||x||^2 for every registered case whose theory
bound is contractive (generic), and deterministic properties of the biased compressors, as
their papers state them (spot checks).

(Unscaled random-k's contraction holds in expectation: see also test_unbiased.py.)
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R

import cconv.compressors as cc
from cconv.compressors.powersgd import orthogonalize

KEY = jax.random.PRNGKey(0)


def rt(c, x, key=KEY):
    x = jnp.asarray(x)
    return np.asarray(jax.jit(lambda x, k: c.roundtrip(x, c.init(x), k)[0])(x, key), np.float64)


def payload_of(c, x, key=KEY):
    x = jnp.asarray(x)
    return jax.jit(lambda x, k: c.compress(x, c.init(x), k)[0])(x, key)


def sq(a):
    return float(np.sum(np.asarray(a, np.float64) ** 2))


def randn(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name,hp", R.CONTRACTIVE)
def test_contraction(name, hp):
    """Deterministic: on every probe (exactly, to float32 rounding); random: by Monte Carlo with a
    variance-derived bound; the theory's worst case attains the bound when it is tight."""
    R.check_contraction(R.subject(name, hp))


@pytest.mark.parametrize("shape,k", [((100,), 1), ((100,), 7), ((13, 7), 30), ((999,), 10), ((5,), 4)])
def test_topk_is_exact_and_contracts(shape, k):
    x = randn(1, shape)
    d = x.size
    y = rt(cc.topk(k=k), x).reshape(-1)
    flat = x.reshape(-1).astype(np.float64)
    kept = np.flatnonzero(y)
    assert kept.size == k
    np.testing.assert_array_equal(y[kept], flat[kept])
    assert np.abs(flat[kept]).min() >= np.abs(np.delete(flat, kept)).max()
    assert sq(flat - y) <= (1 - k / d) * sq(flat) * (1 + 1e-6)


@pytest.mark.parametrize("d,k", [(10, 3), (64, 16), (7, 1)])
def test_topk_contraction_is_tight_on_equal_magnitudes(d, k):
    signs = np.where(np.random.default_rng(d).random(d) < 0.5, -1.0, 1.0)
    x = (0.37 * signs).astype(np.float32)
    y = rt(cc.topk(k=k), x)
    np.testing.assert_allclose(sq(x - y), (1 - k / d) * sq(x), rtol=1e-6)
    # and strictly below the bound as soon as the magnitudes differ
    x2 = x.copy()
    x2[0] *= 2
    assert sq(x2 - rt(cc.topk(k=k), x2)) < (1 - k / d) * sq(x2) * (1 - 1e-6)


@pytest.mark.parametrize("shape", [(), (1,), (9,), (4, 33), (1000,)])
def test_scaled_sign_error_is_exact(shape):
    x = randn(2, shape)
    d = max(x.size, 1)
    y = rt(cc.scaled_sign(), x)
    expected = sq(x) - np.abs(x.astype(np.float64)).sum() ** 2 / d
    assert abs(sq(x - y) - expected) <= 1e-5 * sq(x)
    np.testing.assert_allclose(np.abs(y), np.abs(x.astype(np.float64)).sum() / d, rtol=1e-6)


def test_signsgd_and_scaled_sign_use_sign0_plus1():
    # (+-1e-37 are normal floats; XLA on CPU flushes subnormals to zero, which then map to +1.)
    x = np.array([0.0, -0.0, 2.0, -3.0, 1e-37, -1e-37], np.float32)
    np.testing.assert_array_equal(rt(cc.signsgd(), x), [1, 1, 1, -1, 1, -1])
    y = rt(cc.scaled_sign(), x)
    np.testing.assert_array_equal(np.sign(y), [1, 1, 1, -1, 1, -1])


@pytest.mark.parametrize("shape,k", [((50,), 5), ((7, 9), 10), ((8,), 8), ((8,), 20)])
def test_stc_is_mu_sign_on_topk(shape, k):
    x = randn(3, shape)
    flat = x.reshape(-1).astype(np.float64)
    d = flat.size
    y = rt(cc.stc(k=k), x).reshape(-1)
    kk = min(k, d)
    top = np.argsort(-np.abs(flat), kind="stable")[:kk]
    mu = np.abs(flat[top]).mean()
    expected = np.zeros(d)
    expected[top] = mu * np.where(flat[top] >= 0, 1, -1)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)
    # ||x - C(x)||^2 = ||x||^2 - (sum_S |x_i|)^2 / k
    assert abs(sq(flat - y) - (sq(flat) - np.abs(flat[top]).sum() ** 2 / kk)) <= 1e-5 * sq(flat)


def test_stc_k_ge_d_is_scaled_sign():
    x = randn(4, (6, 5))
    np.testing.assert_allclose(rt(cc.stc(ratio=1.0), x), rt(cc.scaled_sign(), x), rtol=1e-6)


def test_dgc_equals_topk_when_the_sample_is_everything():
    # d <= 256: the strided sample is the whole vector, the threshold is the exact k-th magnitude.
    for d, k in [(200, 5), (256, 3), (37, 9)]:
        x = randn(d, (d,))
        np.testing.assert_array_equal(rt(cc.dgc(k=k), x), rt(cc.topk(k=k), x))


def _dgc_branch(x, c):
    """(thr, n, rounds, branch) of DGC's threshold adjustment, from the module's own functions."""
    dgc_mod = importlib.import_module("cconv.compressors.dgc")
    hp, d = c.hparams, x.size
    k = int(np.ceil(hp["ratio"] * d))
    mag = jnp.abs(jnp.asarray(x))
    thr = dgc_mod.sampled_threshold(mag, k, hp["sample_ratio"])
    thr, n, rounds = (
        np.asarray(v) for v in dgc_mod.adjust_threshold(mag, thr, k, hp["lower_bound"], hp["adapt_iters"])
    )
    if n > hp["upper_bound"] * k and rounds < hp["adapt_iters"]:
        return thr, int(n), int(rounds), "resample"
    return thr, int(n), int(rounds), "cut" if n > k else "all"


@pytest.mark.parametrize(
    "d,ratio,seed,scale,branch",
    [
        (5000, 0.01, 0, 1.0, None),
        (3001, 0.05, 2, 1.0, None),
        (5000, 0.01, 1, 100.0, "all"),  # sampled entries the largest: too few pass, lowered
        (5000, 0.01, 3, 0.01, "resample"),  # sampled entries the smallest: too many pass
        (3001, 0.05, 4, 1.0, "cut"),  # k < n <= 1.3 k: the k lowest-index candidates
        (5000, 0.01, 5, 1.1, "cut"),
    ],
)
def test_dgc_follows_the_reference_threshold_adjustment(d, ratio, seed, scale, branch):
    """Resample (top-k) above 1.3k candidates, lower the threshold by 0.8 below 0.8k, else the
    candidates in index order cut at k (Lin et al. 2018's reference implementation)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(d) * rng.exponential(1.0, d)).astype(np.float32)
    stride = d // max(int(np.ceil(0.01 * d)), 256)
    x[::stride] *= scale
    c = cc.dgc(ratio=ratio)
    k = int(np.ceil(ratio * d))
    thr, n, rounds, got = _dgc_branch(x, c)
    assert branch is None or got == branch, (got, n, k, rounds)
    if branch == "all":
        assert rounds >= 1 and n >= 0.8 * k
    cand = np.flatnonzero(np.abs(x) >= thr)
    assert cand.size == n
    want = np.argsort(-np.abs(x), kind="stable")[:k] if got == "resample" else cand[:k]
    p = payload_of(c, x)
    assert p.values.shape == (k,) and p.indices.dtype == jnp.int32  # fixed capacity: bytes unchanged
    y = rt(c, x)
    expected = np.zeros_like(x)
    expected[want] = x[want]
    np.testing.assert_array_equal(y, expected)
    oracle = importlib.import_module("cconv.compressors.dgc").THEORY.error_sq
    assert sq(x - y) == pytest.approx(oracle(c, x.astype(np.float64), None), rel=1e-6)


def test_dgc_index_order_cut_is_only_non_expansive():
    # d = 1000, k = 800: the sample (every 3rd entry) is all zeros, so thr = 0 and n = d <= 1.3 k:
    # no resample, the first 800 indices are sent -- all zeros -- while the mass sits above.
    d, k = 1000, 800
    x = np.zeros(d, np.float32)
    x[801::3] = 1.0
    c = cc.dgc(k=k)
    assert not rt(c, x).any()
    b = importlib.import_module("cconv.compressors.dgc").THEORY.bound(c, (d,))
    assert (b.kind, b.delta) == ("biased", 0.0)


def test_dgc_adjustment_options():
    rng = np.random.default_rng(5)
    d = 5000
    x = (rng.standard_normal(d) * rng.exponential(1.0, d)).astype(np.float32)
    x[::19] *= 100.0  # too few pass the sampled threshold
    lowered = rt(cc.dgc(ratio=0.01), x)
    fixed = rt(cc.dgc(ratio=0.01, adapt_iters=0), x)  # no adjustment: what passes, cut at k
    assert np.count_nonzero(fixed) < np.count_nonzero(lowered) <= 50
    # upper_bound = 1: any excess over k is resampled to the exact top-k
    x2 = (rng.standard_normal(d)).astype(np.float32)
    x2[::19] *= 0.5
    np.testing.assert_array_equal(rt(cc.dgc(ratio=0.01, upper_bound=1.0), x2), rt(cc.topk(ratio=0.01), x2))


def test_threshold_under_capacity_and_overflow():
    x = np.array([0.1, -2.0, 0.5, 3.0, -0.49, 0.0, 1.5, -0.7], np.float32)
    tau = 0.5
    y = rt(cc.threshold(tau=tau, k=6), x)  # 5 entries pass, capacity 6
    np.testing.assert_array_equal(y, np.where(np.abs(x) >= tau, x, 0))
    p = payload_of(cc.threshold(tau=tau, k=6), x)
    assert p.values.shape == (6,) and int(np.sum(np.asarray(p.values) != 0)) == 5
    y = rt(cc.threshold(tau=tau, k=2), x)  # overflow: the 2 largest of those that pass
    np.testing.assert_array_equal(y, np.where(np.isin(np.arange(8), [1, 3]), x, 0))
    # nothing passes: zero output, no NaN
    np.testing.assert_array_equal(rt(cc.threshold(tau=10.0, k=3), x), np.zeros(8))


@pytest.mark.parametrize(
    "shape,columns", [((40,), False), ((6, 5), False), ((6, 5), True), ((2, 3, 4), True), ((), False)]
)
def test_onebit_means_minimise_squared_error(shape, columns):
    x = randn(5, shape).astype(np.float64) + 0.3
    c = cc.onebit(columns=columns)
    y = rt(c, x.astype(np.float32))
    ncol = shape[-1] if (columns and len(shape) >= 2) else 1
    m = x.reshape(-1, ncol)
    expected = np.empty_like(m)
    for j in range(ncol):
        col = m[:, j]
        pos = col >= 0
        expected[pos, j] = col[pos].mean() if pos.any() else 0.0
        expected[~pos, j] = col[~pos].mean() if (~pos).any() else 0.0
    np.testing.assert_allclose(y.reshape(-1, ncol), expected, rtol=1e-5, atol=1e-6)
    # given the sign bits, moving either reconstruction value only increases the error
    err = sq(x - y)
    pos = m >= 0
    for delta in (1e-2, -1e-2):
        for group in (pos, ~pos):
            assert sq(m - (y.reshape(-1, ncol) + delta * group)) >= err - 1e-9


def test_onebit_single_sign_group_and_zero_vector():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_allclose(rt(cc.onebit(), x), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(rt(cc.onebit(), np.zeros(5, np.float32)), np.zeros(5))


@pytest.mark.parametrize("name,u", [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_casts_relative_error(name, u):
    x = randn(6, (1000,)) * np.float32(100)
    y = rt(cc.get(name), x)
    assert np.all(np.abs(x - y) <= u * np.abs(x) * (1 + 1e-6))


def test_fp16_below_normal_range_has_absolute_error_2_pow_minus_25():
    x = np.array([3e-5, -1e-6, 2e-8, 1e-9, -6e-5], np.float32)
    y = rt(cc.fp16(), x)
    assert np.all(np.abs(x - y) <= 2.0**-25) and y[3] == 0


def test_powersgd_projects_onto_the_p_subspace():
    rng = np.random.default_rng(7)
    m = rng.standard_normal((12, 9)).astype(np.float32)
    c = cc.powersgd(rank=2)
    x = jnp.asarray(m)
    payload, _ = c.compress(x, c.init(x), KEY)
    p = np.asarray(payload.p, np.float64)
    np.testing.assert_allclose(p.T @ p, np.eye(2), atol=1e-5)
    y = np.asarray(c.decompress(payload, x), np.float64)
    np.testing.assert_allclose(y, p @ p.T @ m, rtol=1e-4, atol=1e-5)
    assert abs(sq(m - y) - (sq(m) - sq(p.T @ m))) <= 1e-4 * sq(m)


def test_powersgd_recovers_low_rank_and_converges_to_best_rank_r():
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((10, 2)), rng.standard_normal((7, 2))
    low = (a @ b.T).astype(np.float32)
    c = cc.powersgd(rank=2)
    x = jnp.asarray(low)
    np.testing.assert_allclose(np.asarray(c.roundtrip(x, c.init(x), KEY)[0]), low, atol=1e-4)
    # warm-started power iteration on a fixed matrix: error -> sum of the tail singular values^2
    u, _ = np.linalg.qr(rng.standard_normal((16, 11)))
    v, _ = np.linalg.qr(rng.standard_normal((11, 11)))
    sv = np.array([5.0, 3.0, 1.0, 0.8, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01])
    m = (u * sv) @ v.T
    m = m.astype(np.float32)
    step = jax.jit(lambda x, s: c.roundtrip(x, s, KEY))
    state, x = c.init(jnp.asarray(m)), jnp.asarray(m)
    for _ in range(30):
        y, state = step(x, state)
    np.testing.assert_allclose(sq(m - np.asarray(y)), np.sum(sv[2:] ** 2), rtol=1e-3)


def test_powersgd_orthogonalize_keeps_zero_columns_zero():
    p = jnp.zeros((5, 2))
    assert np.all(np.isfinite(np.asarray(orthogonalize(p))))
    c = cc.powersgd(rank=1)
    z = jnp.zeros((6, 4))
    np.testing.assert_array_equal(np.asarray(c.roundtrip(z, c.init(z), KEY)[0]), np.zeros((6, 4)))


def test_terngrad_clip_scaler_is_c_sigma_and_constant_tensors_survive():
    x = randn(9, (400,))
    x[0] = 40.0  # an outlier that clipping removes
    c = cc.terngrad(clip=2.5)
    payload = payload_of(c, x)
    sigma = float(np.std(x.astype(np.float64)))
    np.testing.assert_allclose(float(payload.scale), 2.5 * sigma, rtol=1e-5)
    assert set(np.unique(np.abs(rt(c, x)).round(4))) <= {0.0, round(2.5 * sigma, 4)}
    for const in (np.full((6,), 0.3, np.float32), np.array(-2.0, np.float32)):
        np.testing.assert_allclose(rt(c, const), const.reshape(-1) if const.ndim else const, rtol=1e-6)


def test_dgc_adjustment_under_vmap_and_shard_map():
    # d > 256: the bounded while_loop and the lax.cond run batched (vmap) and per device.
    rng = np.random.default_rng(6)
    d = 3001
    xs = (rng.standard_normal((4, d)) * rng.exponential(1.0, (4, d))).astype(np.float32)
    xs[1, ::11] *= 100.0  # lowered threshold
    xs[2, ::11] *= 0.01  # resample
    c = cc.dgc(ratio=0.05)
    loop = np.stack([rt(c, x) for x in xs])

    def one(x):
        p, _ = c.compress(x, c.init(x), KEY)
        return c.decompress(p, x)

    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(one))(jnp.asarray(xs))), loop)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("w",))
    spec = jax.sharding.PartitionSpec("w")
    sm = jax.jit(jax.shard_map(lambda x: one(x[0])[None], mesh=mesh, in_specs=spec, out_specs=spec))
    np.testing.assert_array_equal(np.asarray(sm(jnp.asarray(xs))), loop)
