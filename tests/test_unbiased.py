"""Monte Carlo checks of unbiasedness and of the exact second moments the papers give.

Every check draws N = 10^4 fixed keys (one ``jit(vmap(...))`` per compressor), so it is
deterministic. Bounds come from the empirical standard error: a coordinate passes when
|mean - x| <= z * se + atol, with z the two-sided normal quantile for a family-wise error rate
ALPHA shared by Bonferroni over the d coordinates; atol only absorbs float32 rounding of the
samples. Each test also shows that the same check rejects a deliberately wrong hypothesis
(a biased compressor, or a wrong variance constant), so none of them passes vacuously.
"""

import numpy as np
import pytest
import registry_cases as R
from registry_cases import N_MC, mean_ok, scalar_mean_ok, z_for

N = N_MC
X = R.X.reshape(-1)  # the samples are of R.X (3 x 4), flattened
D = X.size


def mc_samples(name: str, hp: tuple, seed: int = 0) -> np.ndarray:
    """(N, d) float64 samples of decompress(compress(X)) over N fixed keys (one compile)."""
    return R.subject(name, dict(hp)).samples(R.X, seed).reshape(N, -1)


@pytest.mark.parametrize("name,hp", R.UNBIASED)
def test_unbiased(name, hp):
    """Every case whose compressor declares ``unbiased``: E[C(x)] = x (exact when it is
    deterministic, Monte Carlo otherwise) and its second moment against the theory."""
    R.check_unbiased(R.subject(name, hp))


@pytest.mark.parametrize(
    "name,hp",
    [
        ("randomk", (("k", 3), ("scaled", True), ("shared", True))),
        ("randomk", (("k", 3), ("scaled", True), ("shared", False))),
        ("qsgd", (("levels", 1),)),
    ],
    ids=lambda v: str(v),
)
@pytest.mark.slow
def test_monte_carlo_mean_of_more_variants(name, hp):
    """Spot checks beyond the registry's cases (their samples also serve the tests below)."""
    passed, worst = mean_ok(mc_samples(name, hp), X)
    assert passed, f"{name}{hp}: worst |mean - x| / se = {worst:.2f} > z = {z_for(D):.2f}"


@pytest.mark.parametrize(
    "name,hp",
    [
        ("randomk", (("k", 3), ("scaled", False), ("shared", True))),
        ("terngrad", (("clip", 0.5),)),
    ],
    ids=["unscaled-randomk", "terngrad-clipped"],
)
@pytest.mark.slow
def test_monte_carlo_mean_rejects_biased_variant(name, hp):
    """The same check must reject compressors that are biased (proves it can fail)."""
    passed, worst = mean_ok(mc_samples(name, hp), X)
    assert not passed and worst > 10 * z_for(D)


def _sq(a):
    return np.sum(a * a, axis=-1)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.slow
def test_randomk_second_moment(shared):
    """E||C(x) - x||^2 = (d/k - 1)||x||^2 for scaled random-k (Stich et al. 2018)."""
    k = 3
    samples = mc_samples("randomk", (("k", k), ("scaled", True), ("shared", shared)))
    err = _sq(samples - X)
    ok, z = scalar_mean_ok(err, (D / k - 1) * _sq(X))
    assert ok, z
    # Sanity: a wrong constant (d/k instead of d/k - 1) is rejected by the same check.
    assert not scalar_mean_ok(err, (D / k) * _sq(X))[0]


@pytest.mark.slow
def test_unscaled_randomk_contraction_in_expectation():
    """E||x - C(x)||^2 = (1 - k/d)||x||^2 for unscaled random-k, and E[C(x)] = (k/d) x."""
    k = 3
    samples = mc_samples("randomk", (("k", k), ("scaled", False), ("shared", True)))
    ok, z = scalar_mean_ok(_sq(X - samples), (1 - k / D) * _sq(X))
    assert ok, z
    assert mean_ok(samples, (k / D) * X)[0]
    assert not scalar_mean_ok(_sq(X - samples), (1 - (k + 1) / D) * _sq(X))[0]


def test_terngrad_second_moment():
    """E||C(x)||^2 = s ||x||_1 with s = max|x_i| (Wen et al. 2017)."""
    samples = mc_samples("terngrad", ())
    s = np.abs(X).max()
    ok, z = scalar_mean_ok(_sq(samples), s * np.abs(X).sum())
    assert ok, z
    assert not scalar_mean_ok(_sq(samples), 1.05 * s * np.abs(X).sum())[0]
    # every output entry is in {-s, 0, s}
    np.testing.assert_allclose(np.abs(samples)[samples != 0], s, rtol=1e-6)


def qsgd_variance(x: np.ndarray, s: int, bucket: int | None) -> float:
    """sum over buckets and coordinates of (||v||/s)^2 p_i (1 - p_i) (Alistarh et al. 2017)."""
    b = x.size if bucket is None else bucket
    total = 0.0
    for start in range(0, x.size, b):
        v = x[start : start + b]
        norm = np.sqrt(np.sum(v * v))
        r = s * np.abs(v) / norm
        p = r - np.floor(r)
        total += np.sum((norm / s) ** 2 * p * (1 - p))
    return total


@pytest.mark.parametrize("levels,bucket", [(2, None), (1, None), (3, 5)])
def test_qsgd_second_moment(levels, bucket):
    hp = (("levels", levels),) if bucket is None else (("levels", levels), ("bucket", bucket))
    samples = mc_samples("qsgd", hp)
    err = _sq(samples - X)
    expected = qsgd_variance(X, levels, bucket)
    ok, z = scalar_mean_ok(err, expected)
    assert ok, z
    assert not scalar_mean_ok(err, 1.05 * expected)[0]
    # the paper's bound min(d/s^2, sqrt(d)/s) ||x||^2 (per bucket) holds
    b = D if bucket is None else bucket
    assert expected <= min(b / levels**2, np.sqrt(b) / levels) * _sq(X)


def test_qsgd_levels_are_the_papers_grid():
    """Every output is ||v|| * l / s with integer l in [-s, s], and l in {floor(r), floor(r)+1}."""
    s = 2
    samples = mc_samples("qsgd", (("levels", s),))
    norm = np.sqrt(_sq(X))
    l = samples * s / norm
    np.testing.assert_allclose(l, np.round(l), atol=1e-5)
    r = s * np.abs(X) / norm
    mag = np.abs(np.round(l))
    assert np.all((mag == np.floor(r)) | (mag == np.floor(r) + 1))
