"""Data-parallel training with compressed collectives (layer 4).

    from cconv.engine import EngineConfig, build
    engine_cfg = EngineConfig(workers=8, compressor=name, memory="ef")   # name: cconv.compressors.names()
    trainer = build(loss_fn, params, optax.sgd(0.1), engine_cfg)
    state = trainer.init()
    state, metrics = trainer.step(state, batch, key)

Inside your own ``jax.shard_map`` / ``pmap`` / ``vmap`` loop, ``Exchange`` and ``as_optax``
(``cconv.engine.dropin``) give the same compressed exchange; ``onebit_adam``
(``cconv.engine.onebit_adam``) is 1-bit Adam, an optax optimizer that communicates its momentum
(also a run-config optimizer: ``cconv.engine.optimizers``), ``zero_one_adam``
(``cconv.engine.zero_one_adam``) 0/1 Adam, with adaptive variance freezing and 1-bit syncs
after local steps (also a run-config optimizer, with its synchronization mode ``zero_one``:
``cconv.engine.zero_one_mode``).

See ``EngineConfig`` for every option and docs/engine.md ("Python API").  Aggregation methods and
transports are objects in ``cconv.comm.aggregation``, memories in ``cconv.memory``, launchers in
``cconv.engine.launchers``, synchronization modes (BSP, local SGD, AdaComm, SSP, ASP) in
``cconv.engine.sync`` (gossip: ``cconv.engine.gossip``, registered there on import) with the
worker timing model in ``cconv.engine.worker_clock``; each kind has a name -> object registry.
"""

from cconv.engine import (
    gossip,  # registers sync="gossip" in cconv.engine.sync.SYNC_MODES
    zero_one_mode,  # registers sync="zero_one" and the optimizer zero_one_adam
)
from cconv.engine.config import (
    ARCHITECTURES,
    COLLECTIVES,
    DGC_WARMUP,
    GRANULARITIES,
    LAUNCHERS,
    MEMORIES,
    EngineConfig,
    Phase,
    Warmup,
    dgc_warmup,
    phase_of,
)
from cconv.engine.dropin import Exchange, as_optax
from cconv.engine.launchers import Launcher
from cconv.engine.onebit_adam import onebit_adam
from cconv.engine.step import WorkerState
from cconv.engine.sync import SYNC_MODES, SyncMode
from cconv.engine.trainer import EngineState, Trainer, build
from cconv.engine.worker_clock import Stragglers
from cconv.engine.zero_one_adam import zero_one_adam

__all__ = [
    "gossip",
    "zero_one_mode",
    "EngineConfig",
    "Warmup",
    "dgc_warmup",
    "build",
    "Trainer",
    "EngineState",
    "WorkerState",
    "Phase",
    "phase_of",
    "MEMORIES",
    "GRANULARITIES",
    "ARCHITECTURES",
    "COLLECTIVES",
    "LAUNCHERS",
    "DGC_WARMUP",
    "Launcher",
    "Exchange",
    "as_optax",
    "onebit_adam",
    "zero_one_adam",
    "SYNC_MODES",
    "SyncMode",
    "Stragglers",
]
