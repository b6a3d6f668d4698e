"""QSGD's Elias-omega wire format (``qsgd(coding="elias")``, ``cconv.compressors.elias``): the
stream against an independent pure-Python encoder, exact decoding, the worst case by exhaustive
search, values bit-identical to coding="fixed", encoded sizes against Theorem 3.2, jit / vmap /
shard_map, the engine's HLO byte proof, and bad input."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import registry_cases as R
from engine_util import loss_fn, make_batch, make_model_state, make_params
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import cconv.compressors as C
from cconv.compressors import bitstream as B
from cconv.compressors import elias as E
from cconv.compressors.packing import packed_size, unpack_bits
from cconv.compressors.qsgd import code_bits

# --------------------------------------------------------------------------- reference coder


def py_omega(x: int) -> str:
    """Elias-omega (Elias 1975), written from its definition: "0"; while x > 1, prepend
    binary(x) and continue with x = bitlen(x) - 1."""
    code = "0"
    while x > 1:
        b = bin(x)[2:]
        code = b + code
        x = len(b) - 1
    return code


def py_encode(levels) -> str:
    """QSGD's message (Alistarh et al. 2017, Sec. 3.2): per nonzero, omega(gap), sign, omega(|l|)."""
    out, prev = [], -1
    for i, lv in enumerate(np.asarray(levels).reshape(-1).tolist()):
        if lv:
            out.append(py_omega(i - prev) + ("1" if lv < 0 else "0") + py_omega(abs(lv)))
            prev = i
    return "".join(out)


def as_words(bits: str, n_words: int) -> np.ndarray:
    arr = np.array([int(b) for b in bits] + [0] * (32 * n_words - len(bits)), np.uint8)
    return np.packbits(arr).view(">u4").astype(np.uint32)


@functools.cache
def _coder(d: int, cap: int, chunk: int, block: int):
    enc = jax.jit(lambda lv: E.encode(lv, cap, chunk))
    dec = jax.jit(lambda s, c: E.decode(s, c, d, chunk, block))
    return enc, dec


def roundtrip(levels, cap=None, chunk=B.CHUNK, block=64):
    levels = np.asarray(levels, np.int32)
    cap = E.worst_case_bits(levels.size, 127) if cap is None else cap
    enc, dec = _coder(levels.size, cap, chunk, block)
    stream, count = enc(levels)
    return stream, count, np.asarray(dec(stream, count))


# --------------------------------------------------------------------------- the integer code


def test_omega_code_lengths_and_small_codes():
    assert [py_omega(x) for x in (1, 2, 3, 4, 8, 16)] == ["0", "100", "110", "101000", "1110000", "10100100000"]
    for x in list(range(1, 3000)) + [2**16, 2**16 + 1, 2**30, 2**31 - 1]:
        assert E.omega_len(x) == len(py_omega(x)), x
        assert E.omega_len(x) <= 2 * x - 1  # the worst-case proof's lemma
    with pytest.raises(ValueError):
        E.omega_len(0)


@pytest.mark.parametrize("d,s", [(1, 1), (3, 2), (4, 3), (3, 8), (2, 127)])
def test_worst_case_bits_is_the_maximum_over_all_level_vectors(d, s):
    vals = range(-s, s + 1) if (2 * s + 1) ** d <= 5000 else (-s, -1, 0, 1, s, 15, 127 if s >= 127 else s)
    longest = max(len(py_encode(v)) for v in itertools.product(vals, repeat=d))
    assert longest == E.worst_case_bits(d, s)


# The fast tier (-m "not slow") keeps the (1, 1) case: the codec against the Python encoder in ~1.5 s.
@pytest.mark.parametrize(
    "chunk,block",
    [pytest.param(256, 64, marks=pytest.mark.slow), pytest.param(4, 3, marks=pytest.mark.extended), (1, 1)],
)
def test_stream_matches_the_python_encoder_and_decodes_exactly(chunk, block):
    rng = np.random.default_rng(chunk)
    d = 3000
    lv = np.where(rng.random(d) < 0.1, rng.integers(-127, 128, d), 0).astype(np.int32)
    lv[-1] = -127
    stream, count, back = roundtrip(lv, chunk=chunk, block=block)
    ref = py_encode(lv)
    assert int(count) == np.count_nonzero(lv) and int(stream.nbits) == len(ref)
    np.testing.assert_array_equal(np.asarray(stream.words), as_words(ref, len(stream.words)))
    np.testing.assert_array_equal(back, lv)


@pytest.mark.parametrize("extra", [0, 1])
@pytest.mark.slow
def test_sparse_and_dense_paths_give_the_python_stream(extra):
    d = 8192
    k = E.sparse_rows(d)
    assert k == 4096
    rng = np.random.default_rng(extra)
    lv = np.zeros(d, np.int32)
    lv[np.sort(rng.choice(d, k + extra, replace=False))] = rng.choice([-3, -1, 1, 2, 5], k + extra)
    stream, count, back = roundtrip(lv)
    ref = py_encode(lv)
    assert int(count) == k + extra and int(stream.nbits) == len(ref)
    np.testing.assert_array_equal(np.asarray(stream.words), as_words(ref, len(stream.words)))
    idx = np.flatnonzero(lv)
    code_len = [
        len(py_omega(int(g))) + 1 + len(py_omega(abs(int(v)))) for g, v in zip(np.diff(idx, prepend=-1), lv[idx])
    ]
    starts = np.concatenate([[0], np.cumsum(code_len)])
    want = np.full(B.num_chunks(d), len(ref))
    want[: -(-idx.size // B.CHUNK)] = starts[:-1][:: B.CHUNK]
    np.testing.assert_array_equal(np.asarray(stream.offsets), want)
    np.testing.assert_array_equal(back, lv)


@pytest.mark.slow
def test_decode_edge_cases():
    d = 70_000
    cases = {
        "all zero": np.zeros(d, np.int32),
        "one nonzero first": np.eye(1, d, 0, dtype=np.int32)[0] * -3,
        "one nonzero last": np.eye(1, d, d - 1, dtype=np.int32)[0] * 127,
        "gaps > 2^16": np.where(np.isin(np.arange(d), [5, 5 + 2**16 + 3, d - 2]), 2, 0).astype(np.int32),
    }
    for label, lv in cases.items():
        stream, count, back = roundtrip(lv)
        assert int(count) == np.count_nonzero(lv) and int(stream.nbits) == len(py_encode(lv)), label
        np.testing.assert_array_equal(back, lv, err_msg=label)
    full = np.where(np.arange(600) % 2 == 0, 127, -127).astype(np.int32)  # all nonzero at the longest level
    cap = E.worst_case_bits(full.size, 127)
    stream, count, back = roundtrip(full, cap=cap)
    assert int(stream.nbits) == cap and int(count) == full.size
    np.testing.assert_array_equal(back, full)


# --------------------------------------------------------------------------- the compressor


@functools.cache
def _pair(levels, bucket):
    cf = C.qsgd(levels=levels, bucket=bucket)
    ce = C.qsgd(levels=levels, bucket=bucket, coding="elias")

    @jax.jit
    def run(x, key):
        pf, pe = cf.compress(x, (), key)[0], ce.compress(x, (), key)[0]
        return pf, pe, cf.decompress(pf, x), ce.decompress(pe, x), ce.encoded_bytes(pe)

    return cf, ce, run


@pytest.mark.slow
@pytest.mark.parametrize(
    "levels,bucket,d,zero_buckets,ones",
    [
        (2, None, 20_000, (), False),
        (1, 1000, 20_000, (0, 7, 19), False),
        pytest.param(8, 512, 5000, (3,), False, marks=pytest.mark.extended),
        (2, None, 7, (), False),
        pytest.param(127, None, 300, (), False, marks=pytest.mark.extended),
        (127, None, 256, (), True),
    ],
)
def test_values_bit_identical_to_fixed_and_stream_as_the_python_encoder(levels, bucket, d, zero_buckets, ones):
    cf, ce, run = _pair(levels, bucket)
    x = np.ones(d, np.float32) if ones else np.array(jax.random.normal(jax.random.PRNGKey(d + levels), (d,)))
    for z in zero_buckets:
        x[z * bucket : (z + 1) * bucket] = 0
    for key in (jax.random.PRNGKey(0), jax.random.PRNGKey(1)):
        pf, pe, yf, ye, enc = run(jnp.asarray(x), key)
        assert np.array_equal(np.asarray(yf), np.asarray(ye))
        np.testing.assert_array_equal(np.asarray(pe.norms), np.asarray(pf.norms))
        nb, s = code_bits(levels), levels
        lv = unpack_bits(pf.codes, nb, d).astype(np.int32) - s
        ref = py_encode(lv)
        fixed = packed_size(d, nb)
        norms = 4 * pe.norms.shape[0]
        elias_bytes = -(-len(ref) // 8) + 4 + 4 * -(-np.count_nonzero(lv) // 256)
        if elias_bytes <= fixed:  # the Elias message is sent
            assert int(pe.count) == np.count_nonzero(lv) and int(pe.stream.nbits) == len(ref)
            np.testing.assert_array_equal(np.asarray(pe.stream.words), as_words(ref, len(pe.stream.words)))
            assert float(enc) == norms + 4 + elias_bytes
        else:  # the fixed codes, in the same buffer
            assert int(pe.count) == -1 and int(pe.stream.nbits) == 8 * fixed
            assert float(enc) == norms + 4 + fixed
        assert float(enc) <= C.payload_bytes(pf) + 4
        assert C.payload_bytes(pe) == ce.wire_bytes((d,)) == C.entry("qsgd").theory.wire_bytes(ce, (d,), 4)
    if (levels, d) == (2, 20_000):
        assert int(pe.count) >= 0  # this case exercises the Elias path
    if (levels, d) == (2, 7) or ones:
        assert int(pe.count) == -1  # and these the fallback (levels ~ 8 everywhere: 9-bit codes > 8)


@pytest.mark.slow
def test_unbiased_as_fixed_over_many_keys():
    cf, ce, _ = _pair(2, 6)
    x = jnp.asarray(R.X.reshape(-1), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(5), 4000)
    ye = jax.jit(jax.vmap(lambda k: ce.roundtrip(x, (), k)[0]))(keys)
    yf = jax.jit(jax.vmap(lambda k: cf.roundtrip(x, (), k)[0]))(keys)
    assert np.array_equal(np.asarray(ye), np.asarray(yf))
    ok, worst = R.mean_ok(np.asarray(ye, np.float64), R.X.reshape(-1))
    assert ok, worst


GAUSS = [(1, 10**5), (2, 10**5), (4, 10**5), (2, 10**4)]


@pytest.mark.slow
@pytest.mark.parametrize("levels,d", GAUSS)
def test_mean_encoded_size_on_gaussian_input_is_below_theorem_3_2(levels, d):
    """Mean over 16 fixed keys (inputs and rounding) of the encoded bytes against Theorem 3.2's
    bound (o(1) = 0, so the paper's form exactly) and against the fixed format."""
    ce = C.qsgd(levels=levels, coding="elias")
    n = 16
    xs = jax.random.normal(jax.random.PRNGKey(levels), (n, d))
    keys = jax.random.split(jax.random.PRNGKey(d), n)
    enc = np.asarray(jax.jit(jax.vmap(lambda x, k: ce.encoded_bytes(ce.compress(x, (), k)[0])))(xs, keys))
    bound = C.entry("qsgd").theory.encoded_bytes(ce, (d,), 4)
    fixed = C.qsgd(levels=levels).wire_bytes((d,))
    se = enc.std(ddof=1) / math.sqrt(n)
    print(f"s={levels} d={d}: encoded {enc.mean():.0f} B (se {se:.1f}), Theorem 3.2 {bound:.0f} B, fixed {fixed} B")
    assert enc.mean() + R.z_for(1) * se < bound
    assert enc.mean() < fixed / 10  # far below the fixed format at small s and large d
    assert enc.mean() > 0.5 * bound  # and the bound is not vacuous here


@pytest.mark.slow
def test_vmap_mixed_paths_and_shard_map():
    _, ce, _ = _pair(127, None)
    d = 256
    x = jnp.stack([jnp.zeros((d,)).at[::50].set(1.0), jnp.ones((d,))])  # Elias / fallback
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    one = jax.jit(lambda x, k: ce.roundtrip(x, (), k)[0])
    pay = jax.jit(jax.vmap(lambda x, k: ce.compress(x, (), k)[0]))(x, keys)
    assert int(pay.count[0]) >= 0 and int(pay.count[1]) == -1
    batched = jax.jit(jax.vmap(lambda x, k: ce.roundtrip(x, (), k)[0]))(x, keys)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(one(x[i], keys[i])))
    mesh = Mesh(np.array(jax.devices()[:2]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_shard(x, k):
        return ce.roundtrip(x[0], (), k[0])[0][None]

    sharded = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(P("w"), P("w")), out_specs=P("w")))(x, keys)
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(batched))


@pytest.mark.slow
def test_engine_hlo_bytes_equal_logged_bytes():
    from cconv.comm import hlo
    from cconv.engine import EngineConfig, build

    workers = 4
    cfg = EngineConfig(workers=workers, compressor=C.qsgd(levels=2, coding="elias"))
    tr = build(loss_fn, make_params(), optax.sgd(0.1), cfg, model_state=make_model_state())
    state = tr.init()
    batch, key = make_batch(0), jax.random.PRNGKey(0)
    compiled = tr.lower(state, batch, key).compile()
    h_sent, h_recv = hlo.per_device_traffic(compiled.as_text(), workers)
    sent, recv = tr.traffic(0, control=True)
    np.testing.assert_allclose(h_sent, sent, rtol=1e-9)
    np.testing.assert_allclose(h_recv, recv, rtol=1e-9)
    _, metrics = compiled(state.worker(), batch, key)
    assert float(metrics["bytes_sent"]) + float(metrics["bytes_control"]) == pytest.approx(h_sent[0], rel=1e-6)


def test_theory_and_defaults():
    e = C.entry("qsgd")
    cf, ce = C.qsgd(), C.qsgd(levels=8, bucket=512, coding="elias")
    assert cf.hparams["coding"] == "fixed" and cf.encoded is None and not cf.variable_length
    assert ce.variable_length
    for shape in ((1,), (7,), (1000,), (33, 17), (10**6,)):
        d = math.prod(shape)
        assert e.theory.encoded_bytes(cf, shape, 4) == cf.wire_bytes(shape) == packed_size(d, 5) + 4
        nb = -(-d // 512)
        sizes = [512] * (nb - 1) + [d - 512 * (nb - 1)]
        want = sum((3 + 1.5 * math.log2(2 * (64 + n) / (8 * (8 + n**0.5)))) * 8 * (8 + n**0.5) + 32 for n in sizes) / 8
        assert e.theory.encoded_bytes(ce, shape, 4) == pytest.approx(want, rel=1e-12)
        assert ce.wire_bytes(shape) == 4 * nb + 4 + B.stream_bytes(8 * packed_size(d, 5), d)
    # moved bytes: the fixed format's plus the count, bit count, spare word and chunk index
    assert C.qsgd(levels=2, coding="elias").wire_bytes((10**6,)) / C.qsgd(levels=2).wire_bytes((10**6,)) < 1.045


def test_unknown_coding_is_a_one_line_error():
    for bad in ("huffman", 3, None):
        with pytest.raises(ValueError) as e:
            C.qsgd(coding=bad)
        msg = str(e.value)
        assert "\n" not in msg and "coding" in msg and "fixed, elias" in msg, msg
    with pytest.raises(ValueError, match="too large"):
        jax.eval_shape(lambda lv: E.encode(lv, 8), jax.ShapeDtypeStruct((2**27,), jnp.int32))
