"""Variable-length bit streams in fixed-capacity buffers, written and read by jitted JAX.

Entropy codes (Golomb-Rice for sparse positions, Elias for QSGD) produce messages whose length
depends on the data, but JAX needs static shapes.  A ``BitStream`` is therefore a buffer of
``capacity`` bits (the worst case of the code, so it never overflows) plus the number of bits
actually used:

    words    uint32[ceil(capacity / 32) + 1]  the bits, most significant first within a word
                                              (one spare word so reads never index past the end)
    nbits    int32 scalar                     bits used (the encoded message is the first nbits)
    offsets  int32[chunks]                    bit position of the first code of every chunk of
                                              ``chunk`` codes (a chunk index, see below)

Writing is one pass, fully parallel: every code is split into fields of at most 32 bits
(``values[n, F]``, ``lengths[n, F]``, zero-length fields allowed); a prefix sum of the lengths
gives every field's position, and each field is added into the one or two words it touches
(fields never overlap, so the adds are ORs).

Reading a stream of variable-length codes is sequential within a stream.  As GPU entropy
decoders do, the encoder also records where every ``chunk``-th code starts, so decoding runs
one code per step in every chunk at once (``decode``: ``chunk`` sequential steps, vectorized over
ceil(n / chunk) chunks).  The chunk index is part of the message: ``encoded_bytes`` counts it
(32 bits per used chunk, 1/8 bit per code at the default chunk of 256 codes), and so does the
capacity.

Byte counts:

    moved    payload_bytes(stream) = 4 * (len(words) + 1 + len(offsets))  (what a collective moves)
    encoded  ceil(nbits / 8) + 4 + 4 * used chunks                       (what a variable-length
                                                                         transport would send)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array

CHUNK = 256  # codes per chunk of the chunk index (default)
_U32 = jnp.uint32


class BitStream(NamedTuple):
    words: Array  # uint32[capacity_words(capacity)]
    nbits: Array  # int32 scalar
    offsets: Array  # int32[num_chunks(n, chunk)]


def capacity_words(capacity_bits: int) -> int:
    """Words of a buffer of ``capacity_bits`` bits (plus one spare word for reads)."""
    return -(-int(capacity_bits) // 32) + 1


def num_chunks(n: int, chunk: int = CHUNK) -> int:
    return max(1, -(-int(n) // int(chunk)))


def stream_bytes(capacity_bits: int, n: int, chunk: int = CHUNK) -> int:
    """Moved bytes of a ``BitStream`` of ``capacity_bits`` for at most ``n`` codes (static)."""
    return 4 * (capacity_words(capacity_bits) + 1 + num_chunks(n, chunk))


def payload_ok(stream: BitStream, capacity_bits: int, n: int, chunk: int = CHUNK) -> bool:
    """Whether ``stream``'s static shapes are those of a stream of ``capacity_bits`` for ``n`` codes."""
    return stream.words.shape == (capacity_words(capacity_bits),) and stream.offsets.shape == (num_chunks(n, chunk),)


def encoded_bytes(stream: BitStream, codes, chunk: int = CHUNK) -> Array:
    """Bytes of the encoded message (traced): ceil(nbits / 8), the 4-byte bit count, and 4 bytes
    per chunk that holds at least one of the ``codes`` codes (``codes`` may be traced)."""
    used = jnp.maximum((jnp.asarray(codes, jnp.int32) + chunk - 1) // chunk, 0)
    return ((stream.nbits + 7) // 8 + 4 + 4 * used).astype(jnp.float32)


def _mask(lengths: Array) -> Array:
    """uint32 masks of the low ``lengths`` bits (0 <= lengths <= 32)."""
    ones = jnp.full(lengths.shape, 0xFFFFFFFF, _U32)
    return jnp.where(lengths >= 32, ones, (jnp.left_shift(_U32(1), jnp.minimum(lengths, 31).astype(_U32)) - 1))


def _shl(x: Array, s: Array) -> Array:
    """x << s for 0 <= s <= 32 (32 gives 0)."""
    return jnp.where(s >= 32, _U32(0), jnp.left_shift(x, jnp.minimum(s, 31).astype(_U32)))


def _shr(x: Array, s: Array) -> Array:
    """x >> s (logical) for 0 <= s <= 32 (32 gives 0)."""
    return jnp.where(s >= 32, _U32(0), jnp.right_shift(x, jnp.minimum(s, 31).astype(_U32)))


def write(values: Array, lengths: Array, capacity_bits: int, chunk: int = CHUNK) -> BitStream:
    """Concatenate codes into a stream.

    ``values``/``lengths``: [n, F] (code i is its F fields in order; field j holds the low
    ``lengths[i, j]`` bits of ``values[i, j]``, written most significant first; a length above 32
    is that many bits of the value with leading zeros, e.g. a unary run of zeros ending in a 1).
    Codes with all lengths 0 take no bits (e.g. padding).  ``capacity_bits`` must be at
    least the total length (the caller's worst case; bits past it are dropped).
    """
    values = jnp.asarray(values).astype(_U32)
    lengths = jnp.asarray(lengths, jnp.int32)
    n = values.shape[0]
    flat_v, flat_l = values.reshape(-1), lengths.reshape(-1)
    ends = jnp.cumsum(flat_l, dtype=jnp.int32)
    starts = ends - flat_l
    short = jnp.minimum(flat_l, 32)  # longer fields are leading zeros, then the value's 32 bits
    v = flat_v & _mask(short)
    first = starts + flat_l - short
    w, off = first >> 5, first & 31
    over = off + short - 32  # > 0: the field straddles into the next word
    hi = jnp.where(over > 0, _shr(v, over), _shl(v, -over))
    lo = jnp.where(over > 0, _shl(v, 32 - over), _U32(0))
    n_words = capacity_words(capacity_bits)
    words = jnp.zeros((n_words,), _U32)
    words = words.at[w].add(jnp.where(short > 0, hi, 0), mode="drop")
    words = words.at[w + 1].add(lo, mode="drop")
    nbits = ends[-1] if ends.size else jnp.zeros((), jnp.int32)
    code_starts = starts.reshape(n, -1)[:, 0] if n else jnp.zeros((0,), jnp.int32)
    offsets = code_starts[::chunk] if n else jnp.zeros((0,), jnp.int32)
    offsets = jnp.pad(offsets, (0, num_chunks(n, chunk) - offsets.shape[0]), constant_values=nbits)
    return BitStream(words, nbits.astype(jnp.int32), offsets.astype(jnp.int32))


def read(words: Array, pos: Array, length: Array) -> Array:
    """The ``length`` bits (0..32) starting at bit ``pos``, as uint32 (vectorized)."""
    pos = jnp.asarray(pos, jnp.int32)
    w, off = pos >> 5, pos & 31
    n = words.shape[0]
    a = words[jnp.clip(w, 0, n - 1)]
    b = words[jnp.clip(w + 1, 0, n - 1)]
    top = _shl(a, off) | _shr(b, 32 - off)  # the 32 bits starting at pos
    return _shr(top, 32 - jnp.asarray(length, jnp.int32))


def next_one_index(words: Array) -> Array:
    """For every word w, the index of the first non-zero word at or after w (len(words) if none):
    the table ``next_one`` uses to skip runs of zero bits in O(1)."""
    n = words.shape[0]
    idx = jnp.where(words != 0, jnp.arange(n, dtype=jnp.int32), n)
    return lax.cummin(idx, reverse=True)


def next_one(words: Array, table: Array, pos: Array) -> Array:
    """Position of the first 1 bit at or after ``pos`` (vectorized; 32 * len(words) if none)."""
    pos = jnp.asarray(pos, jnp.int32)
    n = words.shape[0]
    w, off = pos >> 5, pos & 31
    here = _shl(words[jnp.clip(w, 0, n - 1)], off)
    in_word = pos + lax.clz(here).astype(jnp.int32)
    w2 = table[jnp.clip(w + 1, 0, n - 1)]
    w2 = jnp.where(w + 1 >= n, n, w2)
    later = w2 * 32 + lax.clz(words[jnp.clip(w2, 0, n - 1)]).astype(jnp.int32)
    return jnp.where((here != 0) & (w < n), in_word, jnp.where(w2 < n, later, 32 * n))


Step = Callable[[Array, Array, Array], tuple[tuple[Array, ...], Array]]


def decode(stream: BitStream, n: int, step: Step, chunk: int = CHUNK) -> tuple[Array, ...]:
    """Decode ``n`` codes (static upper bound) from ``stream``.

    ``step(words, table, pos) -> (outputs, next_pos)`` decodes one code at every position of the
    vector ``pos`` (one per chunk); ``table`` is ``next_one_index(words)``.  Returns the outputs
    stacked to shape [n, ...] in code order.  Codes past the stream's real count decode garbage:
    the caller masks them with its own count.
    """
    chunks = num_chunks(n, chunk)
    table = next_one_index(stream.words)
    steps = min(chunk, max(n, 1))
    out_shapes = jax.eval_shape(lambda p: step(stream.words, table, p)[0], stream.offsets)

    def body(t, carry):
        pos, outs = carry
        vals, pos = step(stream.words, table, pos)
        outs = tuple(o.at[:, t].set(v) for o, v in zip(outs, vals))
        return pos, outs

    # The first step is peeled so that the loop carry is built from step outputs: inside
    # shard_map (check_vma) it then has the same varying axes as the body's outputs.
    first, pos = step(stream.words, table, stream.offsets)
    init = tuple(jnp.zeros((chunks, steps, *s.shape[1:]), s.dtype).at[:, 0].set(v) for s, v in zip(out_shapes, first))
    _, outs = lax.fori_loop(1, steps, body, (pos, init))
    return tuple(o.reshape(chunks * steps, *o.shape[2:])[:n] for o in outs)


# --------------------------------------------------------------------------- integer codes


def bit_length(x: Array) -> Array:
    """floor(log2 x) + 1 for x >= 1 (0 for 0), int32."""
    return (32 - lax.clz(jnp.asarray(x).astype(_U32))).astype(jnp.int32)


def rice_parameter(p: float) -> int:
    """Golomb parameter exponent for gaps of Bernoulli(p) positions (Sattler et al. 2019, eq. 17):
    b* = 1 + floor(log2(log(phi - 1) / log(1 - p))), phi the golden ratio; 0 when p >= 1/2 ... 1."""
    if not 0.0 < p < 1.0:
        return 0
    phi = (1 + math.sqrt(5)) / 2
    return max(0, 1 + math.floor(math.log2(math.log(phi - 1) / math.log(1 - p))))


__all__ = [
    "BitStream",
    "CHUNK",
    "bit_length",
    "capacity_words",
    "decode",
    "encoded_bytes",
    "next_one",
    "next_one_index",
    "num_chunks",
    "payload_ok",
    "read",
    "rice_parameter",
    "stream_bytes",
    "write",
]
