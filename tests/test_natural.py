"""Natural compression (cconv.compressors.natural): powers of two, 9 bits per element, unbiased
with the closed-form variance (|x| - 2^a)(2^(a+1) - |x|), omega = 1/8.

Monte Carlo bounds: N draws with fixed keys; a mean or a second moment is compared with its exact
value within Z = 5 standard deviations of the estimate, the standard deviation computed from the
closed form (two-point distributions), so the tests are deterministic and not vacuous.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cconv.compressors as cc
from cconv.theory import constants as K

Z = 5.0
N = 4000
c = cc.natural()
ROUNDTRIP = jax.jit(lambda x, k: c.roundtrip(x, c.init(x), k)[0])
MANY = jax.jit(jax.vmap(lambda x, k: c.roundtrip(x, c.init(x), k)[0], in_axes=(None, 0)))
KEYS = jax.random.split(jax.random.PRNGKey(11), N)


def _draws(x) -> np.ndarray:
    """N independent C_nat(x), float64, shape (N, d)."""
    return np.asarray(MANY(jnp.asarray(x), KEYS), np.float64).reshape(N, -1)


def _neighbours(x):
    """The two powers of two around |x| (float64): 2^a <= |x| < 2^(a+1)."""
    a = np.floor(np.log2(np.abs(x)))
    return 2.0**a, 2.0 ** (a + 1)


def _inputs(d=64, seed=0):
    """Magnitudes 2^u, u uniform in [-20, 20], random signs, plus 4/3 (p = 1/3), 1.5 (p = 1/2),
    an exact power of two (p = 0) and values just above and below one."""
    rng = np.random.default_rng(seed)
    x = rng.choice([-1.0, 1.0], d) * 2.0 ** rng.uniform(-20, 20, d)
    x[:5] = [4 / 3, -1.5, 0.25, 1.0 + 2**-20, -(2.0 - 2**-20)]
    return x.astype(np.float32)


def test_registered_with_its_entry():
    e = cc.entry("natural")
    assert c.name == "natural" and c.unbiased and c.aggregation == "allgather" and c.hparams == {}
    assert e.knob is None and e.label == "natural compression" and e.example == {}
    assert e.bench.target_x == 4.0 and e.theory is not None
    with pytest.raises(ValueError, match=r"valid: \(none\)"):
        cc.get("natural", levels=3)


@pytest.mark.parametrize(
    "dtype,exps",
    [(jnp.float32, range(-126, 128)), (jnp.bfloat16, range(-126, 128)), (jnp.float16, range(-24, 16))],
    ids=str,
)
def test_powers_of_two_and_zero_are_exact(dtype, exps):
    p2 = np.array([2.0**e for e in exps])
    x = jnp.asarray(np.concatenate([p2, -p2, [0.0, -0.0]]), dtype)
    for seed in range(3):
        y = ROUNDTRIP(x, jax.random.PRNGKey(seed))
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(np.asarray(y, np.float64), np.asarray(x, np.float64))


def test_outputs_are_the_neighbouring_powers_of_two_with_the_sign():
    x = _inputs(512, seed=1)
    x[7] = 0.0
    lo, hi = _neighbours(np.where(x == 0, 1, x).astype(np.float64))
    for seed in range(4):
        y = np.asarray(ROUNDTRIP(jnp.asarray(x), jax.random.PRNGKey(seed)), np.float64)
        mag, sgn = np.abs(y), np.sign(y)
        nz = x != 0
        assert np.all((mag[nz] == lo[nz]) | (mag[nz] == hi[nz]))
        assert np.all(sgn[nz] == np.sign(x[nz]))
        assert y[7] == 0.0  # zero stays zero


@pytest.mark.parametrize("shape", [(), (1,), (7,), (8,), (9,), (3, 5), (33, 17), (1000,)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_bytes_are_nine_bits_per_element(shape, dtype):
    d = math.prod(shape)
    payload = jax.eval_shape(
        lambda x, k: c.compress(x, c.init(x), k)[0],
        jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)),
        jax.random.PRNGKey(0),
    )
    expected = math.ceil(d / 8) + d
    assert cc.payload_bytes(payload) == c.wire_bytes(shape, dtype) == expected
    assert K.wire_bytes(c, shape, dtype) == expected
    assert [leaf.dtype for leaf in jax.tree.leaves(payload)] == [jnp.uint8, jnp.uint8]


def test_real_payload_and_headline_bits():
    x = jnp.asarray(_inputs(37))
    payload, _ = c.compress(x, c.init(x), jax.random.PRNGKey(0))
    assert cc.payload_bytes(payload) == 5 + 37
    assert K.bits("natural", (8000,)) == 9.0


def test_monte_carlo_mean_and_variance_match_the_closed_form():
    x = _inputs()
    x64 = x.astype(np.float64)
    y = _draws(x)
    lo, hi = _neighbours(x64)
    p = (np.abs(x64) - lo) / lo
    var = K.variance_per_coordinate(c, x)
    np.testing.assert_allclose(var, (np.abs(x64) - lo) * (hi - np.abs(x64)), rtol=1e-12)
    assert np.all(var >= 0) and var[2] == 0.0
    # mean: unbiased, within Z sd of the mean estimate
    assert np.all(np.abs(y.mean(0) - x64) <= Z * np.sqrt(var / N) + 1e-12 * np.abs(x64))
    # variance: mean((y - x)^2) estimates Var exactly unbiasedly (x is the known mean); for a
    # two-point law with gap h = hi - lo, Var[(y - x)^2] = mu4 - Var^2 = h^4 p (1 - p) (1 - 2p)^2
    v_hat = np.mean((y - x64) ** 2, axis=0)
    sd = np.sqrt((hi - lo) ** 4 * p * (1 - p) * (1 - 2 * p) ** 2 / N)
    assert np.all(np.abs(v_hat - var) <= Z * sd + 1e-6 * var)
    # p = 1/2 (x = -1.5): (y - x)^2 is the constant 1/4, so the estimate is exact
    assert v_hat[1] == pytest.approx(0.25, rel=1e-12)
    # and the total error agrees with the oracle's exact E||C(x) - x||^2 / ||x||^2
    err = np.sum((y - x64) ** 2, axis=1) / np.sum(x64**2)
    assert abs(err.mean() - K.error_ratio(c, x)) <= Z * err.std(ddof=1) / math.sqrt(N) + 1e-12
    assert K.omega_x(c, x) == pytest.approx(var.sum() / np.sum(x64**2), rel=1e-12)


def test_omega_is_one_eighth_tight_at_four_thirds():
    k = K.constants("natural", (100,))
    assert (k.kind, k.omega, k.delta, k.tight) == ("unbiased", 0.125, 0.875, True)
    assert K.omega("natural", (3,)) == 0.125
    w = K.worst_case_input("natural", (6,)).astype(np.float32)
    np.testing.assert_allclose(np.abs(w), 4 / 3, rtol=1e-7)
    assert K.error_ratio(c, w) == pytest.approx(0.125, rel=1e-9)
    y = _draws(w)
    w64 = w.astype(np.float64)
    err = np.sum((y - w64) ** 2, axis=1) / np.sum(w64**2)
    assert abs(err.mean() - 0.125) <= Z * err.std(ddof=1) / math.sqrt(N)
    rng = np.random.default_rng(3)
    for _ in range(200):  # no normal-float input exceeds 1/8
        x = (rng.standard_normal(50) * 2.0 ** rng.integers(-30, 30, 50)).astype(np.float32)
        assert K.omega_x(c, x) <= 0.125 + 1e-12


def test_subnormals_round_unbiasedly_to_zero_or_the_smallest_normal():
    tiny = 2.0**-126
    x = np.array([0.75 * tiny, -0.25 * tiny, 2.0**-149], np.float32)
    assert 0 < abs(float(x[1])) < tiny  # they really are subnormal
    y = _draws(x)
    for i, (v, p) in enumerate([(0.75 * tiny, 0.75), (-0.25 * tiny, 0.25), (2.0**-149, 2.0**-23)]):
        assert np.all((y[:, i] == 0) | (y[:, i] == math.copysign(tiny, v)))
        ups = np.count_nonzero(y[:, i])
        assert abs(ups - N * p) <= Z * math.sqrt(N * p * (1 - p)) + 1
    np.testing.assert_allclose(
        K.variance_per_coordinate(c, x)[:2], [0.75 * 0.25 * tiny**2, 0.25 * 0.75 * tiny**2], rtol=1e-12
    )


def test_rounding_past_the_largest_power_of_two_overflows_to_inf():
    big = 1.5 * 2.0**127  # p = 1/2 of rounding up to 2^128
    x = np.array([big, -big, 2.0**127, np.finfo(np.float32).max], np.float32)
    y = _draws(x)
    assert np.all((y[:, 0] == 2.0**127) | (y[:, 0] == np.inf))
    assert np.all((y[:, 1] == -(2.0**127)) | (y[:, 1] == -np.inf))
    assert abs(np.count_nonzero(np.isinf(y[:, 0])) - N / 2) <= Z * math.sqrt(N / 4)
    assert np.all(y[:, 2] == 2.0**127)  # the largest power of two is exact
    assert np.count_nonzero(np.isinf(y[:, 3])) >= N - 5  # p = 1 - 2^-23
    assert np.isinf(K.variance_per_coordinate(c, x)[0])


def test_non_finite_input_is_sent_as_infinity():
    x = jnp.array([np.inf, -np.inf, np.nan, 1.0], jnp.float32)
    y = np.asarray(ROUNDTRIP(x, jax.random.PRNGKey(0)))
    assert y[0] == np.inf and y[1] == -np.inf and np.isinf(y[2]) and y[3] == 1.0


def test_half_precision_inputs():
    x16 = jnp.asarray([40000.0, -3 * 2.0**-24, 0.3, 2.0**-24], jnp.float16)
    ys = np.asarray(MANY(x16, KEYS[:256]), np.float64)
    assert MANY(x16, KEYS[:2]).dtype == jnp.float16
    assert set(np.unique(ys[:, 0])) == {32768.0, np.inf}  # 2^16 does not fit in float16
    assert set(np.unique(ys[:, 1])) == {-(2.0**-23), -(2.0**-22)}
    assert set(np.unique(ys[:, 2])) == {0.25, 0.5}
    assert np.all(ys[:, 3] == 2.0**-24)
    xb = jnp.asarray(_inputs(32), jnp.bfloat16)
    yb = ROUNDTRIP(xb, jax.random.PRNGKey(1))
    assert yb.dtype == jnp.bfloat16
    lo, hi = _neighbours(np.asarray(xb, np.float64))
    mag = np.abs(np.asarray(yb, np.float64))
    assert np.all((mag == lo) | (mag == hi))
