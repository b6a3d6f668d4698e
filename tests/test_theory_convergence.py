"""Numerical checks of the convergence statements in theory/convergence.md.

Single-process simulations (cconv.theory.simulate: workers and repetitions are vmapped) on a
strongly convex least-squares problem, with the real compressors and error-feedback wrapper.
All methods in one test share their random draws (common random numbers), so ratios between
methods are precise; bounds use the standard error over repetitions.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cconv import compressors as C
from cconv.theory import simulate as S

STEPS = 2000
REPS = 32


@pytest.fixture(scope="module")
def problem():
    return S.least_squares(jax.random.PRNGKey(0), n=256, d=10, cond=10.0, noise=0.5)


def _se(v):
    v = np.asarray(v, np.float64)
    return v.std(ddof=1) / np.sqrt(v.size)


@pytest.mark.slow
def test_error_feedback_topk_reaches_the_sgd_neighbourhood(problem):
    """Stich, Cordonnier & Jaggi (2018), Thm 2.4: with gamma_t = 8/(mu(a+t))-type steps and
    (a+t)^2-weighted averaging, EF top-k converges at SGD's rate O(G^2/(mu T)) (compression
    enters only higher-order terms).  Karimireddy et al. (2019), Thm II: with a constant step the
    compression adds O(gamma^2 (1-delta)/delta^2) to SGD's O(gamma) neighbourhood, so the relative
    excess vanishes as gamma -> 0.  Without error feedback top-k (a biased compressor) is far off."""
    p = problem
    a = 16 * p.L / p.mu
    dec = S.stich_schedule(p.mu, a, 4.0)
    topk = C.get("topk", k=1)  # delta = k/d = 0.1
    g0 = 0.05
    methods = {
        "sgd": (None, False),
        "ef": (topk, True),
        "noef": (topk, False),
        "sgd_c": (None, False, lambda t: g0),
        "ef_c": (topk, True, lambda t: g0),
        "sgd_c4": (None, False, lambda t: g0 / 4),
        "ef_c4": (topk, True, lambda t: g0 / 4),
    }
    out = S.compressed_sgd(p, methods, workers=4, steps=STEPS, lr=dec, key=jax.random.PRNGKey(1), reps=REPS, avg_a=a)
    final = {k: np.asarray(v[1][:, -1], np.float64) for k, v in out.items()}
    sgd, ef = final["sgd"].mean(), final["ef"].mean()
    assert _se(final["sgd"]) < 0.15 * sgd  # the comparison is informative
    assert ef / sgd == pytest.approx(1.0, abs=0.1)
    assert final["noef"].mean() > 100 * sgd
    # constant steps: stationary error over the second half (last iterates)
    stat = {k: float(np.asarray(out[k][0][:, STEPS // 2 :]).mean()) for k in ("sgd_c", "ef_c", "sgd_c4", "ef_c4")}
    excess = (stat["ef_c"] - stat["sgd_c"]) / stat["sgd_c"]
    excess4 = (stat["ef_c4"] - stat["sgd_c4"]) / stat["sgd_c4"]
    assert stat["sgd_c4"] < stat["sgd_c"]  # SGD's O(gamma) neighbourhood
    assert excess > 0.5  # compression costs at large gamma ...
    assert excess4 < excess / 4  # ... and the cost vanishes faster than gamma


@pytest.mark.slow
def test_scaled_sign_fails_without_error_feedback_on_the_counterexample():
    """Karimireddy et al. (2019), Counterexample 1: every stochastic gradient's sign is +-(1,-1),
    so sign methods without memory never leave the line x1 + x2 = 2 through x0 = (1,1), where
    f >= 2 eps^2 = f(x0): no step size helps.  EF-scaled-sign converges to the optimum x* = 0."""
    eps = 0.5
    p = S.karimireddy_counterexample(eps)
    x0 = jnp.array([1.0, 1.0])
    f0 = float(S.loss(p, x0))
    assert f0 == pytest.approx(2 * eps**2)
    ss = C.get("scaled_sign")
    methods = {
        f"{'ef' if ef else 'noef'}_{name}": (ss, ef, lr)
        for ef in (False, True)
        for name, lr in (("0.01", lambda t: 0.01), ("0.1", lambda t: 0.1), ("dec", lambda t: 1.0 / (1.0 + t)))
    }
    out = S.compressed_sgd(p, methods, workers=2, steps=1000, lr=None, key=jax.random.PRNGKey(0), reps=8, x0=x0)
    for name, (last, _) in out.items():
        last = np.asarray(last)
        if name.startswith("noef"):
            assert last.min() >= f0 * (1 - 1e-5), name  # never below f(x0)
        else:
            assert last[:, -1].max() <= 1e-2 * f0, name  # at least 100x below


@pytest.mark.slow
def test_local_sgd_linear_speedup_and_bounded_drift(problem):
    """Stich (2019), Thm 2.2: local SGD with P workers and H <= O(sqrt(T/P)) local steps (steps
    4/(mu(a+t)), a = max(16 kappa, H), (a+t)^2-weighted average) reaches error O(sigma^2/(mu P T)):
    a linear speedup in P.  Lemma 3.3: the workers' spread before averaging is at most
    4 gamma_t^2 H^2 G^2.  Beyond the theorem (constant step): the error grows with H."""
    p = problem
    h_max = 16  # sqrt(T / P) = 15.8
    a = max(16 * p.L / p.mu, h_max)
    dec = S.stich_schedule(p.mu, a, 4.0)
    const = lambda t: 0.02  # noqa: E731
    configs = {
        "p1": (1, 1),
        "h1": (8, 1),
        "h4": (8, 4),
        "h16": (8, 16),
        "c1": (8, 1, const),
        "c4": (8, 4, const),
        "c16": (8, 16, const),
        "cT": (8, STEPS, const),
    }
    out = S.local_sgd(p, configs, steps=STEPS, lr=dec, key=jax.random.PRNGKey(2), reps=REPS, avg_a=a)
    err = {k: np.asarray(v["err"], np.float64) for k, v in out.items()}
    for h in ("h1", "h4", "h16"):
        speedup = err["p1"].mean() / err[h].mean()
        assert 8 / 1.5 < speedup < 8 * 1.5, (h, speedup)
    assert err["h16"].mean() / err["h1"].mean() < 1.1  # the H^2 term is higher order here
    for k in ("h1", "h4", "h16"):
        g2 = float(np.asarray(out[k]["g2"]).mean())
        assert float(np.asarray(out[k]["dev_norm"]).max()) <= 4 * g2
    # constant step: drift makes the error grow with H (paired differences, > 3 standard errors)
    for lo, hi in (("c1", "c4"), ("c4", "c16"), ("c1", "cT")):
        diff = err[hi] - err[lo]
        assert diff.mean() > 3 * _se(diff), (lo, hi)
