"""payload_bytes(real payload) == c.wire_bytes(shape) == theory wire_bytes for every registered
case (generic, tests/registry_cases.py), and spot checks against the papers' sizes, written out
here independently (integer arithmetic, int32 indices, float32 scales), for many shapes and
dtypes (traced payloads: jax.eval_shape gives the same bytes)."""

from fractions import Fraction
from math import ceil, log2, prod

import jax
import jax.numpy as jnp
import pytest
import registry_cases as R

import cconv.compressors as cc

SHAPES = [(), (1,), (7,), (8,), (9,), (3, 5), (33, 17), (2, 3, 5), (1000,), (4, 1)]
TRACED = {(7,), (33, 17), (2, 3, 5), ()}  # payloads traced (the rest: wire_bytes only)
DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kof(d, ratio=None, k=None):
    k = ceil(Fraction(str(ratio)) * d) if k is None else k
    return max(1, min(k, d))


def sparse(d, k, isz):  # top-k style: k values + k int32 indices, dense when k >= d
    return d * isz if k >= d else k * (isz + 4)


def powersgd_bytes(shape, r, isz):
    if len(shape) < 2:
        return prod(shape) * isz
    n, m = prod(shape[:-1]), shape[-1]
    return r * (n + m) * isz if min(n, m) > r else n * m * isz


def qsgd_bytes(d, s, bucket):
    nb = ceil(d / (d if bucket is None else bucket)) if d else 0
    return ceil(d * ceil(log2(2 * s + 1)) / 8) + 4 * nb


# (name, hparams, size(shape, d, itemsize))
PAPER = [
    ("none", {}, lambda sh, d, i: d * i),
    ("fp16", {}, lambda sh, d, i: 2 * d),
    ("bf16", {}, lambda sh, d, i: 2 * d),
    ("randomk", {"ratio": 0.1}, lambda sh, d, i: d * i if kof(d, 0.1) >= d else kof(d, 0.1) * i + 8),
    ("randomk", {"ratio": 0.1, "shared": False}, lambda sh, d, i: sparse(d, kof(d, 0.1), i)),
    ("randomk", {"k": 3, "scaled": False}, lambda sh, d, i: d * i if 3 >= d else 3 * i + 8),
    ("topk", {"ratio": 0.1}, lambda sh, d, i: sparse(d, kof(d, 0.1), i)),
    ("topk", {"k": 5}, lambda sh, d, i: sparse(d, kof(d, k=5), i)),
    ("threshold", {"tau": 0.1, "ratio": 0.25}, lambda sh, d, i: kof(d, 0.25) * (i + 4)),
    ("dgc", {"ratio": 0.01}, lambda sh, d, i: sparse(d, kof(d, 0.01), i)),
    ("terngrad", {}, lambda sh, d, i: ceil(d / 4) + 4),
    ("terngrad", {"clip": 2.5}, lambda sh, d, i: ceil(d / 4) + 4),
    ("signsgd", {}, lambda sh, d, i: ceil(d / 8)),
    ("scaled_sign", {}, lambda sh, d, i: ceil(d / 8) + 4),
    ("onebit", {}, lambda sh, d, i: ceil(d / 8) + 8),
    ("onebit", {"columns": True}, lambda sh, d, i: ceil(d / 8) + 8 * (sh[-1] if len(sh) >= 2 else 1)),
    ("qsgd", {"levels": 8}, lambda sh, d, i: qsgd_bytes(d, 8, None)),
    ("qsgd", {"levels": 1}, lambda sh, d, i: qsgd_bytes(d, 1, None)),
    ("qsgd", {"levels": 2, "bucket": 4}, lambda sh, d, i: qsgd_bytes(d, 2, 4)),
    ("qsgd", {"levels": 127, "bucket": 512}, lambda sh, d, i: qsgd_bytes(d, 127, 512)),
    (
        "stc",
        {"ratio": 0.1},
        lambda sh, d, i: (4 * kof(d, 0.1) + ceil(kof(d, 0.1) / 8) + 4) if kof(d, 0.1) < d else ceil(d / 8) + 4,
    ),
    ("powersgd", {"rank": 1}, lambda sh, d, i: powersgd_bytes(sh, 1, i)),
    ("powersgd", {"rank": 2}, lambda sh, d, i: powersgd_bytes(sh, 2, i)),
    ("natural", {}, lambda sh, d, i: ceil(d / 8) + d),
]


@pytest.mark.parametrize("name,hp", R.CASES)
def test_payload_bytes_equal_wire_bytes_equal_theory(name, hp):
    R.check_wire_bytes(R.subject(name, hp))


def test_spot_values_from_the_papers():
    d = 10**6
    assert cc.signsgd().wire_bytes((d,)) == d // 8
    assert cc.terngrad().wire_bytes((d,)) == d // 4 + 4
    assert cc.topk(ratio=0.01).wire_bytes((d,)) == 8 * 10**4
    assert cc.qsgd(levels=8).wire_bytes((d,)) == ceil(5 * d / 8) + 4  # 2*8+1 = 17 -> 5 bits
    assert cc.none().wire_bytes((d,)) == 4 * d
    assert cc.powersgd(rank=4).wire_bytes((512, 256)) == 4 * (512 + 256) * 4


@pytest.mark.parametrize("name,hp,paper", PAPER, ids=lambda v: str(v) if not callable(v) else "")
def test_wire_bytes_equal_paper(name, hp, paper):
    c = cc.get(name, **hp)
    compress = jax.jit(lambda x, k: c.compress(x, c.init(x), k)[0])
    for dtype, isz in DTYPES.items():
        for shape in SHAPES if dtype != "float16" else [(), (9,), (3, 5), (2, 3, 5)]:
            d = prod(shape)
            expected = paper(shape, d, isz)
            assert c.wire_bytes(shape, dtype) == expected, (shape, dtype)
            if shape in TRACED and dtype != "float16":
                static = jax.eval_shape(compress, jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)), jax.random.PRNGKey(0))
                assert cc.payload_bytes(static) == expected, (shape, dtype)


def test_float32_scales_and_int32_indices():
    x = jax.ShapeDtypeStruct((50,), jnp.bfloat16)
    key = jax.random.PRNGKey(0)

    def payload(c):
        return jax.eval_shape(lambda x: c.compress(x, c.init(x), key)[0], x)

    p = payload(cc.topk(ratio=0.1))
    assert p.indices.dtype == jnp.int32 and p.values.dtype == jnp.bfloat16
    assert payload(cc.randomk(ratio=0.1, shared=False)).indices.dtype == jnp.int32
    assert payload(cc.scaled_sign()).scale.dtype == jnp.float32
    assert payload(cc.terngrad()).scale.dtype == jnp.float32
    assert payload(cc.qsgd()).norms.dtype == jnp.float32
    assert payload(cc.onebit()).means.dtype == jnp.float32
    assert payload(cc.stc(ratio=0.1)).mu.dtype == jnp.float32
    assert payload(cc.stc(ratio=0.1)).indices.dtype == jnp.int32
