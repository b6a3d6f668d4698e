"""DRIVE (Vargaftik, Ben Basat, Portnoy, Mendelson, Ben-Itzhak & Mitzenmacher, NeurIPS 2021,
"DRIVE: One-bit Distributed Mean Estimation"): a randomized Hadamard rotation, then one bit per
coordinate, the sign, with one float32 scale.

With y = R x (``cconv.compressors.rotation``: pad to D = 2^ceil(log2 d), the worker's own random
signs, normalized Walsh-Hadamard transform):

    C(x) = R^{-1}(S sign(y)),   S = ||y||_2^2 / ||y||_1   (``unbiased=True``: <x, C(x)> = ||x||^2,
                                                           unbiased for a uniform rotation)
                                S = ||y||_1 / D           (``unbiased=False``: minimum error)

It is EDEN with b = 1 (the 1-bit Lloyd-Max centroids are +-sqrt(2/pi); the scale absorbs them),
and shares its code (``cconv.compressors.eden.quantizer``).  vNMSE as D grows: pi/2 - 1 = 0.5708
(unbiased scale; DRIVE's Theorem 3 for uniform rotations) and 1 - 2/pi = 0.3634 (minimum error);
the minimum-error scale is a contraction with ||x - C(x)||^2 = ||x||^2 - ||y||_1^2 / D per
rotation (delta >= 1/D); the unbiased scale is no contraction (its error is at most (D - 1) ||x||^2
per rotation).  With the
Hadamard rotation the unbiased scale is unbiased only approximately, so the compressor does not
claim ``unbiased`` (``tests/test_rotation.py`` measures the bias).

Wire format: ceil(D / 8) bytes of sign bits, the float32 scale and the 8-byte key of the sender's
rotation (per-worker rotations, as in the paper): 1 D / d + 96 / d bits per coordinate;
aggregation "allgather" (each payload decoded with its own rotation).
"""

from __future__ import annotations

import numpy as np

from cconv.compressors.base import Compressor
from cconv.compressors.eden import COST, ROTATION_X, quantizer, wire_bytes
from cconv.compressors.oracle import flat64
from cconv.compressors.registry import Bench, Bound, Entry, Param, Schema, Theory, register
from cconv.compressors.rotation import padded


def _drive(unbiased: bool = True) -> Compressor:
    return quantizer(1, unbiased, "drive")


def _bound(c, shape) -> Bound:
    """Minimum error: delta = 1/D (||y||_1 >= ||y||_2); the unbiased scale: a bounded error,
    omega = D - 1 (per rotation), not a contraction."""
    if c.hparams["unbiased"]:  # error = ||y||^2 (D ||y||^2 / ||y||_1^2 - 1) <= (D - 1) ||x||^2
        return Bound("biased", omega=padded(int(np.prod(shape, dtype=np.int64))) - 1.0, delta=None, tight=False)
    return Bound("contractive", delta=1.0 / padded(int(np.prod(shape, dtype=np.int64))), tight=False)


def error_given_rotation(c, y) -> float:
    """||C(x) - x||^2 of the padded vector for the rotated y = R x (float64): D ||y||^4 / ||y||_1^2
    - ||y||^2 (unbiased scale) or ||y||^2 - ||y||_1^2 / D (minimum error); the decompressed
    vector keeps the first d coordinates, whose error is at most this."""
    y = flat64(y)
    n2, n1 = float(y @ y), float(np.abs(y).sum())
    if n1 == 0:
        return 0.0
    return y.size * n2 * n2 / n1**2 - n2 if c.hparams["unbiased"] else n2 - n1 * n1 / y.size


THEORY = Theory(wire_bytes=wire_bytes, bound=_bound)

drive = register(
    "drive",
    Entry(
        _drive,
        schema=Schema((Param("unbiased", "bool", True, help="unbiased scale (else the minimum-error scale)"),)),
        aggregation="allgather",
        theory=THEORY,
        label="DRIVE",
        bench=Bench(target_x=ROTATION_X),
        cost=COST,  # EDEN's at b = 1: one threshold comparison per coordinate
    ),
)
