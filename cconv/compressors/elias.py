"""Elias-omega coding of sparse signed integer levels: QSGD's "Elias recursive coding".

Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding"
(NeurIPS 2017), Section 3.2: a quantised vector is sent as its norm plus, for every nonzero level
in order, Elias(gap to the previous nonzero position), one sign bit, Elias(|level|).  The integer
code is Elias' omega ("recursive") code (Elias 1975):

    omega(x), x >= 1:  code = "0"; while x > 1: code = binary(x) + code; x = bitlen(x) - 1

so omega(1) = "0", omega(2) = "10 0", omega(8) = "11 1000 0"; its length is
1 + sum over the groups g of bitlen(g) (about log2 x + log2 log2 x + ...).  Decoding:
n = 1; while the next bit is 1: read n + 1 bits as m, n = m; then skip the "0"; the value is n.
For x < 2^31 a code has at most 4 groups (x, bitlen(x) - 1 <= 30, 4, 2) and for |level| <= 127
at most 3, so decoding is a bounded loop.

Message of d levels l_0 .. l_{d-1} (int32, |l_i| <= 127) with nonzeros at i_1 < ... < i_m:

    for j = 1 .. m:  omega(i_j - i_{j-1}) (i_0 = -1)  |  sign bit (1: negative)  |  omega(|l_{i_j}|)

written with ``cconv.compressors.bitstream.write`` as three fields per nonzero (the gap's leading
groups, <= 10 bits; binary(gap), <= 31 bits; the gap's "0", the sign and omega(|level|), <= 15
bits).  The codes are the nonzeros in order (compacted), so the stream's chunk index points at
every ``chunk``-th nonzero and ``decode`` runs chunk-parallel.  ``count`` = m travels with it.

Worst case (``worst_case_bits``): the longest message of d levels in [-s, s] has every entry
nonzero at the level of longest omega code:  d * (omega_len(1) + 1 + max_{1<=l<=s} omega_len(l)).
Proof: a message is a sum over nonzeros of omega_len(gap) + 1 + omega_len(|l|), with the gaps
summing to i_m + 1 <= d.  Let L = max_l omega_len(l) >= 1.  Raising every level to length L
never shortens it.  Filling the g - 1 zeros before a nonzero with gap g by nonzeros replaces
omega_len(g) + 1 + L bits by g (1 + 1 + L), which is no shorter because omega_len(g) <= 2g - 1
for every g >= 1 (equality at g = 1, 2; for g >= 5, omega_len(g) <= bitlen(g) + 11 <= 2g - 1,
at most 5 + 3 + 2 bits of leading groups and the "0").  Making the zeros after the last
nonzero nonzero only adds bits.  So the all-nonzero, all-longest message is the maximum
(``tests/test_qsgd_elias.py`` also checks it by exhaustive search over tiny d).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from cconv.compressors import bitstream
from cconv.compressors.base import Array

MAX_VALUE = 2**31 - 1  # largest gap (a tensor's size) the code is written for
_GROUPS = 4  # omega groups of a value < 2^31: x, bitlen(x) - 1 <= 30, 4, 2
_LEVEL_GROUPS = 3  # of a level <= 127: l, bitlen(l) - 1 <= 6, 2
_U32 = jnp.uint32


def omega_len(x: int) -> int:
    """Length in bits of omega(x) for an integer x >= 1 (static, Python)."""
    if x < 1:
        raise ValueError(f"omega_len: x must be an integer >= 1, got {x}")
    n = 1
    while x > 1:
        n += x.bit_length()
        x = x.bit_length() - 1
    return n


def worst_case_bits(d: int, levels: int) -> int:
    """The longest message of d levels in [-levels, levels] (see the module docstring):
    d * (omega_len(1) + 1 + max_{1 <= l <= levels} omega_len(l))."""
    return d * (omega_len(1) + 1 + max(omega_len(l) for l in range(1, levels + 1)))


def _omega_fields(x: Array, groups: int) -> tuple[Array, Array, Array, Array]:
    """omega(x) for x >= 1 (uint32, vectorized) without its terminating "0", as two fields:
    (leading groups value, their length, binary(x) or nothing for x = 1, its length)."""
    length = bitstream.bit_length(x)
    main_len = jnp.where(x > 1, length, 0)
    y = (length - 1).astype(_U32)  # the next group to the left of binary(x)
    pre_v = jnp.zeros(x.shape, _U32)
    pre_l = jnp.zeros(x.shape, jnp.int32)
    for _ in range(groups - 1):
        take = y > 1
        ly = bitstream.bit_length(y)
        pre_v = jnp.where(take, pre_v | jnp.left_shift(y, pre_l.astype(_U32)), pre_v)
        pre_l = jnp.where(take, pre_l + ly, pre_l)
        y = jnp.where(take, (ly - 1).astype(_U32), _U32(1))
    return pre_v, pre_l, jnp.where(x > 1, x, _U32(0)), main_len


def code_fields(gaps: Array, negative: Array, magnitudes: Array) -> tuple[Array, Array]:
    """The [n, 3] (values, lengths) of n codes omega(gap) | sign | omega(magnitude) for
    ``bitstream.write`` (gaps >= 1, magnitudes in [1, 127]; vectorized)."""
    g_pre_v, g_pre_l, g_v, g_l = _omega_fields(gaps.astype(_U32), _GROUPS)
    m_pre_v, m_pre_l, m_v, m_l = _omega_fields(magnitudes.astype(_U32), _LEVEL_GROUPS)
    level_v = jnp.left_shift(jnp.left_shift(m_pre_v, m_l.astype(_U32)) | m_v, _U32(1))  # ... + "0"
    level_l = m_pre_l + m_l + 1
    tail_v = jnp.left_shift(negative.astype(_U32), level_l.astype(_U32)) | level_v  # "0", sign, level
    tail_l = 2 + level_l
    return jnp.stack([g_pre_v, g_v, tail_v], 1), jnp.stack([g_pre_l, g_l, tail_l], 1)


SPARSE = 32  # the sparse path handles up to max(SPARSE_MIN, d // SPARSE) nonzeros
SPARSE_MIN = 4096


def sparse_rows(d: int) -> int:
    """Static number of codes the sparse path of ``encode``/``decode`` handles (d: no sparse path)."""
    return min(d, max(SPARSE_MIN, d // SPARSE))


def encode(levels: Array, capacity_bits: int, chunk: int = bitstream.CHUNK) -> tuple[bitstream.BitStream, Array]:
    """Encode int levels (any shape, read flat; |level| <= 127) into a stream of at most
    ``capacity_bits`` bits; returns (stream, count of nonzeros as int32).  A message longer than
    the capacity is cut (bits past it are dropped) but ``stream.nbits`` is its true length, so
    ``stream.nbits > capacity_bits`` says it did not fit.  Needs 16 * size < 2^31 (bit counts are
    int32).

    Two paths give the same stream bit for bit: when count <= ``sparse_rows(d)`` (QSGD at small s
    has about s sqrt(d) nonzeros) only that many codes are built, their positions found by
    binary search in the running count of nonzeros; otherwise all d code slots are (a ``lax.cond``:
    under ``vmap`` both run)."""
    flat = jnp.asarray(levels).reshape(-1).astype(jnp.int32)
    d = flat.shape[0]
    if 16 * d >= 2**31:
        raise ValueError(f"elias: a tensor of {d} elements is too large to code (at most {2**31 // 16 - 1})")
    if d == 0:
        return bitstream.write(jnp.zeros((0, 3), _U32), jnp.zeros((0, 3), jnp.int32), capacity_bits, chunk), jnp.int32(
            0
        )
    nz = flat != 0
    csum = jnp.cumsum(nz, dtype=jnp.int32)
    count = csum[-1]

    def rows(n, pos):
        """The stream of the first n code slots, nonzero j at flat position pos[j] (j < count)."""
        valid = jnp.arange(n, dtype=jnp.int32) < count
        pos = jnp.where(valid, pos, d)
        prev = jnp.concatenate([jnp.full((1,), -1, jnp.int32), pos[:-1]])
        lev = flat[jnp.minimum(pos, d - 1)]
        values, lengths = code_fields(jnp.where(valid, pos - prev, 1), lev < 0, jnp.where(valid, jnp.abs(lev), 1))
        st = bitstream.write(values, jnp.where(valid[:, None], lengths, 0), capacity_bits, chunk)
        pad = bitstream.num_chunks(d, chunk) - st.offsets.shape[0]  # chunks of empty slots start at nbits
        return st._replace(offsets=jnp.pad(st.offsets, (0, pad), constant_values=st.nbits))

    def dense(_):
        rank = jnp.where(nz, csum - 1, d)
        return rows(d, jnp.full((d,), d, jnp.int32).at[rank].set(jnp.arange(d, dtype=jnp.int32), mode="drop"))

    k = sparse_rows(d)
    if k == d:
        return dense(None), count

    def sparse(_):
        return rows(k, jnp.searchsorted(csum, jnp.arange(1, k + 1, dtype=jnp.int32), side="left").astype(jnp.int32))

    return lax.cond(count <= k, sparse, dense, None), count


def _read_omega(words: Array, pos: Array, groups: int) -> tuple[Array, Array]:
    """Decode one omega code at every position of ``pos``: (value as int32, next position)."""
    n = jnp.ones(pos.shape, jnp.int32)
    done = jnp.zeros(pos.shape, bool)
    for _ in range(groups + 1):
        bit = bitstream.read(words, pos, 1)
        go = (~done) & (bit == 1)
        m = bitstream.read(words, pos, n + 1).astype(jnp.int32)
        pos = jnp.where(go, pos + n + 1, jnp.where(done, pos, pos + 1))
        n = jnp.where(go, m, n)
        done = done | ~go
    return n, pos


def _read_code(words: Array, pos: Array) -> tuple[tuple[Array, Array], Array]:
    gap, pos = _read_omega(words, pos, _GROUPS)
    negative = bitstream.read(words, pos, 1) == 1
    magnitude, pos = _read_omega(words, pos + 1, _LEVEL_GROUPS)
    return (gap, jnp.where(negative, -magnitude, magnitude)), pos


def decode(stream: bitstream.BitStream, count: Array, d: int, chunk: int = bitstream.CHUNK, block: int = 64) -> Array:
    """The d int32 levels of an ``encode``d stream with ``count`` nonzeros (traced).

    Chunk-parallel like ``bitstream.decode``, but only over the chunks that hold codes (those
    whose offset is below ``stream.nbits``): blocks of ``block`` chunks are decoded (``chunk``
    sequential steps each, vectorized over the block) while a block starts below that number, so
    a sparse message costs O(count) decoding steps plus one scatter into the d levels.  Codes
    past ``count`` are masked.  As in ``encode``, count <= ``sparse_rows(d)`` takes a path that
    only holds that many codes (same result)."""
    if d == 0:
        return jnp.zeros((0,), jnp.int32)
    count = jnp.asarray(count, jnp.int32)
    k = sparse_rows(d)
    if k == d:
        return _decode_rows(stream, count, d, d, chunk, block)
    return lax.cond(
        count <= k,
        lambda _: _decode_rows(stream, count, d, k, chunk, block),
        lambda _: _decode_rows(stream, count, d, d, chunk, block),
        None,
    )


def _decode_rows(stream: bitstream.BitStream, count: Array, d: int, n: int, chunk: int, block: int) -> Array:
    """``decode`` of at most n (static) codes."""
    chunks = bitstream.num_chunks(n, chunk)
    block = max(1, min(block, chunks))
    n_blocks = -(-chunks // block)
    offsets = stream.offsets[:chunks]
    used = jnp.sum(offsets < stream.nbits, dtype=jnp.int32)  # chunks that start a code
    offsets = jnp.pad(offsets, (0, n_blocks * block - chunks), constant_values=stream.nbits)
    words = stream.words
    # an int32 zero that varies like the stream (loop carries must, inside shard_map)
    zero = (words[0] & 0).astype(jnp.int32) | (offsets[0] & 0)

    def block_body(carry):
        b, gaps, levels = carry
        pos = lax.dynamic_slice(offsets, (b * block,), (block,))

        def step(t, c):
            pos, g, lv = c
            (gap, level), pos = _read_code(words, pos)
            return pos, g.at[:, t].set(gap), lv.at[:, t].set(level)

        zeros = jnp.zeros((block, chunk), jnp.int32) | zero
        _, g, lv = lax.fori_loop(0, chunk, step, (pos, zeros, zeros))
        gaps = lax.dynamic_update_slice(gaps, g, (b * block, 0))
        levels = lax.dynamic_update_slice(levels, lv, (b * block, 0))
        return b + 1, gaps, levels

    init = (
        jnp.zeros((), jnp.int32),
        jnp.zeros((n_blocks * block, chunk), jnp.int32) | zero,
        jnp.zeros((n_blocks * block, chunk), jnp.int32) | zero,
    )
    _, gaps, levels = lax.while_loop(lambda c: c[0] * block < used, block_body, init)
    gaps, levels = gaps.reshape(-1)[:n], levels.reshape(-1)[:n]
    valid = jnp.arange(n, dtype=jnp.int32) < count
    where = jnp.where(valid, jnp.cumsum(jnp.where(valid, gaps, 0), dtype=jnp.int32) - 1, d)
    return jnp.zeros((d,), jnp.int32).at[where].set(levels, mode="drop")


def expected_bound_bits(n: int, levels: int) -> float:
    """Theorem 3.2 of Alistarh et al. (2017), the expected code length of one bucket of n entries
    quantised to s levels, with its o(1) term taken as 0:
    (3 + (3/2) log2(2 (s^2 + n) / (s (s + sqrt n)))) * s (s + sqrt n) + 32 bits (the 32: the norm)."""
    s = float(levels)
    a = s * (s + math.sqrt(n))
    return (3.0 + 1.5 * math.log2(2.0 * (s * s + n) / a)) * a + 32.0


__all__ = [
    "MAX_VALUE",
    "code_fields",
    "decode",
    "encode",
    "expected_bound_bits",
    "omega_len",
    "sparse_rows",
    "worst_case_bits",
]
