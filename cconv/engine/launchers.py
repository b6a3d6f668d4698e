"""Launchers: how the per-worker step runs on devices or processes, one object each.

A launcher owns everything the trainer does differently per execution model:

    comm()                            a fresh ``Comm`` for one trace of the step
    init(worker_init, params, mstate) the initial state (stacked over workers, or this rank's)
    compile(trace)                    ``trace(comm, ws, batch, key) -> (new ws, metrics)`` as a
                                      callable ``fn(ws, batch, key)`` on the launcher's layout
    inputs(batch, key)                the global host batch and key placed for ``fn``
    shard(batch)                      the global batch placed once as ``fn`` reads it (a data
                                      loader's output put on the devices ahead of the step)
    lower(fn, ws, batch, key)         ``jax.stages.Lowered`` (HLO inspection)
    view(tree, average)               the model to evaluate: worker 0's or the workers' average
    is_main()                         whether this process writes results

``LAUNCHERS`` maps a name to the class, built as ``cls(engine_cfg, devices=..., mpi_comm=...,
seeds=..., compiler_options=...)`` (XLA options every program of the run is built with; none:
XLA's defaults); ``supports_seeds`` says whether ``build(seeds=S)`` works with it, ``one_device``
whether P workers need only one device.  Adding a launcher is one class and one entry.

  shard_map  ``jax.shard_map`` over a 1-D device mesh (default); state leaves carry a leading
             worker axis of size P, sharded over the devices (a seed axis first with ``seeds``).
  pmap       ``jax.pmap`` over the same devices and the same stacked state.
  vmap       every worker on ONE device: ``jax.jit(jax.vmap(step, axis_name=...))`` over the
             same stacked state (with ``seeds``, a vmap over seeds of that vmap).
  mpi        one process per worker (``mpirun``), collectives by mpi4jax; each process holds
             its own worker's state.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from cconv.comm.backend import Comm, MeshComm

Trace = Callable[[Comm, Any, Any, Any], tuple]


class Launcher(abc.ABC):
    """Base class and protocol (see the module docstring): a launcher implements ``comm``,
    ``init``, ``compile`` and ``view``; the rest have defaults."""

    name = ""
    supports_seeds = False
    one_process_per_worker = False  # True: started by an external launcher (mpirun), one rank each
    one_device = False  # True: all P workers run on one device (no simulated devices needed)

    def __init__(self, engine_cfg, devices=None, mpi_comm=None, seeds: int | None = None, compiler_options=None):
        self.engine_cfg, self.workers, self.seeds = engine_cfg, engine_cfg.workers, seeds
        self.compiler_options = dict(compiler_options) if compiler_options else None

    def jit(self, fn: Callable, **kw) -> Callable:
        """``jax.jit(fn)`` with this launcher's XLA ``compiler_options`` (``build(compiler_options=...)``:
        e.g. a fast, unoptimised backend build; every program of the trainer is built the same way).
        A caller's own ``compiler_options=`` replaces them (None: XLA's defaults) for a program of
        its own that runs far more often than it is built (``cconv.experiments.evaluation``)."""
        kw.setdefault("compiler_options", self.compiler_options)
        return jax.jit(fn, **kw)

    @abc.abstractmethod
    def comm(self) -> Comm:
        """A fresh Comm for one trace (its ledger records that trace's collectives)."""

    @abc.abstractmethod
    def init(self, worker_init: Callable, params, mstate, like_params=None, like_mstate=None):
        """The initial worker state(s), placed as this launcher runs them."""

    @abc.abstractmethod
    def compile(self, trace: Trace) -> Callable:
        """The compiled step: (worker state, batch, key) -> (new state, metrics)."""

    def inputs(self, batch, key):
        return batch, key

    def shard(self, batch):
        return batch

    def lower(self, fn, ws, batch, key):
        return fn.lower(ws, batch, key)

    @abc.abstractmethod
    def view(self, tree, average: bool):
        """The tree to evaluate: worker 0's replica, or the workers' mean when ``average``."""

    def is_main(self) -> bool:
        return jax.process_index() == 0


class _StackedLayout(Launcher):
    """Every state leaf has a leading worker axis of size P (a seed axis before it with
    ``seeds``), placed by ``self.sharded``; views are placed by ``self.replicated``."""

    sharded: jax.sharding.Sharding
    replicated: jax.sharding.Sharding
    _view_fn: Callable | None = None

    def init(self, worker_init, params, mstate, like_params=None, like_mstate=None):
        S = self.seeds
        if S is None:
            return self._init_fn(worker_init, None)(params, mstate)
        lead = lambda t, like: (
            jax.tree.leaves(t) and jnp.ndim(jax.tree.leaves(t)[0]) == jnp.ndim(jax.tree.leaves(like)[0]) + 1
        )
        axes = (
            0 if lead(params, like_params) else None,
            0 if jax.tree.leaves(mstate) and lead(mstate, like_mstate) else None,
        )
        return self._init_fn(worker_init, axes)(params, mstate)

    def _init_fn(self, worker_init: Callable, axes: tuple | None) -> Callable:
        """The jitted initialiser, made once per (worker_init, seed axes): a run resumed in the same
        process (the advisor's races) would otherwise compile it again at every restore."""
        cache = self.__dict__.setdefault("_init_fns", {})
        key = (worker_init, axes)
        if key not in cache:
            P_, S = self.workers, self.seeds

            def per_seed(p, m):
                return jax.tree.map(lambda x: jnp.broadcast_to(x, (P_, *jnp.shape(x))), worker_init(p, m))

            fn = per_seed if axes is None else (lambda p, m: jax.vmap(per_seed, in_axes=axes, axis_size=S)(p, m))
            cache[key] = self.jit(fn, out_shardings=self.sharded)
        return cache[key]

    def view(self, tree, average: bool):
        if self._view_fn is None:  # compiled once per trainer (jit caches per tree structure)
            ax = 0 if self.seeds is None else 1
            pick = lambda x: x.mean(ax).astype(x.dtype) if average else jnp.take(x, 0, axis=ax)
            # plain jax.jit: also called inside the evaluator's program, where no options may be given
            self._view_fn = jax.jit(lambda t: jax.tree.map(pick, t), out_shardings=self.replicated)
        return self._view_fn(tree)


class _Stacked(_StackedLayout):
    """Launchers on a device mesh: the worker axis is sharded over P devices."""

    def __init__(self, engine_cfg, devices=None, mpi_comm=None, seeds=None, compiler_options=None):
        super().__init__(engine_cfg, devices, mpi_comm, seeds, compiler_options)
        devices = list(devices if devices is not None else jax.devices())
        if len(devices) < engine_cfg.workers:
            raise ValueError(
                f"EngineConfig.workers={engine_cfg.workers} but only {len(devices)} devices are "
                "visible (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)"
            )
        if jax.process_count() > 1 and len(devices) != engine_cfg.workers:
            raise ValueError(f"multi-process run: workers must equal the {len(devices)} global devices")
        self.mesh = Mesh(
            np.array(devices[: engine_cfg.workers]), (engine_cfg.axis_name,), axis_types=(jax.sharding.AxisType.Auto,)
        )
        self.sharded = NamedSharding(
            self.mesh, P(engine_cfg.axis_name) if seeds is None else P(None, engine_cfg.axis_name)
        )
        self.replicated = NamedSharding(self.mesh, P())
        self.platform = devices[0].platform
        self._view_fn: Callable | None = None

    def comm(self) -> Comm:
        return MeshComm(self.engine_cfg.axis_name, self.workers, self.platform)

    def inputs(self, batch, key):
        if jax.process_count() > 1:  # every process passes the same global (host) batch and key
            glob = lambda x, sh: (
                x
                if isinstance(x, jax.Array) and not x.is_fully_addressable
                else jax.make_array_from_callback(np.shape(x), sh, lambda idx, x=np.asarray(x): x[idx])
            )
            batch = jax.tree.map(lambda x: glob(x, self.sharded), batch)
            key = glob(
                jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key, self.replicated
            )
        return batch, key

    def shard(self, batch):
        """Rows split over the mesh as the step reads them (``self.sharded``): a step given this
        batch transfers nothing."""
        if jax.process_count() > 1:
            return self.inputs(batch, jnp.zeros(2, jnp.uint32))[0]
        return jax.device_put(batch, self.sharded)


class ShardMap(_Stacked):
    """``jax.shard_map`` over the mesh; with ``seeds`` a vmap inside the SPMD program."""

    name = "shard_map"
    supports_seeds = True

    def compile(self, trace):
        axis = self.engine_cfg.axis_name

        def run(ws, batch, key):
            new, metrics = trace(self.comm(), jax.tree.map(lambda a: a[0], ws), batch, key)
            return jax.tree.map(lambda a: a[None], new), metrics

        if self.seeds is None:
            block, spec = run, P(axis)
        else:  # a leading seed axis on everything: vmap inside the SPMD program
            block, spec = jax.vmap(run, in_axes=(0, 0, 0)), P(None, axis)
        return self.jit(jax.shard_map(block, mesh=self.mesh, in_specs=(spec, spec, P()), out_specs=(spec, P())))


class Pmap(_Stacked):
    """``jax.pmap`` over the mesh's devices (the global batch is split on the host side)."""

    name = "pmap"

    def compile(self, trace):
        if self.compiler_options:
            raise ValueError("compiler_options need a jitted launcher (jax.pmap takes none): use shard_map")
        pm = jax.pmap(
            lambda ws, batch, key: trace(self.comm(), ws, batch, key),
            axis_name=self.engine_cfg.axis_name,
            in_axes=(0, 0, None),
            devices=list(self.mesh.devices.flat),
        )

        def fn(ws, batch, key):
            batch = jax.tree.map(lambda x: x.reshape(self.workers, -1, *x.shape[1:]), batch)
            new, metrics = pm(ws, batch, key)
            return new, jax.tree.map(lambda m: m[0], metrics)

        return fn

    def lower(self, fn, ws, batch, key):
        raise ValueError("lower() supports launcher='shard_map' (pmap's program is per device)")


class Vmap(_StackedLayout):
    """All P workers on ONE device: ``jax.jit(jax.vmap(step, axis_name=engine_cfg.axis_name))`` over the
    stacked worker axis (the global batch is split into P row blocks, worker w gets rows
    [w b, (w+1) b) as on the mesh); with ``seeds``, ``jax.vmap`` over seeds of that vmap.

    The ``Comm`` is ``MeshComm(vmapped=True)``: psum / pmax / all_gather / ppermute over the named
    axis are batched by vmap into reductions, broadcasts and gathers on the stacked arrays, and
    the partial permutations (parameter server, gTop-k's fold) are completed and masked.  The
    bytes logged are the algorithm's, recorded from the same payloads as on the mesh, so the
    ledger equals ``shard_map``'s for the same config (tested); the HLO byte proof
    (``cconv.comm.hlo``) does not apply: the compiled program has no collectives to count.
    Arithmetic is the mesh's up to float rounding: vmap batches the matmuls and turns the
    all-reduce into a reduction over the worker axis, whose summation order may differ.
    """

    name = "vmap"
    supports_seeds = True
    one_device = True

    def __init__(self, engine_cfg, devices=None, mpi_comm=None, seeds=None, compiler_options=None):
        super().__init__(engine_cfg, devices, mpi_comm, seeds, compiler_options)
        if jax.process_count() > 1 and devices is None:  # named devices: a computation of this process alone
            raise ValueError("launcher='vmap' runs every worker in one process (multi-process: use 'shard_map')")
        device = list(devices if devices is not None else jax.devices())[0]
        self.sharded = self.replicated = SingleDeviceSharding(device)
        self.platform = device.platform

    def comm(self) -> Comm:
        return MeshComm(self.engine_cfg.axis_name, self.workers, self.platform, vmapped=True)

    def compile(self, trace):
        P_ = self.workers

        def run(ws, batch, key):
            batch = jax.tree.map(lambda x: x.reshape(P_, x.shape[0] // P_, *x.shape[1:]), batch)
            per_worker = lambda w, b: trace(self.comm(), w, b, key)
            new, metrics = jax.vmap(per_worker, axis_name=self.engine_cfg.axis_name)(ws, batch)
            return new, jax.tree.map(lambda m: m[0], metrics)  # metrics are all-reduced: equal

        return self.jit(run if self.seeds is None else jax.vmap(run))


class MPI(Launcher):
    """One process per worker (``mpirun``); the step is ``jax.jit``-compiled per process."""

    name = "mpi"
    one_process_per_worker = True

    def __init__(self, engine_cfg, devices=None, mpi_comm=None, seeds=None, compiler_options=None):
        super().__init__(engine_cfg, devices, mpi_comm, seeds, compiler_options)
        from cconv.comm.mpi import MPIComm

        self.mpi = MPIComm(mpi_comm)
        if self.mpi.size != engine_cfg.workers:
            raise ValueError(
                f"launcher='mpi': EngineConfig.workers={engine_cfg.workers} but the MPI communicator has "
                f"{self.mpi.size} ranks"
            )

    def comm(self) -> Comm:
        from cconv.comm.mpi import MPIComm

        return MPIComm(self.mpi.mpi_comm)

    def init(self, worker_init, params, mstate, like_params=None, like_mstate=None):
        return self.jit(worker_init)(params, mstate)

    def compile(self, trace):
        return self.jit(lambda ws, batch, key: trace(self.comm(), ws, batch, key))

    def inputs(self, batch, key):
        r, b = self.mpi.rank(), jax.tree.leaves(batch)[0].shape[0] // self.workers
        return jax.tree.map(lambda x: x[r * b : (r + 1) * b], batch), key

    def view(self, tree, average: bool):
        if not average:
            return tree
        from mpi4py import MPI as _MPI

        return jax.tree.map(
            lambda x: jnp.asarray(self.mpi.mpi_comm.allreduce(np.asarray(x), op=_MPI.SUM) / self.workers, x.dtype), tree
        )

    def is_main(self) -> bool:
        return self.mpi.rank() == 0


LAUNCHERS: dict[str, type[Launcher]] = {cls.name: cls for cls in (ShardMap, Pmap, Vmap, MPI)}

__all__ = ["Launcher", "LAUNCHERS", "ShardMap", "Pmap", "Vmap", "MPI"]
