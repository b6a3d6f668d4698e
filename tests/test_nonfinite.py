"""Non-finite input: each compressor does exactly what its docstring states (nothing is checked
at run time; the engine detects divergence from the loss)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cconv.compressors as cc
from cconv.compressors.randomk import sample_indices

BASE = np.array([1.0, -2.0, 0.7, 0.5, -0.25, 3.0, 0.3, -1.5, 0.1, -0.1, 2.0, -0.6], np.float32)
POS = 2  # where the non-finite value goes (a small entry: it is not in the finite top-k)
KEY = jax.random.PRNGKey(0)


def with_bad(value, shape=(12,)):
    x = BASE.copy()
    x[POS] = value
    return x.reshape(shape)


@functools.cache
def _jitted(name, hp):
    c = cc.get(name, **dict(hp))
    return jax.jit(lambda x, k: c.roundtrip(x, c.init(x), k)[0])


def rt(name, hp, x, key=KEY):
    """decompress(compress(x)), one compiled function per (compressor, shape)."""
    return np.asarray(_jitted(name, tuple(sorted(hp.items())))(jnp.asarray(x), key)).reshape(-1)


_sample = jax.jit(sample_indices, static_argnums=(1, 2))
BAD = pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])


@BAD
@pytest.mark.parametrize("name", ["none", "fp16", "bf16"])
def test_dense_and_casts_pass_through(name, bad):
    y = rt(name, {}, with_bad(bad))
    assert np.array_equal(y[POS], bad, equal_nan=True)
    assert np.all(np.isfinite(np.delete(y, POS)))


def test_fp16_overflows_to_inf():
    y = rt("fp16", {}, np.array([7e4, -1e5, 65504.0, 1.0], np.float32))
    np.testing.assert_array_equal(y, [np.inf, -np.inf, 65504.0, 1.0])


@BAD
@pytest.mark.parametrize(
    "name,hp", [("topk", {"k": 3}), ("threshold", {"tau": 0.4, "k": 3}), ("dgc", {"k": 3})], ids=str
)
def test_sparsifiers_select_nonfinite_first(name, hp, bad):
    x = with_bad(bad)
    y = rt(name, hp, x)
    assert np.array_equal(y[POS], bad, equal_nan=True)
    others = np.delete(y, POS)
    assert np.all(np.isfinite(others))
    # the remaining k - 1 slots hold the largest finite entries (dgc: a subset of them)
    finite_top = set(np.argsort(-np.abs(np.delete(BASE, POS)))[:2].tolist())
    sent = set(np.flatnonzero(others).tolist())
    assert sent <= finite_top and (name == "dgc" or sent == finite_top)


def test_dgc_threshold_becomes_inf_when_sampled():
    # d <= 256: the sample is everything, the estimate is the k-th largest, here inf -> only
    # the two non-finite entries pass although k = 3.
    x = BASE.copy()
    x[[1, 4]] = [np.inf, np.nan]
    y = rt("dgc", {"k": 3}, x)
    assert np.isinf(y[1]) and np.isnan(y[4]) and np.count_nonzero(np.delete(y, [1, 4])) == 1


@BAD
@pytest.mark.slow
def test_randomk_propagates_only_sampled_entries(bad):
    x = with_bad(bad)
    for seed in range(6):
        key = jax.random.PRNGKey(seed)
        y = rt("randomk", {"ratio": 0.25}, x, key)
        idx = np.asarray(_sample(key, 12, 3))
        if POS in idx:
            assert not np.isfinite(y[POS]) and np.array_equal(np.isnan(y[POS]), np.isnan(bad))
        else:
            assert y[POS] == 0
        assert np.all(np.isfinite(np.delete(y, POS)))


@BAD
@pytest.mark.parametrize(
    "name,hp",
    [("terngrad", {}), ("terngrad", {"clip": 2.5}), ("scaled_sign", {}), ("qsgd", {}), ("powersgd", {"rank": 1})],
    ids=str,
)
def test_whole_tensor_becomes_nonfinite(name, hp, bad):
    shape = (3, 4) if name == "powersgd" else (12,)
    y = rt(name, hp, with_bad(bad, shape))
    assert not np.any(np.isfinite(y))


def test_powersgd_dense_vectors_pass_through():
    y = rt("powersgd", {"rank": 1}, with_bad(np.nan))
    assert np.isnan(y[POS]) and np.all(np.isfinite(np.delete(y, POS)))


@BAD
def test_qsgd_only_the_affected_bucket(bad):
    y = rt("qsgd", {"levels": 4, "bucket": 4}, with_bad(bad))
    assert not np.any(np.isfinite(y[:4]))  # POS = 2 lies in bucket 0
    assert np.all(np.isfinite(y[4:]))


@BAD
def test_signsgd_stays_finite(bad):
    y = rt("signsgd", {}, with_bad(bad))
    assert y[POS] == (1.0 if bad == np.inf else -1.0)  # NaN fails x >= 0 and is sent as -1
    np.testing.assert_array_equal(np.delete(y, POS), np.where(np.delete(BASE, POS) >= 0, 1, -1))


@BAD
def test_onebit_only_the_affected_group(bad):
    x = with_bad(bad)
    y = rt("onebit", {}, x)
    in_pos_group = x >= 0  # NaN joins the negative group
    bad_group = in_pos_group if in_pos_group[POS] else ~in_pos_group
    assert not np.any(np.isfinite(y[bad_group]))
    assert np.all(np.isfinite(y[~bad_group]))


def test_onebit_columns_only_the_affected_column_group():
    x = with_bad(np.nan, (3, 4))  # POS = 2 -> row 0, column 2
    y = rt("onebit", {"columns": True}, x).reshape(3, 4)
    col = x[:, 2]
    assert not np.any(np.isfinite(y[:, 2][~(col >= 0)]))
    assert np.all(np.isfinite(np.delete(y, 2, axis=1)))
    assert np.all(np.isfinite(y[:, 2][col >= 0]))


@BAD
def test_stc_selected_entries_become_nan(bad):
    y = rt("stc", {"k": 3}, with_bad(bad))
    sent = np.flatnonzero(y != 0)
    assert POS in sent and sent.size == 3
    assert not np.any(np.isfinite(y[sent]))  # mu = mean of the selected |x_i| is non-finite
