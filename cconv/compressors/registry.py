"""The compressor registry: one ``Entry`` per compressor holds everything cconv asks about it.

A compressor module builds its ``Compressor`` with a plain factory and registers it once::

    natural = register("natural", Entry(
        factory=_natural,                       # hyper-parameters -> Compressor (no validation)
        schema=Schema(),                        # types, ranges, defaults: the one place bad values
                                                # are rejected
        aggregation="allgather",                # how payloads combine (below), or a function of
                                                # the validated hyper-parameters
        theory=Theory(wire_bytes=..., bound=..., error_sq=...),   # or None: "no constant"
        label="natural compression",            # plots and the planner
        example={},                             # the setting tables and reports show (defaults)
    ))

``register`` returns the validated public factory (``natural(**hp)`` checks ``hp`` against the
schema, then builds), and ``cconv.compressors`` imports it: a new compressor is one module, its
import line in ``cconv/compressors/__init__.py`` and (optionally) its own test file.  Every generic
test (contract, wire bytes, error-feedback invariant, bad input from the schema, determinism,
unbiasedness when the compressor says so, contraction when its theory says so) parametrizes over
``names()``: each entry's ``example``, then the further cases ``tests/registry_cases.py`` lists.

The aggregation declares the algebra of the payloads, and every architecture (all-reduce,
all-gather, parameter server, gossip) follows it:

    "allreduce"   summable payloads: sum (same key on every worker), then decode once
    "allgather"   decode each payload, then sum
    an ``Aggregation`` instance (or the name of a registered one): the compressor's own reducer,
                  defined in its own module (e.g. PowerSGD's two all-reduces); registered by name
                  when the compressor is (``register_aggregation``)

Outside a compressor's own module nothing names a compressor: the engine reads ``aggregation``
and ``collectives``, ``cconv.theory.constants`` calls the ``theory`` oracle, the planner and the
plots read ``knob`` and ``label``, the benchmarks read ``bench``.

Users register their own with ``cconv.compressors.register(name, entry)`` or name a factory by
import path (``get("my_pkg.my_mod:my_factory", ...)``, also in YAML configs).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from cconv._text import shown, shown_names
from cconv.compressors.base import (
    AGGREGATIONS,
    ALGEBRAS,
    DECODE,
    OWN,
    SUM,
    Aggregation,
    Compressor,
    aggregation,
    algebra_of,
    register_aggregation,
)

# --------------------------------------------------------------------------- schema


class Param(NamedTuple):
    """One hyper-parameter: its type, range and default.

    type      "int" | "float" | "bool" | "str" ("any": unchecked, for plain user factories)
    low/high  inclusive bounds (None: unbounded); ``low_open``/``high_open`` make them exclusive
    optional  None is a valid value (meaning "not given" / "off")
    choices   the valid values of a "str" parameter

    Errors read ``<compressor>: <name> must be ..., got <value>`` (one line).
    An int where a float is expected is accepted and converted; bools are never numbers.
    """

    name: str
    type: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    choices: tuple | None = None
    help: str = ""
    show_help: bool = False  # name the help text in errors: "tau (the threshold) must be ..."

    def describe(self) -> str:
        """The constraint in words: 'in (0, 1]', 'an integer >= 1', 'a positive number', ..."""
        if self.type == "bool":
            return "true or false"
        if self.type == "str":
            return "one of " + ", ".join(map(str, self.choices or ()))
        what = "an integer" if self.type == "int" else "a number"
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            return (
                f"{'an integer ' if self.type == 'int' else ''}in {'(' if self.low_open else '['}"
                f"{_fmt(lo)}, {_fmt(hi)}{')' if self.high_open else ']'}"
            )
        if lo is not None:
            if self.type == "float" and lo == 0 and self.low_open:
                return "a positive number"
            return f"{what} {'>' if self.low_open else '>='} {_fmt(lo)}"
        if hi is not None:
            return f"{what} {'<' if self.high_open else '<='} {_fmt(hi)}"
        return what

    def check(self, owner: str, value: Any) -> Any:
        """The normalised value (int -> float for "float"); ValueError if it is not valid."""
        if self.type == "any":  # plain factories (Schema.from_signature): the factory checks
            return value
        if value is None:
            if self.optional:
                return None
            raise ValueError(
                f"{owner}: {self.name}{f' ({self.help})' if self.help and self.show_help else ''} "
                f"must be {self.describe()}, got None"
            )
        bad = ValueError(
            f"{owner}: {self.name}{f' ({self.help})' if self.help and self.show_help else ''} "
            f"must be {self.describe()}, got {value!r}"
        )
        if self.type == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise bad
            return bool(value)
        if self.type == "str":
            if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
                raise bad
            return value
        if isinstance(value, (bool, np.bool_)):
            raise bad
        if self.type == "int":
            if not isinstance(value, (int, np.integer)):
                raise bad
            value = int(value)
        else:
            if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(float(value)):
                raise bad
            value = float(value)
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            raise bad
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            raise bad
        return value


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


class Schema(NamedTuple):
    """A compressor's hyper-parameters (in signature order) and a cross-parameter rule.

    ``rule(owner, values) -> values`` sees the per-parameter-checked values and may reject
    combinations (e.g. "give either ratio or k, not both") or fill a default that depends on
    another parameter.  ``validate`` is the one place cconv rejects bad hyper-parameters.
    """

    params: tuple[Param, ...] = ()
    rule: Callable[[str, dict], dict] | None = None

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def defaults(self) -> dict:
        return {p.name: p.default for p in self.params}

    def validate(self, owner: str, hparams: Mapping[str, Any]) -> dict:
        """Checked and normalised hyper-parameters, defaults filled in; a one-line ValueError
        naming the accepted hyper-parameters for an unknown one, or the constraint for a bad value."""
        unknown = sorted(set(hparams) - set(self.names))
        if unknown:
            valid = ", ".join(self.names) if self.params else "(none)"
            raise ValueError(
                f"compressor {shown(owner)} got unknown hyper-parameter(s) {shown_names(unknown)}; valid: {valid}"
            )
        values = {p.name: p.check(owner, hparams.get(p.name, p.default)) for p in self.params}
        return dict(self.rule(owner, values)) if self.rule is not None else values

    @classmethod
    def from_signature(cls, factory: Callable) -> Schema:
        """A permissive schema for a plain factory (user code without an Entry): the signature's
        names and defaults, types from the defaults (no ranges; the factory checks the rest)."""
        params = []
        for p in inspect.signature(factory).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            d = None if p.default is inspect.Parameter.empty else p.default
            t = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(d))
            params.append(Param(p.name, t or "any", d, optional=True))
        return cls(tuple(params))


# --------------------------------------------------------------------------- theory


class Bound(NamedTuple):
    """Worst-case (over x) constant of a compressor for one shape.

    kind   "unbiased": E[C(x)] = x and E||C(x) - x||^2 <= omega ||x||^2
           "contractive": E||C(x) - x||^2 <= (1 - delta) ||x||^2 with delta > 0
           "biased": neither; delta = 0 when C is only non-expansive, None when even that fails;
           ``omega``, when given, bounds E||C(x) - x||^2 <= omega ||x||^2 all the same (a bounded
           error, e.g. DRIVE's unbiased scale under a Hadamard rotation: scaled to the gradient)
    tight  the worst case is attained (or is the exact supremum), else a valid bound
    """

    kind: str
    omega: float | None = None
    delta: float | None = None
    tight: bool = True


class Theory(NamedTuple):
    """A compressor's closed forms, computed independently of its JAX code (float64 NumPy).

    wire_bytes(c, shape, itemsize) -> int      payload bytes from the paper's formula
    bound(c, shape) -> Bound                   worst-case omega / delta
    error_sq(c, x, state) -> float             exact E||C(x) - x||^2 for this x (x: float64
                                               array of the input's shape; ``state`` is the
                                               compressor state or None for its ``init``)
    variance(c, x) -> ndarray | None           Var[C(x)_i], flat (unbiased compressors; None
                                               for hyper-parameters that make C biased)
    worst_case(c, shape) -> ndarray | None     an x attaining the bound (tight ones); None where
                                               there is none, or a ValueError saying why (e.g.
                                               the bound is a supremum, not attained)
    encoded_bytes(c, shape, itemsize) -> float expected bytes of the encoded message, from the
                                               paper (e.g. Golomb's expected code length for
                                               Bernoulli(p) positions, QSGD's Theorem 3.2 bound);
                                               None: the format is fixed, = wire_bytes
    ``c`` is the built Compressor (``c.hparams`` holds the validated hyper-parameters).

    Every part is optional: a compressor claims what it gives (e.g. only ``wire_bytes``, or a
    ``bound`` without an exact ``error_sq``); the generic tests check each claim made, and
    ``cconv.theory.constants`` answers "no constant" (a ValueError naming the compressors that
    have one) for a missing part.
    """

    wire_bytes: Callable[[Compressor, tuple, int], int] | None = None
    bound: Callable[[Compressor, tuple], Bound] | None = None
    error_sq: Callable[[Compressor, np.ndarray, Any], float] | None = None
    variance: Callable[[Compressor, np.ndarray], np.ndarray] | None = None
    worst_case: Callable[[Compressor, tuple], np.ndarray] | None = None
    encoded_bytes: Callable[[Compressor, tuple, int], float] | None = None


class Knob(NamedTuple):
    """The hyper-parameter a sweep varies (plot colour, planner settings) and its default values."""

    name: str
    values: tuple = ()


class Bench(NamedTuple):
    """How the benchmark suite times a compressor: ``hparams(ratio)`` and its target as a multiple
    of the memory read floor (None: report only)."""

    hparams: Callable[[float], dict] = lambda ratio: {}
    target_x: float | None = None


class Cost(NamedTuple):
    """What one compress / decompress of a tensor of n elements does, for the time model of
    ``cconv.theory.implementation`` (facts about the algorithm, not timings):

    compress_ops      framework operations (kernel launches) per tensor when the compressor runs op
                      by op (GRACE's TensorFlow ops, Horovod's per-tensor hooks)
    compress_passes   passes over memory, in units of one fp32 read of the tensor (4 n bytes)
    select            the selection algorithm: None, "sort" (a framework top-k: sorts, far from
                      memory-bound on GPUs), "radix" (radix select, a few passes), "compare" (a fixed
                      threshold: one comparison pass), "sample" (a threshold estimated on a sample,
                      then one pass)
    decompress_ops    operations per decoded payload
    decompress_passes passes over memory per decoded payload (writing the dense tensor: 1)
    flops             ``(c, shape) -> float``: arithmetic per tensor of compress (PowerSGD's
                      matmuls and orthogonalisation); None: none beyond the passes
    decompress_flops  the same for decompress
    code_bytes        bytes per element its codes take in a framework's smallest dtype (bool, int8)
                      when they are not bit-packed (a framework implementation's message); 0: its
                      wire format either way
    rounds            ``(c, shape) -> float``: expected rounds of a data-dependent loop the framework
                      implementation runs per tensor (GRACE's DGC re-thresholds until the selected
                      count is within bounds); None: no loop.  Each round costs the implementation's
                      ``round_s`` (``cconv.theory.implementation``) and ``round_passes``
    round_passes      passes over memory per round (in fp32 reads of the tensor)
    view              ``shape -> shape``: the matrix a framework implementation of the compressor
                      factorises, from the tensor as the framework lays it out
                      (``cconv.theory.implementation.Implementation.layout``); None: the compressor
                      treats every tensor as its elements (the view changes nothing)
    """

    compress_ops: int = 2
    compress_passes: float = 2.0
    select: str | None = None
    decompress_ops: int = 2
    decompress_passes: float = 1.0
    flops: Callable[[Compressor, tuple], float] | None = None
    decompress_flops: Callable[[Compressor, tuple], float] | None = None
    code_bytes: float = 0.0
    rounds: Callable[[Compressor, tuple], float] | None = None
    round_passes: float = 0.0
    view: Callable[[tuple], tuple] | None = None


SELECTIONS = (None, "sort", "radix", "compare", "sample")


# --------------------------------------------------------------------------- entries


class Entry(NamedTuple):
    """Everything cconv asks about one compressor (see the module docstring).

    factory      validated hyper-parameters -> Compressor
    schema       hyper-parameter types, ranges, defaults (``Schema``)
    aggregation  how its payloads combine: "allreduce" (summable: sum, then decode once),
                 "allgather" (decode each, then sum), the name of a registered aggregation
                 ("intsum") or an ``Aggregation`` instance (its own reducer); or a function of
                 the validated hyper-parameters returning one of these
    collectives  other exchange algorithms it supports besides its aggregation ("gtopk" for
                 top-k selections)
    theory       ``Theory`` oracle, or None ("no constant": theory functions raise ValueError)
    knob         the swept hyper-parameter (``Knob``), or None
    label        human-readable name for plots and tables
    example      the hyper-parameters cconv shows it with where a table, report or readiness
                 export needs one setting of every compressor (the docs' compressor table,
                 ``cconv.engine.bytes_table``, ``cconv doctor``; the generic tests' first case); {}: its
                 defaults.  A compressor with a required hyper-parameter gives it here (the
                 generic tests fail otherwise).  Further test cases live with the tests
                 (``tests/registry_cases.py``), not on the entry
    bench        ``Bench`` settings (None: benchmarked with its defaults, no target)
    votes        its payloads are signs, so sign(sum_w decompress(payload_w)) is signSGD's majority
                 vote: ``vote=True`` is allowed (refused for every other compressor)
    at_density   ``(hparams, r) -> hparams`` giving density r (the fraction of coordinates
                 kept), for warm-up's dense-to-sparse schedule and tables at one density; None:
                 its density is not a hyper-parameter (warm-up refuses it)
    name         filled in by ``register``
    known_as     the names other projects give this method, ``"project:Name"`` (e.g. GRACE's
                 compressor class, ``"grace:TopKCompressor"``), so that published data naming
                 methods its own way is mapped here, on the entry, not in the code that reads it
                 (``known_as``)
    cost         ``Cost``: its compress/decompress operations, memory passes and selection
                 algorithm (the time model's facts); the default is a generic elementwise codec
    """

    factory: Callable[..., Compressor]
    schema: Schema = Schema()
    aggregation: str | Aggregation | Callable[[dict], str | Aggregation] = "allgather"
    collectives: tuple[str, ...] = ()
    theory: Theory | None = None
    knob: Knob | None = None
    label: str = ""
    example: Mapping[str, Any] = MappingProxyType({})
    bench: Bench | None = None
    votes: bool = False
    at_density: Callable[[dict, float], dict] | None = None
    name: str = ""
    known_as: tuple[str, ...] = ()
    cost: Cost = Cost()

    def aggregation_of(self, hparams: Mapping[str, Any]) -> str:
        """The name of the aggregation method for ``hparams`` (an ``Aggregation`` instance is
        registered under its name)."""
        agg = self.aggregation
        if callable(agg) and not isinstance(agg, Aggregation):
            agg = agg(dict(hparams))
        if isinstance(agg, Aggregation):
            return register_aggregation(agg).name
        if not isinstance(agg, str) or not agg:
            raise ValueError(f"compressor {self.name!r}: aggregation must be a name or an Aggregation, got {agg!r}")
        return agg

    def algebra_of(self, hparams: Mapping[str, Any]) -> str:
        """How its payloads combine for ``hparams``: ``SUM``, ``DECODE`` or ``OWN``."""
        return algebra_of(self.aggregation_of(hparams))

    def build(self, **hparams) -> Compressor:
        """Validate ``hparams`` against the schema and build the compressor."""
        hp = self.schema.validate(self.name, hparams)
        c = self.factory(**hp)
        if not isinstance(c, Compressor):
            raise ValueError(
                f"compressor {self.name!r}: its factory returned {type(c).__name__}, not a cconv.compressors.Compressor"
            )
        facts = dict(name=self.name, aggregation=self.aggregation_of(hp), hparams=hp, entry=self)
        if c.agree is not None:  # the coder bound to the agreed statistic is the same method: same facts
            bind = c.agree.bind
            c = c._replace(agree=c.agree._replace(bind=lambda agreed: bind(agreed)._replace(**facts)))
        return c._replace(**facts)


_REGISTRY: dict[str, Entry] = {}


def register(name: str, entry: Entry) -> Callable[..., Compressor]:
    """Register ``entry`` as ``name``; returns its validated public factory.

    Registering the same factory again under the same name is a no-op (module reloads); another
    entry under a taken name is a ValueError.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register: name must be a non-empty string, got {name!r}")
    if not isinstance(entry, Entry):
        raise ValueError(f"register: entry must be a cconv.compressors.Entry, got {type(entry).__name__}")
    if not isinstance(entry.example, Mapping):
        raise ValueError(f"register: {name!r} example must be a mapping of hyper-parameters, got {entry.example!r:.80}")
    if not isinstance(entry.cost, Cost) or entry.cost.select not in SELECTIONS:
        raise ValueError(f"register: {name!r} cost must be a Cost with select in {SELECTIONS}, got {entry.cost!r:.80}")
    if isinstance(entry.aggregation, Aggregation):
        register_aggregation(entry.aggregation)
    elif not callable(entry.aggregation) and not (isinstance(entry.aggregation, str) and entry.aggregation):
        raise ValueError(
            f"register: {name!r} aggregation must be a name ('allreduce', 'allgather', ...), an Aggregation "
            f"or a function of the hyper-parameters, got {entry.aggregation!r}"
        )
    old = _REGISTRY.get(name)
    if (
        old is not None
        and old.factory is not entry.factory
        and getattr(old.factory, "__qualname__", None) != getattr(entry.factory, "__qualname__", 0)
    ):
        raise ValueError(f"register: a compressor named {name!r} is already registered")
    entry = entry._replace(name=name)
    _REGISTRY[name] = entry
    return _public_factory(entry)


def _public_factory(entry: Entry) -> Callable[..., Compressor]:
    @functools.wraps(entry.factory)
    def factory(**hparams) -> Compressor:
        return entry.build(**hparams)

    factory.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default) for p in entry.schema.params],
        return_annotation=Compressor,
    )
    factory.__name__ = entry.name
    factory.__doc__ = describe(entry)
    factory.entry = entry  # type: ignore[attr-defined]
    return factory


def describe(entry: Entry) -> str:
    """``help(cconv.compressors.<name>)``: the compressor module's docstring (formula, paper,
    bytes) or the factory's, then the knobs and their defaults read from the schema and the
    aggregation read from the entry (one source of truth: the text cannot drift from the code)."""
    module = sys.modules.get(getattr(entry.factory, "__module__", ""), None)
    own = module.__doc__ if module is not None and module.__name__.startswith("cconv.compressors.") else None
    text = inspect.cleandoc(own or entry.factory.__doc__ or entry.label or entry.name)
    lines = [text, "", "Hyper-parameters (from the registry schema; a bad value is a one-line ValueError):"]
    for p in entry.schema.params:
        allowed = p.describe() + (", or None" if p.optional else "")
        lines.append(f"    {p.name}={p.default!r}: {allowed}" + (f"; {p.help}" if p.help else ""))
    if not entry.schema.params:
        lines.append("    (none)")
    try:  # what the schema's rule makes of no arguments: a required knob, or defaults it fills in
        filled = entry.schema.validate(entry.name, {})
        extra = {k: v for k, v in filled.items() if v != entry.schema.defaults().get(k)}
        if extra:
            lines.append("    with no arguments: " + ", ".join(f"{k}={v!r}" for k, v in extra.items()))
    except ValueError as e:
        lines.append("    required: " + str(e).split(": ", 1)[-1])
    agg = "depends on the hyper-parameters" if callable(entry.aggregation) else entry.aggregation
    lines.append("")
    lines.append(f"Aggregation: {agg}" + (f"; also {', '.join(entry.collectives)}" if entry.collectives else ""))
    lines.append(f"Entry: cconv.compressors.entry({entry.name!r}) (theory constants, knob, label, example).")
    return "\n".join(lines)


def _from_path(path: str) -> Entry:
    """Import ``"package.module:attr"``: an Entry, a factory returned by ``register``, or a plain
    factory returning a Compressor (registered with a permissive schema and no theory)."""
    module, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"compressor {path!r}: cannot import it ({type(e).__name__}: {e})") from None
    if isinstance(obj, Entry):
        entry = obj
    elif isinstance(getattr(obj, "entry", None), Entry):
        entry = obj.entry
    elif callable(obj):
        entry = Entry(factory=obj, schema=Schema.from_signature(obj), label=path)
    else:
        raise ValueError(f"compressor {path!r}: {type(obj).__name__} is not a factory or an Entry")
    register(path, entry._replace(name=""))
    return _REGISTRY[path]


def entry(name: str) -> Entry:
    """The registry entry of ``name`` (a registered name or ``"package.module:factory"``)."""
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    if isinstance(name, str) and ":" in name:
        return _from_path(name)
    raise ValueError(
        f"unknown compressor {shown(name)}; valid names: {', '.join(sorted(_REGISTRY))} (or 'package.module:factory')"
    )


def entry_of(c: Compressor) -> Entry:
    """The entry ``c`` was built from: the ``entry`` it carries (``Entry.build`` sets it, every
    wrapper keeps it: memories, a user's ``c._replace(name="mine")``), never found from its name.
    A one-line ValueError for a compressor built by hand (``Compressor(...)``), which has none."""
    e = getattr(c, "entry", None)
    if isinstance(e, Entry):
        return e
    raise ValueError(
        f"compressor {shown(getattr(c, 'name', c))} carries no registry entry (built as Compressor(...), not by "
        f"cconv.compressors.get or Entry.build), so cconv knows none of its facts; register it: "
        f"cconv.compressors.register(name, Entry(factory, ...))"
    )


def registered_name(c: Compressor) -> str | None:
    """The name ``c``'s entry is registered under, whatever ``c`` is called now (a user may rename
    it; a memory calls it ``ef(<name>)``); None for a compressor built by hand."""
    e = getattr(c, "entry", None)
    return e.name if isinstance(e, Entry) else None


def known_as(alias: str) -> str:
    """The registered name of the compressor another project calls ``alias`` (``"project:Name"``,
    declared on its entry's ``known_as``); ValueError when no entry declares it."""
    found = [n for n, e in _REGISTRY.items() if alias in e.known_as]
    if len(found) != 1:
        what = "no compressor" if not found else f"several compressors ({', '.join(sorted(found))})"
        raise ValueError(f"{what} declare(s) known_as {alias!r}")
    return found[0]


def names() -> list[str]:
    """Registered compressor names (sorted)."""
    return sorted(_REGISTRY)


def entries() -> list[Entry]:
    """Registered entries, sorted by name."""
    return [_REGISTRY[n] for n in names()]


def hparams_of(name: str) -> list[str]:
    """The hyper-parameters a registered compressor accepts (schema order)."""
    return entry(name).schema.names


def get(name: str, **hparams) -> Compressor:
    """Build a registered compressor by name, e.g. ``get("qsgd", levels=4)``.

    Raises ValueError for an unknown name (listing the valid ones), an unknown hyper-parameter
    (listing the accepted ones) or an out-of-range value.
    """
    return entry(name).build(**hparams)


def ratio_or_k(owner: str, values: dict, default_ratio: float | None = None) -> dict:
    """Schema rule of the sparsifiers: exactly one of ``ratio`` and ``k`` (``ratio`` defaults to
    ``default_ratio`` when neither is given; without a default one of them is required)."""
    ratio, k = values.get("ratio"), values.get("k")
    if ratio is not None and k is not None:
        raise ValueError(f"{owner}: give either ratio or k, not both")
    if ratio is None and k is None:
        if default_ratio is None:
            raise ValueError(f"{owner}: needs ratio (fraction of entries kept, in (0, 1]) or k (>= 1)")
        values = {**values, "ratio": float(default_ratio)}
    return values


def with_ratio(hparams: Mapping[str, Any], density: float) -> dict:
    """``Entry.at_density`` of the sparsifiers: ``ratio`` = the density, ``k`` unset."""
    return {**{n: v for n, v in hparams.items() if n != "k"}, "ratio": float(density)}


RATIO = Param(
    "ratio",
    "float",
    None,
    low=0.0,
    high=1.0,
    low_open=True,
    optional=True,
    help="fraction of entries kept, k = ceil(ratio * d)",
)
K = Param("k", "int", None, low=1, optional=True, help="entries kept per tensor (instead of ratio)")

__all__ = [
    "Param",
    "Schema",
    "Bound",
    "Theory",
    "Knob",
    "Bench",
    "Entry",
    "register",
    "describe",
    "entry",
    "entry_of",
    "registered_name",
    "names",
    "entries",
    "hparams_of",
    "get",
    "ratio_or_k",
    "with_ratio",
    "RATIO",
    "K",
    "AGGREGATIONS",
    "ALGEBRAS",
    "SUM",
    "DECODE",
    "OWN",
    "Aggregation",
    "aggregation",
    "algebra_of",
    "register_aggregation",
]
