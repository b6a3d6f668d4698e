"""Bit packing: the wire format of sub-byte compressors.

``pack_bits(codes, nbits)`` stores ``d`` unsigned codes of ``nbits`` bits each in
``ceil(d * nbits / 8)`` bytes (``uint8``), little-endian within a byte: code ``j`` of a byte
occupies bits ``j*nbits .. j*nbits+nbits-1`` when ``nbits`` divides 8.  Other widths (e.g. QSGD
with s = 2 levels needs ceil(log2(5)) = 3 bits) are written as one continuous bit stream, LSB
first, so no bit is wasted except the final partial byte.

``unpack_bits(packed, nbits, d)`` inverts it exactly.  Both are jit-able with static d and nbits.

Packed-domain aggregation (the compressors' ``gathered_sum`` hooks): ``bit_counts`` counts, per
position, the set bits of P gathered sign payloads without unpacking them (a bit-sliced counter
over 32-bit words); ``sum_rows`` accumulates per-worker contributions (each worker's codes
unpacked and scaled inside the accumulation: no P x d float32 intermediate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cconv.compressors.base import Array


def packed_size(d: int, nbits: int) -> int:
    """Bytes needed for d codes of nbits bits: ceil(d * nbits / 8)."""
    return -(-d * nbits // 8)


def pack_bits(codes: Array, nbits: int) -> Array:
    """Pack a flat array of unsigned integer codes (< 2**nbits) into uint8."""
    if not 1 <= nbits <= 8:
        raise ValueError(f"pack_bits: nbits must be in [1, 8], got {nbits}")
    codes = codes.reshape(-1).astype(jnp.uint8)
    d = codes.shape[0]
    if 8 % nbits == 0:
        per = 8 // nbits
        pad = (-d) % per
        if pad:
            codes = jnp.concatenate([codes, jnp.zeros((pad,), jnp.uint8)])
        groups = codes.reshape(-1, per)
        shifts = (jnp.arange(per, dtype=jnp.uint8) * nbits).astype(jnp.uint8)
        # Fields do not overlap, so a sum is a bitwise or.
        return jnp.sum(groups << shifts, axis=1, dtype=jnp.uint8)
    # General widths (3, 5, 6, 7): 8 codes fill exactly nbits bytes of the stream, so each group
    # of 8 codes is written as nbits bytes by static shifts (an expansion to one byte per bit
    # costs ~30-60x a read of the input at 1e7 codes).
    return _pack_groups(codes, nbits)


def unpack_bits(packed: Array, nbits: int, d: int) -> Array:
    """Inverse of pack_bits: returns d codes as uint8."""
    if not 1 <= nbits <= 8:
        raise ValueError(f"unpack_bits: nbits must be in [1, 8], got {nbits}")
    packed = packed.reshape(-1).astype(jnp.uint8)
    if 8 % nbits == 0:
        per = 8 // nbits
        shifts = (jnp.arange(per, dtype=jnp.uint8) * nbits).astype(jnp.uint8)
        mask = jnp.uint8((1 << nbits) - 1)
        codes = (packed[:, None] >> shifts) & mask
        return codes.reshape(-1)[:d]
    return _unpack_groups(packed, nbits, d)


def _pack_groups(codes: Array, nbits: int) -> Array:
    """Stream layout for any width: a group of 8 codes is the 8*nbits-bit number
    sum_j code_j << (nbits*j), written LSB first as nbits bytes.  It is built as two words of
    4 codes each by a reduction (each code is read once, so XLA does not recompute the code's
    producer, e.g. QSGD's random rounding, for every byte it touches), then cut into bytes."""
    d = codes.shape[0]
    pad = (-d) % 8
    if pad:
        codes = jnp.concatenate([codes, jnp.zeros((pad,), jnp.uint8)])
    g = codes.reshape(-1, 2, 4).astype(jnp.uint32)
    shifts = (jnp.arange(4, dtype=jnp.uint32) * nbits).astype(jnp.uint32)
    words = jnp.sum(g << shifts, axis=2, dtype=jnp.uint32)  # fields do not overlap: sum = or
    lo, hi = words[:, 0], words[:, 1]  # bits [0, 4n) and [4n, 8n)
    half = 4 * nbits
    out = []
    for b in range(nbits):
        o = 8 * b  # first bit of byte b
        acc = lo >> o if o < half else None
        s = half - o  # where hi starts relative to o
        if 0 < s < 8:
            part = hi << s
        elif s <= 0:
            part = hi >> -s
        else:
            part = None
        if part is not None:
            acc = part if acc is None else acc | part
        out.append((acc & 0xFF).astype(jnp.uint8))
    return jnp.stack(out, axis=1).reshape(-1)[: packed_size(d, nbits)]


def _unpack_groups(packed: Array, nbits: int, d: int) -> Array:
    n = -(-d // 8)
    need = n * nbits
    if packed.shape[0] < need:
        packed = jnp.concatenate([packed, jnp.zeros((need - packed.shape[0],), jnp.uint8)])
    B = packed[:need].reshape(n, nbits).astype(jnp.uint32)
    mask = (1 << nbits) - 1
    codes = []
    for j in range(8):
        acc = None
        for b in range(nbits):
            s = 8 * b - nbits * j  # where byte b starts relative to code j
            if -8 < s < nbits:
                part = (B[:, b] << s) if s >= 0 else (B[:, b] >> -s)
                acc = part if acc is None else acc | part
        codes.append((acc & mask).astype(jnp.uint8))
    return jnp.stack(codes, axis=1).reshape(-1)[:d]


def pack_signs(x: Array) -> Array:
    """1 bit per element, bit = (x >= 0), i.e. sign(0) = +1."""
    return pack_bits((x.reshape(-1) >= 0).astype(jnp.uint8), 1)


def unpack_signs(packed: Array, d: int, dtype) -> Array:
    """±1 values of the given dtype from packed sign bits."""
    bits = unpack_bits(packed, 1, d)
    return (2 * bits.astype(jnp.int8) - 1).astype(dtype)


# --------------------------------------------------------------------------- packed-domain sums


def words_le(packed: Array) -> Array:
    """uint8[..., n] -> uint32[..., ceil(n / 4)], 4 bytes per little-endian word (zero padded):
    bit j of word i is bit j % 8 of byte 4i + j // 8, i.e. element 32i + j of a 1-bit stream."""
    pad = (-packed.shape[-1]) % 4
    b = jnp.pad(packed.astype(jnp.uint8), [(0, 0)] * (packed.ndim - 1) + [(0, pad)])
    b = b.reshape(*packed.shape[:-1], -1, 4).astype(jnp.uint32)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def bit_counts(stacked: Array, d: int) -> Array:
    """Per position i < d, how many rows of ``stacked`` (uint8[P, n]: P payloads of 1-bit codes as
    ``pack_bits(., 1)`` writes them) have bit i set: int32[d], exact.

    Bit-sliced: the rows' 32-bit words are added one by one into a binary counter kept as bit
    planes (plane b holds bit b of the count of all 32 positions of a word; adding a word is a
    ripple carry, two bitwise ops per plane, in a loop over the rows), so P rows cost
    O(P log P) word operations for 32 positions, then each position's count is read out of the
    ceil(log2(P + 1)) planes."""
    words = words_le(stacked)
    n_planes = max(1, int(words.shape[0]).bit_length())

    def add(w, planes):  # ripple carry of row w into the counter
        carry, out = words[w], []
        for plane in planes:
            out.append(plane ^ carry)
            carry = plane & carry
        return tuple(out)

    # a loop, not an unrolled chain: the counter's graph stays small whatever P is
    planes = jax.lax.fori_loop(0, words.shape[0], add, (jnp.zeros_like(words[0]),) * n_planes)
    shifts = jnp.arange(32, dtype=jnp.uint32)
    counts = sum(((pl[:, None] >> shifts) & 1).astype(jnp.int32) << b for b, pl in enumerate(planes))
    return jnp.asarray(counts, jnp.int32).reshape(-1)[:d]


def sum_rows(fn, workers: int) -> Array:
    """sum_{w < workers} fn(w), accumulated in worker order (w = 0 first).  ``fn(w)`` is one
    worker's contribution (e.g. its payload unpacked and scaled), so no (P, d) intermediate
    exists: up to 16 workers the adds are unrolled and XLA fuses them with the unpacking into one
    pass over the output; beyond, a loop adds one worker per iteration.  (A ``sum(0)`` over the
    leading axis of a fused (P, d) producer ran at ~300x the memory read floor on XLA:CPU.)"""
    if workers <= 16:
        acc = fn(0)
        for w in range(1, workers):
            acc = acc + fn(w)
        return acc
    return jax.lax.fori_loop(1, workers, lambda w, acc: acc + fn(w), fn(0))


def row(tree, w):
    """Worker ``w``'s payload out of gathered payloads (every leaf stacked on a leading axis)."""
    return jax.tree.map(lambda a: a[w], tree)
