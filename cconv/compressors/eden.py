"""EDEN (Vargaftik, Ben Basat, Portnoy, Mendelson, Ben-Itzhak & Mitzenmacher, ICML 2022, "EDEN:
Communication-Efficient and Robust Distributed Mean Estimation for Federated Learning"):
a randomized Hadamard rotation, then b bits per coordinate with a scale for unbiasedness or for
minimum error.

With R the rotation of ``cconv.compressors.rotation`` (x padded to D = 2^ceil(log2 d), random
signs from the worker's own key, normalized Walsh-Hadamard transform), y = R x and
sigma = ||y|| / sqrt(D) (so y / sigma is close to N(0, 1) coordinatewise):

    Q = the nearest of the 2^b Lloyd-Max centroids of N(0, 1), coordinatewise, of y / sigma
    S = ||y||^2 / <y, Q>      (``unbiased=True``: <x, C(x)> = ||x||^2 for every rotation, which
                               makes C unbiased for a uniformly random rotation, Theorem 2.1)
    S = <y, Q> / ||Q||^2      (``unbiased=False``: the least-squares scale, minimum error)
    C(x) = R^{-1}(S Q), the first d coordinates.

Errors as D grows (y / sigma -> N(0, 1); MSE_b the normalized error of the b-bit Lloyd-Max
quantizer of N(0, 1): 0.3634, 0.1175, 0.03454, 0.009497 for b = 1..4): the unbiased scale has
vNMSE = E||C(x) - x||^2 / ||x||^2 -> MSE_b / (1 - MSE_b) (0.5708 = pi/2 - 1 at b = 1, DRIVE's
constant; 0.1331, 0.0358, 0.00959), the minimum-error scale -> MSE_b.  With the Hadamard rotation
the unbiased scale is unbiased only approximately (exactly for a uniform random rotation, the
theorem's assumption), so the compressor does not claim ``unbiased``; ``tests/test_rotation.py``
measures both the constants and the bias.  Worst cases (per rotation): the minimum-error scale
is a contraction with delta >= (c_min / c_max)^2 / D (c_min, c_max the smallest and largest
|centroid|; = 1/D at b = 1); the unbiased scale is no contraction, its error is at most
(D (c_max / c_min)^2 - 1) ||x||^2 ((D - 1) ||x||^2 at b = 1, reached when y is a spike).

Wire format: the D indices as b-bit codes (``packing.pack_bits``: ceil(D b / 8) bytes), the
float32 scale S, and the 8-byte key of the sender's rotation (each worker rotates with its own
key, as in the paper; the receiver regenerates the signs from it):
ceil(D b / 8) + 4 + 8 bytes, i.e. b D / d + 96 / d bits per coordinate.  Aggregation: each
payload decoded (its own rotation inverted), then summed ("allgather").  Cost: a rotation is
ceil(log2(D) / 4) passes over D floats (``rotation.passes``), once to compress and once per
decoded payload.  A zero vector has S = 0 and decompresses to zero; non-finite input makes the
whole output non-finite.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors import rotation
from cconv.compressors.base import Array, Compressor, check_float, like_info, safe_div, size_of, stateless_init
from cconv.compressors.packing import pack_bits, packed_size, unpack_bits
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Knob, Param, Schema, Theory, register

KEY_BYTES = 8  # the sender's raw uint32[2] key


class RotatedPayload(NamedTuple):
    codes: Array  # uint8[ceil(D * bits / 8)]: centroid indices
    scale: Array  # float32 S
    key: Array  # uint32[2]: the sender's rotation key


def quantizer(bits: int, unbiased: bool, name: str) -> Compressor:
    """EDEN with b = ``bits`` (DRIVE is b = 1): the module docstring's C, as a Compressor named
    ``name``."""
    centroids, thresholds, _ = rotation.lloyd_max(bits)
    table = jnp.asarray(centroids, jnp.float32)

    def compress(x, state, key):
        check_float(name, x)
        y = rotation.rotate(x.reshape(-1), key)
        n = y.shape[0]
        norm2 = jnp.sum(y * y)
        z = y * safe_div(jnp.float32(np.sqrt(n)), jnp.sqrt(norm2))
        idx = rotation.quantize_nearest(z, thresholds)
        q = table[idx]
        yq = jnp.sum(y * q)
        scale = safe_div(norm2, yq) if unbiased else safe_div(yq, jnp.sum(q * q))
        return RotatedPayload(pack_bits(idx, bits), scale.astype(jnp.float32), rotation.raw_key(key)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        d = size_of(shape)
        n = rotation.padded(d)
        q = table[unpack_bits(payload.codes, bits, n)]
        return rotation.unrotate(payload.scale * q, payload.key, d).astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(rotation.padded(size_of(shape)), bits) + 4 + KEY_BYTES

    return Compressor(stateless_init, compress, decompress, wire_bytes, lambda shape: 1.0, name=name, unbiased=False)


# ---------------------------------------------------------------- theory (float64 NumPy)


def wire_bytes(c, shape, isz) -> int:
    """ceil(D b / 8) + 4 + 8 with D = 2^ceil(log2 d)."""
    d = max(size_of(shape), 1)
    n = 1 << (d - 1).bit_length()
    return -(-n * c.hparams.get("bits", 1) // 8) + 4 + KEY_BYTES


def bound(c, shape) -> Bound:
    """Minimum-error scale: error = ||y||^2 (1 - cos^2(y, Q)) with cos^2 >= (c_min / c_max)^2 / D
    (every |Q_i| in [c_min, c_max], same sign as y_i; ||y||_1 >= ||y||_2), a contraction; the
    unbiased scale: error = ||y||^2 (1 / cos^2 - 1) <= (D (c_max / c_min)^2 - 1) ||x||^2 per
    rotation, a bounded error (``omega`` of a "biased" bound) but not a contraction."""
    cents = np.abs(rotation.lloyd_max(c.hparams.get("bits", 1))[0])
    n = rotation.padded(size_of(shape))
    cos2 = float((cents.min() / cents.max()) ** 2 / n)
    if c.hparams["unbiased"]:  # error = ||y||^2 (1 / cos^2 - 1): bounded, not a contraction
        return Bound("biased", omega=1.0 / cos2 - 1.0, delta=None, tight=False)
    return Bound("contractive", delta=cos2, tight=False)


THEORY = Theory(wire_bytes=wire_bytes, bound=bound)
# The planner's cost estimate until a benchmark row exists (x the read floor, compress and
# decompress each): a transform pass costs ~6 read floors on XLA:CPU (the 16 x 16 contraction is
# compute-bound: the whole transform measured 30-37x at D = 2^20 for every radix 2..32), times
# the passes at d = 10^6 (D = 2^20: 5), plus ~8 for the scale, quantization, packing and the
# sign draw.  Measured (studies/benchmarks/run.py --parts a --sizes 1e6, 2-core CPU,
# 2026-11-27): eden compress 58x / decompress 32x, drive 37x / 64x.
ROTATION_X = 6.0 * rotation.passes(10**6) + 8.0


def transform_flops(shape) -> float:
    """Additions of one fast Walsh-Hadamard transform of the padded tensor: D log2 D."""
    n = rotation.padded(size_of(shape))
    return float(n * max(n.bit_length() - 1, 0))


# The time model's facts (``cconv.theory.implementation``): pad and sign flips (2 passes), the
# transform's stages (2 ceil(log2(D) / 4) passes, read and write: 10 at d ~ 10^6, the model's
# reference; its D log2 D additions are ``flops``), the norm and the inner product (2), the
# packing (1); the 2^b - 1 threshold comparisons per coordinate are flops too.  Decode: unpack and
# table lookup (2), the transform (10), sign flips and the slice (2).
ROTATION_COST = dict(compress_ops=12, compress_passes=15.0, decompress_ops=10, decompress_passes=14.0)
COST = Cost(
    **ROTATION_COST,
    flops=lambda c, shape: transform_flops(shape) + ((1 << c.hparams.get("bits", 1)) - 1) * size_of(shape),
    decompress_flops=lambda c, shape: transform_flops(shape),
)


def _eden(bits: int = 2, unbiased: bool = True) -> Compressor:
    return quantizer(bits, unbiased, "eden")


eden = register(
    "eden",
    Entry(
        _eden,
        schema=Schema(
            (
                Param("bits", "int", 2, low=1, high=4, help="bits per (padded) coordinate"),
                Param("unbiased", "bool", True, help="unbiased scale (else the minimum-error scale)"),
            )
        ),
        aggregation="allgather",
        theory=THEORY,
        knob=Knob("bits", (1, 2, 4)),
        label="EDEN",
        bench=Bench(hparams=lambda ratio: {"bits": 2}, target_x=ROTATION_X),
        cost=COST,
    ),
)
