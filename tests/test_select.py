"""cconv.compressors.select: exact top-k (native CPU kernel vs lax.top_k) and random k-subsets."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cconv import _native
from cconv.compressors import select

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _ref_set(x, k):
    return np.sort(np.asarray(select.topk_indices_reference(x, k)), axis=-1)


def _topk(x, k):
    got = np.asarray(jax.jit(select.topk_indices, static_argnums=1)(x, k))
    assert got.dtype == np.int32 and got.shape == x.shape[:-1] + (k,)
    return got


def _check(x, k):
    got = _topk(x, k)
    np.testing.assert_array_equal(got, _ref_set(x, k))  # same set; ours is ascending
    return got


def test_native_kernel_is_built_here():
    # This machine has a C++ compiler, so the fast path must be the one under test.
    assert _native.compiler() is not None
    assert select.native_available(), _native.error()


CASES = [
    (jnp.float32, d, k)
    for d, k in [(1, 1), (2, 1), (7, 3), (100, 1), (100, 99), (70_001, 700), (300_000, 3), (300_000, 150_000)]
]
CASES += [(dt, d, k) for dt in (jnp.bfloat16, jnp.float16) for d, k in [(7, 3), (200_000, 2_000)]]


@pytest.mark.parametrize("dtype,d,k", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_topk_equals_reference(dtype, d, k):
    x = jax.random.normal(jax.random.PRNGKey(d + k), (d,)).astype(dtype)
    _check(x, k)


def test_k_zero_and_k_equals_d():
    x = jnp.arange(5.0)
    assert select.topk_indices(x, 0).shape == (0,)
    np.testing.assert_array_equal(select.topk_indices(x, 5), np.arange(5))
    assert select.topk_indices(jnp.zeros((0,)), 0).shape == (0,)


def test_ties_go_to_the_lowest_index():
    x = jnp.tile(jnp.array([1.0, -1.0]), 50_000)  # all magnitudes equal
    np.testing.assert_array_equal(_check(x, 1234), np.arange(1234))
    # many ties exactly at the k-th magnitude (quantised values), large enough for sampling
    q = jnp.round(jax.random.normal(jax.random.PRNGKey(1), (200_003,)) * 2) / 2
    _check(q, 20_000)
    z = jnp.zeros((100_000,)).at[jnp.array([5, 99_000])].set(jnp.array([-0.0, 3.0]))
    np.testing.assert_array_equal(_check(z, 3), [0, 1, 99_000])  # -0 == +0, lowest index first


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_nonfinite_and_subnormal_order(dtype):
    tiny = float(jnp.finfo(dtype).smallest_subnormal)
    special = np.array([1.0, np.nan, -np.inf, 2.0, -np.nan, np.inf, 0.0, -0.0, tiny, -tiny], np.float32)
    x = jnp.zeros((80_000,), dtype).at[jnp.arange(0, 80_000, 8_000)].set(jnp.asarray(special, dtype))
    got = _check(x, 6)
    # NaN > inf > finite: the two NaNs, the two infs, then 2 and 1.
    np.testing.assert_array_equal(got, np.arange(0, 48_000, 8_000))
    # Subnormals rank above zeros (no flush to zero), then the zeros' lowest indices.  Stated, not
    # compared with lax.top_k: XLA on a CPU with AVX512-BF16 (seen here) flushes bfloat16 subnormals
    # to zero in its comparisons, so its order there is not the reference for this case.
    np.testing.assert_array_equal(_topk(x, 10), [0, 1, 2, 8_000, 16_000, 24_000, 32_000, 40_000, 64_000, 72_000])


def test_nan_payloads_order_like_xla():
    bits = np.array([0x7FC00000, 0x7FC00005, 0xFFC00009, 0x7F800000, 0x7FC00001], np.uint32)
    x = jnp.concatenate([jnp.asarray(bits.view(np.float32)), jnp.ones((99_995,))])
    np.testing.assert_array_equal(_check(x, 2), [1, 2])


def test_sample_missing_the_tail_still_exact():
    # The strided sample sees only large values: the first thresholds admit fewer than k
    # entries, forcing the rescan path; the result must still be exact.
    d = 300_000
    stride = d // 4096  # the kernel's sample size (kSample in cconv/_native/select.cc)
    x = jax.random.normal(jax.random.PRNGKey(0), (d,)) * 0.1
    hot = stride // 2 + stride * np.arange(3000)
    x = x.at[hot].set(10.0 + jnp.arange(3000.0))
    _check(x, 5000)
    # and a sorted ramp (no structure the sample can exploit)
    _check(jnp.linspace(-1.0, 1.0, 100_001), 777)


def test_batched_vmap_and_2d():
    xb = jax.random.normal(jax.random.PRNGKey(3), (3, 4, 70_000))
    _check(xb, 50)
    got = jax.jit(jax.vmap(lambda v: select.topk_indices(v, 50)))(xb.reshape(12, -1))
    np.testing.assert_array_equal(np.asarray(got), _ref_set(xb.reshape(12, -1), 50))


@pytest.mark.slow
def test_inside_shard_map_on_8_devices():
    mesh = jax.make_mesh((8,), ("w",))
    x = jax.device_put(jax.random.normal(jax.random.PRNGKey(4), (8, 10_000)), jax.NamedSharding(mesh, jax.P("w")))
    f = jax.jit(
        jax.shard_map(lambda v: select.topk_indices(v, 10), mesh=mesh, in_specs=jax.P("w"), out_specs=jax.P("w"))
    )
    np.testing.assert_array_equal(np.asarray(f(x)), _ref_set(x, 10))
    # vmapped seeds over a shard_map'd step (and the unchecked variant the engine may use)
    xs = jnp.stack([x, -2 * x])
    g = jax.jit(
        jax.vmap(
            jax.shard_map(
                lambda v: select.topk_indices(v, 10),
                mesh=mesh,
                in_specs=jax.P("w"),
                out_specs=jax.P("w"),
                check_vma=False,
            )
        )
    )
    np.testing.assert_array_equal(np.asarray(g(xs)), _ref_set(xs, 10))
    h = jax.jit(
        jax.shard_map(
            jax.vmap(lambda v: select.topk_indices(v, 10)),
            mesh=mesh,
            in_specs=jax.P(None, "w"),
            out_specs=jax.P(None, "w"),
        )
    )
    np.testing.assert_array_equal(np.asarray(h(xs)), _ref_set(xs, 10))


_TOPK10 = jax.jit(lambda v: select.topk_indices(v, 10))
_X1000 = jax.ShapeDtypeStruct((1000,), jnp.float32)
_ALLOW_KERNEL = [jax.export.DisabledSafetyCheck.custom_call(_native.TOPK_TARGET)]


@pytest.mark.parametrize("platform", ["cuda", "rocm", "tpu"])
def test_gpu_and_tpu_lowerings_use_lax_top_k(platform):
    # One jitted function serves every platform: the path is picked per platform when the
    # program is lowered (lax.platform_dependent), so lowered for CUDA / ROCm / TPU it holds no
    # CPU-only custom call and needs no device to check; no error is caught at run time.
    text = jax.export.export(_TOPK10, platforms=[platform])(_X1000).mlir_module()
    assert _native.TOPK_TARGET not in text and "chlo.top_k" in text


def test_cpu_lowering_calls_the_kernel():
    assert _native.available()  # this machine has a compiler (test_native_kernel_is_built_here)
    text = jax.export.export(_TOPK10, platforms=["cpu"], disabled_checks=_ALLOW_KERNEL)(_X1000).mlir_module()
    assert text.count(f"custom_call @{_native.TOPK_TARGET}(") == 1 and "chlo.top_k" not in text


def test_multi_platform_export_keeps_the_kernel_in_the_cpu_branch():
    # Exporting for CPU and CUDA together lowers both paths into one module; jax refuses a custom
    # call without a compatibility guarantee unless told, and then the kernel sits in the
    # CPU branch of the platform switch only (the CUDA branch is lax.top_k).
    with pytest.raises(ValueError, match="custom calls"):
        jax.export.export(_TOPK10, platforms=["cpu", "cuda"])(_X1000)
    exp = jax.export.export(_TOPK10, platforms=["cpu", "cuda"], disabled_checks=_ALLOW_KERNEL)(_X1000)
    text = exp.mlir_module()
    main = text[text.index("func.func public @main") :]
    switch = main[main.rindex('"stablehlo.case"') :]  # the last case picks the top-k path
    cpu_branch, cuda_branch = switch.split("}, {", 1)
    assert _native.TOPK_TARGET in cpu_branch and "chlo.top_k" not in cpu_branch
    assert _native.TOPK_TARGET not in cuda_branch and "chlo.top_k" in cuda_branch
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(7), (1000,)))
    np.testing.assert_array_equal(np.asarray(exp.call(x)), _ref_set(x, 10))  # runs on CPU


def test_integer_input_uses_the_reference():
    x = jnp.array([3, -7, 1, 5], jnp.int32)
    np.testing.assert_array_equal(select.topk_indices(x, 2), [1, 3])


@pytest.mark.parametrize("k", [-1, 6, 2.0, True, None])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k must"):
        select.topk_indices(jnp.ones(5), k)


def test_scalar_input_rejected():
    with pytest.raises(ValueError, match="at least one dimension"):
        select.topk_indices(jnp.ones(()), 1)


# ----------------------------------------------------------------------------- sample_k_distinct


@pytest.mark.parametrize("d,k", [(1, 1), (1, 0), (50, 50), (10, 9), (10**6, 10**4)])
@pytest.mark.slow
def test_sample_k_distinct_is_a_sorted_k_subset(d, k):
    idx = np.asarray(jax.jit(select.sample_k_distinct, static_argnums=(1, 2))(jax.random.PRNGKey(7), d, k))
    assert idx.dtype == np.int32 and idx.shape == (k,)
    assert np.all(np.diff(idx) > 0) and (k == 0 or (idx[0] >= 0 and idx[-1] < d))


@pytest.mark.slow
def test_sample_k_distinct_subsets_are_uniform():
    # d = 5, k = 2: each of the 10 subsets has probability 1/10.  n = 20000 fixed keys:
    # count ~ Binomial(n, 0.1), sd = sqrt(n * 0.1 * 0.9) = 42.4; allow 5 sd.
    n = 20_000
    keys = jax.random.split(jax.random.PRNGKey(11), n)
    idx = np.asarray(jax.jit(jax.vmap(lambda kk: select.sample_k_distinct(kk, 5, 2)))(keys))
    codes = idx[:, 0] * 5 + idx[:, 1]
    counts = np.array([np.sum(codes == a * 5 + b) for a, b in itertools.combinations(range(5), 2)])
    assert counts.sum() == n
    assert np.max(np.abs(counts - n / 10)) < 5 * math.sqrt(n * 0.1 * 0.9), counts


@pytest.mark.slow
def test_sample_k_distinct_inclusion_is_uniform_on_a_larger_domain():
    # d = 400, k = 20: each index is included with probability 0.05.  Over n = 2000 keys the
    # count per index ~ Binomial(n, 0.05), sd = 9.7; with 400 indices allow 5 sd on the max.
    n, d, k = 2000, 400, 20
    keys = jax.random.split(jax.random.PRNGKey(12), n)
    idx = np.asarray(jax.jit(jax.vmap(lambda kk: select.sample_k_distinct(kk, d, k)))(keys))
    counts = np.bincount(idx.reshape(-1), minlength=d)
    sd = math.sqrt(n * 0.05 * 0.95)
    assert counts.sum() == n * k
    assert np.max(np.abs(counts - n * 0.05)) < 5 * sd
    # the first and last positions are not favoured (the gap process starts at 0, ends at d)
    assert abs(counts[:50].mean() - counts[-50:].mean()) < 5 * sd / math.sqrt(25)


@pytest.mark.slow
def test_sample_k_distinct_determinism_and_typed_keys():
    f = jax.jit(select.sample_k_distinct, static_argnums=(1, 2))
    a = np.asarray(f(jax.random.PRNGKey(1), 1000, 30))
    np.testing.assert_array_equal(a, np.asarray(f(jax.random.PRNGKey(1), 1000, 30)))
    assert not np.array_equal(a, np.asarray(f(jax.random.PRNGKey(2), 1000, 30)))
    typed = np.asarray(jax.random.key_data(jax.random.wrap_key_data(jax.random.PRNGKey(1))))
    typed = np.asarray(f(jax.random.wrap_key_data(typed), 1000, 30))
    np.testing.assert_array_equal(a, typed)


@pytest.mark.slow
def test_sample_k_distinct_with_per_worker_keys_in_shard_map():
    mesh = jax.make_mesh((8,), ("w",))
    keys = jax.device_put(jax.random.split(jax.random.PRNGKey(5), 8), jax.NamedSharding(mesh, jax.P("w")))
    f = jax.jit(
        jax.shard_map(
            lambda kk: select.sample_k_distinct(kk[0], 1000, 17)[None],
            mesh=mesh,
            in_specs=jax.P("w"),
            out_specs=jax.P("w"),
        )
    )
    got = np.asarray(f(keys))
    want = np.asarray(jax.jit(jax.vmap(lambda kk: select.sample_k_distinct(kk, 1000, 17)))(np.asarray(keys)))
    np.testing.assert_array_equal(got, want)
    assert len({tuple(r) for r in got}) == 8


@pytest.mark.parametrize("d,k", [(5, 6), (5, -1), (-1, 0), (2**30, 1), (5.0, 1)])
def test_sample_k_distinct_bad_args(d, k):
    with pytest.raises(ValueError, match="must be"):
        select.sample_k_distinct(jax.random.PRNGKey(0), d, k)
