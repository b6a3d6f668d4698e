"""A compressor and an aggregation method registered from user code (no edit inside ``cconv/``).

Count sketch (Charikar, Chen & Farach-Colton 2002), as SketchSGD compresses gradients (Ivkin et
al., NeurIPS 2019).  With r rows of c = ceil(ratio * d) columns, hashes h_j: [d] -> [c] and signs
s_j: [d] -> {-1, +1} drawn from the step's key (the SAME on every worker)::

    S[j, b] = sum_{i : h_j(i) = b} s_j(i) x_i          (the payload: r x c values + the key)
    x_hat_i = median_j s_j(i) S[j, h_j(i)]              (decode)

The sketch is linear in x, so the sketches of x_1..x_P add up to the sketch of their sum: the
payloads are summable (``aggregation="allreduce"``) and every architecture sums them, then
decodes ONCE -- decoding each and summing would be another algorithm, since the median is not
linear.  One row (r = 1) is unbiased: x_hat_i = x_i + sum_{k != i, h(k) = h(i)} s(i) s(k) x_k.

``sketch_topk`` (SketchSGD's unsketch step) is an aggregation method: the summed sketches are
decoded once and only the ``heavy`` fraction of largest-magnitude estimates is applied.  It is
selectable as ``collective="sketch_topk"`` for the compressors that list it in ``collectives``.

Used by ``tests/test_extension.py`` and shown in ``docs/extending.md``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

import cconv.compressors as cc
from cconv.comm.aggregation import AllReduce
from cconv.compressors.base import check_float, itemsize, like_info, size_of, stateless_init


class SketchPayload(NamedTuple):
    table: jax.Array  # (rows, cols) in the input dtype: summed by the aggregation
    key: jax.Array  # uint32 raw key data: identical on every worker, regenerates the hashes


def _cols(d: int, ratio: float) -> int:
    return max(1, math.ceil(round(ratio * d, 9)))


def _hashes(key, d: int, rows: int, cols: int):
    """(buckets int32 (rows, d), signs float32 (rows, d)) of the key."""
    kb, ks = jax.random.split(jax.random.wrap_key_data(key))
    return jax.random.randint(kb, (rows, d), 0, cols), jax.random.rademacher(ks, (rows, d), jnp.float32)


def _count_sketch(ratio: float, rows: int = 3, heavy: float = 0.1) -> cc.Compressor:
    """Count sketch with ``rows`` rows of ceil(ratio * d) columns (``heavy``: the fraction of
    coordinates ``collective="sketch_topk"`` applies)."""

    def compress(x, state, key):
        check_float("count_sketch", x)
        raw = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
        d = max(x.size, 1)
        buckets, signs = _hashes(raw, d, rows, _cols(d, ratio))
        flat = x.reshape(-1).astype(jnp.float32)
        table = jnp.zeros((rows, _cols(d, ratio)), jnp.float32).at[jnp.arange(rows)[:, None], buckets].add(signs * flat)
        return SketchPayload(table.astype(x.dtype), raw), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        d = max(size_of(shape), 1)
        buckets, signs = _hashes(payload.key, d, rows, payload.table.shape[1])
        estimates = signs * jnp.take_along_axis(payload.table.astype(jnp.float32), buckets, axis=1)
        return jnp.median(estimates, axis=0)[: size_of(shape)].reshape(shape).astype(dtype)

    def wire_bytes(shape, dtype="float32"):
        return rows * _cols(max(size_of(shape), 1), ratio) * itemsize(dtype) + 8

    def density(shape):
        d = max(size_of(shape), 1)
        return min(1.0, rows * _cols(d, ratio) / d)

    return cc.Compressor(
        stateless_init, compress, decompress, wire_bytes, density, name="count_sketch", unbiased=rows == 1
    )


class SketchTopK(AllReduce):
    """SketchSGD's aggregation: the sketches are summed (all-reduce, or on the server) and
    decoded once, as ``allreduce`` does; each worker then applies the ``heavy`` fraction of the
    largest-magnitude coordinates of the mean estimate (its compressor's hyper-parameter)."""

    name = "sketch_topk"
    selectable = True  # collective="sketch_topk"
    gossip = False  # the top-k step is not a mix of payloads

    def average(self, comm, plan, totals):
        out = []
        for t in totals:
            flat = t.reshape(-1) / comm.size
            k = max(1, math.ceil(plan.comp.hparams["heavy"] * flat.size))
            _, idx = jax.lax.top_k(jnp.abs(flat), k)
            out.append(jnp.zeros_like(flat).at[idx].set(flat[idx]).reshape(t.shape))
        return out


cc.register_aggregation(SketchTopK())

COUNT_SKETCH = cc.Entry(
    _count_sketch,
    cc.Schema(
        (
            cc.Param("ratio", "float", None, low=0.0, high=1.0, low_open=True, help="columns per row / d"),
            cc.Param("rows", "int", 3, low=1),
            cc.Param("heavy", "float", 0.1, low=0.0, high=1.0, low_open=True),
        )
    ),
    aggregation="allreduce",  # summable: sum the sketches, decode once
    collectives=("sketch_topk",),
    theory=cc.Theory(
        wire_bytes=lambda c, shape, isz: (
            c.hparams["rows"] * _cols(max(math.prod(shape), 1), c.hparams["ratio"]) * isz + 8
        )
    ),
    knob=cc.Knob("ratio", (0.5, 0.1)),
    label="count sketch",
    example={"ratio": 0.5, "rows": 1},
)
FURTHER = ({"ratio": 0.5},)  # the generic tests' further case (tests/test_extension.py)
count_sketch = cc.register("count_sketch", COUNT_SKETCH)  # the validated factory: count_sketch(ratio=...)
