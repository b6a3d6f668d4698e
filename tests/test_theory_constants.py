"""cconv.theory.constants against the real compressors.

Monte Carlo bounds: with N i.i.d. draws of a quantity Z, |mean - E Z| <= 5 sd / sqrt(N) fails with
probability < 6e-7 by the CLT; the keys are fixed, so the tests are deterministic.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R

from cconv import compressors as C
from cconv.memory import error_feedback
from cconv.theory import constants as K

Z = 5.0
N_MC = 1000

SHAPES = [(1,), (7,), (100,), (33, 17), (8, 3, 5), (64, 64)]


def _inputs():
    rng = np.random.default_rng(0)
    return {
        "normal": rng.standard_normal((33, 17)).astype(np.float32),
        "heavy": rng.standard_t(1.5, (33, 17)).astype(np.float32),
        "sparse": (rng.standard_normal((33, 17)) * (rng.random((33, 17)) < 0.1)).astype(np.float32),
    }


def _real_ratios(c, xs, key=jax.random.PRNGKey(3)):
    """||C(x) - x||^2 / ||x||^2 from the real compressor, for a stack of inputs (one compile)."""
    xs = jnp.asarray(np.stack(xs))
    ys = jax.jit(jax.vmap(lambda x: c.roundtrip(x, c.init(x), key)[0]))(xs)
    y = np.asarray(ys, np.float64).reshape(len(xs), -1)
    x64 = np.asarray(xs, np.float64).reshape(len(xs), -1)
    return np.sum((y - x64) ** 2, axis=1) / np.sum(x64**2, axis=1)


def _real_ratio(c, x):
    return float(_real_ratios(c, [x])[0])


def _constants_api(name, hp):
    """The case's compressor; cconv.theory.constants must read its entry's oracle (the bound
    where the entry claims one, else "no constant")."""
    c = C.get(name, **hp)
    if C.entry(name).theory.bound is not None:
        K.constants(c, (7,))
    else:
        with pytest.raises(ValueError, match="no"):
            K.constants(c, (7,))
    return c


@pytest.mark.parametrize("name,hp", R.WITH_WIRE_FORMULA)
def test_closed_form_bits_equal_wire_bytes(name, hp):
    c = _constants_api(name, hp)
    for shape in SHAPES:
        for dtype in ("float32", "bfloat16"):
            assert K.wire_bytes(c, shape, dtype) == c.wire_bytes(shape, dtype), (shape, dtype)
            d = int(np.prod(shape))
            assert K.bits(c, shape, dtype) == pytest.approx(8 * c.wire_bytes(shape, dtype) / d)


def test_bits_headline_values():
    # large d: the per-tensor scalars vanish and the papers' bits per element appear
    d = (1 << 20,)
    assert K.bits("none", d) == 32
    assert K.bits("fp16", d) == 16
    assert K.bits("signsgd", d) == 1
    assert K.bits("scaled_sign", d) == pytest.approx(1, abs=1e-4)
    assert K.bits("terngrad", d) == pytest.approx(2, abs=1e-4)
    assert K.bits("qsgd", d, levels=4) == pytest.approx(4, abs=1e-4)  # ceil(log2 9) = 4
    assert K.bits("qsgd", d, levels=1) == pytest.approx(2, abs=1e-4)  # ceil(log2 3) = 2
    assert K.bits("topk", d, ratio=0.01) == pytest.approx(0.64, rel=1e-3)  # 64 bits per kept entry
    assert K.bits("randomk", d, ratio=0.01) == pytest.approx(0.32, rel=1e-3)  # shared key: values only
    assert K.bits("stc", d, ratio=0.01) == pytest.approx(0.33, rel=1e-3)  # 32 + 1 bits per kept entry


@pytest.mark.parametrize("name,hp", R.WITH_ERROR)
def test_theory_error_matches_real_compressor(name, hp):
    """theory error_sq against the real compressor on the probes (exact for deterministic ones,
    Monte Carlo for random ones); the exact values respect the worst-case bound, attained when
    it is tight (tests/registry_cases.py)."""
    R.check_theory_error(R.subject(name, hp))


@pytest.mark.parametrize("name,hp", R.WITH_ERROR)
def test_exact_error_on_larger_inputs(name, hp):
    """Deterministic compressors on 33 x 17 inputs (beyond DGC's 256-entry sample, say): the
    closed form equals the real compressor's error; random ones are checked by Monte Carlo above."""
    s = R.subject(name, hp)
    if s.is_random:
        pytest.skip("random: Monte Carlo in test_theory_error_matches_real_compressor")
    c = s.c
    b = s.bound((33, 17))
    inputs = _inputs()
    real = _real_ratios(c, list(inputs.values()))
    for (label, x), got in zip(inputs.items(), real):
        exact = s.theory.error_sq(c, x.astype(np.float64), None) / np.sum(x.astype(np.float64) ** 2)
        assert got == pytest.approx(exact, rel=1e-4, abs=1e-9), label
        if b is None:  # no bound claimed
            continue
        if b.kind == "unbiased" and b.omega is not None:
            assert exact <= b.omega + 1e-9, label
        if b.delta is not None:
            assert 1 - exact >= b.delta - 1e-9, label


@pytest.fixture(scope="module")
def mc_keys():
    return jax.random.split(jax.random.PRNGKey(2024), N_MC)


def _mc_outputs(c, x, keys):
    xj = jnp.asarray(x)
    state = c.init(xj)
    f = jax.jit(jax.vmap(lambda k: c.roundtrip(xj, state, k)[0]))
    return np.asarray(f(keys), np.float64).reshape(len(keys), -1)


@pytest.mark.parametrize(
    "name,hp,shape",
    [
        ("topk", dict(ratio=0.1), (100,)),
        ("randomk", dict(ratio=0.1, scaled=False), (100,)),
        ("scaled_sign", {}, (50,)),
        ("onebit", {}, (50,)),
        ("onebit", dict(columns=True), (10, 5)),
        ("stc", dict(k=2), (100,)),
        ("fp16", {}, (8,)),
        ("bf16", {}, (8,)),
        ("qsgd", dict(levels=1), (64,)),
        ("terngrad", {}, (64,)),
    ],
    ids=lambda v: str(v),
)
def test_worst_case_is_attained(name, hp, shape, mc_keys):
    c = C.get(name, **hp)
    k = K.constants(c, shape)
    assert k.tight
    x = K.worst_case_input(c, shape).astype(np.float32)
    worst = k.omega if k.kind == "unbiased" else 1 - k.delta
    assert K.error_ratio(c, x) == pytest.approx(worst, rel=1e-9, abs=1e-15)
    if c.unbiased:
        y = _mc_outputs(c, x, mc_keys)
        x64 = x.astype(np.float64).reshape(-1)
        err = np.sum((y - x64) ** 2, axis=1) / np.sum(x64**2)
        assert abs(err.mean() - worst) <= Z * err.std(ddof=1) / math.sqrt(N_MC) + 1e-6
    else:
        assert _real_ratio(c, x) == pytest.approx(worst, rel=1e-5, abs=1e-12)


def test_terngrad_worst_case_is_the_supremum():
    """(sqrt(d)-1)/2 is the maximum of s||x||_1/||x||^2 - 1: no random or perturbed x exceeds it."""
    d = 64
    worst = K.omega("terngrad", (d,))
    x0 = K.worst_case_input("terngrad", (d,))
    rng = np.random.default_rng(1)
    for _ in range(300):
        for x in (x0 + 0.02 * rng.standard_normal(d), rng.standard_normal(d) * rng.random(d) ** 3):
            assert K.error_ratio("terngrad", x) <= worst + 1e-12
    # the docstring's sqrt(d) - 1 is a valid but loose bound
    assert worst < math.sqrt(d) - 1


def test_stc_worst_case_is_min_k_over_d_and_one_over_k():
    rng = np.random.default_rng(2)
    for d, k in [(100, 5), (100, 20), (30, 10)]:
        delta = K.delta("stc", (d,), k=k)
        assert delta == pytest.approx(min(k / d, 1 / k))
        for _ in range(300):
            x = rng.standard_normal(d) * rng.random(d) ** rng.integers(1, 8)
            assert K.delta_x("stc", x, k=k) >= delta - 1e-12
        spike = np.ones(d)
        spike[0] = 1e6  # approaches 1/k
        assert K.delta_x("stc", spike, k=k) == pytest.approx(1 / k, rel=1e-3)
        flat = np.ones(d)  # equals k/d
        assert K.delta_x("stc", flat, k=k) == pytest.approx(k / d)


def test_qsgd_paper_bound_holds_and_s1_is_tight():
    rng = np.random.default_rng(3)
    for s, b in [(1, 64), (2, 64), (4, 50), (16, 64)]:
        bound = K.omega("qsgd", (200,), levels=s, bucket=b)
        assert bound == pytest.approx(math.sqrt(b) - 1 if s == 1 else min(b / s**2, math.sqrt(b) / s))
        for _ in range(50):
            x = rng.standard_normal(200) * rng.random(200) ** rng.integers(0, 6)
            assert K.error_ratio("qsgd", x, levels=s, bucket=b) <= bound + 1e-12


def test_dgc_bound_holds_for_adversarial_inputs():
    d, k = 4096, 41
    c = C.get("dgc", k=k)
    delta = K.delta(c, (d,))
    rng = np.random.default_rng(4)
    x = rng.standard_normal(d).astype(np.float32)
    x[::16] *= 100  # the sampled positions are the largest
    xs = [x, rng.standard_normal(d).astype(np.float32)]
    for v, got in zip(xs, _real_ratios(c, xs)):
        assert K.delta_x(c, v) >= delta
        assert got == pytest.approx(K.error_ratio(c, v), rel=1e-5)


def test_powersgd_exact_uses_warm_start_and_is_non_expansive():
    c = C.get("powersgd", rank=1)
    rng = np.random.default_rng(5)
    m = rng.standard_normal((20, 10)).astype(np.float32)
    low_rank = np.outer(rng.standard_normal(20), rng.standard_normal(10)).astype(np.float32)
    assert K.delta_x(c, low_rank) == pytest.approx(1.0, abs=1e-6)  # a rank-1 M is recovered
    dx = K.delta_x(c, m)
    assert 0.0 <= dx <= 1.0
    # the best rank-1 approximation bounds any single power step
    sv = np.linalg.svd(m.astype(np.float64), compute_uv=False)
    assert dx <= sv[0] ** 2 / np.sum(sv**2) + 1e-9
    assert K.constants(c, (20,)).omega == 0.0  # vectors stay dense


def test_signsgd_is_not_a_contraction():
    x = np.full(10, 0.01)
    assert K.delta_x("signsgd", x) < -1000  # ||x - sign(x)||^2 >> ||x||^2
    assert K.constants("signsgd", (10,)).delta is None
    with pytest.raises(ValueError, match="no contraction"):
        K.delta("signsgd", (10,))


def test_api_accepts_objects_names_and_memory_wrappers():
    c = C.get("topk", ratio=0.1)
    assert K.constants(c, (50,)) == K.constants("topk", (50,), ratio=0.1)
    assert K.delta(error_feedback(c), (50,)) == pytest.approx(0.1)
    assert K.omega("randomk", (50,), ratio=0.1) == pytest.approx(9.0)
    assert K.delta("randomk", (50,), ratio=0.1, scaled=False) == pytest.approx(0.1)
    assert K.error_ratio("topk", np.zeros(5), ratio=0.2) == 0.0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: K.constants("nope", (3,)), "valid names"),
        (lambda: K.constants("topk", (3,), bogus=1), "unknown hyper-parameter"),
        (lambda: K.constants("topk", (0,), ratio=0.1), "no elements"),
        (lambda: K.omega("topk", (10,), ratio=0.1), "not unbiased"),
        (lambda: K.constants(C.get("topk", ratio=0.1), (3,), ratio=0.2), "only with a compressor name"),
        (lambda: K.worst_case_input("threshold", (10,), tau=1.0), "no attained worst case"),
    ],
)
def test_bad_input_is_one_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_threshold_and_powersgd_are_only_non_expansive():
    """delta = 0 is attained: nothing above tau (threshold); M Q = 0 (PowerSGD's warm start)."""
    th = C.get("threshold", tau=10.0, ratio=0.1)
    small = np.linspace(-1, 1, 40).astype(np.float32)
    assert K.delta(th, (40,)) == 0.0
    assert K.error_ratio(th, small) == pytest.approx(1.0) and _real_ratio(th, small) == pytest.approx(1.0)
    from cconv.compressors.powersgd import PowerSGDState

    ps = C.get("powersgd", rank=1)
    state = PowerSGDState(jnp.eye(5, 1))  # warm start q = e_1
    m = np.zeros((6, 5), np.float32)
    m[:, 1:] = np.arange(24.0).reshape(6, 4)  # M e_1 = 0: P = 0, C(M) = 0
    assert K.error_ratio(ps, m, state) == 1.0
    y, _ = ps.roundtrip(jnp.asarray(m), state, jax.random.PRNGKey(0))
    assert np.all(np.asarray(y) == 0)


def test_onebit_is_at_least_as_good_as_scaled_sign():
    """1-bit SGD projects onto span(1_+, 1_-), which contains sign(x): its delta_x >= scaled sign's."""
    rng = np.random.default_rng(6)
    for _ in range(100):
        x = rng.standard_normal(50) * rng.random(50) ** 3 + rng.normal()
        assert K.delta_x("onebit", x) >= K.delta_x("scaled_sign", x) - 1e-12
        assert K.delta_x("scaled_sign", x) == pytest.approx(np.sum(np.abs(x)) ** 2 / (50 * np.sum(x * x)))
