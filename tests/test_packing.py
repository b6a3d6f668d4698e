"""Bit packing: exact round trip and the byte layout the docstring of ``packing`` promises.

Reference layout, written independently with numpy: the codes form one bit stream, each code
LSB first, and the stream is cut into bytes LSB first (``np.packbits(..., bitorder="little")``).
For widths dividing 8 this is the same as "code j of a byte occupies bits j*nbits ..".
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cconv.compressors import packing


def reference_pack(codes: np.ndarray, nbits: int) -> np.ndarray:
    codes = np.asarray(codes, np.uint8).reshape(-1)
    bits = (codes[:, None] >> np.arange(nbits, dtype=np.uint8)) & 1
    return np.packbits(bits.reshape(-1).astype(np.uint8), bitorder="little")


@functools.cache
def _jitted(nbits, d):
    return (jax.jit(lambda c: packing.pack_bits(c, nbits)), jax.jit(lambda p: packing.unpack_bits(p, nbits, d)))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    nbits=st.integers(1, 8), d=st.sampled_from([1, 2, 3, 5, 7, 8, 9, 13, 31, 64, 77]), seed=st.integers(0, 2**31 - 1)
)
@pytest.mark.slow
def test_roundtrip_and_layout(nbits, d, seed):
    codes = np.random.default_rng(seed).integers(0, 2**nbits, size=d).astype(np.uint8)
    pack, unpack = _jitted(nbits, d)
    packed = np.asarray(pack(jnp.asarray(codes)))
    assert packed.dtype == np.uint8
    assert packed.shape == (packing.packed_size(d, nbits),) == (-(-d * nbits // 8),)
    np.testing.assert_array_equal(packed, reference_pack(codes, nbits))
    np.testing.assert_array_equal(np.asarray(unpack(jnp.asarray(packed))), codes)


@pytest.mark.slow
def test_layout_examples_written_out():
    # 2-bit codes [1, 2, 3, 0, 1] -> byte0 = 1 | 2<<2 | 3<<4 | 0<<6 = 0b00111001, byte1 = 1.
    np.testing.assert_array_equal(packing.pack_bits(jnp.array([1, 2, 3, 0, 1]), 2), [0b00111001, 1])
    # 3-bit codes [5, 6, 7]: stream LSB first 101 011 111 -> bits 0..8 = 1,0,1,0,1,1,1,1,1
    # byte0 = 0b11110101, byte1 = 0b1.
    np.testing.assert_array_equal(packing.pack_bits(jnp.array([5, 6, 7]), 3), [0b11110101, 1])
    # signs: bit = x >= 0 (sign(0) = +1, -0.0 >= 0 too), element 0 in the lowest bit.
    x = jnp.array([1.0, -2.0, 0.0, -0.0, -1.0, 3.0, -1e-30, 5.0, -7.0])
    np.testing.assert_array_equal(packing.pack_signs(x), [0b10101101, 0])
    np.testing.assert_array_equal(
        packing.unpack_signs(packing.pack_signs(x), 9, jnp.float32), [1, -1, 1, 1, -1, 1, -1, 1, -1]
    )


@pytest.mark.parametrize("nbits", [0, 9])
def test_bad_width(nbits):
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        packing.pack_bits(jnp.zeros(3, jnp.uint8), nbits)
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        packing.unpack_bits(jnp.zeros(3, jnp.uint8), nbits, 3)
