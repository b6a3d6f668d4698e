"""``build``: wrap a loss, parameters and an optax optimizer into a data-parallel trainer.

The per-worker step (the synchronization mode's, ``cconv.engine.sync.SyncMode.step``) is run by a launcher
(``cconv.engine.launchers.LAUNCHERS``): ``jax.shard_map`` over a 1-D device mesh (default),
``jax.pmap``, or one process per MPI rank.  On the mesh launchers every state leaf carries a
leading worker axis of size P (sharded over the devices); under MPI each process holds its own
worker's state.  The step counter is static (pytree
metadata), so the host knows each step's phase (warm-up density, local or sync step) without a
device round trip; every distinct phase is compiled once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import optax

from cconv.comm.accounting import Collective, merge, total_traffic
from cconv.comm.aggregation import TRANSPORTS
from cconv.comm.backend import DryComm
from cconv.compressors.registry import registered_name
from cconv.engine import modes, optimizers
from cconv.engine.config import IDENTITY, EngineConfig, Phase, compressor_at, phase_exchange
from cconv.engine.dropin import Exchange
from cconv.engine.launchers import LAUNCHERS, Launcher
from cconv.engine.step import StepContext, WorkerState
from cconv.engine.sync import SyncMode, sync_mode


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["params", "model_state", "opt_state", "comp_state", "anchor", "sync"],
    meta_fields=["step"],
)
@dataclasses.dataclass(frozen=True)
class EngineState:
    """Training state. Mesh launchers: leaves have a leading worker axis. ``step`` is static."""

    params: Any
    model_state: Any
    opt_state: Any
    comp_state: Any
    anchor: Any
    sync: Any = None  # the synchronization mode's extra state (cconv.engine.sync)
    step: int = 0

    def worker(self) -> WorkerState:
        return WorkerState(self.params, self.model_state, self.opt_state, self.comp_state, self.anchor, self.sync)

    def replace(self, **kw) -> EngineState:
        return dataclasses.replace(self, **kw)


class StepWork(NamedTuple):
    """What a training step does besides one worker's compute, as ``Trainer.step_work`` states it
    (what a clock charges: ``cconv.experiments.clock``)."""

    phase: Phase
    span: float  # the step's compute, in units of one worker's step (``SyncMode.span``: stragglers)
    communicates: bool  # False: a local step (local SGD), no exchange
    collectives: tuple  # ``Collective(kind, bytes, count)`` per worker, control traffic left out
    via_server: bool  # the collectives go through a parameter server (``Transport.via_server``)
    compressor: Any  # the phase's (unwrapped) ``Compressor``; None: nothing is compressed (or the identity)
    memory: str  # the memory around it (``cconv.memory.MEMORIES``; "none")
    units: tuple  # shapes of the compressed tensors (one flat buffer when fused)
    program: Callable  # grads -> (jitted fn, args): the exchange's compute on a shape-only comm


class Trainer:
    """Returned by ``build``; see docs/engine.md ("Python API")."""

    def __init__(
        self,
        loss_fn: Callable,
        params,
        optimizer,
        engine_cfg: EngineConfig,
        model_state=None,
        devices=None,
        mpi_comm=None,
        seeds: int | None = None,
        compiler_options: dict | None = None,
    ):
        if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
            raise ValueError(f"build: seeds must be an integer >= 1 or None, got {seeds!r}")
        launcher = LAUNCHERS[engine_cfg.launcher]
        if seeds is not None and not launcher.supports_seeds:
            ok = " or ".join(repr(n) for n, cls in LAUNCHERS.items() if cls.supports_seeds)
            raise ValueError(f"build(seeds=...) needs launcher={ok}")
        self.engine_cfg, self.loss_fn, self.optimizer, self.seeds = engine_cfg, loss_fn, optimizer, seeds
        optimizers.check(engine_cfg, optimizer)  # an optimizer with its own messages (1-bit Adam) and its engine fields
        self._params0 = params
        self._model_state0 = {} if model_state is None else model_state
        self.workers = engine_cfg.workers
        self._shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
        self._exchanges: dict[Phase, Exchange] = {}
        self._fns: dict[Phase, Callable] = {}
        self._work: dict[Phase, StepWork] = {}
        self._colls: dict[Phase, tuple] = {}
        self._metric_bytes: float | None = None
        self.launcher: Launcher = launcher(
            engine_cfg, devices=devices, mpi_comm=mpi_comm, seeds=seeds, compiler_options=compiler_options
        )
        self.sync: SyncMode = sync_mode(engine_cfg)
        self._host = self.sync.host(engine_cfg, optimizer)  # host-decided phases (AdaComm, 0/1 Adam), or None
        self._report_rank = TRANSPORTS[engine_cfg.architecture].report_rank(engine_cfg.workers)
        self._check_warmup_states()

    # ------------------------------------------------------------------ phases and plans
    def phase(self, step: int) -> Phase:
        return modes.phase_at(self.sync, self.engine_cfg, self._host, step)

    def host_state(self) -> dict | None:
        """The synchronization mode's host state (AdaComm's period), for checkpoints; None: none."""
        return None if self._host is None else self._host.state_dict()

    def load_host_state(self, d: dict | None) -> None:
        if self._host is not None and d is not None:
            self._host.load_state_dict(d)

    def exchange(self, phase: Phase) -> Exchange:
        """The ``Exchange`` phase ``phase`` averages gradients (or model deltas) with."""
        if phase not in self._exchanges:
            base, memory = phase_exchange(self.engine_cfg, self.sync, phase)
            self._exchanges[phase] = Exchange.from_config(self.engine_cfg, base, memory)
        return self._exchanges[phase]

    def plan(self, phase: Phase):
        """The static plan of phase ``phase`` (``cconv.engine.exchange.Plan``)."""
        return self.exchange(phase).plan(self._shapes)

    def _comp_exchange(self) -> Exchange:
        """The exchange whose compressor state the engine state carries."""
        return Exchange.from_config(self.engine_cfg, self.engine_cfg.compressor, self.engine_cfg.memory)

    def _check_warmup_states(self):
        if self.engine_cfg.warmup is None:
            return
        leaves = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in jax.tree.leaves(self._params0)]
        want = jax.tree.structure(jax.eval_shape(lambda: self._comp_exchange().init_worker(leaves)))
        for d in set(self.engine_cfg.warmup.densities) | {1.0}:
            ex = Exchange.from_config(self.engine_cfg, compressor_at(self.engine_cfg, d), self.engine_cfg.memory)
            if ex.plan(self._shapes).comp is None:
                continue
            got = jax.tree.structure(jax.eval_shape(lambda ex=ex: ex.init_worker(leaves)))
            if got != want:
                raise ValueError(f"warmup: the compressor state at density {d} differs from the final one")

    # ------------------------------------------------------------------ state
    def _worker_init(self, params, model_state) -> WorkerState:
        comp = self._comp_exchange().init_worker(jax.tree.leaves(params))
        anchor = params if self.engine_cfg.model_averaging else None
        extra = self.sync.init(self.engine_cfg, params)
        return WorkerState(params, model_state, self.optimizer.init(params), comp, anchor, extra)

    def init(self, key=None, params=None, model_state=None) -> EngineState:
        """Initial state: every worker holds the same replica.

        ``params`` / ``model_state`` override the ones given to ``build`` (same structure); with
        ``seeds=S`` they may carry a leading seed axis (one initial model per seed) or not
        (broadcast).  ``key`` is accepted for API symmetry: the built-in compressor states are
        deterministic, so workers start identical.
        """
        params = self._params0 if params is None else params
        mstate = self._model_state0 if model_state is None else model_state
        ws = self.launcher.init(self._worker_init, params, mstate, self._params0, self._model_state0)
        return EngineState(*ws, step=0)

    # ------------------------------------------------------------------ step
    def _ctx(self, phase: Phase) -> StepContext:
        clip = None if self.engine_cfg.clip is None else self.engine_cfg.clip / math.sqrt(self.workers)
        ex = {phase: self.exchange(phase)}
        return StepContext(self.loss_fn, self.optimizer, ex, clip, self._report_rank)

    def _comm(self):
        """A fresh comm (its ledger records one trace)."""
        return self.launcher.comm()

    def _trace_step(self, comm, phase, ws, batch, key):
        key, host = key if isinstance(key, tuple) else (key, None)  # host: the mode's per-step inputs
        new, metrics = self.sync.step(comm, self._ctx(phase), phase, ws, batch, key, host)
        # the metrics' all-reduce is the step's last control record (an exchange may add others)
        self._metric_bytes = next(c.bytes for c in reversed(comm.ledger) if c.control)
        return new, metrics

    def _fn(self, phase: Phase) -> Callable:
        if phase not in self._fns:
            self._fns[phase] = self.launcher.compile(
                lambda comm, ws, batch, key: self._trace_step(comm, phase, ws, batch, key)
            )
        return self._fns[phase]

    def _check_batch(self, batch) -> None:
        b_axis = 0 if self.seeds is None else 1
        for x in jax.tree.leaves(batch):
            if self.seeds is not None and (x.ndim < 2 or x.shape[0] != self.seeds):
                raise ValueError(f"seeds={self.seeds}: batch leaves need a leading seed axis, got {x.shape}")
            if x.shape[b_axis] % self.workers:
                raise ValueError(f"global batch size {x.shape[b_axis]} is not divisible by workers={self.workers}")

    def _inputs(self, batch, key):
        self._check_batch(batch)
        return self.launcher.inputs(batch, key)

    def shard(self, batch):
        """``batch`` (global, host or device) placed on the devices as the step reads it: each
        worker's rows on its device (a seed axis first with ``seeds``).  Optional: ``step`` takes
        a host batch too, but placing it ahead (e.g. in a prefetching data loader) takes the
        transfer out of the step."""
        self._check_batch(batch)  # no key here: across processes a launcher's inputs() places one too
        return self.launcher.shard(batch)

    def step(self, state: EngineState, batch, key):
        """One training step: (new state, metrics).  Do not wrap in jax.jit (it is compiled per
        phase already); ``jax.vmap`` over a leading seed axis of (state, batch, key) works."""
        phase = self.phase(state.step)
        batch, key = self._inputs(batch, key)
        new, metrics = self._fn(phase)(state.worker(), batch, self._with_host(key, state.step))
        if self._host is not None:
            self._host.observe(state.step, metrics)
        return EngineState(*new, step=state.step + 1), metrics

    def _with_host(self, key, step: int):
        """``key``, or (key, the mode's host inputs of ``step``) when it has any (replicated;
        broadcast over the seed axis under ``seeds``)."""
        host = self.sync.inputs(self.engine_cfg, step)
        if host is None:
            return key
        host = jax.numpy.asarray(host)
        return key, host if self.seeds is None else jax.numpy.broadcast_to(host, (self.seeds, *host.shape))

    def lower(self, state: EngineState, batch, key):
        """``jax.stages.Lowered`` of this state's step (for inspecting HLO)."""
        fn = self._fn(self.phase(state.step))
        batch, key = self._inputs(batch, key)
        return self.launcher.lower(fn, state.worker(), batch, self._with_host(key, state.step))

    def export(self, state: EngineState, batch, key, platforms):
        """``jax.export.Exported`` of this state's step lowered (not compiled) for ``platforms``,
        e.g. ``("cuda",)``: no device of that kind is needed (``cconv.doctor``).  ``state`` may
        be abstract (``jax.eval_shape(trainer.init)``).  jit launchers only (jax.export refuses
        pmap's program)."""
        fn = self._fn(self.phase(state.step))
        batch, key = self._inputs(batch, key)
        return jax.export.export(fn, platforms=tuple(platforms))(
            state.worker(), batch, self._with_host(key, state.step)
        )

    # ------------------------------------------------------------------ views
    def params(self, state: EngineState):
        """The model to evaluate: worker 0's replica, or the workers' average (local SGD, gossip:
        ``SyncMode.average_view``)."""
        return self._view(state.params)

    def model_state(self, state: EngineState):
        return self._view(state.model_state)

    def _view(self, tree):
        return self.launcher.view(tree, self.sync.average_view(self.engine_cfg))

    # ------------------------------------------------------------------ accounting
    def collectives(self, step: int, control: bool = False) -> list[Collective]:
        """What step ``step`` communicates (static): ``Collective(kind, bytes, count)`` per
        worker.  ``control=True`` adds the all-reduce of the logged metrics (known after the
        first step has been traced)."""
        phase = self.phase(step)
        if phase not in self._colls:  # traced once per phase (shapes only)
            comm, ex = DryComm(self.workers, like=self._comm()), self.exchange(phase)
            ws = jax.eval_shape(self._worker_init, self._params0, self._model_state0)
            jax.eval_shape(lambda ws: self.sync.dry(comm, ex, ws, phase), ws)  # what the step communicates
            self._colls[phase] = tuple(comm.ledger)
        out = list(self._colls[phase])
        if control:
            if self._metric_bytes is None:
                raise ValueError("collectives(control=True) needs one traced step first (metric sizes)")
            out.append(Collective("allreduce", self._metric_bytes, 1, True))
        return merge(out)

    def step_work(self, step: int) -> StepWork:
        """What step ``step`` does besides one worker's compute (``StepWork``): its collectives and
        bytes, the compression it runs (compressor, memory, compressed tensors' shapes) and, as a
        program, the exchange's compute (``SyncMode.exchange_work``: memory, compression, decoding
        of what a worker receives; the collectives on a shape-only ``DryComm``).  Traced once per
        phase; the span is the step's own."""
        phase, engine_cfg = self.phase(step), self.engine_cfg
        if phase not in self._work:
            colls = tuple(c for c in self.collectives(step) if not c.control)
            plan, ex = self.plan(phase), self.exchange(phase)
            shapes = [s for s, c in zip(self._shapes, plan.compressed) if c]
            units = ((sum(math.prod(s) for s in shapes),),) if plan.fused and shapes else tuple(shapes)
            self._work[phase] = StepWork(
                phase=phase,
                span=1.0,
                communicates=bool(self.sync.communicates(phase)),
                collectives=colls,
                via_server=TRANSPORTS[engine_cfg.architecture].via_server,
                compressor=None if plan.comp is None or registered_name(ex.compressor) == IDENTITY else ex.compressor,
                memory=ex.memory,
                units=units,
                program=lambda grads: self.sync.exchange_work(engine_cfg, plan, grads),
            )
        return self._work[phase]._replace(span=float(self.sync.span(engine_cfg, step)))

    def traffic(self, step: int, control: bool = False):
        """(sent, received) bytes per rank at ``step`` (numpy arrays of length P)."""
        return total_traffic(self.collectives(step, control), self.workers)


def build(
    loss_fn: Callable,
    params,
    optimizer: optax.GradientTransformation,
    engine_cfg: EngineConfig,
    model_state=None,
    devices=None,
    mpi_comm=None,
    seeds: int | None = None,
    compiler_options: dict | None = None,
) -> Trainer:
    """A data-parallel trainer.

    loss_fn(params, model_state, batch, key) -> (loss, (new_model_state, aux_dict)) is evaluated
    by each worker on its rows of the global batch; ``optimizer`` (optax) applies the averaged,
    decompressed update.  See ``EngineConfig`` for the options.

    ``seeds=S`` trains S independent replicas of the whole data-parallel run in one program
    (vmapped inside the compiled step): state, batch and key then carry a leading seed axis
    (batch leaves (S, B, ...), keys (S, 2)) and metrics have shape (S,).  Prefer it to
    ``jax.jit(jax.vmap(trainer.step))``, which recompiles every step (the step counter is static).

    ``compiler_options`` (XLA's, as ``jax.jit`` takes them) build every program of the trainer
    alike, e.g. ``{"xla_backend_optimization_level": 0}``: a faster build of a slower program, the
    same computation up to floating-point rounding (``cconv advise`` builds its probes so on CPU).
    """
    if not isinstance(engine_cfg, EngineConfig):
        raise ValueError(f"build: engine_cfg must be a cconv.engine.EngineConfig, got {type(engine_cfg).__name__}")
    return Trainer(loss_fn, params, optimizer, engine_cfg, model_state, devices, mpi_comm, seeds, compiler_options)
