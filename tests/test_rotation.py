"""DRIVE and EDEN (``cconv.compressors.drive`` / ``eden``) and their rotation
(``cconv.compressors.rotation``): the fast Walsh-Hadamard transform against the Hadamard matrix,
the Lloyd-Max quantizers against Max (1960), the papers' error constants, the unbiased scale's
identity <x, C(x)> = ||x||^2 and its (small) bias under a Hadamard rotation, and bytes per
coordinate."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R
from scipy.linalg import hadamard

import cconv.compressors as C
from cconv.compressors import rotation
from cconv.compressors.drive import error_given_rotation
from cconv.theory import constants as K

# Max (1960), Table I: mean squared error of the optimal N-level quantizer of N(0, 1), N = 2, 4, 8, 16.
MAX_1960_MSE = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}
VARIANTS = [("drive", {"unbiased": u}) for u in (True, False)] + [
    ("eden", {"bits": b, "unbiased": u}) for b in (2, 3, 4) for u in (True, False)
]


@pytest.mark.slow  # ~3 s of small compiles
def test_fwht_is_the_hadamard_matrix_and_the_rotation_is_orthonormal():
    v = np.random.default_rng(0).standard_normal(512)
    for n in (1, 2, 8, 32, 512):  # 512 = 16 * 16 * 2: a partial last stage
        got = np.asarray(rotation.fwht(jnp.asarray(v[:n], jnp.float32)), np.float64)
        np.testing.assert_allclose(got, hadamard(n) @ v[:n], rtol=1e-5, atol=1e-4)
    x = jnp.asarray(v[:300], jnp.float32)
    y = rotation.rotate(x, jax.random.PRNGKey(1))
    assert y.shape == (512,) and float(jnp.sum(y * y)) == pytest.approx(float(jnp.sum(x * x)), rel=1e-5)
    np.testing.assert_allclose(rotation.unrotate(y, jax.random.PRNGKey(1), 300), x, atol=1e-5)
    assert [rotation.passes(d) for d in (1, 2, 16, 17, 10**6)] == [0, 1, 1, 2, 5]


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_lloyd_max_quantizers_are_max_1960(bits):
    c, t, mse = rotation.lloyd_max(bits)
    assert mse == pytest.approx(MAX_1960_MSE[bits], rel=1e-3)
    np.testing.assert_allclose(c, -c[::-1], atol=1e-12)  # symmetric
    np.testing.assert_allclose(t, (c[1:] + c[:-1]) / 2)
    if bits == 1:
        assert c[1] == pytest.approx(math.sqrt(2 / math.pi), rel=1e-9)


def _vnmse(c, x, n_keys, seed=5):
    keys = jax.random.split(jax.random.PRNGKey(seed), n_keys)
    ys = np.asarray(jax.jit(jax.vmap(lambda k: c.roundtrip(x, c.init(x), k)[0]))(keys), np.float64)
    xx = np.asarray(x, np.float64)
    return ys, ((ys - xx) ** 2).sum(1) / (xx @ xx)


@pytest.mark.slow
@pytest.mark.parametrize("name,hp", VARIANTS, ids=str)
def test_error_constants_of_the_papers(name, hp):
    """vNMSE at D = 2^14 (a heavy-tailed x: the rotation makes it Gaussian-like) over 32 keys:
    MSE_b / (1 - MSE_b) with the unbiased scale (pi/2 - 1 for DRIVE, DRIVE Theorem 3 / EDEN
    Section 4), MSE_b with the minimum-error scale; bound z * standard error (Bonferroni over the
    variants) plus 0.2 % for the finite D."""
    x = jnp.asarray(np.random.default_rng(0).standard_t(3, 2**14), jnp.float32)
    _, r = _vnmse(C.get(name, **hp), x, 32)
    mse = rotation.lloyd_max(hp.get("bits", 1))[2]
    want = mse / (1 - mse) if hp["unbiased"] else mse
    if name == "drive":
        assert want == pytest.approx(math.pi / 2 - 1 if hp["unbiased"] else 1 - 2 / math.pi, rel=1e-9)
    se = r.std(ddof=1) / math.sqrt(r.size)
    assert abs(r.mean() - want) <= R.z_for(len(VARIANTS)) * se + 2e-3 * want, (r.mean(), want, se)


@pytest.mark.parametrize("name,hp", VARIANTS[:3])
def test_unbiased_scale_keeps_the_projection_and_min_error_is_least_squares(name, hp):
    """<x, C(x)> = ||x||^2 for every rotation (unbiased scale: what makes it unbiased for a
    uniform rotation); the minimum-error scale's error is ||y||^2 - ||y||_1^2 / D at b = 1."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal(256), jnp.float32)
    c = C.get(name, **hp)
    ys, r = _vnmse(c, x, 8)
    xx = np.asarray(x, np.float64)
    if hp["unbiased"]:
        np.testing.assert_allclose(ys @ xx, xx @ xx, rtol=2e-5)
    else:
        y = [np.asarray(rotation.rotate(x, k), np.float64) for k in jax.random.split(jax.random.PRNGKey(5), 8)]
        exact = [error_given_rotation(c, v) / (xx @ xx) for v in y]
        np.testing.assert_allclose(r, exact, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name,hp", [("drive", {"unbiased": True}), ("eden", {"bits": 2, "unbiased": True})])
def test_unbiased_scale_bias_is_small_under_the_hadamard_rotation(name, hp):
    """The unbiased scale is unbiased for a uniform random rotation; with the Hadamard rotation the
    bias is measurable but small: at d = 1024 over N = 4000 keys, the estimate
    ||mean - x||^2 - E||C(x) - x||^2 / N of ||E C(x) - x||^2 stays below (1 % ||x||)^2 (measured:
    about 2.4e-5 ||x||^2 for DRIVE), far above its standard error."""
    x = jnp.asarray(np.random.default_rng(1).standard_t(3, 1024), jnp.float32)
    ys, r = _vnmse(C.get(name, **hp), x, 4000, seed=9)
    xx = np.asarray(x, np.float64)
    m = ys.mean(0)
    bias2 = (m - xx) @ (m - xx) / (xx @ xx) - r.mean() / ys.shape[0]
    assert bias2 < 1e-4, bias2


@pytest.mark.parametrize("name,hp", [("drive", {}), ("eden", {"bits": 1}), ("eden", {"bits": 3})])
def test_bytes_per_coordinate_are_the_papers(name, hp):
    """b bits per coordinate of the padded vector, plus the float32 scale and the 8-byte key:
    b + 96 / d bits at d = 2^k; the theory's closed form equals the payload's bytes."""
    b = hp.get("bits", 1)
    c = C.get(name, **hp)
    for d in (1024, 2**16):
        assert K.bits(c, (d,)) == pytest.approx(b + 96 / d)
        x = jax.ShapeDtypeStruct((d,), jnp.float32)
        payload = jax.eval_shape(lambda x: c.compress(x, c.init(x), jax.random.PRNGKey(0))[0], x)
        assert C.payload_bytes(payload) == K.wire_bytes(c, (d,))
    assert K.wire_bytes(c, (1000,)) == K.wire_bytes(c, (1024,))  # padded to 1024
