"""The compressor contract, modelled on ``optax.GradientTransformation``.

A compressor is a NamedTuple of pure functions plus static properties::

    c = cconv.compressors.topk(ratio=0.01)
    state = c.init(x)                                # pytree, may be empty
    payload, state = c.compress(x, state, key)       # payload: the message that travels
    y = c.decompress(payload, like)                  # like: array or ShapeDtypeStruct
    payload_bytes(payload) == c.wire_bytes(x.shape, x.dtype)     # what a collective moves
    c.encoded_bytes(payload) <= payload_bytes(payload)           # the encoded message (traced)

``payload`` is a pytree of arrays and *is* the message: sub-byte methods are bit-packed
(``cconv.compressors.packing``), so the bytes the framework logs are the ``nbytes`` of these
arrays.  ``wire_bytes`` is the closed-form size from the paper, computed statically; the test
suite checks that the two agree for every registered compressor and many shapes.

Static properties
-----------------
``unbiased``     E[decompress(compress(x))] = x for every x (checked by Monte Carlo in tests).
``aggregation``  the name of the aggregation method that combines the payloads of several
                 workers (``AGGREGATIONS``, an open registry).  Each method states its algebra
                 (``Aggregation.algebra``), which every architecture follows:
                 ``SUM``     ``"allreduce"``: payloads are summable in compressed form -- the
                             payloads of x_1..x_P compressed with the SAME key sum (floating leaves;
                             integer leaves, e.g. a shared PRNG key, are identical on every worker
                             and are *not* communicated) to a payload whose decompression is the
                             aggregate: sum, then decode once (all-reduce, the server's sum,
                             gathered payloads, gossip's weighted sum).
                 ``DECODE``  ``"allgather"`` (and ``"vote"``, ``"intsum"``): every payload is
                             decoded, the decodings are summed (``sum_gathered``).
                 ``OWN``     the method is its own reducer (``"powersgd"``: two all-reduces with an
                             orthogonalisation between, defined in ``cconv.compressors.powersgd``;
                             ``"gtopk"``); an architecture it does not define refuses it.
``density``      fraction of coordinates a payload carries (k/d for sparsifiers, 1 otherwise).
``hparams``      the validated hyper-parameters, for logging.
``encoded``      None for fixed-size formats; for variable-length ones (entropy-coded bit streams
                 in a fixed-capacity buffer, ``cconv.compressors.bitstream``) a traced function
                 ``payload -> float32 bytes of the encoded message``, which ``encoded_bytes`` calls.
``sparse``       None, or ``(payload, like) -> SparsePayload``: the (value, index) pairs of a
                 coded sparse payload, so that gathered payloads are summed in one scatter-add
                 of all P*k pairs, in the same order as the int32 format (same sums, bit for bit).
``agree``        None, or an ``Agreement``: a per-tensor statistic every worker agrees on (one
                 reduction over the workers) before compressing, e.g. a shared max scaler.
``gathered_sum`` None, or ``(stacked, like) -> sum_w decompress(payload_w)``: the sum of P
                 gathered payloads (every leaf with a leading worker axis) computed in the packed
                 domain, without decompressing each into its own dense float array (e.g. sign
                 bits counted by a bit-sliced popcount, ternary codes summed as integers).  It
                 equals ``jax.vmap(decompress)(stacked).sum(0)`` bit for bit where the arithmetic
                 is exact (counts, integer sums) and within float rounding where only the order
                 of the summation changes; the aggregation methods call it when it is set.

``aggregation`` and ``hparams`` are filled in from the compressor's registry entry when it is
built (``cconv.compressors.registry.Entry.build``), so a raw factory need not repeat them.

``entry``        what cconv knows about the compressor beyond its functions: the registry
                 ``Entry`` it was built from (theory oracle, extra collectives, ``votes``,
                 ``at_density``, ``cost``, ``knob``, ``label``), set by ``Entry.build``.  Every
                 wrapper forwards it (``_replace`` keeps it: ``cconv.memory.wrap``, a user's
                 ``c._replace(name="mine")``), so the engine, the aggregations and the theory read
                 a compressor's facts from the object, never from its name
                 (``cconv.compressors.entry_of``).  None for a ``Compressor(...)`` built by hand:
                 it has no facts (no theory constant, no extra collective, no vote, no warm-up).

Conventions (documented once, used everywhere)
----------------------------------------------
* ``sign(0) = +1`` (the papers' counterexamples assume it): a sign bit is ``x >= 0``, so -0.0
  is +1 too, and so are subnormals where XLA flushes them to zero (CPU does).
* Indices are ``int32`` and counted as 4 bytes each.
* Scales, norms and means that travel are ``float32`` (4 bytes), whatever the input dtype.
* A zero vector compresses to a payload that decompresses to exactly zero (never NaN).
* Sparsifiers (``randomk``, ``topk``, ``dgc``) with ``k >= d`` behave as the identity and send
  the dense array (no indices).  ``threshold``'s k is a capacity (still |x_i| >= tau only) and
  ``stc`` with k >= d is mu * sign(x) on every entry (its definition; no indices are sent).
* Non-finite input is not checked (a check would cost a pass and a host sync): see each
  compressor's docstring and ``tests/test_nonfinite.py`` for what propagates.  The training
  engine detects divergence from the loss.
"""

from __future__ import annotations

import abc
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Shape = Sequence[int]
State = Any
Payload = Any

SUM, DECODE, OWN = "sum", "decode", "own"  # how an aggregation method combines payloads
ALGEBRAS = (SUM, DECODE, OWN)


class Aggregation(abc.ABC):
    """An aggregation method: how every worker's tensors ("units") become their average through
    compressed payloads.  Subclass it (or ``cconv.comm.aggregation.AllReduce`` / ``AllGather``,
    which implement ``aggregate`` on every transport) and ``register_aggregation`` an instance.

    name        the registry key; a compressor entry names it in ``aggregation``
    algebra     ``SUM`` (sum payloads, decode once), ``DECODE`` (decode each, sum) or ``OWN``
    fusable     tensors may be fused into one flat buffer (``granularity="fused"``)
    selectable  a configuration may ask for it by name (``collective=NAME``)
    shared_key  every worker compresses with the same key (summable payloads need it)
    gatherable  ``collective="allgather"`` may gather its payloads instead
    gossip      gossip can follow it: mixing the payloads by ``algebra`` is all it does (False
                for a method that does more, e.g. a top-k of the aggregate; OWN ones never)

    ``aggregate(comm, plan, units, state, key) -> (averages, state)`` is the method itself (see
    ``cconv.comm.aggregation``); ``check(engine_cfg, c)`` raises a one-line ValueError for what it cannot
    do; ``compresses(c, shape)`` says whether a tensor of ``shape`` is compressed at all.
    """

    name = ""
    algebra = DECODE
    fusable = True
    selectable = False
    shared_key = False
    gatherable = False
    gossip = True

    def compresses(self, c: Compressor, shape: tuple) -> bool:
        """Whether a tensor of ``shape`` is compressed (else it travels in the dense buffer)."""
        return True

    def check(self, engine_cfg, c: Compressor) -> None:
        """One-line ValueError when ``engine_cfg`` (EngineConfig fields) asks this method of ``c``
        something it cannot do; the default accepts everything."""
        return None

    @abc.abstractmethod
    def aggregate(self, comm, plan, units, state: dict, key) -> tuple[list, dict]:
        """This worker's averaged ``units`` and the new aggregation state (every method defines it)."""


AGGREGATIONS: dict[str, Aggregation] = {}  # name -> method (``register_aggregation``)


def register_aggregation(method: Aggregation) -> Aggregation:
    """Register ``method`` under ``method.name`` (an open registry, like the compressors'); the
    same class again under its name is a no-op (module reloads), another one a ValueError."""
    if not isinstance(method, Aggregation):
        raise ValueError(f"register_aggregation: expects a cconv.compressors.Aggregation, got {type(method).__name__}")
    if not isinstance(method.name, str) or not method.name:
        raise ValueError(f"register_aggregation: {type(method).__name__}.name must be a non-empty string")
    if method.algebra not in ALGEBRAS:
        raise ValueError(f"register_aggregation: {method.name!r} algebra must be one of {', '.join(ALGEBRAS)}")
    old = AGGREGATIONS.get(method.name)
    if old is not None and type(old).__qualname__ != type(method).__qualname__:
        raise ValueError(f"register_aggregation: an aggregation named {method.name!r} is already registered")
    AGGREGATIONS[method.name] = method
    return method


def aggregation(name: str) -> Aggregation:
    """The registered aggregation method ``name``; a one-line ValueError listing the valid ones."""
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {name!r}; registered: {', '.join(sorted(AGGREGATIONS))}")
    return AGGREGATIONS[name]


def algebra_of(name: str) -> str:
    """How the payloads of aggregation ``name`` combine (``SUM`` for ``"allreduce"``, ``DECODE``
    for ``"allgather"`` even before ``cconv.comm`` registers them)."""
    known = {"allreduce": SUM, "allgather": DECODE}
    return AGGREGATIONS[name].algebra if name in AGGREGATIONS else known.get(name, OWN)


class Compressor(NamedTuple):
    """A gradient compressor: pure functions plus static properties (see module docstring)."""

    init: Callable[[Array], State]
    compress: Callable[[Array, State, Array], tuple[Payload, State]]
    decompress: Callable[[Payload, Any], Array]
    wire_bytes: Callable[..., int]
    density: Callable[[Shape], float]
    name: str
    unbiased: bool
    aggregation: str = "allgather"  # set from the registry entry by ``Entry.build``
    hparams: Mapping[str, Any] = MappingProxyType({})  # the validated hyper-parameters (build)
    encoded: Callable[[Payload], Array] | None = None  # variable-length formats: encoded bytes
    agree: Agreement | None = None  # a statistic the workers agree on before compressing
    sparse: Callable[[Payload, Any], Any] | None = None  # coded payload -> its (values, indices)
    gathered_sum: Callable[[Payload, Any], Array] | None = None  # stacked payloads -> their decompressed sum
    subtract: Callable[[Array, Payload], Array] | None = None  # (y, payload) -> y - decompress(payload, y), cheaper
    entry: Any = None  # its registry Entry (set by ``Entry.build``; module docstring): its facts

    def minus(self, y: Array, payload: Payload) -> Array:
        """``y - decompress(payload, y)``: what error feedback keeps.  A compressor whose payload
        is sparse says how to compute it without the dense decompressed array (``subtract``: a
        scatter-add of the negated values into ``y``, bit for bit the same for distinct indices);
        otherwise the dense difference."""
        if self.subtract is not None:
            return self.subtract(y, payload)
        return y - self.decompress(payload, y)

    def encoded_bytes(self, payload: Payload) -> Array:
        """Bytes of the message a variable-length transport would send (traced float32 scalar):
        ``payload_bytes(payload)`` for fixed-size formats, the used part of the bit stream (with
        its length and chunk index) for entropy-coded ones."""
        if self.encoded is None:
            return jnp.float32(payload_bytes(payload))
        return jnp.asarray(self.encoded(payload), jnp.float32)

    @property
    def variable_length(self) -> bool:
        """True when ``encoded_bytes`` depends on the data (an entropy-coded format)."""
        return self.encoded is not None

    @property
    def summable(self) -> bool:
        """True when payloads of different workers can be summed in compressed form (its
        aggregation's algebra is ``SUM``)."""
        return algebra_of(self.aggregation) == SUM

    def sum_gathered(self, stacked: Payload, like) -> Array:
        """sum_w decompress(payload_w) of gathered payloads (every leaf with a leading worker
        axis): the compressor's ``gathered_sum`` hook, else each decoded and summed."""
        if self.gathered_sum is not None:
            return self.gathered_sum(stacked, like)
        return jax.vmap(lambda p: self.decompress(p, like))(stacked).sum(0)

    def sum_payloads(self, stacked: Payload, sum_dtype=None) -> Payload:
        """The payload of the summed inputs, for summable payloads (``SUM``): floating leaves
        summed over the leading worker axis (worker order, in ``sum_dtype(leaf dtype)`` when
        given), integer leaves (a shared key) taken from worker 0."""

        def leaf(x):
            if not jnp.issubdtype(x.dtype, jnp.floating):
                return x[0]
            wide = x.astype(sum_dtype(x.dtype)) if sum_dtype is not None else x
            if x.shape[0] > 16:  # unrolled adds beyond 16 workers compile slowly
                return wide.sum(0).astype(x.dtype)
            acc = wide[0]
            for w in range(1, x.shape[0]):
                acc = acc + wide[w]
            return acc.astype(x.dtype)

        return jax.tree.map(leaf, stacked)

    def roundtrip(self, x: Array, state: State, key: Array) -> tuple[Array, State]:
        """decompress(compress(x)) with the new state; a convenience for tests and memory."""
        payload, state = self.compress(x, state, key)
        return self.decompress(payload, x), state


class Agreement(NamedTuple):
    """A per-tensor statistic all workers agree on before compressing (the ``agree`` hook).

    With P workers holding x_1..x_P, the aggregation computes ``statistic(x_w)`` on each worker
    (on the input the compressor sees, after its memory), combines them with one ``reduce``
    collective over the workers (all tensors' statistics in one small vector; logged as control
    traffic) and compresses with ``bind(agreed)``: a compressor that uses the agreed value and
    whose payload omits it (every worker already knows it).  Without an aggregation (one
    worker, plain ``compress``) the compressor uses its own statistic, the P = 1 agreement.

    statistic    x -> float32 scalar, this worker's statistic (e.g. max_i |x_i|)
    reduce       how the workers' statistics combine: "max"
    bind         agreed float32 scalar -> the bound Compressor (same state, init and density)
    levels       bound payload, like -> int8[d] integer levels with |level| <= ``level_max``
                 (None: payloads are not integer levels), so that
                 sum_w decompress(payload_w) = level_value(agreed) * sum_w levels(payload_w)
    level_max    the largest |level| (1 for ternary codes)
    level_value  agreed statistic -> the value of level 1 (float32)
    decode       None, or (summed levels, agreed, like) -> sum_w decompress(payload_w), for
                 levels in another basis than the tensor's (THC: a shared rotation, inverted
                 once after the sum); None: level_value(agreed) * summed levels, reshaped
    """

    statistic: Callable[[Array], Array]
    reduce: str
    bind: Callable[[Array], Compressor]
    levels: Callable[[Payload, Any], Array] | None = None
    level_max: int = 0
    level_value: Callable[[Array], Array] | None = None
    decode: Callable[[Array, Array, Any], Array] | None = None

    def decode_sum(self, summed: Array, agreed: Array, like) -> Array:
        """sum_w decompress(payload_w) from the summed integer levels (``decode``, or
        level_value(agreed) * summed in like's shape and dtype)."""
        if self.decode is not None:
            return self.decode(summed, agreed, like)
        return (summed.astype(jnp.float32) * self.level_value(agreed)).reshape(like.shape).astype(like.dtype)


class EmptyState(NamedTuple):
    """State of a stateless compressor."""


class DensePayload(NamedTuple):
    """A dense array on the wire (identity, or a sparsifier with k >= d)."""

    values: Array


def payload_bytes(payload: Payload) -> int:
    """Bytes of a payload: the sum of its leaves' ``nbytes``.

    Works on concrete arrays and on ``jax.ShapeDtypeStruct`` leaves (e.g. from ``jax.eval_shape``),
    so it can be evaluated inside a trace from static shapes.
    """
    total = 0
    for leaf in jax.tree.leaves(payload):
        total += int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


# --------------------------------------------------------------------------- helpers


def resolve_k(d: int, ratio: float | None, k: int | None) -> int:
    """Number of kept entries for a tensor of d elements: k = ceil(ratio * d), clipped to [1, d]."""
    if d == 0:
        return 0
    if k is None:
        # Guard against float noise such as 0.07 * 100 = 7.000000000000001.
        k = math.ceil(round(ratio * d, 9))
    return max(1, min(int(k), d))


class SparsifierSize(NamedTuple):
    """A sparsifier's size rule from its validated ``ratio`` / ``k`` (exactly one is not None; the
    schema, ``registry.ratio_or_k``, enforces it): ``k(shape)`` entries kept, ``density`` = k / d."""

    ratio: float | None
    k_fixed: int | None

    def k(self, shape: Shape) -> int:
        return resolve_k(size_of(shape), self.ratio, self.k_fixed)

    def density(self, shape: Shape) -> float:
        return self.k(shape) / max(size_of(shape), 1)


def stateless_init(x) -> EmptyState:
    """``init`` of a compressor that keeps no state."""
    return EmptyState()


def check_float(name: str, x) -> None:
    """Raise a clear ValueError for non-floating inputs (checked at trace time, static)."""
    dtype = jnp.dtype(x.dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name}: expects a floating-point array (float32, bfloat16, float16), got dtype {dtype}")


def size_of(shape: Shape) -> int:
    """Number of entries of ``shape``; a ValueError unless every size is an integer >= 0.

    Every compressor's ``wire_bytes``, ``k`` and density go through here, so a negative or
    non-integer shape is refused in one line for all of them."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be a sequence of integers >= 0, got {shape!r}") from None
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and s >= 0 for s in dims):
        raise ValueError(f"shape must be a sequence of integers >= 0, got {shape!r}")
    return int(np.prod(dims, dtype=np.int64))


def itemsize(dtype) -> int:
    return np.dtype(jnp.dtype(dtype)).itemsize


def like_info(like) -> tuple[tuple[int, ...], Any]:
    """(shape, dtype) of an array or ShapeDtypeStruct."""
    return tuple(like.shape), like.dtype


def safe_div(a: Array, b: Array) -> Array:
    """a / b with 0 where b == 0 (zero vectors compress to zero, never NaN)."""
    return jnp.where(b > 0, a / jnp.where(b > 0, b, 1), 0)
