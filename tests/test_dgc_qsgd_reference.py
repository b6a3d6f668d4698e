"""DGC's and QSGD's payloads against NumPy replays of their module docs, bit for bit on fixed keys.

The generic tests (``registry_cases``) check these compressors' error terms and unbiasedness; these
pin the exact message: which entries DGC sends in which slots (each selection rule reached), and
which level QSGD sends for each entry given the uniforms it draws.  A change to the jitted bodies
that changes the compiled program's results fails here.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cconv.compressors as C
from cconv.compressors import fastrng
from cconv.compressors.packing import unpack_bits

# the modules (the package's names dgc and qsgd are the registered factories)
dgc = importlib.import_module("cconv.compressors.dgc")
qsgd = importlib.import_module("cconv.compressors.qsgd")


def heavy(d: int, seed: int) -> jnp.ndarray:
    """Gaussian entries scaled by exp(2 N(0, 1)): heavy-tailed magnitudes, as gradients have."""
    a, b = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(a, (d,)) * jnp.exp(2.0 * jax.random.normal(b, (d,)))


# (hyper-parameters, d, the rule the replay takes, whether all k slots are sent): every rule of
# dgc.replay_selection and both index-order paths of dgc.select_slots (n <= upper_bound * k: among
# the top magnitudes; n > upper_bound * k after the last lowering: ranked by index), with padding
DGC_CASES = (
    ({"ratio": 0.1}, 200, "exact", True),  # d <= 256: the sample is the whole vector
    ({"ratio": 0.01}, 20000, "first", True),  # the usual case: k < n <= upper_bound * k after lowering
    ({"ratio": 0.01, "adapt_iters": 0}, 20000, "first", False),  # n < k, no lowering: padding
    ({"ratio": 0.02, "adapt_iters": 0, "upper_bound": 1.0, "sample_ratio": 0.05}, 5000, "first", True),  # n > k
    ({"ratio": 0.02, "upper_bound": 1.0}, 5000, "resample", True),
    ({"ratio": 0.05, "positions": "golomb"}, 4000, "resample", True),
    ({"ratio": 0.01, "positions": "golomb"}, 20000, "first", True),
)


@pytest.mark.parametrize("hp, d, rule, full", DGC_CASES, ids=[f"dgc-{i}" for i in range(len(DGC_CASES))])
def test_dgc_sends_the_replayed_entries_in_ascending_slots(hp, d, rule, full):
    c = C.get("dgc", **hp)
    x, k = heavy(d, seed=d), dgc.sparsifier_k(c, d)
    payload, _ = jax.jit(lambda x: c.compress(x, (), jax.random.PRNGKey(0)))(x)
    sent, how = dgc.replay_selection(np.asarray(x, np.float64), k, c.hparams)
    assert how == rule
    sent = np.sort(sent)
    n = len(sent)
    assert (n == k) == full
    if isinstance(payload, dgc.CodedPayload):
        assert int(payload.count) == n
        payload = c.sparse(payload, x)
    idx, values = np.asarray(payload.indices), np.asarray(payload.values)
    np.testing.assert_array_equal(idx[:n], sent)
    np.testing.assert_array_equal(values[:n], np.asarray(x)[sent])  # exact copies
    assert not idx[n:].any() and not values[n:].any()  # padding: value 0 at index 0
    y = np.asarray(jax.jit(lambda p: c.decompress(p, x))(payload))
    expected = np.zeros(d, np.float32)
    expected[sent] = np.asarray(x)[sent]
    np.testing.assert_array_equal(y, expected)


def qsgd_levels(x: np.ndarray, norms: np.ndarray, u: np.ndarray, s: int, b: int) -> np.ndarray:
    """The module doc's rule in float32: l = floor(s |v_i| / ||v||), xi = l + 1 with probability
    s |v_i| / ||v|| - l (when the uniform u_i is below it), signed; ||v|| as sent."""
    nb = norms.shape[0]
    v = np.pad(x.astype(np.float32), (0, nb * b - x.size)).reshape(nb, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(norms[:, None] > 0, np.float32(s) * np.abs(v) / norms[:, None], np.float32(0))
    lo = np.floor(r)
    xi = np.minimum(lo + (u < r - lo), s)
    return np.where(v >= 0, xi, -xi).reshape(-1)[: x.size]


@pytest.mark.parametrize("levels, bucket, d", [(1, None, 1000), (4, 6, 999), (8, 512, 3000), (127, None, 300)])
@pytest.mark.slow
def test_qsgd_sends_the_replayed_levels(levels, bucket, d):
    c = C.get("qsgd", levels=levels, bucket=bucket)
    x, key = heavy(d, seed=levels), jax.random.PRNGKey(levels)
    payload, _ = jax.jit(lambda x, key: c.compress(x, (), key))(x, key)
    b = d if bucket is None else min(bucket, d)
    nb = -(-d // b)
    norms = np.asarray(payload.norms)
    v = np.pad(np.asarray(x), (0, nb * b - d)).reshape(nb, b)
    np.testing.assert_allclose(norms, np.sqrt(np.sum(v.astype(np.float64) ** 2, 1)), rtol=1e-6)
    u = np.asarray(fastrng.uniform(key, (nb, b)))
    got = np.asarray(unpack_bits(payload.codes, qsgd.code_bits(levels), d)).astype(np.int32) - levels
    np.testing.assert_array_equal(got, qsgd_levels(np.asarray(x), norms, u, levels, b))
