"""Bad input gets a one-line ValueError naming the valid choices or range; k >= d is the identity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R

import cconv.compressors as cc
import cconv.memory as mem

SPARSIFIERS = ["randomk", "topk", "dgc", "stc", "threshold"]


def make(name, **hp):
    if name == "threshold":
        hp.setdefault("tau", 0.1)
    return cc.get(name, **hp)


def one_line(excinfo):
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize("name,hp", R.CASES)
def test_bad_hyper_parameters_from_the_schema(name, hp):
    """Every Param of the schema: wrong type, a bool for a number, None when not optional,
    below low / above high / at an open bound, non-finite, a string not in the choices: a
    one-line ValueError naming the parameter; an unknown one lists the accepted ones."""
    e = cc.entry(name)
    n = R.check_bad_hparams(e, hp)
    assert n >= 3 * len(e.schema.params)


# Spot checks of the wording (the generic test above covers every parameter of every compressor).
@pytest.mark.parametrize("name", ["randomk", "topk", "threshold"])
@pytest.mark.parametrize("ratio", [0, -0.1, 1.0001, float("nan"), "0.1", True])
def test_bad_ratio(name, ratio):
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]") as e:
        make(name, ratio=ratio)
    one_line(e)


@pytest.mark.parametrize("name", ["randomk", "stc"])
@pytest.mark.parametrize("k", [0, 2.5, "4", True])
def test_bad_k(name, k):
    with pytest.raises(ValueError, match=r"k must be an integer >= 1") as e:
        make(name, k=k)
    one_line(e)


@pytest.mark.parametrize("name", [e.name for e in cc.entries() if {"ratio", "k"} <= set(e.schema.names)])
def test_ratio_and_k_together(name):
    """Every compressor whose schema has both ratio and k takes exactly one of them."""
    with pytest.raises(ValueError, match="either ratio or k"):
        cc.get(name, **{**cc.entry(name).example, "ratio": 0.1, "k": 3})


@pytest.mark.parametrize("name", ["randomk", "topk", "dgc", "stc"])
def test_size_is_required(name):
    with pytest.raises(ValueError, match=r"ratio .*\(0, 1\].* or k"):
        cc.get(name)


@pytest.mark.parametrize("levels", [0, -1, 128, 2.0, None, True])
def test_bad_levels(levels):
    with pytest.raises(ValueError, match=r"levels must be an integer in \[1, 127\]"):
        cc.qsgd(levels=levels)


@pytest.mark.parametrize("bucket", [0, -5, 1.5])
def test_bad_bucket(bucket):
    with pytest.raises(ValueError, match=r"bucket must be an integer >= 1"):
        cc.qsgd(bucket=bucket)


@pytest.mark.parametrize("rank", [0, -2, 1.0, None])
def test_bad_rank(rank):
    with pytest.raises(ValueError, match=r"rank must be an integer >= 1"):
        cc.get("powersgd", rank=rank)


@pytest.mark.parametrize(
    "hp,match",
    [
        ({}, r"tau .* must be a number >= 0"),
        ({"tau": -1.0}, r"tau .* must be a number >= 0"),
        ({"tau": float("nan")}, r"tau .* >= 0"),
        ({"tau": "1"}, r"tau .* >= 0"),
    ],
)
def test_bad_tau(hp, match):
    with pytest.raises(ValueError, match=match):
        cc.get("threshold", **hp)


@pytest.mark.parametrize(
    "name,hp,match",
    [
        ("terngrad", {"clip": 0}, "clip must be a positive number"),
        ("terngrad", {"clip": -2.5}, "clip must be a positive number"),
        ("onebit", {"columns": 1}, "columns must be true or false"),
        ("dgc", {"ratio": 0.1, "sample_ratio": 0}, r"sample_ratio must be in \(0, 1\]"),
        ("dgc", {"ratio": 0.1, "sample_ratio": 1.5}, r"sample_ratio must be in \(0, 1\]"),
    ],
)
def test_other_hparams(name, hp, match):
    with pytest.raises(ValueError, match=match):
        cc.get(name, **hp)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as e:
        cc.get("top-k", ratio=0.1)
    one_line(e)
    assert "unknown compressor 'top-k'" in str(e.value)
    for n in cc.names():
        assert n in str(e.value)
    with pytest.raises(ValueError, match="valid names"):
        cc.hparams_of("nope")
    with pytest.raises(ValueError, match="valid names"):
        cc.get(None)


def test_unknown_hparam_lists_the_accepted_ones():
    with pytest.raises(ValueError, match=r"unknown hyper-parameter\(s\) levels; valid: ratio, k") as e:
        cc.get("topk", ratio=0.1, levels=3)
    one_line(e)
    with pytest.raises(ValueError, match=r"valid: \(none\)"):
        cc.get("signsgd", ratio=0.1)


@pytest.mark.parametrize("name,hp", R.CASES)
def test_integer_input_is_rejected(name, hp):
    s = R.subject(name, hp)
    R.check_float_input_only(s)
    ef = mem.error_feedback(s.c)
    x = jnp.ones((4, 6), jnp.int32)
    with pytest.raises(ValueError, match="floating-point"):
        ef.compress(x, ef.init(x), jax.random.PRNGKey(0))


@pytest.mark.parametrize("name,hp", [("topk", {"ratio": 0.5}), ("qsgd", {}), ("none", {})], ids=str)
def test_integer_input_message(name, hp):
    c = cc.get(name, **hp)
    x = jnp.ones((4, 6), jnp.uint8)
    with pytest.raises(ValueError, match=r"expects a floating-point array \(float32, bfloat16, float16\)"):
        c.compress(x, c.init(x), jax.random.PRNGKey(0))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
@pytest.mark.parametrize(
    "name,hp",
    [
        ("topk", {"ratio": 1.0}),
        ("topk", {"k": 12}),
        ("topk", {"k": 10**6}),
        ("randomk", {"k": 12}),
        ("randomk", {"ratio": 1.0, "scaled": False, "shared": False}),
        ("dgc", {"k": 12}),
        ("threshold", {"tau": 0.0, "k": 12}),
    ],
    ids=lambda v: str(v),
)
def test_k_at_least_d_is_identity(name, hp, shape, dtype):
    c = cc.get(name, **hp)
    x = jax.random.normal(jax.random.PRNGKey(5), shape, dtype)
    y = jax.jit(lambda x, k: c.roundtrip(x, c.init(x), k)[0])(x, jax.random.PRNGKey(1))
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(x, np.float32))
    assert c.density(shape) == 1.0


def test_ratio_float_noise_does_not_add_an_entry():
    # 0.07 * 100 = 7.000000000000001 in floating point; k must be 7, not 8.
    assert cc.topk(ratio=0.07).density((100,)) == 0.07
    assert cc.topk(ratio=0.07).wire_bytes((100,)) == 7 * 8
