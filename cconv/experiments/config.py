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
    memory: ef                                # none | ef | dgc
    network: [10GbE, 100GbE, 100GbIB]         # simulated time on each (optional)
    log_every: 10
    tensorboard: true                         # also write TensorBoard event files (optional)

Every field, its default and its meaning is in ``FIELDS`` (``cconv run --help`` prints them).  An
unknown key is an error that lists the valid ones.  Nested values are addressed with dots in
``--set`` overrides (``--set compressor.ratio=0.001``); values are parsed as YAML scalars.

Sweep files (``base`` + ``grid``, ``include``, ``rules``) are expanded by ``cconv.experiments.sweep``.

Option lists (memories, architectures, collectives, granularities, launchers) are the engine's
(``cconv.engine.config``; ``EngineConfig`` is the truth and validates every combination).  The
only config-level spellings are the architecture aliases of ``ARCHITECTURE_ALIASES``
(``architecture: ps`` and ``architecture: gtopk``), mapped before the engine sees them.

Optimizers and schedules are optax's own, not a list of ours (``optimizer_function``,
``schedule_function``; arguments validated with ``inspect.signature``): ``optimizer.name`` is any
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
``ef_scale: auto`` applies the standard fix, the compressor's input scaled by 1/(1 + omega)
(``cconv.memory.error_feedback``; omega is the largest over the tensors the engine compresses).

YAML 1.1 (PyYAML) reads ``1e-3`` as a string; configs and ``--set`` values are read with a loader
that also resolves such exponent-only floats (YAML 1.2), so ``lr: 1e-3`` is 0.001.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from cconv._text import shown
from cconv.engine.config import ADAPTIVE, ARCHITECTURES, COLLECTIVES, GRANULARITIES, LAUNCHERS, MEMORIES
from cconv.engine.sync import public_names as sync_names
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
# fields added after runs were written: an older config.yaml without them holds their default,
# and at their default they are left out of ``digest`` (old run directories resume unchanged)
ADDED_FIELDS: dict[str, Any] = {
    "ef_scale": None,
    "tensorboard": False,
    "sync": "bsp",
    "staleness": 0,
    "max_staleness": None,
    "stragglers": None,
    "jitter": 0.0,
    "worker_speeds": None,
    "adapt_every": 50,
    "local_steps_init": 4,
    "schedule": None,
    "servers": None,
    "advise": None,
}
# gossip (decentralized training, sync: gossip): EngineConfig's fields of the same names
GOSSIP_FIELDS: dict[str, Any] = {
    "gossip": "dpsgd",
    "topology": "ring",
    "torus": None,
    "mixing": None,
    "gossip_gamma": None,  # null: the compressor's safe consensus step (cconv.theory.gossip.safe_gamma)
}
ADDED_FIELDS.update(GOSSIP_FIELDS)


@dataclass
class RunConfig:
    """One training run.  Field docs are the ``help`` metadata; defaults are the values shown."""

    name: str = field(default="", metadata={"help": "free-form label (shown in plots when set)"})
    model: dict = field(
        default_factory=lambda: {"name": "mlp"},
        metadata={"help": "model name (cconv.models.names()) or {name, **hyper-parameters}"},
    )
    data: dict = field(
        default_factory=lambda: {"name": "digits"},
        metadata={"help": "dataset name or {name, root, partition: iid|dirichlet|shards, alpha, **hp}"},
    )
    workers: int = field(default=8, metadata={"help": "data-parallel workers (simulated CPU devices on CPU)"})
    steps: int = field(default=300, metadata={"help": "training steps"})
    batch_size: int = field(default=256, metadata={"help": "global batch size (divided evenly among workers)"})
    optimizer: dict = field(
        default_factory=lambda: {"name": "sgd"},
        metadata={"help": "optax optimizer alias or {name, **kwargs}, e.g. {name: sgd, momentum: 0.9}"},
    )
    lr: float = field(default=0.1, metadata={"help": "learning rate"})
    lr_schedule: Any = field(
        default="constant",
        metadata={"help": "constant | cosine (decay to 0 over steps) | any optax schedule {name, **args}"},
    )
    lr_warmup: int = field(default=0, metadata={"help": "steps of linear learning-rate warm-up from 0"})
    seed: Any = field(default=0, metadata={"help": "int, or a list of ints run as one vmapped program"})
    compressor: dict = field(
        default_factory=lambda: {"name": "none"},
        metadata={"help": "compressor name or {name, **hparams} (cconv.compressors.names())"},
    )
    memory: str = field(default="none", metadata={"help": "none | ef (error feedback) | dgc (momentum correction)"})
    momentum: float = field(default=0.9, metadata={"help": "DGC momentum when memory is dgc"})
    masking: bool = field(default=True, metadata={"help": "DGC momentum-factor masking when memory is dgc"})
    ef_scale: Any = field(
        default=None,
        metadata={"help": "memory ef: scale the compressor's input by a in (0, 1], or auto (= 1/(1+omega)); null: 1"},
    )
    clip: Any = field(default=None, metadata={"help": "local gradient-clipping threshold (scaled by N^-1/2), or null"})
    warmup: Any = field(
        default=None,
        metadata={"help": "density warm-up {densities: [..] or dgc, steps_per_stage, dense_steps}, or null"},
    )
    local_steps: Any = field(
        default=1, metadata={"help": "local SGD steps between model averaging (1 = BSP), or adaptive (AdaComm)"}
    )
    local_steps_init: int = field(default=4, metadata={"help": "local_steps: adaptive: H_0, the initial period"})
    adapt_every: int = field(default=50, metadata={"help": "local_steps: adaptive: steps between updates of H"})
    sync: str = field(
        default="bsp", metadata={"help": "bsp | ssp | asp (asp needs architecture: parameter-server) | gossip"}
    )
    staleness: int = field(default=0, metadata={"help": "sync: ssp: staleness bound s (0 = BSP)"})
    max_staleness: Any = field(default=None, metadata={"help": "sync: asp: parameter versions kept (null: 2 workers)"})
    stragglers: Any = field(
        default=None, metadata={"help": "timing model: {fraction, slowdown}: a fixed subset computes slowdown x slower"}
    )
    jitter: float = field(default=0.0, metadata={"help": "timing model: lognormal sigma per worker-step"})
    worker_speeds: Any = field(default=None, metadata={"help": "timing model: relative compute time per worker"})
    post_local_switch: int = field(
        default=0, metadata={"help": "step at which BSP switches to local SGD (post-local SGD)"}
    )
    compress_delta: bool = field(default=False, metadata={"help": "local SGD: compress the averaged model delta"})
    granularity: str = field(default="layerwise", metadata={"help": "layerwise | fused (one flat buffer)"})
    min_compress_size: int = field(default=0, metadata={"help": "tensors with fewer elements are sent dense"})
    compress_vectors: bool = field(
        default=True, metadata={"help": "false: biases and other 1-D tensors are sent dense"}
    )
    architecture: str = field(
        default="all-to-all",
        metadata={
            "help": "all-to-all | parameter-server | ps (= parameter-server) | "
            "gtopk (= all-to-all with collective gtopk)"
        },
    )
    collective: str = field(default="auto", metadata={"help": "auto (the compressor's) | allgather | gtopk"})
    vote: bool = field(
        default=False, metadata={"help": "signSGD majority vote (sign compressors only); a tie gives +1"}
    )
    ps_downlink: Any = field(default=None, metadata={"help": "PS downlink compressor (name or mapping) or null"})
    launcher: str = field(
        default="shard_map",
        metadata={"help": " | ".join(n for n, cls in LAUNCHERS.items() if not cls.one_process_per_worker)},
    )
    network: Any = field(
        default=None, metadata={"help": "network for simulated time: preset name, {name, alpha, beta}, or a list"}
    )
    schedule: Any = field(
        default=None,
        metadata={
            "help": "simulated time: null (compute + exchange + sum of collective times) | bsp | wfbp | "
            "mg-wfbp | bytescheduler | fusion (event simulator over the model's layers)"
        },
    )
    servers: Any = field(
        default=None, metadata={"help": "simulated time with a schedule: parameter servers (push/pull), or null"}
    )
    log_every: int = field(default=10, metadata={"help": "steps between metric lines (and test evaluations)"})
    checkpoint_every: int = field(default=100, metadata={"help": "steps between checkpoints (resume points)"})
    target_loss: Any = field(default=None, metadata={"help": "loss for bytes-to-target in reports, or null"})
    wandb: Any = field(
        default=False, metadata={"help": "false, true, or {project, mode, entity, group}; offline by default"}
    )
    tensorboard: bool = field(
        default=False, metadata={"help": "also write TensorBoard event files to <run>/tensorboard/seed_<s>/"}
    )
    advise: Any = field(
        default=None,
        metadata={"help": "`cconv advise`: its search space and options (cconv.advisor.space); others ignore it"},
    )
    # --- gossip (decentralized training, cconv.engine.gossip) -------------------------------------
    gossip: str = field(
        default="dpsgd",
        metadata={"help": "sync gossip: dpsgd (D-PSGD; with a compressor: naive compressed gossip) | choco"},
    )
    topology: str = field(
        default="ring", metadata={"help": "sync gossip: ring | torus | exponential | complete | matrix"}
    )
    torus: Any = field(default=None, metadata={"help": "topology torus: [rows, cols] (null: most square)"})
    mixing: Any = field(default=None, metadata={"help": "topology matrix: the P x P mixing matrix (list of rows)"})
    gossip_gamma: Any = field(
        default=None,
        metadata={
            "help": "consensus step size in (0, 1] (choco; dpsgd with a compressor); null: the compressor's "
            "contraction delta (1 uncompressed); a value above it warns"
        },
    )

    # ------------------------------------------------------------------ helpers
    def to_dict(self) -> dict:
        """Every field, as plain Python values."""
        return dataclasses.asdict(self)

    def seeds(self) -> list[int]:
        """The seeds of the run (one, or the list run as one vmapped program)."""
        return list(self.seed) if isinstance(self.seed, list) else [int(self.seed)]

    def networks(self) -> list:
        """The network entries (preset names or mappings) simulated time is computed on."""
        if self.network is None:
            return []
        return list(self.network) if isinstance(self.network, list) else [self.network]

    def digest(self) -> str:
        """A short hash of the resolved config (identifies a run's content)."""
        d = {k: v for k, v in self.to_dict().items() if k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(RunConfig)}
_NAMED = ("model", "data", "optimizer", "compressor")  # fields given as name or {name, **hp}


def field_help() -> str:
    """One line per field: name, default, meaning (for --help)."""
    lines = []
    default = RunConfig()
    for name, f in FIELDS.items():
        lines.append(f"  {name:<18} {json.dumps(getattr(default, name), default=str):<26} {f.metadata['help']}")
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
    the defaults they held (``ADDED_FIELDS``); a damaged file (not UTF-8, not YAML, not a mapping)
    is a one-line ConfigError naming it."""
    try:
        raw = parse_yaml(read_text(path), path)
    except ConfigError as e:
        raise ConfigError(f"damaged run config: {e}; move the run directory aside or choose another --out") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"damaged run config {path}: not a mapping of config keys; move the run directory aside")
    if raw.get("sync", "bsp") != "gossip" and raw.get("gossip_gamma") == 1.0:  # written when 1.0 was the
        raw["gossip_gamma"] = None  # default (moot outside gossip); today's default is null
    return {**{k: v for k, v in ADDED_FIELDS.items() if k not in raw}, **raw}


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
    """Set a dotted key of a raw config in place (a name given as a string becomes {name: ...})."""
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"bad key {shown(dotted)}")
    top = parts[0]
    if top not in FIELDS:
        raise ConfigError(f"unknown config key {shown(top)}; valid keys: {', '.join(FIELDS)}")
    if len(parts) == 1:
        d[top] = value
        return
    if top in _NAMED or top in ("network", "wandb", "ps_downlink", "lr_schedule"):
        cur = d.get(top)
        if cur is None or isinstance(cur, (bool, list)):
            if top in _NAMED:
                cur = {"name": FIELDS[top].default_factory()["name"]}
            else:
                cur = {"name": FIELDS[top].default} if top == "lr_schedule" else {}
        elif isinstance(cur, str):
            cur = {"name": cur}
        else:
            cur = dict(cur)
        node = cur
        for p in parts[1:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {shown(dotted)}: {shown(p)} is not a mapping")
        node[parts[-1]] = value
        d[top] = cur
        return
    raise ConfigError(f"cannot set {shown(dotted)}: {shown(top)} is not a mapping")


PATH_KEYS = ("data.root",)  # config keys that hold a file-system path (a string)


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
            raise ConfigError(f"{where} is {v}: every number in a config must be finite")
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT and str(where)[:4] != "seed":
            raise ConfigError(f"{where} is {shown(v)}: integers in a config are at most 2**31 - 1 in magnitude")


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


def _named(value: Any, what: str) -> dict:
    if isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict):
        if "name" not in value or not isinstance(value["name"], str):
            raise ConfigError(f"{what}: a mapping needs a 'name' string, got {shown(value)}")
        return dict(value)
    raise ConfigError(f"{what}: expected a name or a mapping with 'name', got {shown(value)}")


def _int(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}, got {shown(v)}")
    return v


def _num(name: str, v: Any, lo: float | None = None, allow_none: bool = False, strict: bool = False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{name} must be a number, got {shown(v)}")
    if lo is not None and (v <= lo if strict else v < lo):
        raise ConfigError(f"{name} must be {'>' if strict else '>='} {lo}, got {shown(v)}")
    return float(v)


def _choice(name: str, v: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if v not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {shown(v)}")
    return v


def from_dict(raw: Any, source: str = "config") -> RunConfig:
    """Validate a raw mapping into a RunConfig (structure and ranges; library names are checked by
    ``check_names``, which imports the model/data/compressor registries)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        raise ConfigError(
            f"{source}: unknown config key(s) {', '.join(map(str, unknown))}; valid keys: {', '.join(FIELDS)}"
        )
    check_values(raw)
    cfg = RunConfig(**copy.deepcopy(raw))
    for n in _NAMED:
        setattr(cfg, n, _named(getattr(cfg, n), n))
    for dotted in PATH_KEYS:
        top, key = dotted.split(".")
        v = getattr(cfg, top).get(key)
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"{dotted} is a path: it must be a string, got {shown(v)}")
    if not isinstance(cfg.name, str):
        raise ConfigError(f"name must be a string, got {shown(cfg.name)}")
    cfg.workers = _int("workers", cfg.workers)
    cfg.steps = _int("steps", cfg.steps)
    cfg.batch_size = _int("batch_size", cfg.batch_size)
    if cfg.batch_size % cfg.workers:
        raise ConfigError(
            f"batch_size {cfg.batch_size} is not divisible by workers {cfg.workers} (the global batch is split evenly)"
        )
    cfg.lr = _num("lr", cfg.lr, 0.0, strict=True)
    if not isinstance(cfg.lr_schedule, str):
        cfg.lr_schedule = _named(cfg.lr_schedule, "lr_schedule")
    schedule_function(cfg.lr_schedule if isinstance(cfg.lr_schedule, str) else cfg.lr_schedule["name"])
    cfg.lr_warmup = _int("lr_warmup", cfg.lr_warmup, 0)
    optimizer_function(cfg.optimizer["name"])
    if isinstance(cfg.seed, list):
        if not cfg.seed or any(
            isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED for s in cfg.seed
        ):
            raise ConfigError(
                f"seed must be an integer in [0, 2**63 - 1] or a non-empty list of them, got {shown(cfg.seed)}"
            )
        if len(cfg.seed) > MAX_SEEDS:
            raise ConfigError(f"seed: {len(cfg.seed)} seeds (more than {MAX_SEEDS}, limit MAX_SEEDS); split the run")
        if len(set(cfg.seed)) != len(cfg.seed):
            raise ConfigError(f"seed list has duplicates: {shown(cfg.seed)}")
    else:
        cfg.seed = _int("seed", cfg.seed, 0)
        if cfg.seed > MAX_SEED:
            raise ConfigError(f"seed must be an integer in [0, 2**63 - 1], got {cfg.seed}")
    cfg.memory = _choice("memory", "none" if cfg.memory is None else cfg.memory, MEMORIES)
    cfg.momentum = _num("momentum", cfg.momentum, 0.0)
    if cfg.momentum >= 1:
        raise ConfigError(f"momentum must be in [0, 1), got {shown(cfg.momentum)}")
    if cfg.ef_scale is not None:
        if cfg.ef_scale != "auto" and (
            isinstance(cfg.ef_scale, bool) or not isinstance(cfg.ef_scale, (int, float)) or not 0 < cfg.ef_scale <= 1
        ):
            raise ConfigError(f"ef_scale must be null, auto or a number in (0, 1], got {shown(cfg.ef_scale)}")
        if cfg.memory != "ef":
            raise ConfigError(f"ef_scale scales error feedback: it needs memory: ef, got memory: {cfg.memory}")
        cfg.ef_scale = cfg.ef_scale if cfg.ef_scale == "auto" else float(cfg.ef_scale)
    cfg.clip = _num("clip", cfg.clip, 0.0, allow_none=True, strict=True)
    if cfg.local_steps != ADAPTIVE:
        cfg.local_steps = _int("local_steps", cfg.local_steps)
    cfg.local_steps_init = _int("local_steps_init", cfg.local_steps_init)
    cfg.adapt_every = _int("adapt_every", cfg.adapt_every)
    cfg.sync = _choice("sync", cfg.sync, sync_names())
    cfg.staleness = _int("staleness", cfg.staleness, 0)
    if cfg.max_staleness is not None:
        cfg.max_staleness = _int("max_staleness", cfg.max_staleness)
    _check_bounds(cfg)
    if cfg.stragglers is not None:
        st = cfg.stragglers
        if not isinstance(st, dict) or set(st) - {"fraction", "slowdown"}:
            raise ConfigError(f"stragglers must be null or a mapping {{fraction, slowdown}}, got {shown(st)}")
        cfg.stragglers = {k: _num(f"stragglers.{k}", v) for k, v in st.items()}
    cfg.jitter = _num("jitter", cfg.jitter, 0.0)
    if cfg.worker_speeds is not None:
        if not isinstance(cfg.worker_speeds, list):
            raise ConfigError(
                f"worker_speeds must be null or a list of {cfg.workers} numbers, got {shown(cfg.worker_speeds)}"
            )
        cfg.worker_speeds = [_num("worker_speeds[]", v, 0.0, strict=True) for v in cfg.worker_speeds]
    cfg.post_local_switch = _int("post_local_switch", cfg.post_local_switch, 0)
    cfg.granularity = _choice("granularity", cfg.granularity, GRANULARITIES)
    cfg.collective = _choice("collective", cfg.collective, COLLECTIVES)
    for flag in ("masking", "compress_delta", "compress_vectors"):
        if not isinstance(getattr(cfg, flag), bool):
            raise ConfigError(f"{flag} must be true or false, got {shown(getattr(cfg, flag))}")
    if cfg.warmup is not None:
        if not isinstance(cfg.warmup, dict):
            raise ConfigError(
                f"warmup must be null or a mapping {{densities, steps_per_stage, dense_steps}}, got {shown(cfg.warmup)}"
            )
        bad = [k for k in cfg.warmup if k not in WARMUP_KEYS]
        if bad:
            raise ConfigError(f"warmup: unknown key(s) {', '.join(map(str, bad))}; valid: {', '.join(WARMUP_KEYS)}")
        d = cfg.warmup.get("densities", "dgc")
        if d != "dgc" and (
            not isinstance(d, list)
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in d)
        ):
            raise ConfigError(f"warmup.densities must be 'dgc' or a list of numbers in (0, 1], got {shown(d)}")
    cfg.min_compress_size = _int("min_compress_size", cfg.min_compress_size, 0)
    cfg.architecture = _choice("architecture", cfg.architecture, (*ARCHITECTURES, *ARCHITECTURE_ALIASES))
    if not isinstance(cfg.vote, bool):
        raise ConfigError(f"vote must be true or false, got {shown(cfg.vote)}")
    if cfg.ps_downlink is not None:
        cfg.ps_downlink = _named(cfg.ps_downlink, "ps_downlink")
    # the runner is one process: launchers that need one process per worker (mpirun) are for the
    # engine API (experiments/cluster/), not for `cconv run`
    cfg.launcher = _choice(
        "launcher", cfg.launcher, [n for n, cls in LAUNCHERS.items() if not cls.one_process_per_worker]
    )
    cfg.log_every = _int("log_every", cfg.log_every)
    cfg.checkpoint_every = _int("checkpoint_every", cfg.checkpoint_every)
    cfg.target_loss = _num("target_loss", cfg.target_loss, allow_none=True)
    if not isinstance(cfg.wandb, (bool, dict)):
        got = shown(cfg.wandb)
        raise ConfigError(f"wandb must be true, false or a mapping {{project, mode, entity, group}}, got {got}")
    if isinstance(cfg.wandb, dict):
        bad = set(cfg.wandb) - {"project", "mode", "entity", "group", "tags"}
        if bad:
            raise ConfigError(
                f"wandb: unknown key(s) {', '.join(sorted(bad))}; valid: project, mode, entity, group, tags"
            )
    if not isinstance(cfg.tensorboard, bool):
        raise ConfigError(f"tensorboard must be true or false, got {shown(cfg.tensorboard)}")
    if cfg.schedule is not None:
        from cconv.theory.schedule import schedules

        cfg.schedule = _choice("schedule", cfg.schedule, schedules.names())
        if cfg.network is None:
            raise ConfigError(f"schedule: {cfg.schedule} sets the simulated time; it needs a network")
    if cfg.servers is not None:
        cfg.servers = _int("servers", cfg.servers)
        if cfg.schedule is None:
            raise ConfigError("servers: the parameter servers of the simulated time need a schedule")
    if cfg.advise is not None and not isinstance(cfg.advise, dict):
        raise ConfigError(f"advise must be a mapping (cconv.advisor.space), got {shown(cfg.advise)}")

    _check_gossip(cfg)
    nets = cfg.network
    if nets is not None:
        for n in nets if isinstance(nets, list) else [nets]:
            if not isinstance(n, (str, dict)):
                raise ConfigError(
                    f"network entries must be a preset name or a mapping {{name, alpha, beta}}, got {shown(n)}"
                )
    return cfg


def _check_gossip(cfg: RunConfig) -> None:
    """The gossip keys' types (their values and combinations: ``EngineConfig``, in ``check_names``)."""
    for name in ("gossip", "topology"):
        if not isinstance(getattr(cfg, name), str):
            raise ConfigError(f"{name} must be a string, got {shown(getattr(cfg, name))}")
    g = cfg.gossip_gamma
    if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g <= 1):
        raise ConfigError(f"gossip_gamma must be null (the compressor's safe value) or in (0, 1], got {shown(g)}")
    cfg.gossip_gamma = None if g is None else float(g)
    if cfg.sync != "gossip":
        set_keys = [k for k, default in GOSSIP_FIELDS.items() if getattr(cfg, k) != default]
        if set_keys:
            raise ConfigError(f"{', '.join(set_keys)}: gossip keys, but sync is {cfg.sync} (they need sync: gossip)")
    if cfg.torus is not None and not isinstance(cfg.torus, list):
        raise ConfigError(f"torus must be a list [rows, cols] or null, got {shown(cfg.torus)}")
    if cfg.mixing is not None and not (isinstance(cfg.mixing, list) and all(isinstance(r, list) for r in cfg.mixing)):
        raise ConfigError("mixing must be a list of rows (a P x P matrix) or null")
    if cfg.sync == "gossip" and cfg.workers < 2:
        raise ConfigError(f"sync: gossip needs at least 2 workers, got workers: {cfg.workers}")


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
