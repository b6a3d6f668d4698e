"""Golomb-Rice coded positions (cconv.compressors.golomb) and the positions="golomb" option of
stc, topk and randomk: against an independent pure-Python encoder, exact decoding, the
worst-case capacity on adversarial index sets, the paper's expected code length, bit-identical
outputs to the int32 format, jit/vmap/shard_map, and bad input."""

from __future__ import annotations

import math
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cconv.compressors as cc
from cconv.compressors import bitstream as B
from cconv.compressors import golomb as G
from cconv.theory import constants as T

CODED = [
    ("stc", {"positions": "golomb"}),
    ("topk", {"positions": "golomb"}),
    ("randomk", {"positions": "golomb", "shared": False}),
]
# DGC sends a data-dependent number (<= k) of entries: the Theory estimate is an upper one
CODED_ALL = CODED + [("dgc", {"positions": "golomb"})]


def py_rice_bits(indices, d: int, k: int | None = None) -> list[int]:
    """Reference encoder, written from the paper: b* = 1 + floor(log2(ln(phi - 1) / ln(1 - k/d)))
    (0 if negative; k = len(indices) unless given), each gap i_j - i_{j-1} - 1 (i_0 = -1) as
    q = gap // 2^b zeros, a one, then the b low bits of the gap, most significant first."""
    k = len(indices) if k is None else k
    p = k / d
    b = max(0, 1 + math.floor(math.log2(math.log((math.sqrt(5) - 1) / 2) / math.log(1 - p)))) if p < 1 else 0
    out, prev = [], -1
    for i in indices:
        gap = int(i) - prev - 1
        out += [0] * (gap >> b) + [1] + [(gap >> (b - 1 - t)) & 1 for t in range(b)]
        prev = int(i)
    return out


def as_words(bits: list[int], n_words: int) -> np.ndarray:
    bits = bits + [0] * (32 * n_words - len(bits))
    return np.packbits(np.array(bits, np.uint8)).view(">u4").astype(np.uint32)


def index_sets(d: int, k: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Adversarial and random sorted index sets of k out of range(d)."""
    rng = np.random.default_rng(seed + 1000 * k + d)
    return {
        "end": np.arange(d - k, d),  # one gap of d - k: the worst case, attains the capacity
        "first": np.arange(k),  # all gaps 0
        "spread": np.linspace(0, d - 1, k).round().astype(np.int64),  # even gaps
        "random": np.sort(rng.choice(d, k, replace=False)),
        "ends": np.sort(np.r_[np.arange(k // 2), np.arange(d - (k - k // 2), d)]),  # two blocks, one long gap
    }


SIZES = [(2, 1), (10, 1), (10, 9), (100, 99), (100, 50), (1000, 10), (1000, 500), (5000, 700), (10**6, 1), (10**6, 3)]


@pytest.mark.parametrize("d,k", SIZES, ids=str)
def test_encoder_matches_a_python_golomb_rice_encoder_and_decodes_exactly(d, k):
    enc = jax.jit(lambda i: G.encode(i, d, chunk=64))
    dec = jax.jit(lambda s: G.decode(s, k, d, chunk=64))
    cap = G.capacity_bits(k, d)
    for name, idx in index_sets(d, k).items():
        idx = np.unique(idx).astype(np.int32)
        if len(idx) != k:
            continue
        s = enc(jnp.asarray(idx))
        bits = py_rice_bits(idx, d)
        assert int(s.nbits) == len(bits) <= cap, (name, int(s.nbits), cap)
        np.testing.assert_array_equal(np.asarray(s.words), as_words(bits, B.capacity_words(cap)), err_msg=name)
        got, valid = dec(s)
        np.testing.assert_array_equal(np.asarray(got), idx, err_msg=name)
        assert bool(np.all(valid)) and got.dtype == jnp.int32
        if name == "end":  # the worst case is attained: the capacity is exact
            assert int(s.nbits) == cap
        assert float(G.encoded_bytes(s, 64)) == -(-len(bits) // 8) + 4 + 4 * -(-k // 64)


@pytest.mark.slow
def test_long_zero_runs_and_the_capacity_proof_on_many_sets():
    """Unary runs far longer than a word (k = d/2 gives b = 0: a gap of d/2 zeros), and for many
    random (d, k) every adversarial set stays within k (1 + b) + ((d - k) >> b) bits."""
    d, k = 4000, 2000
    assert G.parameter(k, d) == 0
    idx = np.arange(d - k, d, dtype=np.int32)
    s = G.encode(jnp.asarray(idx), d)
    assert int(s.nbits) == k + (d - k) == G.capacity_bits(k, d)
    np.testing.assert_array_equal(np.asarray(G.decode(s, k, d)[0]), idx)
    rng = np.random.default_rng(0)
    for _ in range(12):
        d = int(rng.integers(2, 3000))
        k = int(rng.integers(1, d))
        for idx in index_sets(d, k, seed=1).values():
            bits = len(py_rice_bits(np.unique(idx), d)) if len(np.unique(idx)) == k else 0
            assert bits <= G.capacity_bits(k, d), (d, k)


def test_a_dynamic_count_codes_only_the_first_entries():
    """count <= k (traced): the padding slots take no bits, decode marks them invalid (index 0),
    and the stream fits the same capacity."""
    d, k = 3000, 40
    idx = np.sort(np.random.default_rng(3).choice(d, k, replace=False)).astype(np.int32)

    @jax.jit
    def roundtrip(i, n):
        s = G.encode(i, d, count=n)
        return s, G.decode(s, k, d)

    for n in (0, 1, 17, k):
        s, (got, valid) = roundtrip(jnp.asarray(idx), n)
        assert int(s.nbits) == len(py_rice_bits(idx[:n], d, k))  # b from k/d, not n/d
        np.testing.assert_array_equal(np.asarray(valid), np.arange(k) < n)
        np.testing.assert_array_equal(np.asarray(got), np.where(np.arange(k) < n, idx, 0))
        used = -(-n // B.CHUNK)
        assert float(G.encoded_bytes(s)) == -(-int(s.nbits) // 8) + 4 + 4 * used
        payload = G.GolombPayload(jnp.zeros((k,), jnp.float32), s)
        assert float(G.payload_encoded_bytes(payload, count=int(valid.sum()))) == 4 * n + float(G.encoded_bytes(s))


def test_mean_code_length_of_bernoulli_positions_is_the_papers():
    """Bernoulli(p) positions have Geometric(p) gaps, so a code takes b* + 1 + floor(gap / 2^b*)
    bits, floor(gap / 2^b*) geometric with P(>= m) = q^m, q = (1 - p)^(2^b*): mean
    b* + 1/(1 - q) (Sattler et al. 2019), variance q / (1 - q)^2 per code.  Mean over 40 draws
    (fixed keys) within z * the standard error.  (The capacity k is 1.3 p d, with the same b*.)"""
    d, p, draws = 40_000, 0.01, 40
    k = int(1.3 * p * d)
    b = B.rice_parameter(p)
    assert G.parameter(k, d) == b
    q = (1 - p) ** (2**b)

    @jax.jit
    @jax.vmap
    def draw(key):
        mask = jax.random.bernoulli(key, p, (d,))
        n = jnp.sum(mask, dtype=jnp.int32)
        idx = jnp.nonzero(mask, size=k, fill_value=0)[0].astype(jnp.int32)
        return G.encode(idx, d, count=n).nbits, n

    nbits, n = map(np.asarray, draw(jax.random.split(jax.random.PRNGKey(5), draws)))
    assert n.max() <= k
    mean = nbits.sum() / n.sum()
    se = math.sqrt(q / (1 - q) ** 2 / n.sum())
    z = NormalDist().inv_cdf(1 - 1e-4 / 2)
    assert abs(mean - G.expected_bits(p)) <= z * se, (mean, G.expected_bits(p), se)
    assert G.expected_bits(p) == pytest.approx(b + 1 / (1 - q))


@pytest.mark.parametrize("name,hp", CODED, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.slow
def test_theory_encoded_bytes_predict_the_mean_message(name, hp):
    """Top-k of iid N(0, 1) input (and random-k) selects a uniform k-subset: its mean encoded
    size is the paper's expectation (Theory.encoded_bytes) within z * standard error plus the
    < 1 byte of rounding nbits up to bytes.  The moved bytes are the capacity (Theory.wire_bytes)."""
    d, ratio, draws = 20_000, 0.01, 24
    c = cc.get(name, ratio=ratio, **hp)
    enc = jax.jit(jax.vmap(lambda x, key: c.encoded_bytes(c.compress(x, c.init(x), key)[0])))
    keys = jax.random.split(jax.random.PRNGKey(11), draws)
    xs = jax.random.normal(jax.random.PRNGKey(12), (draws, d))
    got = np.asarray(enc(xs, keys), np.float64)
    k, p = math.ceil(ratio * d), ratio
    b = B.rice_parameter(p)
    q = (1 - p) ** (2**b)
    se_bytes = math.sqrt(k * q / (1 - q) ** 2 / draws) / 8
    z = NormalDist().inv_cdf(1 - 1e-4 / 2)
    want = T.encoded_bytes(c, (d,))
    assert abs(got.mean() - want) <= z * se_bytes + 1.0, (got.mean(), want, se_bytes)
    assert np.all(got <= c.wire_bytes((d,))) and T.wire_bytes(c, (d,)) == c.wire_bytes((d,))


@pytest.mark.parametrize("name,hp", CODED_ALL, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize(
    "shape,dtype", [((1,), "float32"), ((7,), "bfloat16"), ((33, 17), "float32"), ((5000,), "float32")]
)
@pytest.mark.slow
def test_golomb_and_int32_positions_decompress_bit_identically(name, hp, shape, dtype):
    """The coding changes only the message: same key, same output, bit for bit; the payload
    bytes are the (static) wire bytes and the encoded bytes never exceed them."""
    plain = cc.get(name, ratio=0.05, **{**hp, "positions": "int32"})
    coded = cc.get(name, ratio=0.05, **hp)
    x = jax.random.normal(jax.random.PRNGKey(1), shape).astype(dtype)
    key = jax.random.PRNGKey(2)

    def run(c):
        return jax.jit(lambda x, k: (lambda p: (p, c.decompress(p, x), c.encoded_bytes(p)))(c.compress(x, None, k)[0]))(
            x, key
        )

    (pp, yp, ep), (pc, yc, ec) = run(plain), run(coded)
    assert yc.dtype == yp.dtype and np.array_equal(np.asarray(yc).view(np.uint8), np.asarray(yp).view(np.uint8))
    assert cc.payload_bytes(pc) == coded.wire_bytes(shape, dtype) == T.wire_bytes(coded, shape, dtype)
    assert float(ec) <= cc.payload_bytes(pc) and float(ep) == cc.payload_bytes(pp) == plain.wire_bytes(shape, dtype)
    if math.ceil(0.05 * math.prod(shape)) < math.prod(shape):  # coded positions save bytes
        assert cc.payload_bytes(pc) < cc.payload_bytes(pp) or math.prod(shape) < 64


def test_defaults_are_the_int32_format():
    for name, hp in CODED_ALL:
        hp = {k: v for k, v in hp.items() if k != "positions"}
        c = cc.get(name, ratio=0.01, **hp)
        assert c.hparams["positions"] == "int32" and c.encoded is None
        assert c.wire_bytes((10**6,)) == cc.get(name, ratio=0.01, **hp, positions="int32").wire_bytes((10**6,))
    assert cc.topk(ratio=0.01).wire_bytes((10**6,)) == 8 * 10**4  # unchanged


@pytest.mark.slow
def test_vmapped_compress_and_a_shard_map_allgather():
    """vmap over workers' tensors, and an all-gather of Golomb payloads over 2 devices in
    shard_map, decompressed and summed on every device: equal to the per-tensor roundtrips."""
    c = cc.topk(ratio=0.1, positions="golomb")
    xs = jax.random.normal(jax.random.PRNGKey(3), (2, 50))
    payloads = jax.jit(jax.vmap(lambda x: c.compress(x, None, None)[0]))(xs)
    for w in range(2):
        single = c.compress(xs[w], None, None)[0]
        jax.tree.map(lambda a, b, w=w: np.testing.assert_array_equal(np.asarray(a[w]), np.asarray(b)), payloads, single)
    mesh = jax.make_mesh((2,), ("w",), devices=jax.devices()[:2])

    def worker(x):
        payload, _ = c.compress(x[0], None, None)
        gathered = jax.tree.map(lambda a: jax.lax.all_gather(a, "w"), payload)
        return jax.vmap(lambda p: c.decompress(p, x[0]))(gathered).sum(0)[None]

    xs_sharded = jax.device_put(xs, NamedSharding(mesh, P("w")))
    out = jax.jit(jax.shard_map(worker, mesh=mesh, in_specs=P("w"), out_specs=P("w")))(xs_sharded)
    want = sum(np.asarray(c.roundtrip(xs[w], None, None)[0]) for w in range(2))
    out = np.asarray(out)
    for w in range(2):
        np.testing.assert_allclose(out[w], want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["stc", "topk", "randomk"])
def test_bad_positions_are_one_line_errors_from_the_schema(name):
    extra = {"shared": False} if name == "randomk" else {}
    for bad in ("golomb-rice", "", 32, None):
        with pytest.raises(ValueError, match=r"positions must be one of int32, golomb") as e:
            cc.get(name, ratio=0.1, positions=bad, **extra)
        assert "\n" not in str(e.value)


def test_randomk_refuses_golomb_where_no_index_travels():
    with pytest.raises(ValueError, match=r"positions='golomb' needs shared=False") as e:
        cc.randomk(ratio=0.1, positions="golomb")
    assert "\n" not in str(e.value)


def test_k_at_least_d_sends_the_dense_format():
    for name, hp in CODED_ALL:
        c = cc.get(name, k=10, **hp)
        x = jnp.arange(4.0) - 1.5
        p, _ = c.compress(x, None, jax.random.PRNGKey(0))
        assert (
            cc.payload_bytes(p)
            == c.wire_bytes((4,))
            == cc.get(name, k=10, **{**hp, "positions": "int32"}).wire_bytes((4,))
        )
        assert float(c.encoded_bytes(p)) == cc.payload_bytes(p)


@pytest.mark.slow
def test_dgc_codes_only_the_entries_it_sends():
    """DGC's coded payload carries its count; the encoded message is the count, the sent values
    and the used stream, at most the Theory estimate for k entries."""
    d, ratio = 20_000, 0.01
    c = cc.dgc(ratio=ratio, positions="golomb")
    ref = cc.dgc(ratio=ratio)
    x = jax.random.normal(jax.random.PRNGKey(3), (d,))
    p, _ = c.compress(x, c.init(x), None)
    r, _ = ref.compress(x, ref.init(x), None)
    n = int(p.count)
    assert n == int(np.count_nonzero(np.asarray(r.values))) and 0 < n <= 200
    idx, valid = G.decode(p.positions, 200, d)
    np.testing.assert_array_equal(np.asarray(idx)[:n], np.asarray(r.indices)[:n])
    assert int(np.asarray(valid).sum()) == n
    want = 4 + 4 * n + float(G.encoded_bytes(p.positions))
    assert float(c.encoded_bytes(p)) == want <= T.encoded_bytes(c, (d,)) + 1


@pytest.mark.parametrize("name", ["topk", "dgc", pytest.param("randomk", marks=pytest.mark.extended)])
@pytest.mark.slow
def test_the_engine_trains_bit_identically_with_coded_positions(name):
    """Gathered coded payloads are summed in the int32 format's one scatter of all P*k pairs
    (``Compressor.sparse``), so the training trajectory does not depend on the coding."""
    import optax
    from engine_util import loss_fn, make_batch, make_model_state, make_params

    from cconv.engine import EngineConfig, build

    extra = {"shared": False} if name == "randomk" else {}
    out = []
    for positions in ("int32", "golomb"):
        c = cc.get(name, ratio=0.2, positions=positions, **extra)
        cfg = EngineConfig(workers=4, compressor=c, memory="ef", compress_vectors=True, min_compress_size=0)
        tr = build(loss_fn, make_params(), optax.sgd(0.1), cfg, model_state=make_model_state())
        s = tr.init()
        for t in range(3):
            s, m = tr.step(s, make_batch(t), jax.random.PRNGKey(t))
        out.append((jax.tree.leaves(tr.params(s)), float(m["loss"]), float(m["bytes_encoded_sent"])))
    for a, b in zip(out[0][0], out[1][0]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert out[0][1] == out[1][1] and out[1][2] < out[0][2]
