"""The bit-stream writer/reader against a pure-Python bit writer (cconv.compressors.bitstream)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cconv.compressors import bitstream as B


def py_bits(values, lengths) -> list[int]:
    """Reference writer: every field's low ``length`` bits, most significant first."""
    out: list[int] = []
    for v, n in zip(np.asarray(values, np.uint64).reshape(-1).tolist(), np.asarray(lengths).reshape(-1).tolist()):
        v = int(v) & ((1 << n) - 1)
        out += [(v >> (n - 1 - t)) & 1 for t in range(n)]
    return out


def as_words(bits: list[int], n_words: int) -> np.ndarray:
    bits = bits + [0] * (32 * n_words - len(bits))
    return np.packbits(np.array(bits, np.uint8)).view(">u4").astype(np.uint32)


@pytest.mark.parametrize("n,fields,chunk", [(1, 1, 256), (700, 3, 64), (257, 2, 256)])
def test_write_matches_a_python_bit_writer_and_reads_back(n, fields, chunk):
    rng = np.random.default_rng(n)
    lengths = rng.integers(0, 33, size=(n, fields))
    lengths[n // 2] = 0  # a code of no bits
    values = rng.integers(0, 2**32, size=(n, fields), dtype=np.uint64)
    cap = int(lengths.sum()) + 5
    s = jax.jit(lambda v, l: B.write(v, l, cap, chunk=chunk))(values.astype(np.uint32), lengths)
    assert s.words.shape == (B.capacity_words(cap),) and B.payload_ok(s, cap, n, chunk)
    assert int(s.nbits) == lengths.sum()
    np.testing.assert_array_equal(np.asarray(s.words), as_words(py_bits(values, lengths), len(s.words)))
    starts = np.concatenate([[0], np.cumsum(lengths.sum(1))[:-1]])
    np.testing.assert_array_equal(np.asarray(s.offsets), starts[::chunk])
    field_starts = np.concatenate([[0], np.cumsum(lengths.reshape(-1))[:-1]])
    got = B.read(s.words, field_starts, lengths.reshape(-1))
    want = values.reshape(-1) & ((np.uint64(1) << lengths.reshape(-1).astype(np.uint64)) - np.uint64(1))
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.uint32))
    enc = float(B.encoded_bytes(s, n, chunk))
    assert enc == -(-int(lengths.sum()) // 8) + 4 + 4 * -(-n // chunk)


def test_next_one_finds_the_first_set_bit_across_long_zero_runs():
    bits = [0] * 300 + [1] + [0] * 5 + [1, 1] + [0] * 200 + [1] + [0] * 40
    words = jnp.asarray(as_words(bits, B.capacity_words(len(bits))))
    table = B.next_one_index(words)
    ones = np.flatnonzero(bits)
    pos = np.arange(len(bits) + 20)
    idx = np.searchsorted(ones, pos)
    want = np.where(idx < len(ones), ones[np.minimum(idx, len(ones) - 1)], 32 * len(words))
    np.testing.assert_array_equal(np.asarray(B.next_one(words, table, pos)), want)


def rice(gaps, b):
    """Reference Golomb-Rice: q = g >> b zeros, a one, then the b low bits."""
    out = []
    for g in gaps:
        out += [0] * (g >> b) + [1] + [(g >> (b - 1 - t)) & 1 for t in range(b)]
    return out


@pytest.mark.parametrize("chunk", [1, 7, 256])
def test_chunked_decoding_of_a_rice_code_is_exact(chunk):
    rng = np.random.default_rng(chunk)
    b, n = 3, 500
    gaps = rng.geometric(0.05, size=n) - 1
    gaps[10] = 700  # a run of zeros longer than a word
    q = gaps >> b
    values = np.stack([np.ones(n), gaps & ((1 << b) - 1)], 1).astype(np.uint32)
    lengths = np.stack([q + 1, np.full(n, b)], 1)  # q zeros then the 1: only the 1 is written
    values[:, 0] = 1
    cap = int(lengths.sum())
    s = B.write(jnp.asarray(values), jnp.asarray(lengths), cap, chunk=chunk)
    np.testing.assert_array_equal(np.asarray(s.words), as_words(rice(gaps.tolist(), b), len(s.words)))

    def step(words, table, pos):
        one = B.next_one(words, table, pos)
        r = B.read(words, one + 1, b)
        return ((((one - pos) << b) | r.astype(jnp.int32)),), one + 1 + b

    (got,) = jax.jit(lambda s: B.decode(s, n, step, chunk))(s)
    np.testing.assert_array_equal(np.asarray(got), gaps)


def test_rice_parameter_follows_the_stc_formula():
    # b* = 1 + floor(log2(log(phi - 1) / log(1 - p))) (Sattler et al. 2019)
    assert B.rice_parameter(0.01) == 1 + int(np.floor(np.log2(np.log(0.6180339887) / np.log(0.99))))
    assert B.rice_parameter(1 / 400) == 8
    assert B.rice_parameter(0.9) == 0 and B.rice_parameter(1.0) == 0
