"""Run and sweep configurations: YAML in, one validated, fully resolved ``RunConfig`` out.

A run config is a flat mapping (YAML, loaded with a safe loader, see below)::

    model: {name: mlp, hidden: [64]}          # or just `model: mlp`
    data: {name: digits, partition: iid}      # or just `data: digits`
    workers: 8
    steps: 300
    batch_size: 256                           # global batch, split evenly over workers
    optimizer: {name: sgd, momentum: 0.9}     # any optax optimizer alias and its arguments
    lr: 0.1
    lr_schedule: cosine                       # constant | cosine | any optax schedule {name, **args}
    compressor: {name: topk, ratio: 0.01}     # any name in cconv.compressors.names()
    memory: ef                                # none | ef | dgc | ef21 | ef21_sgdm
    network: [10GbE, 100GbE, 100GbIB]         # simulated time on each (optional)
    log_every: 10
    tensorboard: true                         # also write TensorBoard event files (optional)

Every key is declared once, in the body of ``RunConfig`` (the schema: ``key(default, help,
rule)``; ``FIELDS``; ``cconv run --help`` prints them).  The engine's keys are its section: each
is the ``EngineConfig`` field of the same name, declared ``engine_key(help)`` and given the
engine field's default and rule (``ENGINE_KEYS``; ``RunConfig.engine_section`` is what the build
passes on).
``from_dict`` checks a mapping against the schema once (unknown keys, every number, each key's
rule, then ``CROSS_RULES``) into a frozen ``RunConfig``.  An unknown key is an error that lists
the valid ones.  Nested values of the keys declared ``dotted`` are addressed with dots in
``--set`` overrides (``--set compressor.ratio=0.001``); values are parsed as YAML scalars.

Sweep files (``base`` + ``grid``, ``include``, ``rules``) are expanded by ``cconv.experiments.sweep``.

Option lists (memories, architectures, collectives, granularities, launchers) are the engine's
(``cconv.engine.config``; ``EngineConfig`` is the truth and validates every combination).  The
only config-level spellings are the architecture aliases of ``ARCHITECTURE_ALIASES``
(``architecture: ps`` and ``architecture: gtopk``), mapped before the engine sees them.

This module is the schema and the loading; a validated ``RunConfig`` becomes a run in one pass in
``cconv.experiments.build`` (data, models, optimizer, compression, engine config, trainer), which
also holds ``check_names``.  Optimizers and schedules are optax's own, not a list of ours
(``cconv.experiments.optax_names``: ``optimizer_function``, ``schedule_function``; arguments
validated with ``inspect.signature``; built by ``build.make_optimizer``): ``optimizer.name`` is any
optax function that takes a ``learning_rate`` (``adamw``, ``lion``, ``contrib.muon``, ...), called
as ``optax.<name>(learning_rate=schedule, **arguments)``; ``lr_schedule`` is ``constant``
(= ``constant_schedule``), ``cosine`` (= ``cosine_decay_schedule``) or any optax schedule (a
function of ``optax.schedules`` whose name ends in ``_schedule`` or ``_decay``) as ``{name,
**arguments}``, e.g. ``{name: warmup_cosine_decay_schedule, init_value: 0.0, warmup_steps: 50}``.
Required arguments a schedule leaves out are taken from the run: its value (``peak_value``, else
``init_value``, else ``value``) is ``lr`` and its length (``decay_steps``, else
``transition_steps``) is ``steps - lr_warmup``; ``lr_warmup`` (linear from 0) comes before any
schedule.

Error feedback needs a delta-contraction; around an unbiased compressor whose variance factor
omega (``cconv.theory.constants``) is >= 1 it can diverge: the run warns once (naming omega) and
``ef_scale: auto`` (``build.make_compression``) applies the standard fix, the compressor's input scaled by 1/(1 + omega)
(``cconv.memory.error_feedback``; omega is the largest over the tensors the engine compresses).

YAML 1.1 (PyYAML) reads ``1e-3`` as a string; configs and ``--set`` values are read with a loader
that also resolves such exponent-only floats (YAML 1.2), so ``lr: 1e-3`` is 0.001.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from cconv._rules import Rule, choice, flag, fraction, integer, is_number, number, string
from cconv._text import shown, shown_name, shown_names
from cconv.engine.config import (
    ARCHITECTURES,
    GOSSIP_FIELDS,
    LAUNCHERS,
    EngineConfig,
)
from cconv.experiments.errors import ConfigError
from cconv.experiments.optax_names import optimizer_function, schedule_function

# --------------------------------------------------------------------------- schema

# Config spellings of engine settings: ``architecture: <alias>`` stands for these EngineConfig
# fields (they override the config's own ``architecture`` and ``collective``).  The one alias table.
ARCHITECTURE_ALIASES: dict[str, dict[str, str]] = {
    "ps": {"architecture": "parameter-server"},
    "gtopk": {"architecture": "all-to-all", "collective": "gtopk"},
}
WARMUP_KEYS = ("densities", "steps_per_stage", "dense_steps")
# keys added after runs were written: an older config.yaml without them holds their default
# (``read_stored`` fills it in), and at their default they are left out of ``digest`` (old run
# directories resume unchanged); names only, the defaults are the schema's (``default_of``)
ADDED_FIELDS: tuple[str, ...] = (
    "ef_scale",
    "tensorboard",
    "sync",
    "staleness",
    "max_staleness",
    "stragglers",
    "jitter",
    "worker_speeds",
    "adapt_every",
    "local_steps_init",
    "schedule",
    "servers",
    "advise",
    *GOSSIP_FIELDS,  # the engine's gossip fields (cconv.engine.config), needing sync: gossip
)
# keys that only steer the advisor or the report, never what is trained: they are no part of a
# run's identity (``identity``: ``digest``, the stored-config comparison of ``cconv run``/``sweep``),
# so adding an ``advise:`` block or changing ``target_loss`` keeps a finished run finished.  The run
# directory keeps the values it was started with (``cconv report --target`` overrides the target).
STEERING_FIELDS = ("target_loss", "advise")


def identity(d: dict) -> dict:
    """A config mapping with ``STEERING_FIELDS`` at their defaults: what decides whether two configs
    are one run (defaults, not removal: the digest of a config that never set them is unchanged)."""
    return {k: (default_of(k) if k in STEERING_FIELDS else v) for k, v in d.items()}


# --------------------------------------------------------------------------- rules
# A rule checks one key's value and returns it normalized (ints stay ints, numbers become floats,
# a name becomes {name: ...}): ``rule(key, value, run)``, ``run`` the keys checked before it (in
# table order), or a one-line error naming the key (``from_dict`` makes a ValueError a
# ConfigError).  Each key of ``RunConfig`` names its rule (an engine key: the engine's, from
# ``cconv._rules``: integer, number, fraction, choice, flag, string, numbers); ``CROSS_RULES`` (below
# ``from_dict``) check keys against each other afterwards.  The rules below are the run config's.


def named(
    *, optional: bool = False, keep_string: bool = False, lookup: Callable | None = None, paths: tuple = ()
) -> Rule:
    """A name or ``{name, **hyper-parameters}``, as a new mapping (a string stays one with
    ``keep_string``); ``lookup(name)`` raises for an unknown name; ``paths``: keys that hold a
    file-system path (a string)."""

    def check(name: str, v: Any, run: Mapping) -> Any:
        if v is None and optional:
            return None
        spec = v if keep_string and isinstance(v, str) else _named(v, name)
        for key in paths:
            p = spec.get(key)
            if p is not None and not isinstance(p, str):
                raise ConfigError(f"{name}.{key} is a path: it must be a string, got {shown(p)}")
        if lookup is not None:
            lookup(spec if isinstance(spec, str) else spec["name"])
        return spec

    return check


def _named(value: Any, what: str) -> dict:
    if isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict):
        if "name" not in value or not isinstance(value["name"], str):
            raise ConfigError(f"{what}: a mapping needs a 'name' string, got {shown(value)}")
        return dict(value)
    raise ConfigError(f"{what}: expected a name or a mapping with 'name', got {shown(value)}")


def mapping(
    what: str,
    keys: tuple[str, ...] | None = None,
    *,
    values: Mapping[str, Rule] | None = None,
    optional: bool = True,
    flags: bool = False,
) -> Rule:
    """``None`` (when ``optional``; true/false with ``flags``) or a mapping whose keys are among
    ``keys`` (any when None), each checked by its rule in ``values``; ``what`` describes it in the
    message.  With a rule for every key (``values`` covers ``keys``), an unknown key is a wrong
    shape; otherwise it is named."""

    def check(name: str, v: Any, run: Mapping) -> Any:
        if (v is None and optional) or (flags and isinstance(v, bool)):
            return v
        closed = values is not None and keys is not None and set(keys) <= set(values)
        if not isinstance(v, dict) or (closed and any(k not in keys for k in v)):
            raise ConfigError(f"{name} must be {what}, got {shown(v)}")
        bad = [str(k) for k in v if keys is not None and k not in keys]
        if bad:
            raise ConfigError(f"{name}: unknown key(s) {shown_names(bad)}; valid: {', '.join(keys)}")
        rules = values or {}
        return {k: rules[k](f"{name}.{k}", x, run) if k in rules else x for k, x in v.items()}

    return check


def densities() -> Rule:
    """``dgc`` (DGC's warm-up densities) or a list of densities in (0, 1]."""

    def check(name: str, v: Any, run: Mapping) -> Any:
        if v != "dgc" and (not isinstance(v, list) or not all(is_number(x) and 0 < x <= 1 for x in v)):
            raise ConfigError(f"{name} must be 'dgc' or a list of numbers in (0, 1], got {shown(v)}")
        return v

    return check


def nested_list(what: str, depth: int = 1) -> Rule:
    """``None`` or a list (``depth`` 2: a list of lists, a matrix, not echoed in the message)."""

    def check(name: str, v: Any, run: Mapping) -> Any:
        if v is None:
            return None
        if not isinstance(v, list) or (depth == 2 and not all(isinstance(r, list) for r in v)):
            raise ConfigError(f"{name} must be {what}" + (f", got {shown(v)}" if depth == 1 else ""))
        return v

    return check


def seed_values() -> Rule:
    """An integer in [0, ``MAX_SEED``] or a non-empty list of at most ``MAX_SEEDS`` distinct ones."""

    def check(name: str, v: Any, run: Mapping) -> Any:
        if not isinstance(v, list):
            v = integer(0)(name, v, run)
            if v > MAX_SEED:
                raise ConfigError(f"{name} must be an integer in [0, 2**63 - 1], got {v}")
            return v
        if not v or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED for s in v):
            raise ConfigError(
                f"{name} must be an integer in [0, 2**63 - 1] or a non-empty list of them, got {shown(v)}"
            )
        if len(v) > MAX_SEEDS:
            raise ConfigError(f"{name}: {len(v)} seeds (more than {MAX_SEEDS}, limit MAX_SEEDS); split the run")
        if len(set(v)) != len(v):
            raise ConfigError(f"{name} list has duplicates: {shown(v)}")
        return v

    return check


def network_entries() -> Rule:
    """``None``, one network entry (a preset name or ``{name, alpha, beta}``) or a list of them
    (resolved by ``check_names``)."""

    def check(name: str, v: Any, run: Mapping) -> Any:
        for n in [] if v is None else v if isinstance(v, list) else [v]:
            if not isinstance(n, (str, dict)):
                raise ConfigError(
                    f"{name} entries must be a preset name or a mapping {{name, alpha, beta}}, got {shown(n)}"
                )
        return v

    return check


def key(default: Any, doc: str, rule: Rule, *, dotted: bool = False) -> Any:
    """A config key of ``RunConfig``: its default, its line in ``cconv run --help``, its rule, and
    whether dotted keys (``--set compressor.ratio=0.01``, sweep grids) reach into its mapping
    (the ``help``, ``rule`` and ``dotted`` of the field's metadata)."""
    meta = {"help": doc, "rule": rule, "dotted": dotted}
    if isinstance(default, (dict, list)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
    return field(default=default, metadata=meta)


def engine_key(
    doc: str, rule: Rule | None = None, *, dotted: bool = False, run_default: Any = dataclasses.MISSING
) -> Any:
    """A config key that is the ``EngineConfig`` field of the same name (the engine's section of
    the schema: ``ENGINE_KEYS``, ``RunConfig.engine_section``, passed on by
    ``build.make_engine_config``).  Its default and its rule are the engine's, read from the
    dataclass field (``_engine_defaults``), unless a run's own differ: ``run_default``
    (``workers``), or a ``rule`` for a key a config spells otherwise than the engine (a mapping
    for ``warmup``, the aliases of ``architecture``, the launchers ``cconv run`` offers)."""
    meta = {"help": doc, "rule": rule, "dotted": dotted, "engine": True}
    if run_default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=run_default, metadata={**meta, "run_default": True})


def _engine_defaults(cls: type) -> type:
    """Give each ``engine_key`` of ``cls``'s body the default (unless a ``run_default``) and the
    rule (unless its own) of ``EngineConfig``'s field of the same name, before ``dataclass`` reads
    the body: an engine key's default and range are written once, in the engine."""
    engine = {f.name: f for f in dataclasses.fields(EngineConfig)}
    for name, f in vars(cls).items():
        if not isinstance(f, dataclasses.Field) or not f.metadata.get("engine"):
            continue
        if name not in engine:
            raise TypeError(f"engine_key {name!r}: EngineConfig has no field {name!r}")
        if not f.metadata.get("run_default"):
            f.default = engine[name].default
        if f.metadata["rule"] is None:
            if "rule" not in engine[name].metadata:
                raise TypeError(f"engine_key {name!r}: EngineConfig.{name} declares no rule; give the key its own")
            f.metadata = types.MappingProxyType({**f.metadata, "rule": engine[name].metadata["rule"]})
    return cls


def _launchers() -> list[str]:
    # the runner is one process: launchers that need one process per worker (mpirun) are for the
    # engine API (studies/cluster/), not for `cconv run`
    return [n for n, cls in LAUNCHERS.items() if not cls.one_process_per_worker]


def _schedules() -> list[str]:
    from cconv.theory.schedule import schedules

    return schedules.names()


# --------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
@_engine_defaults
class RunConfig:
    """One training run, validated (``from_dict``) and immutable: the class body is the config
    schema, one ``key(default, help, rule)`` per config key (``FIELDS``; ``field_help`` prints it).

    Frozen: a field is never reassigned; a changed config is ``dataclasses.replace(cfg, ...)``
    (not validated) or, better, ``from_dict({**cfg.to_dict(), ...})``.  The mapping and list
    values (``model``, ``seed``, ``network``, ...) stay plain ``dict``/``list``, deliberately: they
    are what YAML gives and what ``to_dict``/``to_yaml``/``digest`` (byte-identical for existing
    run directories), ``json.dumps``, ``copy.deepcopy``, wandb and the engine's ``isinstance``
    checks take, and they compare equal to the dicts and lists tests write; read-only views
    (``MappingProxyType``, tuples) would need a thaw in each of those and would change equality with
    lists.  ``from_dict`` deep-copies its input, so a RunConfig shares no container with its
    caller (``tests/test_config_schema.py``); nothing in cconv, its tests or studies/ writes
    into one (grep, when it was frozen): a builder that needs a changed value makes a new one.
    """

    name: str = key("", "free-form label (shown in plots when set)", string())
    model: dict = key(
        {"name": "mlp"}, "model name (cconv.models.names()) or {name, **hyper-parameters}", named(), dotted=True
    )
    data: dict = key(
        {"name": "digits"},
        "dataset name or {name, root, partition: iid|dirichlet|shards, alpha, **hp}",
        named(paths=("root",)),
        dotted=True,
    )
    workers: int = engine_key(
        "data-parallel workers (simulated CPU devices on CPU)", run_default=8
    )  # a run simulates 8 devices on CPU; the engine's API default is 1
    steps: int = key(300, "training steps", integer(1))
    batch_size: int = key(256, "global batch size (divided evenly among workers)", integer(1))
    optimizer: dict = key(
        {"name": "sgd"},
        "optax optimizer alias or {name, **kwargs}, e.g. {name: sgd, momentum: 0.9}",
        named(lookup=lambda n: optimizer_function(n)),  # optax's names (cconv.experiments.optax_names)
        dotted=True,
    )
    lr: float = key(0.1, "learning rate", number(0.0, strict=True))
    lr_schedule: Any = key(
        "constant",
        "constant | cosine (decay to 0 over steps) | any optax schedule {name, **args}",
        named(keep_string=True, lookup=lambda n: schedule_function(n)),
        dotted=True,
    )
    lr_warmup: int = key(0, "steps of linear learning-rate warm-up from 0", integer(0))
    seed: Any = key(0, "int, or a list of ints run as one vmapped program", seed_values())
    compressor: dict = key(
        {"name": "none"}, "compressor name or {name, **hparams} (cconv.compressors.names())", named(), dotted=True
    )
    memory: str = engine_key(
        "none | ef (error feedback) | dgc (momentum correction) | ef21 | ef21_sgdm (EF21, EF21-SGDM)"
    )
    momentum: float = engine_key("DGC momentum when memory is dgc; beta = 1 - eta when memory is ef21_sgdm")
    masking: bool = engine_key("DGC momentum-factor masking when memory is dgc")
    ef_scale: Any = key(
        None,
        "memory ef: scale the compressor's input by a in (0, 1], or auto (= 1/(1+omega)); null: 1",
        fraction("null, auto or a number in (0, 1]", also=("auto",)),
    )
    clip: Any = engine_key("local gradient-clipping threshold (scaled by N^-1/2), or null")
    warmup: Any = engine_key(
        "density warm-up {densities: [..] or dgc, steps_per_stage, dense_steps}, or null",
        mapping(f"null or a mapping {{{', '.join(WARMUP_KEYS)}}}", WARMUP_KEYS, values={"densities": densities()}),
    )
    local_steps: Any = engine_key("local SGD steps between model averaging (1 = BSP), or adaptive (AdaComm)")
    local_steps_init: int = engine_key("local_steps: adaptive: H_0, the initial period")
    adapt_every: int = engine_key("local_steps: adaptive: steps between updates of H")
    sync: str = engine_key("bsp | ssp | asp (asp needs architecture: parameter-server) | gossip")
    staleness: int = engine_key("sync: ssp: staleness bound s (0 = BSP)")
    max_staleness: Any = engine_key("sync: asp: parameter versions kept (null: 2 workers)")
    stragglers: Any = engine_key(
        "timing model: {fraction, slowdown}: a fixed subset computes slowdown x slower",
        mapping(
            "null or a mapping {fraction, slowdown}",
            ("fraction", "slowdown"),
            values={"fraction": number(), "slowdown": number()},
        ),
    )
    jitter: float = engine_key("timing model: lognormal sigma per worker-step")
    worker_speeds: Any = engine_key("timing model: relative compute time per worker")
    post_local_switch: int = engine_key("step at which BSP switches to local SGD (post-local SGD)")
    compress_delta: bool = engine_key("local SGD: compress the averaged model delta")
    granularity: str = engine_key("layerwise | fused (one flat buffer)")
    min_compress_size: int = engine_key("tensors with fewer elements are sent dense")
    compress_vectors: bool = engine_key("true: compress 1-D tensors (biases, norm scales) too; false: sent dense")
    architecture: str = engine_key(
        "all-to-all | parameter-server | ps (= parameter-server) | gtopk (= all-to-all with collective gtopk)",
        choice(lambda: (*ARCHITECTURES, *ARCHITECTURE_ALIASES)),
    )
    collective: str = engine_key("auto (the compressor's) | allgather | gtopk")
    vote: bool = engine_key("signSGD majority vote (sign compressors only); a tie gives +1")
    ps_downlink: Any = engine_key("PS downlink compressor (name or mapping) or null", named(optional=True), dotted=True)
    launcher: str = engine_key(" | ".join(_launchers()), choice(_launchers))
    network: Any = key(
        None, "network for simulated time: preset name, {name, alpha, beta}, or a list", network_entries(), dotted=True
    )
    schedule: Any = key(
        None,
        "simulated time: null (compute + exchange + sum of collective times) | bsp | wfbp | "
        "mg-wfbp | bytescheduler | fusion (event simulator over the model's layers)",
        choice(_schedules, optional=True),
    )
    servers: Any = key(
        None,
        "simulated time with a schedule: parameter servers (push/pull), or null",
        integer(1, optional=True),
    )
    log_every: int = key(10, "steps between metric lines (and test evaluations)", integer(1))
    checkpoint_every: int = key(100, "steps between checkpoints (resume points)", integer(1))
    target_loss: Any = key(None, "loss for bytes-to-target in reports, or null", number(optional=True))
    wandb: Any = key(
        False,
        "false, true, or {project, mode, entity, group}; offline by default",
        mapping(
            "true, false or a mapping {project, mode, entity, group}",
            ("project", "mode", "entity", "group", "tags"),
            optional=False,
            flags=True,
        ),
        dotted=True,
    )
    tensorboard: bool = key(False, "also write TensorBoard event files to <run>/tensorboard/seed_<s>/", flag())
    advise: Any = key(
        None,
        "`cconv advise`: its search space and options (cconv.advisor.space); others ignore it",
        mapping("a mapping (cconv.advisor.space)"),
    )
    # --- gossip (decentralized training, cconv.engine.gossip; values and combinations: EngineConfig)
    gossip: str = engine_key("sync gossip: dpsgd (D-PSGD; with a compressor: naive compressed gossip) | choco")
    topology: str = engine_key("sync gossip: ring | torus | exponential | complete | matrix")
    torus: Any = engine_key(
        "topology torus: [rows, cols] (null: most square)", nested_list("a list [rows, cols] or null")
    )
    mixing: Any = engine_key(
        "topology matrix: the P x P mixing matrix (list of rows)",
        nested_list("a list of rows (a P x P matrix) or null", depth=2),
    )
    gossip_gamma: Any = engine_key(
        "consensus step size in (0, 1] (choco; dpsgd with a compressor); null: the compressor's "
        "contraction delta (1 uncompressed); a value above it warns"
    )

    # ------------------------------------------------------------------ helpers
    def to_dict(self) -> dict:
        """Every field, as plain Python values."""
        return dataclasses.asdict(self)

    def engine_section(self) -> dict[str, Any]:
        """The values of the engine's keys (``ENGINE_KEYS``), as configured."""
        return {k: getattr(self, k) for k in ENGINE_KEYS}

    def seeds(self) -> list[int]:
        """The seeds of the run (one, or the list run as one vmapped program)."""
        return list(self.seed) if isinstance(self.seed, list) else [int(self.seed)]

    def networks(self) -> list:
        """The network entries (preset names or mappings) simulated time is computed on."""
        if self.network is None:
            return []
        return list(self.network) if isinstance(self.network, list) else [self.network]

    def digest(self) -> str:
        """A short hash of the resolved config (identifies a run's content: ``identity``, the keys
        that steer only the advisor or the report left out)."""
        d = {k: v for k, v in identity(self.to_dict()).items() if k not in ADDED_FIELDS or v != default_of(k)}
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(RunConfig)}
# the engine's section of the schema: keys that are ``EngineConfig`` fields (declared ``engine_key``)
ENGINE_KEYS: tuple[str, ...] = tuple(k for k, f in FIELDS.items() if f.metadata.get("engine"))


def default_of(name: str) -> Any:
    """The default of config key ``name`` (a fresh copy of a mapping or list)."""
    f = FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def field_help() -> str:
    """One line per field: name, default, meaning (for --help)."""
    lines = []
    for name, f in FIELDS.items():
        lines.append(f"  {name:<18} {json.dumps(default_of(name), default=str):<26} {f.metadata['help']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- loading

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KB; a 64 x 64 mixing matrix ~80 KB
MAX_CONFIG_VALUES = 100_000  # YAML nodes of a file (counted while composing), values once aliases expand
MAX_ITEMS = 10_000  # items of one YAML list or mapping (counted while composing)
MAX_DEPTH = 32  # nesting of YAML lists and mappings (a config nests 3 deep)


class ConfigLimit(yaml.MarkedYAMLError):
    """A YAML file past a size limit or with a duplicate key, found while it is read."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` for configs: also reads exponent floats without a dot (``1e-3``, YAML
    1.2); counts nodes (``MAX_CONFIG_VALUES``), items per list or mapping (``MAX_ITEMS``) and
    depth (``MAX_DEPTH``) while composing, so an oversized file is refused after reading at most
    that many nodes; refuses a key given twice in one mapping (naming it and both lines)."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0

    def _limit(self, problem: str) -> ConfigLimit:
        return ConfigLimit(problem=problem, problem_mark=self.peek_event().start_mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._nodes += 1
        if self._nodes > MAX_CONFIG_VALUES:
            raise self._limit(f"more than {MAX_CONFIG_VALUES} values (limit MAX_CONFIG_VALUES)")
        if parent is not None and len(parent.value) >= MAX_ITEMS:
            raise self._limit(f"more than {MAX_ITEMS} items in one list or mapping (limit MAX_ITEMS)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise self._limit(f"nested more than {MAX_DEPTH} levels deep (limit MAX_DEPTH)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<' merges: explicit keys override merged ones (YAML's rule)
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first is not None:
                raise ConfigLimit(
                    problem=f"duplicate key {shown(key)} (lines {first} and {line}); YAML keeps the last one silently",
                    problem_mark=key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


MAX_SEED = 2**63 - 1  # jax.random.key takes a signed 64-bit seed
MAX_SEEDS = 1_000  # seeds of one run (one vmapped program holds a model and optimizer state per seed)
MAX_INT = 2**31 - 1  # any other integer of a config (JAX's default integers are 32-bit)


def check_size(obj: Any, where: str, limit: int = MAX_CONFIG_VALUES) -> Any:
    """``obj`` unchanged, or a ConfigError when it holds more than ``limit`` values once every
    YAML alias is expanded (a "billion laughs" file is small on disk, huge when resolved)."""
    count = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        count += 1
        if count > limit:
            raise ConfigError(f"{where}: the config expands to more than {limit} values (YAML aliases?); refusing it")
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return obj


def read_text(path: str) -> str:
    """The text of a config file: at most ``MAX_CONFIG_BYTES`` (checked before parsing), UTF-8;
    anything else is a one-line ConfigError naming the file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes (limit MAX_CONFIG_BYTES); refusing it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}): not a YAML config") from None


def parse_yaml(text: str, where: str) -> Any:
    """YAML text through ``_Loader`` (limits, duplicate keys) and ``check_size`` (aliases); a
    one-line ConfigError naming ``where`` and the line otherwise."""
    try:
        return check_size(_safe_load(text), where)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, ConfigLimit):
            raise ConfigError(f"{where}{at}: {problem}; refusing it") from None
        raise ConfigError(f"malformed YAML in {where}{at}: {problem}") from None


def load_yaml(path: str) -> Any:
    """Load a YAML config file (``read_text``, ``parse_yaml``); an empty file (or only comments)
    is a ConfigError: it would silently train the defaults."""
    value = parse_yaml(read_text(path), path)
    if value is None:
        raise ConfigError(f"{path} holds no config (the file is empty or only comments)")
    return value


def read_stored(path: str) -> dict:
    """A run directory's ``config.yaml`` as a mapping, fields added since it was written filled with
    their defaults (``ADDED_FIELDS``, at ``default_of``); a damaged file (not UTF-8, not YAML, not a mapping)
    is a one-line ConfigError naming it."""
    try:
        raw = parse_yaml(read_text(path), path)
    except ConfigError as e:
        raise ConfigError(f"damaged run config: {e}; move the run directory aside or choose another --out") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"damaged run config {path}: not a mapping of config keys; move the run directory aside")
    if raw.get("sync", default_of("sync")) != "gossip" and raw.get("gossip_gamma") == 1.0:  # written when 1.0 was the
        raw["gossip_gamma"] = None  # default (moot outside gossip); today's default is null
    return {**{k: default_of(k) for k in ADDED_FIELDS if k not in raw}, **raw}


def parse_value(text: str) -> Any:
    """A --set value: a YAML scalar/flow value (``0.01``, ``true``, ``null``, ``[1, 2]``, ``ef``);
    text that is not YAML stays a string, but a value past a limit is refused."""
    try:
        value = _safe_load(text)
    except ConfigLimit as e:
        raise ConfigError(f"--set value {shown(text)}: {e.problem}; refusing it") from None
    except yaml.YAMLError:
        return text
    return check_size(value, f"--set value {shown(text)}")


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``key=value`` overrides (dotted keys reach into mappings) to a raw config mapping."""
    out = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {shown(item)}")
        key, text = item.split("=", 1)
        set_path(out, key.strip(), parse_value(text))
    return out


def set_path(d: dict, dotted: str, value: Any) -> None:
    """Set a dotted key of a raw config in place: ``top.a.b`` reaches into the keys declared
    ``dotted`` in the schema (a name given as a string becomes {name: ...}; a key not given, or
    given as true/false or a list, starts from its default's name)."""
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"bad key {shown(dotted)}")
    top = parts[0]
    if top not in FIELDS:
        raise ConfigError(f"unknown config key {shown(top)}; valid keys: {', '.join(FIELDS)}")
    if len(parts) == 1:
        d[top] = value
        return
    if not FIELDS[top].metadata["dotted"]:
        raise ConfigError(f"cannot set {shown(dotted)}: {shown(top)} is not a mapping")
    cur = d.get(top)
    if cur is None or isinstance(cur, (bool, list)):
        default = default_of(top)
        cur = (
            {"name": default["name"]}
            if isinstance(default, dict)
            else {"name": default}
            if isinstance(default, str)
            else {}
        )
    elif isinstance(cur, str):
        cur = {"name": cur}
    elif isinstance(cur, dict):
        cur = dict(cur)
    else:
        raise ConfigError(f"cannot set {shown(dotted)}: {top} is {shown(cur)}, not a name or a mapping")
    node = cur
    for p in parts[1:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {shown(dotted)}: {shown(p)} is not a mapping")
    node[parts[-1]] = value
    d[top] = cur


def check_values(raw: dict) -> None:
    """The rules every value of a config obeys, wherever it sits (top level, a block, a list): a
    float is finite (no NaN or inf: a NaN momentum or schedule argument trains garbage); an integer
    is at most ``MAX_INT`` in magnitude (a seed has its own rule, [0, ``MAX_SEED``]): a 31-digit
    batch size or staleness would otherwise reach NumPy/JAX and crash the run after its directory
    is written.
    A one-line ConfigError naming the dotted key."""
    stack = list(raw.items())
    while stack:  # bounded: ``check_size`` has counted the values
        where, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}", x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{shown_name(where, 80)} is {v}: every number in a config must be finite")
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT and str(where)[:4] != "seed":
            raise ConfigError(
                f"{shown_name(where, 80)} is {shown(v)}: integers in a config are at most 2**31 - 1 in magnitude"
            )


def _check_bounds(cfg: RunConfig) -> None:
    """Numbers that size what a run allocates, bounded by what can change the run: SSP keeps
    staleness + 1 model versions and ASP max_staleness + 1, but a bound past the run's length
    (steps clocks; ASP: steps x workers arrivals) never binds."""
    if cfg.staleness > cfg.steps:
        raise ConfigError(f"staleness {cfg.staleness} is more than steps {cfg.steps} (a bound past the run is moot)")
    if cfg.max_staleness is not None and cfg.max_staleness > cfg.steps * cfg.workers:
        raise ConfigError(
            f"max_staleness {cfg.max_staleness} is more than steps x workers = {cfg.steps * cfg.workers} "
            "(a bound past the run never binds)"
        )


def check_batch(cfg: RunConfig, train_size: int) -> None:
    """The global batch is at most the training set (a larger batch repeats samples within a step and
    allocates batch_size samples per step); called once the dataset is loaded, before anything is written."""
    if cfg.batch_size > train_size:
        raise ConfigError(f"batch_size {cfg.batch_size} is more than the {train_size} training samples of the dataset")


def _batch_split(cfg: RunConfig) -> None:
    if cfg.batch_size % cfg.workers:
        raise ConfigError(
            f"batch_size {cfg.batch_size} is not divisible by workers {cfg.workers} (the global batch is split evenly)"
        )


def _ef_scale_needs_ef(cfg: RunConfig) -> None:
    if cfg.ef_scale is not None and cfg.memory != "ef":
        raise ConfigError(f"ef_scale scales error feedback: it needs memory: ef, got memory: {cfg.memory}")


def _schedule_needs_network(cfg: RunConfig) -> None:
    if cfg.schedule is not None and cfg.network is None:
        raise ConfigError(f"schedule: {cfg.schedule} sets the simulated time; it needs a network")


def _servers_need_schedule(cfg: RunConfig) -> None:
    if cfg.servers is not None and cfg.schedule is None:
        raise ConfigError("servers: the parameter servers of the simulated time need a schedule")


def _check_gossip(cfg: RunConfig) -> None:
    """The gossip keys need ``sync: gossip`` (set to anything but their defaults), and gossip at
    least 2 workers (the keys' values and combinations: ``EngineConfig``, in ``check_names``)."""
    if cfg.sync != "gossip":
        set_keys = [k for k in GOSSIP_FIELDS if getattr(cfg, k) != default_of(k)]
        if set_keys:
            raise ConfigError(f"{', '.join(set_keys)}: gossip keys, but sync is {cfg.sync} (they need sync: gossip)")
    if cfg.sync == "gossip" and cfg.workers < 2:
        raise ConfigError(f"sync: gossip needs at least 2 workers, got workers: {cfg.workers}")


# The rules that relate keys, run in this order once every key has passed its own rule.
CROSS_RULES: tuple[Callable[[RunConfig], None], ...] = (
    _batch_split,
    _ef_scale_needs_ef,
    _check_bounds,
    _schedule_needs_network,
    _servers_need_schedule,
    _check_gossip,
)


def from_dict(raw: Any, source: str = "config") -> RunConfig:
    """Validate a raw mapping into a RunConfig: unknown keys, ``check_values`` (every number), each
    key's rule in table order (``RunConfig``; a missing key takes its default), then
    ``CROSS_RULES``.  Library names are checked by ``check_names`` (it imports the model, data and
    compressor registries), except optax's optimizer and schedule names, checked here."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        raise ConfigError(f"{source}: unknown config key(s) {shown_names(unknown)}; valid keys: {', '.join(FIELDS)}")
    check_values(raw)
    raw = copy.deepcopy(raw)  # the RunConfig shares no container with its caller
    values: dict[str, Any] = {}
    for name, f in FIELDS.items():
        try:
            values[name] = f.metadata["rule"](name, raw[name] if name in raw else default_of(name), values)
        except ValueError as e:  # a rule of cconv._rules (the engine's too) names the key; one line
            raise ConfigError(str(e)) from None
    cfg = RunConfig(**values)
    for rule in CROSS_RULES:
        rule(cfg)
    return cfg


def load_run(path: str | None, overrides: list[str] | None = None) -> RunConfig:
    """Load, override and structurally validate a run config file."""
    raw = load_yaml(path) if path else {}
    if isinstance(raw, dict) and "grid" in raw:
        raise ConfigError(f"{path} is a sweep file (it has 'grid'); use `cconv sweep`")
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(raw).__name__}")
    return from_dict(apply_overrides(raw or {}, overrides or []), source=path or "config")


def to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML (what ``config.yaml`` of a run holds)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None)


def diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Keys whose values differ between two config dicts (dotted)."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += diff(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}: {shown(x)} -> {shown(y)}")
    return out
