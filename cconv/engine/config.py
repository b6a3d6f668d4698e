"""Engine configuration, warm-up schedules and the static per-step phase.

``EngineConfig`` is a frozen dataclass; ``phase_of(engine_cfg, step)`` tells what step ``step`` does
(which density, gradient averaging or local SGD, sync or not).  A step's phase is static: each
distinct phase is compiled once, so changing density under warm-up changes the payload shapes
(and the logged bytes) for real.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from cconv import _rules as R
from cconv import compressors as C
from cconv import memory as M
from cconv._text import shown
from cconv.comm import aggregation
from cconv.compressors.base import Compressor
from cconv.engine import modes, worker_clock
from cconv.engine.launchers import LAUNCHERS  # name -> Launcher class
from cconv.engine.modes import ADAPTIVE  # local_steps: AdaComm's adaptive communication period
from cconv.engine.worker_clock import Stragglers
from cconv.memory.dgc import MOMENTUM as DGC_MOMENTUM  # Lin et al. 2018's m, the memory's momentum

# The uncompressed baseline's registered name (defined by the compressors layer).
IDENTITY: str = C.IDENTITY
MEMORIES = M.MEMORIES  # name -> Memory factory
GRANULARITIES = ("layerwise", "fused")
ARCHITECTURES = tuple(aggregation.TRANSPORTS)  # "all-to-all", "parameter-server"
COLLECTIVES = aggregation.COLLECTIVES  # "auto" (the compressor's aggregation), "allgather", "gtopk"
DGC_WARMUP = (0.25, 0.0625, 0.015625, 0.004)
# EngineConfig's gossip fields (decentralized training, ``sync="gossip"``; ``cconv.engine.gossip``):
# meaningful only under gossip (a run config refuses them set elsewhere)
GOSSIP_FIELDS = ("gossip", "topology", "torus", "mixing", "gossip_gamma")


def _field(default, rule: R.Rule):
    """A field and its rule (``cconv._rules``): ``EngineConfig`` runs it under the name
    ``EngineConfig.<field>``, a run config (``cconv.experiments.config.engine_key``) under the
    YAML key's; the one place the field's range is written."""
    return dataclasses.field(default=default, metadata={"rule": rule})


def _real(v) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def _integer(v) -> bool:
    """An integer (Python or numpy; not a bool)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


@dataclasses.dataclass(frozen=True)
class Warmup:
    """A density schedule: ``dense_steps`` uncompressed steps, then ``densities[i]`` for
    ``steps_per_stage`` steps each, then the compressor's own density.

    DGC (Lin et al. 2018) warms up over the first 4 epochs with densities 0.25, 0.0625,
    0.015625, 0.004, then 0.001 (the compressor's ratio): ``dgc_warmup(steps_per_epoch)``.
    Densities need a compressor whose entry sets them (``Entry.at_density``); ``dense_steps``
    alone suits any compressor (1-bit Adam's warm-up: ``cconv.engine.onebit_adam``).
    """

    densities: Sequence[float] = ()
    steps_per_stage: int = 1
    dense_steps: int = 0

    def __post_init__(self):
        d = self.densities
        if isinstance(d, (str, bytes)) or not isinstance(d, Sequence) or not all(_real(x) and 0 < x <= 1 for x in d):
            raise ValueError(f"Warmup: densities must be a sequence of numbers in (0, 1], got {shown(d)}")
        object.__setattr__(self, "densities", tuple(float(x) for x in d))
        for name, lo in (("steps_per_stage", 1), ("dense_steps", 0)):
            v = getattr(self, name)
            if not _integer(v) or v < lo:
                raise ValueError(f"Warmup: {name} must be an integer >= {lo}, got {shown(v)}")
            object.__setattr__(self, name, int(v))

    def density(self, step: int) -> float | None:
        """Density at ``step`` (1.0 in the dense phase), or None for the compressor's own."""
        if step < self.dense_steps:
            return 1.0
        stage = (step - self.dense_steps) // self.steps_per_stage
        return self.densities[stage] if stage < len(self.densities) else None


def dgc_warmup(steps_per_epoch: int, epochs_per_stage: int = 1, dense_steps: int = 0) -> Warmup:
    """DGC's exponential warm-up: 0.25, 0.0625, 0.015625, 0.004, then the compressor's ratio."""
    return Warmup(DGC_WARMUP, steps_per_stage=int(steps_per_epoch) * int(epochs_per_stage), dense_steps=dense_steps)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """What the data-parallel engine does (see docs/engine.md, "Python API").

    A field's range is its rule (``_field(default, rule)``, ``cconv._rules``): ``__post_init__``
    runs it (then the checks that relate fields), and a run config's key of the same name
    (``cconv.experiments.config.engine_key``) takes the field's default and rule.

    workers            P, number of data-parallel workers (mesh devices, pmap devices or MPI ranks)
    compressor         a ``Compressor`` or a registered name (None: no compression)
    memory             a key of ``MEMORIES``: none, ef (error feedback) or dgc (DGC's momentum
                       correction + masking; the optimizer must then be plain SGD: the momentum
                       lives in the memory), ef21 / ef21_sgdm (EF21: compress the change of each
                       worker's gradient estimate; the update is the server's estimate)
    momentum, masking  DGC memory's momentum factor and momentum-factor masking (momentum is
                       EF21-SGDM's beta = 1 - eta)
    ef_scale           error feedback's input scale a in (0, 1]: the compressor sees a (g + e);
                       1/(1 + omega) makes an unbiased compressor with variance factor omega a
                       delta-contraction (``cconv.memory.error_feedback``); 1: plain EF
    clip               local gradient clipping: each worker clips its gradient's global norm to
                       clip * P^(-1/2) (DGC), before memory and compression; None: off
    warmup             a ``Warmup`` density schedule (``dgc_warmup(...)``), None: off
    local_steps        H: local SGD averages models every H steps.  Model averaging is active
                       when H > 1 or post_local_switch > 0; otherwise gradients are averaged
                       every step (BSP).  "adaptive": AdaComm (Wang and Joshi 2019), H_t =
                       ceil(sqrt(F(x_t) / F(x_0)) H_0) re-evaluated every ``adapt_every`` steps
                       from the training loss (``cconv.engine.sync.AdaComm``)
    local_steps_init   AdaComm's H_0
    adapt_every        AdaComm: steps between updates of H
    post_local_switch  step at which BSP switches to local SGD (post-local SGD, Lin et al. 2020)
    compress_delta     under local SGD, compress the model delta with ``compressor`` (+ memory)
    granularity        "layerwise" (one payload per tensor) | "fused" (one flat buffer)
    min_compress_size  tensors with fewer elements are sent dense
    compress_vectors   True: tensors with ndim <= 1 (biases, norm scales) are compressed too; False
                       (default): they are sent dense in the fused all-reduce and counted as dense
                       bytes, as DDP's PowerSGD hook and DGC's reference code leave them
    architecture       "all-to-all" | "parameter-server" (server co-located with worker 0)
    collective         "auto" (the compressor's aggregation) | "allgather" | "gtopk"
                       (recursive-doubling global top-k; compressors whose registry entry lists
                       it in ``collectives``, P a power of 2)
    vote               signSGD majority vote: update = sign(sum_w decompress(payload_w)); a tie
                       (sum 0, possible with an even number of workers) gives +1.  Only for
                       compressors whose registry entry declares ``votes`` (sign compressors)
    ps_downlink        compressor for the server's reply (error feedback on the server)
    launcher           a key of ``LAUNCHERS``: shard_map (default), pmap, vmap (all workers on
                       one device) or mpi
    axis_name          name of the worker axis
    sync               synchronization mode, a key of ``cconv.engine.sync.SYNC_MODES``: bsp
                       (default; with local_steps > 1 or post_local_switch: local SGD), ssp, asp,
                       gossip (decentralized: ``cconv.engine.gossip``; the fields below)
    staleness          SSP's bound s (clocks a gradient's parameters may lag; 0: BSP exactly)
    max_staleness      ASP: the parameter versions kept (a gradient older than this is computed on
                       the oldest kept version); None: 2 P
    stragglers         timing model: ``Stragglers(fraction, slowdown)`` (a fixed subset of the
                       workers, drawn from ``timing_seed``, computes ``slowdown`` times slower)
    jitter             timing model: lognormal sigma of each worker-step's compute time (0: none)
    worker_speeds      timing model: explicit relative compute times per worker (P positive
                       numbers, multiplied into the stragglers' slowdown; None: all 1)
    timing_seed        seed of the timing model (``cconv.engine.worker_clock``)
    gossip             "dpsgd" (D-PSGD; with a compressor: naive compressed gossip of the models)
                       | "choco" (CHOCO-SGD: compressed differences and public copies x_hat)
    topology           a key of ``cconv.comm.topology.TOPOLOGIES``: ring, torus, exponential,
                       complete, matrix (Metropolis-Hastings weights, except ``matrix``)
    torus              (rows, cols) of the torus (None: the most square factorisation of P)
    mixing             the explicit P x P mixing matrix of ``topology="matrix"``
    gossip_gamma       consensus step size gamma in (0, 1] (CHOCO; naive compressed D-PSGD); None:
                       the compressor's safe value, gamma = delta per tensor
                       (``cconv.engine.gossip.safe_gamma``); an explicit value above it warns
    """

    workers: int = _field(1, R.integer(1))
    compressor: Compressor | str | None = None
    memory: str = _field(M.NONE, R.choice(lambda: MEMORIES, null=M.NONE))
    momentum: float = _field(DGC_MOMENTUM, R.number(0.0, below=1))
    masking: bool = _field(True, R.flag())
    ef_scale: float = 1.0
    clip: float | None = _field(None, R.number(0.0, strict=True, optional=True))
    warmup: Warmup | None = None
    local_steps: int | str = _field(1, R.integer(1, also=(ADAPTIVE,)))
    local_steps_init: int = _field(4, R.integer(1))
    adapt_every: int = _field(50, R.integer(1))
    post_local_switch: int = _field(0, R.integer(0))
    compress_delta: bool = _field(False, R.flag())
    granularity: str = _field("layerwise", R.choice(lambda: GRANULARITIES))
    min_compress_size: int = _field(0, R.integer(0))
    compress_vectors: bool = _field(False, R.flag())
    architecture: str = "all-to-all"
    collective: str = _field("auto", R.choice(lambda: COLLECTIVES))
    vote: bool = _field(False, R.flag())
    ps_downlink: Compressor | str | None = None
    launcher: str = "shard_map"
    axis_name: str = "workers"
    sync: str = _field("bsp", R.choice(modes.public_names))  # the registry the modes fill
    staleness: int = _field(0, R.integer(0))
    max_staleness: int | None = _field(None, R.integer(1, optional=True))
    stragglers: Stragglers | None = None
    jitter: float = _field(0.0, R.number(0.0))
    worker_speeds: Sequence[float] | None = _field(None, R.numbers("workers", R.number(0.0, strict=True)))
    timing_seed: int = 0
    # --- gossip (decentralized training; cconv.engine.gossip) ---------------------------------
    gossip: str = _field("dpsgd", R.choice(lambda: modes.GOSSIP))
    topology: str = _field("ring", R.string())
    torus: tuple | None = None
    mixing: tuple | None = None
    gossip_gamma: float | None = _field(None, R.fraction("null (the compressor's safe value) or in (0, 1]"))

    def __post_init__(self):
        def choice(field, valid):
            v = getattr(self, field)
            if not isinstance(v, str) or v not in valid:
                raise ValueError(f"EngineConfig.{field}={shown(v)}; valid: {', '.join(valid)}")

        for f in dataclasses.fields(self):  # each field's own rule (_field), normalizing its value
            if "rule" in f.metadata:
                v = f.metadata["rule"](f"EngineConfig.{f.name}", getattr(self, f.name), vars(self))
                object.__setattr__(self, f.name, v)
        if self.architecture == "ps":
            object.__setattr__(self, "architecture", "parameter-server")
        for name in ("compressor", "ps_downlink"):
            v = getattr(self, name)
            if v is None and name == "compressor":
                v = IDENTITY
            if isinstance(v, str):
                object.__setattr__(self, name, C.get(v))
            elif v is not None and not isinstance(v, Compressor):
                raise ValueError(f"EngineConfig.{name} must be a Compressor or a registered name, got {shown(v)}")
        choice("architecture", ARCHITECTURES)
        choice("launcher", LAUNCHERS)
        if not _real(self.ef_scale) or not 0 < self.ef_scale <= 1:
            raise ValueError(f"EngineConfig.ef_scale must be a number in (0, 1], got {shown(self.ef_scale)}")
        if self.ef_scale != 1 and self.memory != "ef":
            raise ValueError(f"EngineConfig.ef_scale scales error feedback: needs memory='ef', got {self.memory!r}")
        if not isinstance(self.axis_name, str) or not self.axis_name:
            raise ValueError(f"EngineConfig.axis_name must be a non-empty string, got {shown(self.axis_name)}")
        if self.warmup is not None and not isinstance(self.warmup, Warmup):
            raise ValueError("EngineConfig.warmup must be a cconv.engine.Warmup (e.g. dgc_warmup(...)) or None")
        c = self.compressor
        aggregation.check(self, c)  # what the aggregation methods cannot do (powersgd, gtopk, vote)
        if self.ps_downlink is not None and self.architecture != "parameter-server":
            raise ValueError("ps_downlink needs architecture='parameter-server'")
        self._check_gossip()
        self._check_sync()
        if self.warmup is not None and self.warmup.densities and C.entry_of(c).at_density is None:
            ok = [e.name for e in C.entries() if e.at_density is not None]
            raise ValueError(
                f"warmup changes the density: needs a compressor whose entry sets it (Entry.at_density: "
                f"{', '.join(ok)}), got {shown(c.name)}"
            )

    def _check_gossip(self):
        """The gossip matrices as tuples (the other gossip fields: their rules); what
        ``sync="gossip"`` combines with is checked by its mode (``cconv.engine.gossip.Gossip.check``)."""
        for name in ("torus", "mixing"):  # lists (YAML) -> tuples (hashable, frozen)
            v = getattr(self, name)
            if isinstance(v, (list, tuple, np.ndarray)):
                v = tuple(tuple(r) if isinstance(r, (list, tuple, np.ndarray)) else r for r in v)
                object.__setattr__(self, name, v)

    def _check_sync(self):
        if not _integer(self.timing_seed):
            raise ValueError(f"EngineConfig.timing_seed must be an integer, got {shown(self.timing_seed)}")
        worker_clock.check(self)
        modes.sync_mode(self).check(self)

    @property
    def model_averaging(self) -> bool:
        return self.local_steps == ADAPTIVE or self.local_steps > 1 or self.post_local_switch > 0


# Each field's default, read from the dataclass: the one place an engine default is written.  An API
# that takes engine settings as keywords (``cconv.engine.dropin.Exchange``, ``as_optax``, the
# doctor's ``Combo``) defaults to these, so its signature shows the engine's values
# (``tests/test_engine_defaults.py`` fails on a default written again).
ENGINE_DEFAULTS: Mapping[str, Any] = MappingProxyType({f.name: f.default for f in dataclasses.fields(EngineConfig)})


class Phase(NamedTuple):
    """What one step does (static; one compiled program per distinct phase)."""

    density: float | None  # None: the compressor as configured; 1.0: dense
    kind: str  # "bsp" (average gradients) | "local" (no communication) | "sync" | "gossip"


def phase_of(engine_cfg: EngineConfig, step: int) -> Phase:
    density = engine_cfg.warmup.density(step) if engine_cfg.warmup is not None else None
    if not engine_cfg.model_averaging or step < engine_cfg.post_local_switch:
        return Phase(density, "bsp")
    local = (step - engine_cfg.post_local_switch + 1) % engine_cfg.local_steps != 0
    return Phase(density, "local" if local else "sync")


def compressor_at(engine_cfg: EngineConfig, density: float | None) -> Compressor:
    """The (unwrapped) compressor of a phase: dense identity at density 1 under warm-up."""
    c = engine_cfg.compressor
    if density is None:
        return c
    if density >= 1.0:
        return C.get(IDENTITY)
    entry = C.entry_of(c)
    hp = {k: v for k, v in c.hparams.items() if k in entry.schema.names}
    return entry.build(**entry.at_density(hp, density))


def phase_exchange(engine_cfg: EngineConfig, mode, phase: Phase) -> tuple[Compressor | None, str]:
    """(compressor, memory) that phase ``phase`` of sync mode ``mode`` exchanges with: the
    compressor at the phase's density (``compressor_at``) and the config's memory when the mode
    compresses the phase, else (None, no memory): dense.  ``Trainer.exchange`` builds its
    ``Exchange`` from it, and ``cconv.engine.stages`` plans from it."""
    if mode.compresses(engine_cfg, phase):
        return compressor_at(engine_cfg, phase.density), engine_cfg.memory
    return None, M.NONE
