"""THC (Li, Ben Basat, Vargaftik, Lao, Xu, Akella & Yu, NSDI 2024, "THC: Accelerating Distributed
Deep Learning Using Tensor Homomorphic Compression"): a shared randomized Hadamard rotation,
then stochastic quantization to b-bit indices whose values the workers (or a parameter server)
sum as integers, in compressed form, before one decode.

All workers rotate with the same R (``cconv.compressors.rotation``, signs from the key of the
``seed`` hyper-parameter: shared by construction) and agree on the range M = max_w max_i |(R x_w)_i|
(one max-reduction of every tensor's local maximum, the ``Agreement``, control traffic).  With a
table of 2^b integers -G = v_0 < ... < v_{2^b - 1} = G, each rotated coordinate t_i = G y_i / M is
rounded stochastically to one of its two neighbours v_lo <= t_i <= v_hi (P(v_hi) = (t_i - v_lo) /
(v_hi - v_lo)), so E[v] = t_i and C(x) = R^{-1}(M / G * v) is unbiased.  Tables (``table``):

    "uniform"  v_j = 2j - (2^b - 1), G = 2^b - 1 (equally spaced odd integers)
    "table"    THC's lookup table: v_j = round(G c_j / c_max) on a finer grid G = 4 (2^b - 1),
               c_j the Lloyd-Max centroids of N(0, 1) (denser levels near 0, where the rotated
               coordinates are)

Homomorphic sum: every payload is M / G times integer levels in a shared rotated basis, so
sum_w C(x_w) = R^{-1}(M / G * sum_w v_w): the aggregation "intsum" sums the levels as int8/int16
(ring all-reduce when it moves fewer bytes than gathering the b-bit codes) or, gathered (and on a
parameter server), as integers in one accumulation over the workers (``gathered_sum``), then
decodes once (one inverse rotation).  The rotation is fixed per tensor size (the paper draws a
fresh shared one per round from a shared seed; the key cconv hands a compressor under "intsum"
differs per worker, so the shared rotation comes from ``seed``); unbiasedness holds for any fixed
rotation.

Exact second moment (any fixed rotation): with u_i = (v_hi - t_i)(t_i - v_lo) (M / G)^2 the
variance of rotated coordinate i, Var[C(x)_j] = sum_i u_i / D for every j (every Hadamard entry
is +-1 / sqrt(D)) and E||C(x) - x||^2 = (d / D) sum_i u_i.  Worst case: u_i <= (gap / 2)^2
(M / G)^2 and M <= ||x||, so omega <= d (gap_max / (2 G))^2 (not tight).

Wire format: ceil(D b / 8) bytes of indices; standalone (one worker, no agreement) plus the
float32 M; bound to the agreed M, the indices only.  Cost: two rotations to compress (the
statistic and the compression), one per decode (ceil(log2(D) / 4) passes each).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv.compressors import fastrng, rotation
from cconv.compressors.base import (
    Agreement,
    Array,
    Compressor,
    check_float,
    like_info,
    safe_div,
    size_of,
    stateless_init,
)
from cconv.compressors.oracle import flat64
from cconv.compressors.packing import pack_bits, packed_size, row, sum_rows, unpack_bits
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Knob, Param, Schema, Theory, register

TABLES = ("uniform", "table")


def _transform_flops(shape) -> float:
    """D log2 D additions of one fast Walsh-Hadamard transform of the padded tensor."""
    n = rotation.padded(size_of(shape))
    return float(n * max(n.bit_length() - 1, 0))


class THCPayload(NamedTuple):
    codes: Array  # uint8[ceil(D * bits / 8)]: table indices
    scale: Array  # float32 M (standalone only)


class THCCodes(NamedTuple):
    codes: Array  # bound to the agreed M: the indices only


def table_of(bits: int, table: str) -> np.ndarray:
    """The 2^b integer levels v_0 < ... < v_{2^b - 1} (module docstring); v_last = G."""
    m = 1 << bits
    if table == "uniform":
        return np.array([2 * j - (m - 1) for j in range(m)], np.int64)
    c = rotation.lloyd_max(bits)[0]
    g = 4 * (m - 1)
    return np.round(g * c / c[-1]).astype(np.int64)


def _rot_key(seed: int):
    """The shared rotation's key: PRNGKey(seed) folded with a constant (so that the rotation is
    not drawn from the very key some other draw, e.g. test data, uses)."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), 0x7C)


def _max_rotated(x, seed: int):
    return jnp.max(jnp.abs(rotation.rotate(x.reshape(-1), _rot_key(seed))), initial=0.0)


def _quantize(x, m, key, levels: np.ndarray, seed: int):
    """Indices (uint8) of the stochastic rounding of G R x / M to the table (module docstring)."""
    y = rotation.rotate(x.reshape(-1), _rot_key(seed))
    g = float(levels[-1])
    t = jnp.clip(y * safe_div(jnp.float32(g), m), -g, g)
    lv = jnp.asarray(levels, jnp.float32)
    lo = jnp.clip(jnp.searchsorted(lv, t, side="right") - 1, 0, len(levels) - 2)
    a, b = lv[lo], lv[lo + 1]
    up = fastrng.uniform(key, t.shape) < (t - a) / (b - a)
    return (lo + up).astype(jnp.uint8)


def _decode(idx_levels, m, g: float, seed: int, like):
    """R^{-1}(M / G * levels) -> like's shape and dtype (levels: summed or one worker's)."""
    shape, dtype = like_info(like)
    vals = idx_levels.astype(jnp.float32) * (jnp.asarray(m, jnp.float32) / g)
    return rotation.unrotate(vals, _rot_key(seed), size_of(shape)).astype(dtype).reshape(shape)


def _level_ints(levels: np.ndarray, bits: int):
    """(codes, like, dtype) -> the integer table values of the D packed indices."""
    lv8 = jnp.asarray(levels, jnp.int8)

    def level_ints(codes, like, dtype=jnp.int8):
        n = rotation.padded(size_of(like_info(like)[0]))
        return lv8[unpack_bits(codes, bits, n)].astype(dtype)

    return level_ints


def _bind(c: Compressor, m, bits: int, table: str, seed: int) -> Compressor:
    """``c`` bound to the agreed range ``m``: the payload is the indices only; gathered payloads
    are summed as integers and decoded once."""
    levels = table_of(bits, table)
    g = float(levels[-1])
    level_ints = _level_ints(levels, bits)
    m = jnp.asarray(m, jnp.float32)

    def b_compress(x, state, key):
        return THCCodes(pack_bits(_quantize(x, m, key, levels, seed), bits)), state

    def b_decompress(payload, like):
        return _decode(level_ints(payload.codes, like), m, g, seed, like)

    def b_gathered_sum(stacked, like):
        """The homomorphic sum: integer levels summed over the workers, decoded once."""
        total = sum_rows(lambda w: level_ints(stacked.codes[w], like, jnp.int32), stacked.codes.shape[0])
        return _decode(total, m, g, seed, like)

    return c._replace(
        aggregation="intsum",
        hparams={"bits": bits, "table": table, "seed": seed},
        compress=b_compress,
        decompress=b_decompress,
        wire_bytes=lambda shape, dtype="float32": packed_size(rotation.padded(size_of(shape)), bits),
        agree=None,
        gathered_sum=b_gathered_sum,
    )


def _thc(bits: int = 4, table: str = "uniform", seed: int = 0) -> Compressor:
    levels = table_of(bits, table)
    g = float(levels[-1])
    level_ints = _level_ints(levels, bits)

    def compress(x, state, key):
        check_float("thc", x)
        m = _max_rotated(x, seed)
        return THCPayload(pack_bits(_quantize(x, m, key, levels, seed), bits), m.astype(jnp.float32)), state

    def decompress(payload, like):
        return _decode(level_ints(payload.codes, like), payload.scale, g, seed, like)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(rotation.padded(size_of(shape)), bits) + 4

    def gathered_sum(stacked, like):
        return sum_rows(lambda w: decompress(row(stacked, w), like), stacked.codes.shape[0])

    c = Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        lambda shape: 1.0,
        name="thc",
        unbiased=True,
        gathered_sum=gathered_sum,
    )
    return c._replace(
        agree=Agreement(
            statistic=lambda x: _max_rotated(x, seed),
            reduce="max",
            bind=lambda m: _bind(c, m, bits, table, seed),
            levels=lambda payload, like: level_ints(payload.codes, like),
            level_max=int(g),
            level_value=lambda m: jnp.asarray(m, jnp.float32) / g,
            decode=lambda summed, m, like: _decode(summed, m, g, seed, like),
        ),
    )


# ---------------------------------------------------------------- theory (float64 NumPy)


def _rotated64(c, x) -> np.ndarray:
    """R x in float64 (the signs of the seed's key; the Hadamard transform by Sylvester's rule)."""
    x = flat64(x)
    n = rotation.padded(x.size)
    v = np.zeros(n)
    v[: x.size] = x
    v = v * np.asarray(rotation.signs(_rot_key(c.hparams["seed"]), n), np.float64)
    h = 1
    while h < n:  # butterflies
        v = v.reshape(-1, 2, h)
        v = np.concatenate([v[:, 0] + v[:, 1], v[:, 0] - v[:, 1]], axis=1).reshape(n)
        h *= 2
    return v / math.sqrt(n)


def _rotated_variances(c, x) -> tuple[np.ndarray, int]:
    """(u_i, d): the variance of each rotated coordinate (module docstring), own range M."""
    levels = table_of(c.hparams["bits"], c.hparams["table"]).astype(np.float64)
    y = _rotated64(c, x)
    m = float(np.max(np.abs(y)))
    if m == 0:
        return np.zeros_like(y), flat64(x).size
    g = levels[-1]
    t = np.clip(g * y / m, -g, g)
    lo = np.clip(np.searchsorted(levels, t, side="right") - 1, 0, levels.size - 2)
    a, b = levels[lo], levels[lo + 1]
    return (b - t) * (t - a) * (m / g) ** 2, flat64(x).size


def _variance(c, x):
    u, d = _rotated_variances(c, x)
    return np.full(d, u.sum() / u.size)


def _bound(c, shape) -> Bound:
    levels = table_of(c.hparams["bits"], c.hparams["table"])
    gap = float(np.max(np.diff(levels)))
    return Bound("unbiased", omega=size_of(shape) * (gap / (2.0 * levels[-1])) ** 2, tight=False)


def _wire_bytes(c, shape, isz) -> int:
    """ceil(D b / 8) bytes of indices, plus the float32 M unless bound to the agreed one."""
    return packed_size(rotation.padded(size_of(shape)), c.hparams["bits"]) + (4 if c.agree is not None else 0)


THEORY = Theory(
    wire_bytes=_wire_bytes,
    bound=_bound,
    error_sq=lambda c, x, state: float(_variance(c, x).sum()),
    variance=_variance,
)

thc = register(
    "thc",
    Entry(
        _thc,
        schema=Schema(
            (
                Param("bits", "int", 4, low=1, high=4, help="bits per (padded) coordinate"),
                Param("table", "str", "uniform", choices=TABLES, help="uniform levels or THC's lookup table"),
                Param("seed", "int", 0, low=0, high=2**31 - 1, help="seed of the shared rotation"),
            )
        ),
        aggregation="intsum",
        theory=THEORY,
        knob=Knob("bits", (2, 4)),
        label="THC",
        # two rotations to compress, one to decode: 1.5 per side on average, each ~6 read floors
        # per pass (see eden.ROTATION_X); measured at d = 10^6: compress 74x, decompress 29x
        bench=Bench(hparams=lambda ratio: {"bits": 4}, target_x=1.5 * 6.0 * rotation.passes(10**6) + 8.0),
        # two rotations to compress (the agreed range's statistic, then the quantization: 2 x 12
        # passes at d ~ 10^6 as eden.ROTATION_COST, plus the max, the rounding and the packing: 4),
        # the transforms' D log2 D additions and the b-step table search as flops.  Decode: each
        # gathered payload is unpacked, looked up and added as integers (3 passes per payload); the
        # one inverse rotation of the sum is the decompress flops (counted once per call)
        cost=Cost(
            compress_ops=22,
            compress_passes=28.0,
            decompress_ops=4,
            decompress_passes=3.0,
            flops=lambda c, shape: 2 * _transform_flops(shape) + c.hparams["bits"] * size_of(shape),
            decompress_flops=lambda c, shape: _transform_flops(shape),
        ),
    ),
)
