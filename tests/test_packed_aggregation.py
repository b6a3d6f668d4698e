"""Packed-domain aggregation (issue 16, section 3): every compressor's ``gathered_sum`` hook equals
the unpacked path, sum_w decompress(payload_w), for P in {2, 3, 8}: bit for bit where the
arithmetic is exact (sign counts, the majority vote with its ties, integer sums of shared-scale
codes), within float rounding where only the summation order changes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry_cases import cases, subject

from cconv.compressors.packing import bit_counts, pack_bits

GATHERED = cases(lambda s: s.c.gathered_sum is not None)
AGREED_LEVELS = cases(lambda s: s.c.agree is not None and s.c.agree.levels is not None)
SHAPE = (33, 17)  # 561 entries: a partial last byte for every code width
WORKERS = (2, 3, 8)


def _matrix(case_params):
    """(name, hp, P) for P in WORKERS: in CI every case at P = 3 and the first at every P; the
    rest of the matrix is ``extended`` (compiles dominate: ~1 s per case and P on 2 cores)."""
    out = []
    for i, c in enumerate(case_params):
        for workers in WORKERS:
            extended = i > 0 and workers != 3
            marks = tuple(c.marks) + ((pytest.mark.extended,) if extended else ())
            out.append(pytest.param(*c.values, workers, id=f"{c.id}-P{workers}", marks=marks))
    return out


def _inputs(workers: int, ties: bool):
    """One float32 gradient per worker; with ``ties`` worker 2i+1 holds -(worker 2i's), so an
    even number of workers has every sign vote tied (no zeros: sign(0) = sign(-0) = +1)."""
    xs = jax.random.normal(jax.random.PRNGKey(workers), (workers, *SHAPE), jnp.float32)
    xs = jnp.where(xs == 0, 0.5, xs)
    if ties:
        xs = xs.at[1::2].set(-xs[0 : workers // 2 * 2 : 2])
    return xs


def _stacked(c, xs):
    keys = jax.random.split(jax.random.PRNGKey(7), xs.shape[0])
    return jax.vmap(lambda x, k: c.compress(x, c.init(x), k)[0])(xs, keys)


def _both(c, stacked, like):
    unpacked = jax.jit(lambda p: jax.vmap(lambda q: c.decompress(q, like))(p).sum(0))(stacked)
    packed = jax.jit(lambda p: c.gathered_sum(p, like))(stacked)
    return np.asarray(unpacked), np.asarray(packed)


@pytest.mark.parametrize("workers", [1, 2, 3, 7, 8, 9, 64])
def test_bit_counts_is_an_exact_popcount(workers):
    rng = np.random.default_rng(workers)
    d = 77  # not a multiple of 8 or 32
    bits = rng.integers(0, 2, (workers, d)).astype(np.uint8)
    stacked = jnp.stack([pack_bits(jnp.asarray(b), 1) for b in bits])
    got = np.asarray(jax.jit(lambda s: bit_counts(s, d))(stacked))
    np.testing.assert_array_equal(got, bits.sum(0))


@pytest.mark.parametrize("name,hp,workers", _matrix(GATHERED))
@pytest.mark.slow
def test_gathered_sum_matches_the_unpacked_path(name, hp, workers):
    c = subject(name, hp).c
    like = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    stacked = _stacked(c, _inputs(workers, ties=True))
    unpacked, packed = _both(c, stacked, like)
    assert packed.shape == SHAPE and packed.dtype == np.float32
    np.testing.assert_allclose(packed, unpacked, rtol=2e-6, atol=1e-6 * float(np.max(np.abs(unpacked))))
    # the majority vote, sign(sum) with sign(0) = +1, is the same decision
    np.testing.assert_array_equal(np.where(packed >= 0, 1, -1), np.where(unpacked >= 0, 1, -1))
    if np.all(np.abs(unpacked - np.round(unpacked)) == 0):  # integer sums (sign counts): bit for bit
        np.testing.assert_array_equal(packed, unpacked)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("name,hp", GATHERED[:1])
@pytest.mark.slow
def test_vote_ties_bit_for_bit(name, hp, workers):
    """Odd P has no ties; even P with mirrored workers ties everywhere: sign(0) = +1 both ways."""
    c = subject(name, hp).c
    like = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    unpacked, packed = _both(c, _stacked(c, _inputs(workers, ties=True)), like)
    vote = lambda t: np.where(t >= 0, 1.0, -1.0)
    np.testing.assert_array_equal(vote(packed), vote(unpacked))
    if workers % 2 == 0 and np.all(unpacked == np.round(unpacked)):
        assert np.all(unpacked == 0) and np.all(packed == 0)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("name,hp", AGREED_LEVELS)
@pytest.mark.slow
def test_shared_scale_codes_sum_as_integers(name, hp, workers):
    """A compressor bound to an agreed statistic: its gathered codes are summed as integers
    (exact: equal to the levels' sum) and multiplied once (within rounding of the unpacked sum)."""
    c = subject(name, hp).c
    xs = _inputs(workers, ties=False)
    agreed = jnp.max(jax.vmap(c.agree.statistic)(xs))
    bound = c.agree.bind(agreed)
    like = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    stacked = _stacked(bound, xs)
    unpacked, packed = _both(bound, stacked, like)
    np.testing.assert_allclose(packed, unpacked, rtol=2e-6, atol=1e-6 * float(np.max(np.abs(unpacked))))
    levels = jax.vmap(lambda p: c.agree.levels(p, like).astype(jnp.int32))(stacked).sum(0)
    # decoded once from the summed levels: level_value * levels, or the agreement's own decode
    # (THC: one inverse rotation of the summed levels)
    np.testing.assert_array_equal(packed, np.asarray(c.agree.decode_sum(levels, agreed, like)))
    if c.agree.decode is None:
        value = np.asarray(c.agree.level_value(agreed))
        np.testing.assert_array_equal(packed, (value * np.asarray(levels, np.float32)).reshape(SHAPE))
