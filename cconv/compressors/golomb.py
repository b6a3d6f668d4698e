"""Golomb-Rice coded positions of sparse payloads (Sattler et al., "Robust and Communication-
Efficient Federated Learning from Non-IID Data", IEEE TNNLS 2019, Sec. IV-C).

A sparse payload's ``k`` positions are sorted int32 indices ``i_1 < ... < i_k`` into a tensor of
``d`` entries.  Instead of 32 bits each, the gaps between them are Golomb-Rice coded:

    gap_j = i_j - i_{j-1} - 1   (i_0 = -1, so gap_j >= 0 and sum_j gap_j = i_k + 1 - k <= d - k)
    b     = rice_parameter(k / d) = 1 + floor(log2(ln(phi - 1) / ln(1 - p))), p = k / d  (b* of STC)
    code  = q = gap >> b zeros, a one, then the b low bits of gap      (q + 1 + b bits)

The gap after ``i_k`` is not coded (the receiver knows ``k``).  For Bernoulli(p) positions the
gaps are Geometric(p) on {0, 1, ...}; with M = 2^b, ``floor(gap / M)`` is geometric with
P(>= m) = q^m, q = (1 - p)^M, so the expected code length per position is (the paper's
expected bits per position)

    E[bits] = b + 1 + q / (1 - q) = b + 1 / (1 - (1 - p)^(2^b)).

Capacity (the fixed-size buffer, ``cconv.compressors.bitstream``), an exact worst case::

    total bits = sum_j (q_j + 1 + b) = k (1 + b) + sum_j floor(gap_j / 2^b)
              <= k (1 + b) + floor(sum_j gap_j / 2^b)           (sum of floors <= floor of sum)
              <= k (1 + b) + ((d - k) >> b)                     (sum_j gap_j <= d - k)

and it is attained (all k positions at the end: one gap of d - k, then k - 1 gaps of 0), so the
buffer of ``capacity_bits(k, d)`` bits can never overflow and is no larger than it must be.  The
same bound holds for any ``count <= k`` codes (each further code adds 1 + b >= 1 bits and removes
at most one unit of floor((d - count) / 2^b)), so a payload with a dynamic count of valid
entries (DGC sends at most k) uses the same buffer: ``encode(..., count=n)`` writes the first
``n`` codes only, and ``decode`` marks a code valid when it starts before the stream's ``nbits``
(every code has at least one bit), so the count need not travel.

Bytes (``GolombPayload``; the stream's leaves are ``BitStream``'s):

    moved    k * itemsize + 4 * (ceil(capacity / 32) + 1) + 4 + 4 * ceil(k / chunk)
             (values, the buffer with one spare word, the bit count, the chunk index)
    encoded  k * itemsize + ceil(nbits / 8) + 4 + 4 * (chunks that hold a code)

The chunk index (the bit offset of every ``chunk``-th code, 32 bits each: 1/8 bit per position
at the default chunk of 256) and the 4-byte bit count are counted in both: they are part of the
message a parallel decoder needs.  The values are never changed by the coding: decompressing a
Golomb payload gives bit-for-bit the array the int32 payload gives.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from cconv.compressors import bitstream
from cconv.compressors.base import Array, itemsize, payload_bytes
from cconv.compressors.bitstream import CHUNK, BitStream
from cconv.compressors.registry import Param
from cconv.compressors.sparse import SparsePayload, scatter

__all__ = [
    "POSITIONS",
    "GolombPayload",
    "capacity_bits",
    "closed_form_stream_bytes",
    "decode",
    "decompress",
    "encode",
    "encoded_bytes",
    "expected_bits",
    "expected_stream_bytes",
    "gather",
    "parameter",
    "moved_bytes",
    "payload_encoded_bytes",
    "stream_bytes",
    "to_sparse",
]

POSITIONS = Param(
    "positions",
    "str",
    "int32",
    choices=("int32", "golomb"),
    help="how the positions travel: int32 indices, or Golomb-Rice coded gaps (Sattler et al. 2019)",
)

_MAX_BITS = 2**31 - 64  # bit positions are int32


class GolombPayload(NamedTuple):
    """k values (input dtype, in ascending index order) and the Golomb-Rice code of their positions."""

    values: Array  # (k,) input dtype
    positions: BitStream  # the gaps of the k sorted indices


def parameter(k: int, d: int) -> int:
    """The Rice parameter b (code of a gap: gap >> b zeros, a one, b low bits): b* of STC for p = k/d."""
    return bitstream.rice_parameter(k / d) if 0 < k < d else 0


def capacity_bits(k: int, d: int) -> int:
    """Exact worst-case bits of k coded positions in range(d): k (1 + b) + ((d - k) >> b) (see the
    module docstring for the proof and the index set attaining it)."""
    b = parameter(k, d)
    return k * (1 + b) + ((d - k) >> b)


def stream_bytes(k: int, d: int, chunk: int = CHUNK) -> int:
    """Moved bytes of the position stream: buffer (+ spare word), bit count and chunk index."""
    return bitstream.stream_bytes(capacity_bits(k, d), k, chunk)


def moved_bytes(k: int, d: int, dtype, chunk: int = CHUNK) -> int:
    """Moved bytes of a ``GolombPayload`` with k < d entries: values plus the position stream."""
    return k * itemsize(dtype) + stream_bytes(k, d, chunk)


def expected_bits(p: float) -> float:
    """Expected Golomb-Rice bits per position for Bernoulli(p) positions (Sattler et al. 2019):
    b* + 1 / (1 - (1 - p)^(2^b*)), with b* = ``bitstream.rice_parameter(p)``."""
    if not 0.0 < p < 1.0:
        return 1.0  # every gap is 0 (p = 1): one bit
    b = bitstream.rice_parameter(p)
    return b + 1.0 / (1.0 - (1.0 - p) ** (2**b))


def expected_stream_bytes(k: int, d: int, chunk: int = CHUNK) -> float:
    """Expected encoded bytes of the position stream of k < d Bernoulli(k/d)-like positions:
    k * expected_bits(k/d) / 8 (the rounding of nbits up to a byte adds < 1), the 4-byte bit
    count and 4 bytes per chunk of the chunk index."""
    return k * expected_bits(k / d) / 8.0 + 4.0 + 4.0 * bitstream.num_chunks(k, chunk)


def _check(k: int, d: int) -> None:
    if capacity_bits(k, d) > _MAX_BITS:
        raise ValueError(f"golomb: {k} positions in {d} entries need more than 2^31 bits; use positions='int32'")


def encode(indices: Array, d: int, count: Array | None = None, chunk: int = CHUNK) -> BitStream:
    """Golomb-Rice code of ``indices`` (int32 (k,), ascending, distinct, in range(d); k < d static).

    ``count`` (optional, may be traced, 0 <= count <= k): only the first ``count`` indices are
    coded (the rest are padding and take no bits).  Every code is two fields for
    ``bitstream.write``: the unary part (value 1, length q + 1: q zeros then the one) and the
    b low bits of the gap.  Capacity: ``capacity_bits(k, d)``, which no index set exceeds.
    """
    k = indices.shape[0]
    _check(k, d)
    b = parameter(k, d)
    idx = indices.astype(jnp.int32)
    prev = jnp.concatenate([jnp.full((1,), -1, jnp.int32), idx[:-1]])
    gaps = idx - prev - 1
    q = gaps >> b
    values = jnp.stack([jnp.ones_like(gaps), gaps & ((1 << b) - 1)], axis=1).astype(jnp.uint32)
    lengths = jnp.stack([q + 1, jnp.full_like(gaps, b)], axis=1)
    if count is not None:
        live = jnp.arange(k, dtype=jnp.int32) < jnp.asarray(count, jnp.int32)
        lengths = jnp.where(live[:, None], lengths, 0)
    return bitstream.write(values, lengths, capacity_bits(k, d), chunk)


def decode(stream: BitStream, k: int, d: int, chunk: int = CHUNK) -> tuple[Array, Array]:
    """(indices, valid): the k sorted int32 indices ``encode`` coded, exactly, and which slots hold
    a code (``valid``: the code starts before ``stream.nbits``; all True unless ``encode`` was
    given a ``count``).  Invalid slots decode to index 0 (the sparse padding convention).

    Chunk-parallel: ``bitstream.decode`` runs ``chunk`` sequential steps over every chunk at
    once; a step finds the code's terminating one with the next-one table (O(1) however long
    the run of zeros) and reads the b low bits after it.
    """
    b = parameter(k, d)

    def step(words, table, pos):
        one = bitstream.next_one(words, table, pos)
        low = bitstream.read(words, one + 1, b).astype(jnp.int32)
        return ((one - pos) << b | low, pos), one + 1 + b

    gaps, starts = bitstream.decode(stream, k, step, chunk)
    valid = starts < stream.nbits
    idx = jnp.cumsum(jnp.where(valid, gaps + 1, 0), dtype=jnp.int32) - 1
    return jnp.where(valid, idx, 0), valid


def gather(flat: Array, indices: Array, count: Array | None = None, chunk: int = CHUNK) -> GolombPayload:
    """The payload of the entries of ``flat`` at sorted ``indices`` (values in index order)."""
    return GolombPayload(flat[indices], encode(indices, flat.shape[0], count, chunk))


def decompress(payload: GolombPayload, like, chunk: int = CHUNK) -> Array:
    """Dense array of like's shape/dtype: the values scattered to the decoded positions (padding
    slots, if any, add nothing)."""
    d = math.prod(like.shape)
    k = payload.values.shape[0]
    idx, valid = decode(payload.positions, k, d, chunk)
    return scatter(jnp.where(valid, payload.values, jnp.zeros((), payload.values.dtype)), idx, like)


def to_sparse(payload: GolombPayload, like, chunk: int = CHUNK) -> SparsePayload:
    """The (value, int32 index) pairs of ``payload`` (padding slots: value 0 at index 0, as the
    int32 format's), for the engine's one-scatter sum of gathered payloads (``Compressor.sparse``)."""
    d = math.prod(like.shape)
    idx, valid = decode(payload.positions, payload.values.shape[0], d, chunk)
    return SparsePayload(jnp.where(valid, payload.values, jnp.zeros((), payload.values.dtype)), idx)


def encoded_bytes(stream: BitStream, chunk: int = CHUNK) -> Array:
    """Encoded bytes of a position stream (traced float32): ceil(nbits / 8), the 4-byte bit count
    and 4 bytes per chunk that holds a code (a chunk holds one iff its first code starts before
    nbits, since every code has at least one bit: no count needed)."""
    used = jnp.sum(stream.offsets < stream.nbits, dtype=jnp.int32)
    return bitstream.encoded_bytes(stream, used * chunk, chunk)


def payload_encoded_bytes(payload, count: Array | None = None, chunk: int = CHUNK) -> Array:
    """Encoded bytes of a ``GolombPayload`` (traced float32): its values (all k, or the first
    ``count`` for a payload encoded with a dynamic count; ``decode(...)[1].sum()`` recovers it
    from the stream) and the encoded position stream; any other payload (e.g. the dense one of
    k >= d): its ``payload_bytes``."""
    if not isinstance(payload, GolombPayload):
        return jnp.float32(payload_bytes(payload))
    n = payload.values.size if count is None else jnp.asarray(count, jnp.float32)
    return n * itemsize(payload.values.dtype) + encoded_bytes(payload.positions, chunk)


def closed_form_stream_bytes(k: int, d: int) -> int:
    """Moved bytes of k < d coded positions from the closed form alone (for the ``Theory``
    oracles; the tests check it against the real buffers): the worst case k (1 + b*) +
    ((d - k) >> b*) bits in 32-bit words plus one spare word, the 4-byte bit count, and one
    4-byte offset per chunk of 256 codes.  b* = 1 + floor(log2(ln(phi - 1) / ln(1 - k/d)))."""
    p, phi = k / d, (1 + math.sqrt(5)) / 2
    b = max(0, 1 + math.floor(math.log2(math.log(phi - 1) / math.log(1 - p)))) if p < 1 else 0
    bits = k * (1 + b) + ((d - k) >> b)
    return 4 * (-(-bits // 32) + 1) + 4 + 4 * -(-k // 256)
