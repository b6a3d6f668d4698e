"""The generic compressor tests' shared source: every registered compressor with its entry's
``example`` and the further cases ``tests/compressor_cases.py`` lists for it, subsets by
*declared* property, and the checks themselves as plain functions.

A compressor is covered by every generic test the moment it is registered: the test files
parametrize over ``CASES`` (or a subset below) and call ``check_*`` on a ``Subject``.  Nothing
here names a compressor.  The checks are plain functions so that a test can run them on a
test-local ``Entry`` that is never registered (``tests/test_compressors.py``), and on broken
compressors to show that each check can fail.

Subsets (decided at collection time from what the entry and the built compressor declare; a
compressor is tested for the claims it makes, ``claims``):

    UNBIASED      ``c.unbiased``
    SUMMABLE      ``c.summable`` (its aggregation's algebra is SUM: payloads add up)
    WITH_WIRE_FORMULA  its ``Theory`` gives ``wire_bytes``
    WITH_BOUND    its ``Theory`` gives a worst-case ``bound``
    WITH_ERROR    its ``Theory`` gives the exact error term ``error_sq`` (``WITH_THEORY``: the same)
    CONTRACTIVE   its theory bound at ``PROBE_SHAPE`` is "contractive" with delta > 0

Cases are each entry's ``example`` (``{}``: its defaults) and its further cases
(``compressor_cases.FURTHER``, keyed by registered name), lazily built: a case that does not build
(a required hyper-parameter the entry's ``example`` omits) is still collected in ``CASES`` and its tests fail
with the build's one-line error; it is in no subset.  Test ids start with the compressor's
name, so ``pytest -k NAME`` selects all of its registry-parametrized tests.

Whether a compressor is random is detected, not declared: two keys give different payloads
(``Subject.is_random``).

Statistics (as in ``DEVELOPERS.md``): fixed keys, so every test is deterministic; Monte-Carlo
bounds are ``z * standard error`` with z the two-sided normal quantile at family-wise rate ALPHA,
Bonferroni over the coordinates tested together.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping
from statistics import NormalDist
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compressor_cases import FURTHER

import cconv.comm.aggregation  # noqa: F401  (registers the built-in aggregation methods)
import cconv.compressors as cc
import cconv.memory as mem
from cconv.compressors import Compressor, Entry, Theory, payload_bytes


@contextlib.contextmanager
def registries_restored():
    """Run a block that registers compressors, aggregations, schedules or run-config optimizers from user code (the
    extension tests, the docs' examples) and put every registry back as it was afterwards, so
    that what one test registers never changes what the next one enumerates."""
    from cconv.compressors import base, registry
    from cconv.engine import optimizers
    from cconv.theory.schedule import schedules

    saved = [(d, dict(d)) for d in (registry._REGISTRY, base.AGGREGATIONS, schedules.SCHEDULES, optimizers.OPTIMIZERS)]
    try:
        yield
    finally:
        for d, before in saved:
            d.clear()
            d.update(before)


KEY1, KEY2 = jax.random.PRNGKey(7), jax.random.PRNGKey(8)
F32, BF16, F16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)
EPS = {F32: 2.0**-23, BF16: 2.0**-7, F16: 2.0**-10}
# Real runs, one compiled program per case: 0-d, (1,), odd, 2-D, 3-D in float32, and half
# precision where the compressor accepts it.  Dropped dtypes are the ones the compressor rejects
# with a ValueError at trace time (float32 must be accepted).
CONTRACT_INPUTS = (((), F32), ((1,), F32), ((7,), F32), ((3, 5), F32), ((2, 3, 4), F32), ((7,), BF16), ((3, 5), F16))
# The error-feedback step runs on these (fewer programs to compile for costly compressors).
EF_INPUTS = (((), F32), ((2, 3, 4), F32), ((7,), BF16))
# Byte counts only (traced with jax.eval_shape, never run).
STATIC_SHAPES = ((8,), (9,), (1, 1), (4, 1), (33, 17), (2, 1, 3), (1000,), (64, 64), (3, 4, 5, 2))
# Monte Carlo / probe inputs: 12 entries (one zero, a range of magnitudes) as a 3 x 4 matrix,
# so matrix compressors compress it too.
PROBE_SHAPE = (3, 4)
X = np.array([3.0, -1.0, 0.5, 0.0, -2.5, 0.1, 1.7, -0.3, 4.0, -0.05, 0.8, 2.2]).reshape(PROBE_SHAPE)
N_MC = 10_000
ALPHA = 1e-4


def z_for(m: int) -> float:
    """Two-sided normal quantile at family-wise rate ALPHA, Bonferroni over m tests."""
    return NormalDist().inv_cdf(1 - ALPHA / (2 * m))


def f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


def sq(a) -> float:
    return float(np.sum(f64(a) ** 2))


def hp_key(hp: dict) -> tuple:
    return tuple(sorted(hp.items()))


def case_id(name: str, hp: dict) -> str:
    return name + ("-" + ",".join(f"{k}={v}" for k, v in sorted(hp.items())) if hp else "")


# --------------------------------------------------------------------------- theory


def theory_of(entry: Entry) -> Theory | None:
    """The entry's Theory oracle (None: "no constant", the theory checks do not apply)."""
    return entry.theory


# --------------------------------------------------------------------------- the subject


class Result(NamedTuple):
    """One compiled contract program's outputs for one input (numpy / pytrees of numpy)."""

    payload: Any
    y: np.ndarray  # decompress(payload, ShapeDtypeStruct)
    sent: np.ndarray | None  # error feedback (EF_INPUTS only): decompress of C(x + e)
    residual: np.ndarray | None  # error feedback: the new residual


class Subject:
    """A built compressor, its theory and its compiled programs (compiled once, lazily)."""

    def __init__(self, c: Compressor, theory: Theory | None, entry: Entry | None = None):
        self.c, self.theory, self.entry = c, theory, entry
        self._mc: dict = {}

    def with_theory(self, theory: Theory | None) -> Subject:
        """The same compressor (and its compiled programs and samples) with another theory."""
        other = Subject(self.c, theory, self.entry)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("theory",)})
        other.theory = theory
        return other

    def __repr__(self) -> str:
        return f"Subject({self.c.name}, {self.c.hparams})"

    # -- which inputs ------------------------------------------------------------------

    def accepts(self, dtype) -> bool:
        """The compressor accepts this floating dtype (a ValueError at trace time: it does not)."""
        c = self.c
        x = jax.ShapeDtypeStruct((7,), dtype)
        try:
            jax.eval_shape(lambda x, k: c.compress(x, c.init(x), k)[0], x, KEY1)
        except ValueError:
            if jnp.dtype(dtype) == F32:
                raise
            return False
        return True

    @functools.cached_property
    def inputs(self) -> tuple:
        ok = {d: self.accepts(d) for d in (F32, BF16, F16)}
        return tuple((s, d) for s, d in CONTRACT_INPUTS if ok[d])

    def data(self, seed: int = 0) -> tuple[list, list]:
        """Inputs x and residuals e (normal, with a few exact zeros), in each input's dtype."""
        rng = np.random.default_rng(seed)
        xs, es = [], []
        for shape, dtype in self.inputs:
            x = rng.standard_normal(shape)
            if x.size > 2:
                x.reshape(-1)[::3] = 0.0
            xs.append(jnp.asarray(x, dtype))
            es.append(jnp.asarray(0.5 * rng.standard_normal(shape), dtype))
        return xs, es

    # -- compiled programs ---------------------------------------------------------------

    @functools.cached_property
    def contract_program(self) -> Callable:
        """One jitted program: for every input, the payload, C(x) and one error-feedback step
        from residual e; plus vmap over two examples (the (3, 5) input twice, keys k1, k2)."""
        c = self.c
        ef = mem.error_feedback(c)
        like = [jax.ShapeDtypeStruct(s, d) for s, d in self.inputs]
        vi = self.inputs.index(((3, 5), F32))

        with_ef = [inp in EF_INPUTS for inp in self.inputs]

        @jax.jit
        def run(xs, es, key, key2):
            out = []
            for x, e, lk, do_ef in zip(xs, es, like, with_ef):
                payload, _ = c.compress(x, c.init(x), key)
                y = c.decompress(payload, lk)
                sent = residual = None
                if do_ef:
                    ef_payload, ef_state = ef.compress(x, ef.init(x)._replace(residual=e), key)
                    sent, residual = ef.decompress(ef_payload, x), ef_state.residual
                out.append((payload, y, sent, residual))
            pair = jnp.stack([xs[vi], xs[vi]])
            batched = jax.vmap(lambda x, k: c.roundtrip(x, c.init(x), k)[0])(pair, jnp.stack([key, key2]))
            return out, batched

        return run

    def _run(self, seed: int, key, zero: bool = False):
        xs, es = self.data(seed)
        if zero:
            xs, es = [jnp.zeros_like(x) for x in xs], [jnp.zeros_like(e) for e in es]
        out, batched = jax.device_get(self.contract_program(xs, es, key, KEY2))
        return [f64(x) for x in xs], [f64(e) for e in es], [Result(*o) for o in out], batched

    @functools.cached_property
    def runs(self) -> dict:
        """The contract program at KEY1 (twice), KEY2 and on zeros."""
        return {
            "a": self._run(0, KEY1),
            "again": self._run(0, KEY1),
            "b": self._run(0, KEY2),
            "zero": self._run(0, KEY1, zero=True),
        }

    @functools.cached_property
    def is_random(self) -> bool:
        """Two keys give different payloads for some input (detected, not declared).  Tried
        first on the probes through the small batch program (cheap to compile); only when those
        outputs agree is the whole contract program compiled and its payloads compared."""
        probes = list(self.probes().values())
        if not np.array_equal(self.roundtrips(probes, KEY1), self.roundtrips(probes, KEY2), equal_nan=True):
            return True
        a, b = self.runs["a"][2], self.runs["b"][2]
        return not all(_leaves_equal(r.payload, s.payload) for r, s in zip(a, b))

    @functools.cached_property
    def batch_program(self) -> Callable:
        """jit(vmap(roundtrip)) over N_MC (x, key) pairs of PROBE_SHAPE, float32."""
        c = self.c
        return jax.jit(jax.vmap(lambda x, k: c.roundtrip(x, c.init(x), k)[0]))

    def samples(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        """(N_MC, *PROBE_SHAPE) float64 samples of C(x) over N_MC fixed keys."""
        key = (f64(x).tobytes(), seed)
        if key not in self._mc:
            xs = jnp.broadcast_to(jnp.asarray(x, jnp.float32), (N_MC, *PROBE_SHAPE))
            keys = jax.random.split(jax.random.PRNGKey(seed), N_MC)
            self._mc[key] = f64(self.batch_program(xs, keys))
        return self._mc[key]

    def roundtrips(self, xs: list[np.ndarray], key=KEY1) -> np.ndarray:
        """C(x) for a few PROBE_SHAPE inputs with one key (through the same compiled program)."""
        pad = N_MC - len(xs)
        stack = np.concatenate([np.stack(xs), np.zeros((pad, *PROBE_SHAPE))]).astype(np.float32)
        keys = jnp.broadcast_to(key, (N_MC, *key.shape))
        return f64(self.batch_program(jnp.asarray(stack), keys))[: len(xs)]

    def probes(self) -> dict[str, np.ndarray]:
        """Deterministic probe inputs of PROBE_SHAPE (float32-representable values)."""
        rng = np.random.default_rng(1)
        out = {
            "mc": X,
            "heavy": rng.standard_t(1.5, PROBE_SHAPE),
            "sparse": np.where(rng.random(PROBE_SHAPE) < 0.25, rng.standard_normal(PROBE_SHAPE), 0.0),
            "ties": np.where(np.arange(12).reshape(PROBE_SHAPE) % 2 == 0, 0.37, -0.37),
            "one": np.eye(1, 12).reshape(PROBE_SHAPE),
        }
        worst = self.worst_case(PROBE_SHAPE)
        if worst is not None:
            out["worst"] = worst
        return {k: f64(np.asarray(v, np.float32)) for k, v in out.items()}

    def worst_case(self, shape) -> np.ndarray | None:
        if self.theory is None or self.theory.worst_case is None:
            return None
        try:
            w = self.theory.worst_case(self.c, shape)
        except ValueError:  # a supremum, not attained
            return None
        return None if w is None else f64(w).reshape(shape)

    def bound(self, shape):
        """The theory's worst-case Bound, or None where the entry claims none."""
        if self.theory is None or self.theory.bound is None:
            return None
        return self.theory.bound(self.c, tuple(shape))


@functools.cache
def _subject(name: str, hpk: tuple) -> Subject:
    e = cc.entry(name)
    return Subject(cc.get(name, **dict(hpk)), theory_of(e), e)


def subject(name: str, hp: dict) -> Subject:
    """The (cached) subject of a registered case."""
    return _subject(name, hp_key(hp))


def local_subject(entry: Entry, hp: dict, name: str = "local") -> Subject:
    """A subject for an Entry that is not registered (tests of the checks themselves); entries
    with the same factory share compiled programs (only their theory may differ)."""
    entry = entry._replace(name=name)
    key = (entry.factory, name, hp_key(hp))
    if key not in _LOCAL:
        _LOCAL[key] = Subject(entry.build(**hp), None, entry._replace(theory=None))
    return _LOCAL[key].with_theory(entry.theory)


_LOCAL: dict = {}


def _leaves_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(u), np.asarray(v), equal_nan=True) for u, v in zip(la, lb)
    )


def _layout(payload) -> tuple:
    return tuple((tuple(leaf.shape), str(leaf.dtype)) for leaf in jax.tree.leaves(payload))


# --------------------------------------------------------------------------- cases


def _builds(name: str, hp: dict) -> Subject | None:
    """The case's subject, or None when the case does not build (a one-line ValueError)."""
    try:
        return subject(name, hp)
    except ValueError:
        return None


def cases(
    pred: Callable[[Subject], bool] | None = None,
    names: list[str] | None = None,
    further: Mapping[str, tuple[dict, ...]] = FURTHER,
) -> list:
    """pytest params (name, hp) of every registered compressor's cases (or those of ``names``):
    its entry's ``example``, then ``further[name]``; optionally those whose subject satisfies
    ``pred`` (evaluated at collection: only static, declared properties; a case that does not
    build is in ``CASES`` only, where its tests fail with the build error).  An entry's first
    selected case runs in the fast subset; its further cases are marked ``slow`` and ``extended``
    (outside the README/CI command: the options they exercise have their own test modules, e.g.
    tests/test_golomb.py, tests/test_qsgd_elias.py)."""
    out = []
    for e in cc.entries() if names is None else [cc.entry(n) for n in names]:
        first = True
        for hp in (dict(e.example), *further.get(e.name, ())):
            s = _builds(e.name, hp)
            if pred is None or (s is not None and pred(s)):
                marks = () if first else (pytest.mark.slow, pytest.mark.extended)
                out.append(pytest.param(e.name, dict(hp), id=case_id(e.name, hp), marks=marks))
                first = False
    return out


def first_case(name: str) -> dict:
    """The hyper-parameters of ``name``'s example (what tables keyed by compressor use instead of
    hand-written defaults, so a required hyper-parameter is always given)."""
    return dict(cc.entry(name).example)


def _contractive(s: Subject) -> bool:
    b = s.bound(PROBE_SHAPE)
    return b is not None and b.kind == "contractive" and (b.delta or 0) > 0


def _claims_part(part: str) -> Callable[[Subject], bool]:
    return lambda s: s.theory is not None and getattr(s.theory, part) is not None


def claims(s: Subject) -> dict[str, Callable[[Subject], None]]:
    """The claims ``s`` makes by its declarations, each with the check that tests it (the
    generic checks, ``GENERIC_CHECKS``, apply to every compressor)."""
    out = {}
    if s.c.unbiased:
        out["unbiased"] = check_unbiased
    if _claims_part("error_sq")(s):
        out["exact error term (Theory.error_sq)"] = check_theory_error
    if _contractive(s):
        out["contraction (Theory.bound)"] = check_contraction
    if s.c.summable:
        out["summable payloads (algebra SUM)"] = check_summable
    return out


CASES = cases()
UNBIASED = cases(lambda s: s.c.unbiased)
SUMMABLE = cases(lambda s: s.c.summable)
WITH_WIRE_FORMULA = cases(_claims_part("wire_bytes"))
WITH_BOUND = cases(_claims_part("bound"))
WITH_ERROR = WITH_THEORY = cases(_claims_part("error_sq"))
CONTRACTIVE = cases(_contractive)


# --------------------------------------------------------------------------- checks


def check_static(s: Subject) -> None:
    """Static properties: name, aggregation, density, hparams, the memory wrapper's view."""
    c = s.c
    assert c.aggregation in cc.AGGREGATIONS
    assert c.summable == (cc.AGGREGATIONS[c.aggregation].algebra == cc.SUM)
    if s.entry is not None:
        assert c.name == s.entry.name
        assert c.aggregation == s.entry.aggregation_of(c.hparams)
        assert set(c.hparams) == set(s.entry.schema.names)
    for shape in ((10, 10), (7,), (1,)):
        assert 0 < c.density(shape) <= 1
    ef = mem.error_feedback(c)
    assert ef.wire_bytes((6, 7)) == c.wire_bytes((6, 7)) and ef.aggregation == c.aggregation
    assert not ef.unbiased


def check_contract(s: Subject) -> None:
    """decompress(compress(x)) has x's shape and dtype and is finite; zero -> exact zero (see below);
    payload layouts do not depend on the values or the key; every float dtype is accepted."""
    assert s.accepts(F32)
    # zero -> exactly zero wherever a declared property implies it: unbiased (E C(0) = 0, and
    # every unbiased method here sends 0 for 0) or a bound with delta (||C(0)||^2 <= (1 - delta) 0).
    # Otherwise only finite (signSGD's sign(0) = +1 sends ones).
    b = s.bound((7,))
    zero_to_zero = s.c.unbiased or (b is not None and b.delta is not None)
    xs, _, res, _ = s.runs["a"]
    _, _, zero, _ = s.runs["zero"]
    _, _, other, _ = s.runs["b"]
    for (shape, dtype), _x, r, z, o in zip(s.inputs, xs, res, zero, other):
        assert r.y.shape == shape and r.y.dtype == dtype, (shape, dtype, r.y.shape, r.y.dtype)
        assert np.all(np.isfinite(f64(r.y))), (shape, dtype)
        if zero_to_zero:
            assert np.all(f64(z.y) == 0), (shape, dtype)
            assert z.residual is None or np.all(f64(z.residual) == 0), (shape, dtype)
        assert np.all(np.isfinite(f64(z.y))), (shape, dtype)
        assert _layout(r.payload) == _layout(z.payload) == _layout(o.payload), (shape, dtype)
    assert s.runs["a"][2][0].y.shape == ()  # a 0-d input ran


def check_wire_bytes(s: Subject) -> None:
    """payload_bytes(payload) == c.wire_bytes(shape, dtype) == theory.wire_bytes (when the entry
    has theory): real payloads for the contract inputs, traced ones for STATIC_SHAPES."""
    c = s.c
    compress = jax.jit(lambda x, k: c.compress(x, c.init(x), k)[0])

    def expect(shape, dtype, nbytes):
        assert c.wire_bytes(shape, dtype) == nbytes, (shape, str(dtype), c.wire_bytes(shape, dtype), nbytes)
        if s.theory is not None and s.theory.wire_bytes is not None:
            got = s.theory.wire_bytes(c, tuple(shape), jnp.dtype(dtype).itemsize)
            assert got == nbytes, ("theory", shape, str(dtype), got, nbytes)

    for (shape, dtype), r in zip(s.inputs, s.runs["a"][2]):
        static = jax.eval_shape(compress, jax.ShapeDtypeStruct(shape, dtype), KEY1)
        assert _layout(static) == _layout(r.payload)
        expect(shape, dtype, payload_bytes(r.payload))
        expect(shape, dtype, payload_bytes(static))
    dtypes = sorted({d for _, d in s.inputs}, key=str)
    for i, shape in enumerate(STATIC_SHAPES):
        for dtype in dtypes if i % 3 == 0 else [F32]:
            static = jax.eval_shape(compress, jax.ShapeDtypeStruct(shape, dtype), KEY1)
            expect(shape, dtype, payload_bytes(static))


def check_determinism(s: Subject) -> None:
    """Same key -> same payload and output; deterministic compressors ignore the key."""
    a, again, b = s.runs["a"][2], s.runs["again"][2], s.runs["b"][2]
    for r, t in zip(a, again):
        assert _leaves_equal(r.payload, t.payload) and np.array_equal(r.y, t.y, equal_nan=True)
    if not s.is_random:
        assert all(np.array_equal(r.y, t.y) for r, t in zip(a, b))


def check_vmap(s: Subject) -> None:
    """vmap over two examples (same x, keys k1 and k2) equals the single-example results."""
    vi = s.inputs.index(((3, 5), F32))
    batched = f64(s.runs["a"][3])
    for i, run in enumerate(("a", "b")):
        np.testing.assert_allclose(batched[i], s.runs[run][2][vi].y, rtol=1e-6, atol=1e-6)


def check_error_feedback(s: Subject) -> None:
    """decompress(C(x + e)) + e_new == x + e (to the dtype's rounding), for every input,
    and on zeros exactly zero."""
    n = 0
    for run in ("a", "b"):
        xs, es, res, _ = s.runs[run]
        for (shape, dtype), x, e, r in zip(s.inputs, xs, es, res):
            if r.sent is None:
                continue
            n += 1
            p = x + e
            sent, new = f64(r.sent), f64(r.residual)
            assert sent.shape == new.shape == shape and r.residual.dtype == dtype
            tol = 4 * EPS[dtype] * (np.abs(p).max(initial=0) + np.abs(sent).max(initial=0)) + 1e-30
            assert np.all(np.abs(sent + new - p) <= tol), (shape, dtype, np.abs(sent + new - p).max())
    assert n >= 4


def bad_values(p) -> list:
    """Values a Param must reject: wrong type, a bool for a number, None when not optional,
    below low / above high / at an open bound, non-finite floats, a string not in choices."""
    if p.type == "any":
        return []
    out = [] if p.optional else [None]
    if p.type == "bool":
        return out + [1, "true", 0.0]
    if p.type == "str":
        return out + [3, "__not_a_choice__"] if p.choices else out + [3]
    out += [True, "1", [1]]
    if p.type == "int":
        out += [2.5, float(p.low if p.low is not None else 1)]  # floats are not ints
    else:
        out += [float("nan"), float("inf"), float("-inf")]
    step = 1 if p.type == "int" else None
    if p.low is not None:
        out += [p.low if p.low_open else (p.low - step if step else float(np.nextafter(p.low, -np.inf)))]
        out += [p.low - 10 * (1 + abs(p.low))]
    if p.high is not None:
        out += [p.high if p.high_open else (p.high + step if step else float(np.nextafter(p.high, np.inf)))]
        out += [p.high + 10 * (1 + abs(p.high))]
    return out


def check_bad_hparams(entry: Entry, base: dict) -> int:
    """Every bad value of every schema Param -> a one-line ValueError naming the parameter;
    an unknown hyper-parameter -> one that lists the accepted ones.  Returns how many values."""
    build = entry.build
    n = 0
    for p in entry.schema.params:
        for value in bad_values(p):
            with pytest.raises(ValueError) as e:
                build(**{**base, p.name: value})
            msg = str(e.value)
            assert "\n" not in msg and p.name in msg, (p.name, value, msg)
            n += 1
    with pytest.raises(ValueError) as e:
        build(**base, not_a_hyper_parameter=1)
    msg = str(e.value)
    assert "\n" not in msg and "not_a_hyper_parameter" in msg
    assert all(name in msg for name in entry.schema.names), msg
    return n


def check_float_input_only(s: Subject) -> None:
    """Integer and boolean inputs: a ValueError saying a floating-point array is expected."""
    c = s.c
    for dtype in (jnp.int32, jnp.uint8, jnp.bool_):
        x = jax.ShapeDtypeStruct((4, 6), dtype)
        with pytest.raises(ValueError, match="floating-point"):
            jax.eval_shape(lambda x: c.compress(x, c.init(x), KEY1)[0], x)


def mean_ok(samples: np.ndarray, target: np.ndarray) -> tuple[bool, float]:
    """Per-coordinate test of E[samples] == target (Bonferroni over the coordinates); returns
    (passed, worst z-score).  atol only absorbs float32 rounding of the samples."""
    samples = samples.reshape(samples.shape[0], -1)
    target = np.asarray(target, np.float64).reshape(-1)
    mean = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / np.sqrt(samples.shape[0])
    atol = 1e-6 * np.abs(target).max(initial=0) + 1e-12
    dev = np.abs(mean - target)
    passed = bool(np.all(dev <= z_for(target.size) * se + atol))
    return passed, float(np.max((dev - atol).clip(0) / (se + 1e-30)))


def scalar_mean_ok(values: np.ndarray, expected: float) -> tuple[bool, float]:
    """Test E[values] == expected for one scalar statistic."""
    se = values.std(ddof=1) / np.sqrt(values.size)
    dev = abs(values.mean() - expected)
    tol = 1e-6 * abs(expected) + 1e-12
    return bool(dev <= z_for(1) * se + tol), float(dev / (se + 1e-30))


def _err(samples: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.sum((samples - x).reshape(samples.shape[0], -1) ** 2, axis=1)


def check_unbiased(s: Subject) -> None:
    """E[C(x)] = x: exactly for a deterministic compressor, by Monte Carlo (N_MC fixed keys,
    Bonferroni over the coordinates) for a random one; and its second moment against the theory
    (E||C(x) - x||^2 = error_sq, Var[C(x)_i] = variance_i) when the entry has one."""
    assert s.c.unbiased
    probes = s.probes()
    if not s.is_random:
        ys = s.roundtrips(list(probes.values()))
        for (label, x), y in zip(probes.items(), ys):
            np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-30, err_msg=label)
        return
    for label in ("mc", "heavy"):
        x = probes[label]
        ys = s.samples(x)
        ok, worst = mean_ok(ys, x)
        assert ok, f"{label}: worst |mean - x| / se = {worst:.2f} > z = {z_for(x.size):.2f}"
        if s.theory is None or s.theory.error_sq is None:
            continue
        err = _err(ys, x)
        expected = s.theory.error_sq(s.c, x, None)
        ok, z = scalar_mean_ok(err, expected)
        assert ok, f"{label}: E||C(x)-x||^2 = {err.mean():.6g} vs theory {expected:.6g} (z = {z:.2f})"
        var = s.theory.variance(s.c, x) if s.theory.variance is not None else None
        if var is not None:
            var = f64(var).reshape(-1)
            assert var.sum() == pytest.approx(expected, rel=1e-9, abs=1e-12)
            ok, worst = mean_ok((ys - x).reshape(N_MC, -1) ** 2, var)
            assert ok, f"{label}: Var[C(x)_i] vs theory.variance, worst z = {worst:.2f}"
        b = s.bound(PROBE_SHAPE)
        if b is not None and b.omega is not None:
            assert expected <= b.omega * sq(x) * (1 + 1e-9) + 1e-12


def check_contraction(s: Subject) -> None:
    """E||C(x) - x||^2 <= (1 - delta) ||x||^2 for the theory's delta at PROBE_SHAPE: exactly
    (to float32 rounding) for a deterministic compressor on every probe, by Monte Carlo with a
    variance-derived bound for a random one; the worst case attains the bound when it is tight."""
    b = s.bound(PROBE_SHAPE)
    assert b.kind == "contractive" and b.delta > 0, b
    probes = s.probes()
    if not s.is_random:
        ys = s.roundtrips(list(probes.values()))
        for (label, x), y in zip(probes.items(), ys):
            err = sq(y - x)
            assert err <= (1 - b.delta) * sq(x) * (1 + 1e-6) + 1e-30, (label, err / sq(x), 1 - b.delta)
            if label == "worst" and b.tight:
                assert err == pytest.approx((1 - b.delta) * sq(x), rel=1e-5, abs=1e-12)
        return
    for label in ("mc", "heavy") + (("worst",) if "worst" in probes else ()):
        x = probes[label]
        err = _err(s.samples(x), x)
        se = err.std(ddof=1) / math.sqrt(N_MC)
        assert err.mean() <= (1 - b.delta) * sq(x) + z_for(1) * se + 1e-9 * sq(x), (
            label,
            err.mean() / sq(x),
            1 - b.delta,
        )
        if label == "worst" and b.tight:
            assert scalar_mean_ok(err, (1 - b.delta) * sq(x))[0]


def check_theory_error(s: Subject) -> None:
    """theory.error_sq(c, x) against the real compressor: exactly-ish for a deterministic one,
    by Monte Carlo for a random one; and the worst-case bound holds for the exact value."""
    t = s.theory
    assert t is not None and t.error_sq is not None
    b = s.bound(PROBE_SHAPE)
    probes = s.probes()
    if not s.is_random:
        # not on the rank-1 probes ("ties", "one"): there a low-rank method's Gram-Schmidt is
        # ill-conditioned and float32 and the float64 closed form may pick different bases
        general = {k: v for k, v in probes.items() if k not in ("ties", "one")}
        ys = s.roundtrips(list(general.values()))
        for (label, x), y in zip(general.items(), ys):
            expected = t.error_sq(s.c, x, None)
            assert sq(y - x) == pytest.approx(expected, rel=1e-4, abs=1e-9 * sq(x) + 1e-12), label
    else:
        for label in ("mc", "heavy") + (("worst",) if "worst" in probes else ()):
            x = probes[label]
            expected = t.error_sq(s.c, x, None)
            ok, z = scalar_mean_ok(_err(s.samples(x), x), expected)
            assert ok, (label, z)
    for label, x in probes.items():
        if b is None:  # no bound claimed: the exact values are all there is to check
            break
        ratio = t.error_sq(s.c, x, None) / sq(x)
        if b.kind == "unbiased" and b.omega is not None:
            assert ratio <= b.omega + 1e-9, (label, ratio, b)
        if b.delta is not None:
            assert 1 - ratio >= b.delta - 1e-9, (label, ratio, b)
        worst = b.omega if b.kind == "unbiased" else None if b.delta is None else 1 - b.delta
        if label == "worst" and b.tight and worst is not None:
            assert ratio == pytest.approx(worst, rel=1e-9, abs=1e-12)


def check_summable(s: Subject, workers: int = 4) -> None:
    """Summable payloads (algebra SUM, e.g. aggregation "allreduce"): the payloads of x_1..x_P
    compressed with the same key sum (floating leaves; integer leaves, e.g. the shared key, are
    identical on every worker and not summed) to the payload of sum_w x_w, so summing and
    decoding once (what every architecture does) is decoding the compressed sum.  The decode
    itself need not be linear (a count sketch's median is not)."""
    c = s.c
    assert c.summable
    xs = jax.random.normal(jax.random.PRNGKey(11), (workers, 4, 5))

    @jax.jit
    def run(xs):
        payloads = jax.vmap(lambda x: c.compress(x, c.init(x), KEY1)[0])(xs)
        of_sum = c.compress(xs.sum(0), c.init(xs[0]), KEY1)[0]
        ints = [leaf for leaf in jax.tree.leaves(payloads) if not jnp.issubdtype(leaf.dtype, jnp.floating)]
        return payloads, of_sum, ints

    payloads, of_sum, ints = run(xs)
    for leaf in ints:  # identical on every worker
        assert np.all(np.asarray(leaf) == np.asarray(leaf)[:1])
    for each, want in zip(jax.tree.leaves(payloads), jax.tree.leaves(of_sum)):
        if not jnp.issubdtype(want.dtype, jnp.floating):
            assert np.array_equal(np.asarray(each)[0], np.asarray(want))
            continue
        each, want = f64(each), f64(want)
        tol = 8 * 2.0**-11 * np.abs(each).sum(0) + 1e-5 * (1 + np.abs(want))
        assert np.all(np.abs(each.sum(0) - want) <= tol), np.abs(each.sum(0) - want).max()


GENERIC_CHECKS = (
    check_static,
    check_contract,
    check_wire_bytes,
    check_determinism,
    check_vmap,
    check_error_feedback,
    check_float_input_only,
)


# --------------------------------------------------------------------------- import paths


def scaled_identity(scale: float = 0.5) -> Compressor:
    """A plain factory for ``cc.get("tests.registry_cases:scaled_identity", scale=...)``:
    C(x) = scale * x, sent densely (deterministic; contractive for 0 < scale < 2)."""
    from cconv.compressors.base import DensePayload, check_float, itemsize, like_info, size_of, stateless_init

    def compress(x, state, key):
        check_float("scaled_identity", x)
        return DensePayload(x * jnp.asarray(scale, x.dtype)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(dtype)

    return Compressor(
        stateless_init,
        compress,
        decompress,
        lambda shape, dtype="float32": size_of(shape) * itemsize(dtype),
        lambda shape: 1.0,
        name="scaled_identity",
        unbiased=scale == 1.0,
        aggregation="allgather",
        hparams={"scale": scale},
    )


# --------------------------------------------------------------------------- demo entries
# Two small compressors with full theory, never registered globally: the generic checks run on
# them in tests/test_compressors.py (a new compressor is covered without any test edit), and
# broken variants of them show that each check can fail.


def _dense_bytes(shape, dtype="float32") -> int:
    from cconv.compressors.base import itemsize, size_of

    return size_of(shape) * itemsize(dtype)


def shrink(scale: float = 0.75, *, bytes_extra: int = 0, out_dtype=None) -> Compressor:
    """C(x) = scale * x (deterministic, contractive with delta = 1 - (1 - scale)^2)."""
    from cconv.compressors.base import DensePayload, check_float, like_info, stateless_init

    def compress(x, state, key):
        check_float("shrink", x)
        return DensePayload(x * jnp.asarray(scale, x.dtype)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(out_dtype or dtype)

    return Compressor(
        stateless_init,
        compress,
        decompress,
        lambda shape, dtype="float32": _dense_bytes(shape, dtype) + bytes_extra,
        lambda shape: 1.0,
        name="shrink",
        unbiased=False,
        aggregation="allreduce",
        hparams={"scale": scale},
    )


def dropout(p: float = 0.25, *, bias: float = 1.0) -> Compressor:
    """C(x)_i = x_i / p with probability p, else 0 (unbiased for bias = 1: omega = 1/p - 1)."""
    from cconv.compressors.base import DensePayload, check_float, like_info, stateless_init

    def compress(x, state, key):
        check_float("dropout", x)
        keep = jax.random.bernoulli(key, p, x.shape)
        return DensePayload(jnp.where(keep, x * jnp.asarray(bias / p, x.dtype), 0).astype(x.dtype)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(dtype)

    return Compressor(
        stateless_init,
        compress,
        decompress,
        _dense_bytes,
        lambda shape: 1.0,
        name="dropout",
        unbiased=True,
        aggregation="allgather",
        hparams={"p": p},
    )


def _unit(c, shape):
    return np.ones(shape)


SHRINK = Entry(
    shrink,
    cc.Schema((cc.Param("scale", "float", 0.75, low=0.0, high=1.0, low_open=True),)),
    aggregation="allreduce",
    theory=Theory(
        wire_bytes=lambda c, shape, isz: math.prod(shape) * isz,
        bound=lambda c, shape: cc.Bound("contractive", delta=1 - (1 - c.hparams["scale"]) ** 2),
        error_sq=lambda c, x, state=None: (1 - c.hparams["scale"]) ** 2 * sq(x),
        worst_case=_unit,
    ),
    label="shrink (test)",
)
DROPOUT = Entry(
    dropout,
    cc.Schema((cc.Param("p", "float", 0.25, low=0.0, high=1.0, low_open=True),)),
    theory=Theory(
        wire_bytes=lambda c, shape, isz: math.prod(shape) * isz,
        bound=lambda c, shape: cc.Bound("unbiased", omega=1 / c.hparams["p"] - 1),
        error_sq=lambda c, x, state=None: (1 / c.hparams["p"] - 1) * sq(x),
        variance=lambda c, x: (1 / c.hparams["p"] - 1) * f64(x) ** 2,
        worst_case=_unit,
    ),
    label="dropout (test)",
)
