"""A validated ``RunConfig`` into the objects of a run, in one pass: ``problem(cfg) -> Problem``.

Each stage is one short function, runs once per build and in this order, reads only the config
keys listed (and what the stages before it built), raises a one-line ``ConfigError`` on bad input
and writes nothing:

1. ``load_data``: ``data`` (name, hyper-parameters, ``partition`` keys), ``workers``,
   ``batch_size``, ``seed`` -> the dataset and one ``Batcher`` per seed.
2. ``init_models``: ``model``, ``seed`` (and the dataset's input shape, classes and task) -> one
   ``ModelSpec`` per seed, the loss and the evaluation functions.
3. ``make_optimizer``: ``optimizer``, ``lr``, ``lr_schedule``, ``lr_warmup``, ``steps``,
   ``memory`` (and the parameters) -> the optax transformation: names and arguments checked against
   optax's signatures (``cconv.experiments.optax_names``), the schedule evaluated at step 0 and one
   ``init`` + ``update`` on the parameters, all abstractly (``jax.eval_shape``).
4. ``make_compression``: ``compressor``, ``ps_downlink``, ``memory``, ``ef_scale``, ``optimizer``,
   ``lr``, ``granularity``, ``min_compress_size``, ``compress_vectors`` (and the parameter shapes)
   -> the compressors and the error-feedback scale; ``ef_scale: auto`` and the two warnings
   (``ErrorFeedbackWarning``, ``SignLearningRateWarning``) read ONE query of
   ``cconv.theory.constants``: one per distinct compressed shape.
5. ``make_engine_config``: the engine's section of the config (``RunConfig.engine_section``:
   the keys declared ``engine_key``, ``config.ENGINE_KEYS``; of these ``architecture``,
   ``collective``, ``warmup``, ``ps_downlink`` and ``launcher`` translated), ``seed``,
   ``servers`` (and the compression and parameter shapes) -> the ``EngineConfig``, with the
   launcher the devices allow (``launcher_for``).
6. ``make_trainer``: ``seed`` (and all of the above) -> the engine's ``Trainer`` (several seeds:
   one program with a leading seed axis).

Seeds: seed s initialises its model from ``fold_in(key(s), 0)``, partitions the data with seed s
and batches it with ``fold_in(key(s), 1)``; step t uses ``fold_in(fold_in(key(s), 2), t)``
(``seed_keys``).

``check_names(cfg)`` is the same build without data and model (``shapes=None``): stages 3-5 run
on the config alone (before the devices are known: the configured launcher), plus the names of
the model, data and networks, and the optional writers; the CLI, sweeps and the advisor call it
so that bad input fails before anything is written.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cconv import data, engine, models
from cconv._text import shown
from cconv.comm.aggregation import TRANSPORTS, AllReduce, method_of
from cconv.compressors import get as get_compressor
from cconv.engine import optimizers
from cconv.engine.gossip import check_gamma
from cconv.engine.launchers import LAUNCHERS
from cconv.experiments import writers
from cconv.experiments.config import ARCHITECTURE_ALIASES, FIELDS, RunConfig, check_batch, default_of
from cconv.experiments.errors import ConfigError
from cconv.experiments.optax_names import check_arguments, optimizer_function, parameters, schedule_function
from cconv.theory import constants, network

if TYPE_CHECKING:
    from cconv.compressors.base import Compressor
    from cconv.data import Batcher, Dataset
    from cconv.engine import EngineConfig, Trainer
    from cconv.models import ModelSpec

PARTITION_KEYS = ("partition", "alpha", "min_size", "shards_per_worker")  # data keys of the partition
# required schedule arguments filled from the run when a config leaves them out (first present wins)
SCHEDULE_VALUE_ARGS = ("peak_value", "init_value", "value")  # = lr
SCHEDULE_LENGTH_ARGS = ("decay_steps", "transition_steps")  # = steps - lr_warmup


class Problem(NamedTuple):
    """Everything a run needs (``problem``)."""

    cfg: RunConfig
    ds: Dataset
    specs: list[ModelSpec]  # one per seed
    loss_fn: Callable
    eval_fn: Callable
    optimizer: optax.GradientTransformation
    engine_cfg: EngineConfig
    trainer: Trainer  # one; with several seeds, built with seeds=S
    batchers: list[Batcher]  # one per seed
    seeds: list[int]


class RunData(NamedTuple):
    """Stage 1: the dataset and one ``Batcher`` per seed."""

    ds: Dataset
    batchers: list[Batcher]


class Models(NamedTuple):
    """Stage 2: one ``ModelSpec`` per seed and the functions of the first (all seeds share them)."""

    specs: list[ModelSpec]
    loss_fn: Callable
    eval_fn: Callable


class Compression(NamedTuple):
    """Stage 4: the run's compressor, the parameter server's downlink compressor (or None) and the
    number ``ef_scale`` stands for."""

    compressor: Compressor
    downlink: Compressor | None
    ef_scale: float


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


# --------------------------------------------------------------------------- the one pass


def problem(cfg: RunConfig, compiler_options: dict | None = None, like: Problem | None = None, devices=None) -> Problem:
    """Everything a run needs, stage by stage (module docstring); bad input raises a one-line
    ValueError (``ConfigError`` where cconv checks it), and nothing is written.  ``compiler_options``:
    XLA's, for every program of the run (``cconv.engine.build``; none: XLA's defaults).  ``like``: a
    Problem whose config has the same data, model and seeds (the advisor's other candidates): its
    data set and initial models (immutable arrays) are reused, the batchers made anew.  ``devices``:
    the trainer's (``cconv.engine.build``; none: the launcher's default, every device)."""
    same = like is not None and same_inputs(cfg, like)
    run_data = load_data(cfg, like.ds if same else None)
    nets = Models(like.specs, like.loss_fn, like.eval_fn) if same else init_models(cfg, run_data.ds)
    params = nets.specs[0].params
    optimizer = make_optimizer(cfg, params)
    shapes = [x.shape for x in jax.tree.leaves(params)]
    compression = make_compression(cfg, shapes)
    engine_cfg = make_engine_config(cfg, compression, shapes, launcher=launcher_for(cfg), optimizer=optimizer)
    return Problem(
        cfg=cfg,
        ds=run_data.ds,
        specs=nets.specs,
        loss_fn=nets.loss_fn,
        eval_fn=nets.eval_fn,
        optimizer=optimizer,
        engine_cfg=engine_cfg,
        trainer=make_trainer(cfg, nets, optimizer, engine_cfg, compiler_options, devices),
        batchers=run_data.batchers,
        seeds=cfg.seeds(),
    )


def check_names(cfg: RunConfig) -> None:
    """The build without data and model (``shapes=None``): names and hyper-parameters against the
    registries (compressors, models, data, networks, optax) and the combination against
    ``EngineConfig``, so that a bad name fails before anything is written.  Compressor
    hyper-parameters are validated by the compressor registry (its entry's schema); names may be
    import paths (``"package.module:factory"``)."""
    try:
        writers.check_available(wandb=bool(cfg.wandb), tensorboard=cfg.tensorboard)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    optimizer = make_optimizer(cfg)
    make_engine_config(cfg, make_compression(cfg), optimizer=optimizer)
    for registry, spec in ((models, cfg.model), (data, cfg.data)):
        try:
            registry.hparams_of(spec["name"])  # a registered name or an importable "module:function"
        except ValueError as e:
            raise ConfigError(_first_line(e)) from None
    for n in cfg.networks():
        resolve_network(n)


# --------------------------------------------------------------------------- 1. data


def seed_keys(seed: int) -> dict:
    """Independent PRNG streams of one seed: model init, data order, per-step keys (a fresh dict of
    the same immutable keys on every call; computed once per seed and process: four eager
    dispatches each, and the advisor asks for every seed of every candidate)."""
    return dict(_seed_keys(int(seed)))


@functools.lru_cache(maxsize=256)
def _seed_keys(seed: int) -> tuple:
    base = jax.random.key(seed)
    return tuple((name, jax.random.fold_in(base, i)) for i, name in enumerate(("model", "data", "steps")))


def load_dataset(cfg: RunConfig) -> Dataset:
    """The run's dataset (``data`` without the partition keys)."""
    hp = {k: v for k, v in cfg.data.items() if k not in ("name",) + PARTITION_KEYS}
    return data.load(cfg.data["name"], **hp)


def same_inputs(cfg: RunConfig, like: Problem) -> bool:
    """Does ``cfg`` load the data set and initialise the models ``like`` was built on?"""
    return cfg.data == like.cfg.data and cfg.model == like.cfg.model and cfg.seeds() == like.cfg.seeds()


def load_data(cfg: RunConfig, ds: Dataset | None = None) -> RunData:
    """Stage 1: the dataset (``ds``: already loaded for this config), the global batch checked
    against it, and per seed s the training set partitioned over the workers with seed s and
    batched with ``seed_keys(s)["data"]``."""
    ds = load_dataset(cfg) if ds is None else ds
    check_batch(cfg, len(ds.train["y"]))
    pkw = {k: cfg.data[k] for k in PARTITION_KEYS if k in cfg.data}
    scheme = pkw.pop("partition", "iid")
    batchers = []
    for s in cfg.seeds():
        parts = data.partition(ds.train["y"], cfg.workers, scheme=scheme, key=s, **pkw)
        batchers.append(data.Batcher(ds.train, parts, cfg.batch_size, seed_keys(s)["data"]))
    return RunData(ds, batchers)


# --------------------------------------------------------------------------- 2. model


def init_models(cfg: RunConfig, ds: Dataset) -> Models:
    """Stage 2: the model of each seed, initialised from ``seed_keys(s)["model"]``."""
    hp = {k: v for k, v in cfg.model.items() if k != "name"}
    specs = []
    for s in cfg.seeds():
        try:
            specs.append(models.build(cfg.model["name"], ds.input_shape, ds.num_classes, seed_keys(s)["model"], **hp))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"model {cfg.model}: {_first_line(e)}") from None
    return Models(specs, models.make_loss(specs[0], ds.task), models.make_eval(specs[0], ds.task))


# --------------------------------------------------------------------------- 3. optimizer


def schedule_arguments(cfg: RunConfig) -> tuple[Any, dict]:
    """(optax schedule function, its keyword arguments) of the run's ``lr_schedule``: the
    config's arguments, plus the required ones it leaves out that the run defines (value = lr,
    length = steps - lr_warmup: ``SCHEDULE_VALUE_ARGS``, ``SCHEDULE_LENGTH_ARGS``)."""
    spec = {"name": cfg.lr_schedule} if isinstance(cfg.lr_schedule, str) else dict(cfg.lr_schedule)
    fn = schedule_function(spec["name"])
    params = parameters(fn)
    required = [k for k, p in params.items() if p.default is p.empty]
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    fills = ((SCHEDULE_VALUE_ARGS, cfg.lr), (SCHEDULE_LENGTH_ARGS, max(cfg.steps - cfg.lr_warmup, 1)))
    for names, value in fills:
        present = [n for n in names if n in params]
        if present and present[0] in required and present[0] not in kwargs:
            kwargs[present[0]] = value
    check_arguments(f"lr_schedule {spec['name']!r}", fn, kwargs)
    return fn, kwargs


def make_schedule(cfg: RunConfig) -> optax.Schedule:
    """The learning-rate schedule: ``lr_warmup`` steps linear from 0 to lr, then ``lr_schedule``;
    built and evaluated abstractly at step 0 (``jax.eval_shape``), so that an argument of the wrong
    type is a one-line ConfigError here, not a failed run."""
    fn, kwargs = schedule_arguments(cfg)  # names and arguments (one-line errors of their own)
    try:
        schedule = fn(**kwargs)
        if cfg.lr_warmup:
            warm = optax.linear_schedule(0.0, cfg.lr, cfg.lr_warmup)
            schedule = optax.join_schedules([warm, schedule], [cfg.lr_warmup])
        jax.eval_shape(schedule, jnp.zeros((), jnp.int32))
    except Exception as e:  # noqa: BLE001 - any error of optax on these arguments is bad input
        raise ConfigError(f"lr_schedule {cfg.lr_schedule}: {type(e).__name__}: {_first_line(e)}") from None
    return schedule


def check_optimizer(cfg: RunConfig, optimizer: optax.GradientTransformation, params: Any) -> None:
    """One abstract ``init`` + ``update`` on the model's parameter shapes (``jax.eval_shape``,
    nothing computed): an optimizer argument of the wrong type (``momentum: abc``, ``b1: [1]``)
    becomes a one-line ConfigError here, before anything is written, not a failed run."""

    def probe(p):
        return optimizer.update(p, optimizer.init(p), p)

    try:
        jax.eval_shape(probe, params)
    except Exception as e:  # noqa: BLE001 - any error of optax on these arguments is bad input
        raise ConfigError(f"optimizer {cfg.optimizer}: {type(e).__name__}: {_first_line(e)}") from None


def make_optimizer(cfg: RunConfig, params: Any = None) -> optax.GradientTransformation:
    """Stage 3: ``optax.<name>(learning_rate=make_schedule(cfg), **arguments)``, its arguments
    checked against the function's signature and, given the parameters (or their shapes), by one
    abstract step (``check_optimizer``)."""
    spec = cfg.optimizer
    fn = optimizer_function(spec["name"])
    check_arguments(f"optimizer {spec['name']!r}", fn, spec, given=("learning_rate",))
    schedule = make_schedule(cfg)
    if cfg.memory == "dgc" and (spec["name"] != "sgd" or spec.get("momentum")):
        raise ConfigError("memory: dgc keeps the momentum itself; use optimizer {name: sgd} without momentum")
    try:
        optimizer = fn(learning_rate=schedule, **{k: v for k, v in spec.items() if k != "name"})
    except Exception as e:  # noqa: BLE001 - any error of optax on these arguments is bad input
        raise ConfigError(f"optimizer {cfg.optimizer}: {type(e).__name__}: {_first_line(e)}") from None
    if params is not None:
        check_optimizer(cfg, optimizer, params)
    return optimizer


# --------------------------------------------------------------------------- 4. compression


class ErrorFeedbackWarning(UserWarning):
    """Error feedback around a compressor it is not guaranteed to converge with (the CLI prints
    it as one line, ``cconv: warning: ...``)."""

    one_line = True


class NothingCompressedWarning(UserWarning):
    """A compressor that this model's tensors never reach: every tensor is 1-D (dense by default,
    ``compress_vectors``) or under ``min_compress_size``, so the run is dense under another name
    (the CLI prints it as one line)."""

    one_line = True


def warn_if_nothing_compressed(engine_cfg: Any, shapes: Iterable) -> None:
    """``NothingCompressedWarning`` when ``engine_cfg``'s compressor compresses none of ``shapes``
    (the exchange's own plan, ``cconv.engine.exchange.make_plan``); gossip compresses every tensor."""
    from cconv import compressors as C
    from cconv.engine.exchange import make_plan

    comp, shapes = engine_cfg.compressor, list(shapes)
    if engine_cfg.sync == "gossip" or not shapes or C.registered_name(comp) == C.IDENTITY:
        return
    if any(make_plan(engine_cfg, comp, shapes, memory=engine_cfg.memory).compressed):
        return
    warnings.warn(
        f"compressor {C.registered_name(comp)} compresses none of this model's {len(shapes)} tensors (1-D tensors "
        f"travel dense by default, and those under min_compress_size): the run is dense; set "
        f"compress_vectors: true to compress 1-D tensors",
        NothingCompressedWarning,
        stacklevel=2,
    )


class SignLearningRateWarning(UserWarning):
    """A compressor whose output is not bounded by its input (signSGD's +-1 per coordinate) under
    plain SGD with a learning rate of SGD's range (the CLI prints it as one line)."""

    one_line = True


# SGD's learning rates (0.01 to 1) are chosen for gradients whose entries are far below 1; with
# outputs of size 1 per coordinate they move every coordinate by lr per step.
SGD_TUNED_LR = 0.01
_WARNED: set = set()  # (compressor, omega) and (compressor, lr) pairs already warned about in this process


def make_compressor(spec: dict, what: str = "compressor") -> Compressor:
    """The compressor of a ``{name, **hparams}`` spec, validated by the compressor registry (its
    entry's schema); a bad name or value is a one-line ConfigError."""
    try:
        return get_compressor(spec["name"], **{k: v for k, v in spec.items() if k != "name"})
    except ValueError as e:
        raise ConfigError(_first_line(e)) from None
    except TypeError as e:  # a plain user factory called with arguments it does not take
        raise ConfigError(f"{what} {shown(spec)}: {e}") from None


def compressed_shapes(cfg: RunConfig, shapes: Iterable) -> list[tuple[int, ...]]:
    """The shapes of the tensors the engine compresses (``min_compress_size``,
    ``compress_vectors``; one flat buffer when ``granularity: fused``)."""
    keep = []
    for s in shapes:
        s = tuple(int(n) for n in s)
        n = math.prod(s)
        if n > 0 and n >= cfg.min_compress_size and (cfg.compress_vectors or len(s) > 1):
            keep.append(s)
    if cfg.granularity == "fused" and keep:
        return [(sum(math.prod(s) for s in keep),)]
    return keep


def theory_constants(c: Compressor, shapes: Iterable) -> dict:
    """{shape: ``cconv.theory.constants.constants(c, shape)``} over the distinct shapes, sorted:
    one query per shape.  A shape the theory cannot answer maps to its ValueError (each reader
    decides what that means: an error for ``ef_scale: auto``, silence for the warnings)."""
    table: dict = {}
    for s in sorted(set(shapes)):
        try:
            table[s] = constants.constants(c, s)
        except ValueError as e:
            table[s] = e
    return table


def largest_omega(table: dict) -> tuple[float, tuple] | None:
    """(omega, shape): the largest worst-case variance factor in a ``theory_constants`` table, or
    None when the compressor is not unbiased.  The ValueError of a shape without constants."""
    best = None
    for s, k in table.items():
        if isinstance(k, ValueError):
            raise k
        if k.kind != "unbiased" or k.omega is None:
            return None
        if best is None or k.omega > best[0]:
            best = (float(k.omega), s)
    return best


def _ef_scale(cfg: RunConfig, table: Callable[[], dict]) -> float:
    """The number ``ef_scale`` stands for: 1 (null), the number, or for ``auto`` 1/(1 + omega)
    with omega the largest over the compressed tensors (1 when the compressor is contractive or
    the memory is not ef): C(p / (1 + omega)) is then a delta-contraction with delta =
    1/(1 + omega) on every tensor (``cconv.memory.error_feedback``)."""
    if cfg.ef_scale is None:
        return 1.0
    if cfg.ef_scale != "auto":
        return float(cfg.ef_scale)
    if cfg.memory != "ef":
        return 1.0
    try:
        om = largest_omega(table())
    except ValueError as e:
        raise ConfigError(
            f"ef_scale: auto needs the variance factor omega of {cfg.compressor['name']!r} "
            f"({_first_line(e)}); give ef_scale a number in (0, 1]"
        ) from None
    return 1.0 if om is None else 1.0 / (1.0 + om[0])


def _warn_error_feedback(cfg: RunConfig, c: Compressor, table: Callable[[], dict]) -> None:
    """Warn once (per compressor and omega, per process) when plain error feedback runs around an
    unbiased compressor with omega >= 1: EF needs a delta-contraction and can diverge there."""
    if cfg.memory != "ef" or cfg.ef_scale is not None:
        return
    try:
        om = largest_omega(table())
    except ValueError:  # no constants for this compressor: nothing to say
        return
    if om is None or om[0] < 1 or (c.name, om[0]) in _WARNED:
        return
    _WARNED.add((c.name, om[0]))
    warnings.warn(
        f"memory ef around unbiased {c.name} (omega = {om[0]:.3g} >= 1 for a tensor of shape {om[1]}, "
        f"cconv.theory.constants.omega) is not a delta-contraction and can diverge; "
        f"set ef_scale: auto (input scaled by 1/(1+omega) = {1 / (1 + om[0]):.3g})",
        ErrorFeedbackWarning,
        stacklevel=2,
    )


def _warn_sign_learning_rate(cfg: RunConfig, c: Compressor, table: Callable[[], dict]) -> None:
    """Warn once per compressor and lr when plain SGD with lr >= SGD_TUNED_LR runs a compressor
    whose registry bound says it is not even non-expansive, nor of bounded error
    (``Bound(kind="biased", delta=None, omega=None)``,
    ``cconv.theory.constants``): its update is not scaled to the gradient, so the learning rate
    must be retuned (decided from the entry; no compressor is named here)."""
    if cfg.optimizer.get("name") != "sgd" or not isinstance(cfg.lr, (int, float)) or cfg.lr < SGD_TUNED_LR:
        return
    for k in table().values():
        if isinstance(k, ValueError):  # no constants for this compressor: nothing to say
            return
        if k.kind == "biased" and k.delta is None and k.omega is None and (c.name, cfg.lr) not in _WARNED:
            _WARNED.add((c.name, cfg.lr))
            warnings.warn(
                f"{c.name} is not scaled to the gradient (not even non-expansive, cconv.theory.constants: "
                f"each coordinate of its update is +-1) and runs under optimizer sgd with lr {cfg.lr:g}, a "
                f"learning rate for SGD: every coordinate moves by lr per step; retune lr (e.g. 10-100x smaller) "
                f"or use a scaled variant",
                SignLearningRateWarning,
                stacklevel=2,
            )
            return


def make_compression(cfg: RunConfig, shapes: Iterable | None = None) -> Compression:
    """Stage 4: the compressors and the error-feedback scale of the run whose parameters have
    ``shapes``.  The theory (``theory_constants`` of the compressed shapes) is queried at most once,
    when ``ef_scale: auto`` or a warning needs it.  Without shapes (``check_names``) only whether
    ``auto`` can be resolved is checked (on a probe tensor), and ``auto`` stands for 1."""
    c = make_compressor(cfg.compressor)
    down = None if cfg.ps_downlink is None else make_compressor(cfg.ps_downlink, "ps_downlink")
    probe = shapes is None
    table = functools.cache(lambda: theory_constants(c, compressed_shapes(cfg, [(8,)] if probe else shapes)))
    ef_scale = _ef_scale(cfg, table)
    if probe:
        return Compression(c, down, 1.0 if cfg.ef_scale in (None, "auto") else ef_scale)
    _warn_error_feedback(cfg, c, table)
    _warn_sign_learning_rate(cfg, c, table)
    return Compression(c, down, ef_scale)


# --------------------------------------------------------------------------- 5. engine config, launcher


def _warmup(cfg: RunConfig) -> engine.Warmup | None:
    """The engine's density warm-up of ``warmup`` (``densities: dgc``, or none given, is DGC's
    schedule); the keys not given take ``Warmup``'s defaults (written there)."""
    if cfg.warmup is None:
        return None
    d = cfg.warmup.get("densities", "dgc")
    rest = {k: v for k, v in cfg.warmup.items() if k != "densities"}
    return engine.Warmup(engine.DGC_WARMUP if d == "dgc" else tuple(d), **rest)


def _check_servers(cfg: RunConfig, engine_cfg: EngineConfig) -> None:
    """``servers`` on an all-to-all engine simulates its all-reduce through parameter servers
    (``cconv.theory.schedule.runs``); other exchanges (gathered payloads, gossip) have no server
    form there: refused (they go through servers with ``architecture: parameter-server``)."""
    if cfg.servers is None or TRANSPORTS[engine_cfg.architecture].via_server:
        return
    method = (
        "gossip" if cfg.sync == "gossip" else method_of(engine_cfg.compressor, engine_cfg.collective, engine_cfg.vote)
    )
    if method != AllReduce.name:
        raise ConfigError(
            f"servers: {cfg.servers} simulates an all-reduce through parameter servers; this run's exchange is "
            f"{method} ({cfg.compressor['name']}): use architecture: parameter-server"
        )


def _optimizer_fields(cfg: RunConfig, optimizer: Any) -> dict:
    """The ``EngineConfig`` fields an optimizer sets itself (``MessageTransformation.engine``: 1-bit
    Adam's compressor, memory and dense warm-up); a config key of the same name left at its default
    (or naming the value the optimizer sets, ``sync: zero_one`` beside 0/1 Adam) or a one-line
    ConfigError."""
    fields = getattr(optimizer, "engine", None) or {}
    for k, own in fields.items():
        if k not in FIELDS:
            continue
        given = getattr(cfg, k)
        same = isinstance(own, (str, bool, int, float)) and given == own  # plain values; objects never equal
        if given != default_of(k) and not same:
            raise ConfigError(
                f"optimizer {cfg.optimizer['name']} sets the engine's {k} itself (from its own knobs); "
                f"remove {k}: {shown(given)} from the config"
            )
    return dict(fields)


def make_engine_config(
    cfg: RunConfig,
    compression: Compression | None = None,
    shapes: Iterable | None = None,
    launcher: str | None = None,
    optimizer: Any = None,
) -> EngineConfig:
    """Stage 5: the ``cconv.engine.EngineConfig`` of a run (the engine validates the combination;
    its ValueError becomes a one-line ConfigError).  An architecture alias
    (``ARCHITECTURE_ALIASES``) is replaced by the engine fields it stands for.  ``compression``:
    stage 4's (default: made here from ``shapes``); ``shapes``: the parameter shapes, for gossip's
    consensus step (``cconv.engine.gossip.check_gamma``); ``launcher``: the one the devices allow
    (``launcher_for``; default: the configured one); ``optimizer``: stage 3's, whose own engine
    fields (``cconv.engine.optimizers.MessageTransformation.engine``) replace the config's."""
    compression = make_compression(cfg, shapes) if compression is None else compression
    own = _optimizer_fields(cfg, optimizer)
    topology = {
        "architecture": cfg.architecture,
        "collective": cfg.collective,
        **ARCHITECTURE_ALIASES.get(cfg.architecture, {}),
    }
    try:
        fields = {
            **cfg.engine_section(),  # the engine's keys as configured; those spelt otherwise replaced:
            **topology,
            "compressor": compression.compressor,
            "ps_downlink": compression.downlink,
            "ef_scale": compression.ef_scale,
            "warmup": _warmup(cfg),
            "timing_seed": cfg.seeds()[0],
            "launcher": launcher or cfg.launcher,
        }
        engine_cfg = engine.EngineConfig(**{**fields, **own})
        if optimizer is not None:  # e.g. 1-bit Adam's messages need a mode that averages them every step
            optimizers.check(engine_cfg, optimizer)
        if shapes is not None:
            shapes = list(shapes)
            if cfg.sync == "gossip":
                check_gamma(engine_cfg, shapes)  # gossip compresses every tensor; before anything is written
            warn_if_nothing_compressed(engine_cfg, shapes)
    except ValueError as e:
        raise ConfigError(_first_line(e)) from None
    _check_servers(cfg, engine_cfg)
    return engine_cfg


def check_devices(workers: int, launcher: str = default_of("launcher")) -> None:
    """Refuse, in one line, to run more workers than the backend has devices: on CPU, where the
    CLI simulates one device per worker, unless the launcher runs every worker on one device
    (``launcher: vmap``); on GPU/TPU such runs use that launcher (``launcher_for``)."""
    n = jax.device_count()
    if workers > n and not LAUNCHERS[launcher].one_device:
        plat = jax.default_backend()
        if plat != "cpu":
            return
        hint = (
            " (the CLI sets XLA_FLAGS=--xla_force_host_platform_device_count before jax starts; "
            "it must not be overridden with a smaller count)"
        )
        raise ConfigError(f"workers={workers} but only {n} {plat} device(s) are available{hint}")


_ANNOUNCED: set = set()


def launcher_for(cfg: RunConfig) -> str:
    """The launcher a run uses: ``cfg.launcher``, except that on a GPU/TPU with fewer devices
    than ``workers`` every worker runs on one device (the one-device launcher, ``vmap``; one line
    says so, once per process).  On CPU the CLI simulates one device per worker instead."""
    n, plat = jax.device_count(), jax.default_backend()
    if LAUNCHERS[cfg.launcher].one_device or cfg.workers <= n or plat == "cpu":
        return cfg.launcher
    name = next(k for k, cls in LAUNCHERS.items() if cls.one_device)
    if (cfg.workers, n) not in _ANNOUNCED:
        _ANNOUNCED.add((cfg.workers, n))
        print(f"cconv: workers={cfg.workers} > {n} {plat} device(s): launcher {name} (all workers on one device)")
    return name


def resolve_network(spec: str | dict) -> network.Network:
    """A ``cconv.theory.network.Network`` from a config entry (name or mapping)."""
    try:
        return network.from_config(spec)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"network {shown(spec)}: {_first_line(e)}") from None


def network_label(spec: str | dict) -> str:
    """The name a network entry is shown and logged under (``sim_time@<label>``)."""
    return spec if isinstance(spec, str) else str(spec.get("name", "custom"))


# --------------------------------------------------------------------------- 6. trainer


def make_trainer(
    cfg: RunConfig,
    nets: Models,
    optimizer: optax.GradientTransformation,
    engine_cfg: EngineConfig,
    compiler_options: dict | None = None,
    devices=None,
) -> Trainer:
    """Stage 6: the engine's trainer on the first seed's model; several seeds: one program that
    carries a leading seed axis (the engine's ``build(seeds=S)``)."""
    n = len(cfg.seeds())
    spec = nets.specs[0]
    return engine.build(
        nets.loss_fn,
        spec.params,
        optimizer,
        engine_cfg,
        model_state=spec.model_state,
        seeds=n if n > 1 else None,
        compiler_options=compiler_options,
        devices=devices,
    )
