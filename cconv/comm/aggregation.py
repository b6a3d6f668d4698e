"""Aggregation methods and the transports they use: one object each, looked up by name.

An aggregation method turns every worker's tensors ("units") into their average, identical on
every worker, through compressed payloads:

    agg, state = AGGREGATORS[method].aggregate(comm, plan, units, state, key)

``state`` is ``{"units": per-unit (memory-wrapped) compressor states, "server": the server's
downlink states}``.  ``plan`` is the engine's static plan (``cconv.engine.exchange.Plan``); a
method reads ``plan.comp`` (the memory-wrapped compressor), ``plan.memory`` (its ``Memory``
hooks), ``plan.transport`` and ``plan.downlink``.

Methods (``AGGREGATORS``):
  allreduce  summable payloads (casts, shared-key random-k): every worker compresses with the
             SAME key, the payloads are summed, decompressed and divided by P.
  allgather  every payload reaches every worker (or the server), each is decompressed, the
             sum divided by P.
  vote       signSGD with majority vote (Bernstein et al. 2018): sign(sum_w decompress(payload_w)),
             sign(0) = +1.
  gtopk      recursive-doubling global top-k (Shi et al. 2019, ``cconv.comm.gtopk``); entries a
             worker sent that did not survive go back to its memory (``Memory.give_back``).
  powersgd   P = M Q, mean P, orthogonalise, Q = M^T P, mean Q; the update is P Q^T, and the
             memory's ``absorb`` / ``settle`` run around the *aggregate* (error feedback keeps
             M - P Q^T; Vogels et al. 2019).

Transports (``TRANSPORTS``, one per architecture) move what a method hands them:
  all-to-all        collectives between the workers (ring allreduce / allgather).
  parameter-server  payloads are pushed to the server (rank 0), which decompresses and averages
                    (or votes), then replies with the dense average or, with a downlink
                    compressor, a compressed one (error feedback on the server).  Integer
                    leaves of summable payloads (a shared key) are identical everywhere and
                    stay home.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp

from cconv import memory as M
from cconv.comm.gtopk import gtopk
from cconv.compressors.base import Compressor, DensePayload
from cconv.compressors.powersgd import PowerSGDState, compute_p, compute_q, is_compressed, matrix_shape, orthogonalize
from cconv.compressors.registry import entries, entry_of
from cconv.compressors.sparse import SparsePayload, scatter

_SERVER_KEY = 1 << 20  # folded into the step key for the server's downlink compression


def _gathered_sum(c: Compressor, stacked, like):
    """Sum of the decompressed payloads of all workers (stacked on a leading axis).  Sparse
    payloads are one scatter-add of all P*k (value, index) pairs into one dense array, O(d + Pk)
    (decompressing each into its own dense array and summing costs P dense passes)."""
    if isinstance(stacked, SparsePayload):
        return scatter(stacked.values.reshape(-1), stacked.indices.reshape(-1), like)
    return jax.vmap(lambda p: c.decompress(p, like))(stacked).sum(0)


# ----------------------------------------------------------------------------- transports


class Transport(Protocol):
    """How tensors and payloads travel for one architecture."""

    name: str

    def mean(self, comm, tree): ...
    def reduce(self, comm, c: Compressor, payloads, units) -> list: ...
    def gather(self, comm, c: Compressor, payloads, units) -> list: ...
    def reply(self, comm, agg, units, server, downlink, key) -> tuple[list, tuple]: ...
    def report_rank(self, workers: int) -> int: ...


class AllToAll:
    """Collectives between the workers; every worker ends with the aggregate."""

    name = "all-to-all"

    def mean(self, comm, tree):
        """Dense average: one allreduce."""
        return comm.allmean(tree)

    def reduce(self, comm, c, payloads, units):
        """sum_w decompress(payload_w) of summable payloads: allreduce, then decompress."""
        return [c.decompress(p, u) for p, u in zip(comm.allreduce(payloads), units)]

    def gather(self, comm, c, payloads, units):
        """sum_w decompress(payload_w): allgather, then decompress each."""
        return [_gathered_sum(c, s, u) for s, u in zip(comm.allgather(payloads), units)]

    def reply(self, comm, agg, units, server, downlink, key):
        return agg, server

    def report_rank(self, workers: int) -> int:
        return 0


class ParameterServer:
    """Push to the server (rank 0), aggregate there, pull the reply (``comm.push`` / ``pull``)."""

    name = "parameter-server"

    def mean(self, comm, tree):
        """Dense average: push, server mean, pull."""
        stacked = comm.push(tree)
        return comm.pull(jax.tree.map(lambda s: s.sum(0) / comm.size, stacked))

    def reduce(self, comm, c, payloads, units):
        """Summable payloads: their floating leaves are pushed; integer leaves (a shared key)
        are identical on every worker and stay home."""
        leaves, treedef = jax.tree.flatten(payloads)
        is_f = [jnp.issubdtype(x.dtype, jnp.floating) for x in leaves]
        got = iter(comm.push([x for x, f in zip(leaves, is_f) if f]))
        stacked = jax.tree.unflatten(
            treedef, [next(got) if f else jnp.broadcast_to(x, (comm.size, *x.shape)) for x, f in zip(leaves, is_f)]
        )
        return [_gathered_sum(c, s, u) for s, u in zip(stacked, units)]

    def gather(self, comm, c, payloads, units):
        return [_gathered_sum(c, s, u) for s, u in zip(comm.push(payloads), units)]

    def reply(self, comm, agg, units, server, downlink, key):
        """The server's reply: ``agg`` dense, or compressed by ``downlink`` (whose states are
        ``server``); returns (what every worker receives, new server states)."""
        if downlink is None:
            return comm.pull(agg), server
        skey = jax.random.fold_in(key, _SERVER_KEY)
        down = [downlink.compress(a, s, jax.random.fold_in(skey, j)) for j, (a, s) in enumerate(zip(agg, server))]
        pulled = comm.pull([p for p, _ in down])
        return [downlink.decompress(p, u) for p, u in zip(pulled, units)], tuple(s for _, s in down)

    def report_rank(self, workers: int) -> int:
        """A non-server worker's bytes are the ones to report."""
        return 1 if workers > 1 else 0


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (AllToAll(), ParameterServer())}


# ----------------------------------------------------------------------------- methods


def _collectives(c: Compressor) -> tuple[str, ...]:
    """The extra collectives ``c``'s registry entry lists (none for an unregistered one)."""
    try:
        return entry_of(c).collectives
    except ValueError:
        return ()


def supporting(option: str) -> list[str]:
    """Registered compressors whose entry lists ``option`` among its collectives."""
    return [e.name for e in entries() if option in e.collectives]


class Aggregator(Protocol):
    """One aggregation method (see the module docstring)."""

    name: str
    fusable: bool  # tensors may be fused into one flat buffer
    selectable: bool  # a configuration may ask for it by name (``collective``)

    def compresses(self, c: Compressor, shape: tuple) -> bool: ...
    def check(self, cfg, c: Compressor) -> None: ...
    def aggregate(self, comm, plan, units, state: dict, key) -> tuple[list, dict]: ...


class _Method:
    name = ""
    fusable = True
    selectable = False  # a configuration may ask for it (``collective=<name>``)
    shared_key = False  # every worker compresses with the same key (summable payloads)

    def compresses(self, c: Compressor, shape: tuple) -> bool:
        """Whether a tensor of ``shape`` is compressed (else it travels in the dense buffer)."""
        return True

    def check(self, cfg, c: Compressor) -> None:
        """One-line ValueError when ``cfg`` (EngineConfig fields) asks this method of ``c``
        something it cannot do."""

    def _compress(self, comm, plan, units, state, key):
        if self.shared_key:
            keys = [jax.random.fold_in(key, j) for j in range(len(units))]
        else:
            keys = [jax.random.fold_in(jax.random.fold_in(key, comm.rank()), j) for j in range(len(units))]
        pairs = [plan.comp.compress(u, s, k) for u, s, k in zip(units, state["units"], keys)]
        return [p for p, _ in pairs], [s for _, s in pairs]

    def _finish(self, comm, totals):
        return [t / comm.size for t in totals]

    def _reply(self, comm, plan, agg, units, states, state, key):
        agg, server = plan.transport.reply(comm, agg, units, state["server"], plan.downlink, key)
        return agg, {"units": tuple(states), "server": server}


class AllReduce(_Method):
    name = "allreduce"
    shared_key = True

    def aggregate(self, comm, plan, units, state, key):
        payloads, states = self._compress(comm, plan, units, state, key)
        totals = plan.transport.reduce(comm, plan.comp, payloads, units)
        return self._reply(comm, plan, self._finish(comm, totals), units, states, state, key)


class AllGather(_Method):
    name = "allgather"
    selectable = True

    def check(self, cfg, c):
        if cfg.collective == self.name and c.aggregation not in ("allreduce", self.name):
            raise ValueError(f"{c.name}'s aggregation is {c.aggregation!r}; collective='allgather' does not apply")

    def aggregate(self, comm, plan, units, state, key):
        payloads, states = self._compress(comm, plan, units, state, key)
        totals = plan.transport.gather(comm, plan.comp, payloads, units)
        return self._reply(comm, plan, self._finish(comm, totals), units, states, state, key)


class Vote(AllGather):
    """Majority vote over gathered payloads: sign(sum_w decompress(payload_w)), sign(0) = +1."""

    name = "vote"
    selectable = False  # asked for by ``vote=True``, not by ``collective``

    def check(self, cfg, c):
        if c.aggregation != "allgather":
            raise ValueError(
                f"vote=True needs a compressor whose payloads are gathered (a sign compressor), "
                f"got {c.name!r} (aggregation {c.aggregation!r})"
            )

    def _finish(self, comm, totals):
        return [jnp.where(t >= 0, 1, -1).astype(t.dtype) for t in totals]


class GTopK(_Method):
    name = "gtopk"
    selectable = True

    def check(self, cfg, c):
        ok = supporting(self.name)
        if self.name not in _collectives(c):
            raise ValueError(f"collective='gtopk' needs a top-k selection compressor ({', '.join(ok)}), got {c.name!r}")
        if cfg.architecture != AllToAll.name:
            raise ValueError("collective='gtopk' is an all-to-all algorithm; use architecture='all-to-all'")

    def aggregate(self, comm, plan, units, state, key):
        payloads, states = self._compress(comm, plan, units, state, key)
        out = []
        for j, (u, p) in enumerate(zip(units, payloads)):
            if isinstance(p, DensePayload):  # k >= d: nothing to select
                out.append(comm.allmean(p.values).reshape(u.shape).astype(u.dtype))
                continue
            v, i, alive = gtopk(comm, p.values, p.indices)
            out.append(scatter(v, i, u) / comm.size)
            lost = jnp.where(alive, jnp.zeros((), p.values.dtype), p.values)
            states[j] = plan.memory.give_back(states[j], scatter(lost, p.indices, u))
        return out, {**state, "units": tuple(states)}


class PowerSGD(_Method):
    """Two mean-reductions per matrix (P, then Q); the memory runs around the aggregate."""

    name = "powersgd"
    fusable = False
    MEMORIES = (M.NONE, "ef")  # masking (DGC) needs a sparse "sent"; the aggregate is dense

    def compresses(self, c, shape):
        return is_compressed(shape, c.hparams["rank"])

    def check(self, cfg, c):
        if cfg.collective == AllGather.name:
            raise ValueError(f"{c.name}'s factors are all-reduced; collective='allgather' does not apply")
        if cfg.memory not in self.MEMORIES:
            raise ValueError(f"{c.name} supports memory='ef' or 'none' (error feedback on the aggregate)")
        if cfg.granularity == "fused":
            raise ValueError(f"{c.name} factorises each matrix: use granularity='layerwise'")
        if cfg.ps_downlink is not None:
            raise ValueError(f"{c.name}'s factors are already compressed: ps_downlink must be None")

    def aggregate(self, comm, plan, units, state, key):
        mem, mean = plan.memory, plan.transport.mean
        absorbed = [mem.absorb(u, s) for u, s in zip(units, state["units"])]
        mats = [p.astype(jnp.float32).reshape(matrix_shape(u.shape)) for (p, _, _), u in zip(absorbed, units)]
        qs = [inner.q for _, inner, _ in absorbed]
        ps = [orthogonalize(p) for p in mean(comm, [compute_p(m, q) for m, q in zip(mats, qs)])]
        qs = mean(comm, [compute_q(m, p) for m, p in zip(mats, ps)])
        approx = [p @ q.T for p, q in zip(ps, qs)]
        out = [a.reshape(u.shape).astype(u.dtype) for a, u in zip(approx, units)]
        new = [
            mem.settle(s, m.reshape(u.shape), PowerSGDState(q), a.reshape(u.shape))
            for (_, _, s), m, q, a, u in zip(absorbed, mats, qs, approx, units)
        ]
        return out, {**state, "units": tuple(new)}


AGGREGATORS: dict[str, Aggregator] = {m.name: m for m in (AllReduce(), AllGather(), Vote(), GTopK(), PowerSGD())}


COLLECTIVES = ("auto", *(n for n, m in AGGREGATORS.items() if m.selectable))


def method_of(c: Compressor, collective: str = "auto", vote: bool = False) -> str:
    """The aggregation method for compressor ``c`` (unwrapped or memory-wrapped):

    its own ``aggregation``; ``collective="allgather"`` gathers summable payloads instead of
    summing them; a collective the compressor's registry entry lists (``collectives``) replaces
    it; ``vote`` turns gathering into a majority vote.
    """
    method = c.aggregation
    if collective == AllGather.name and method == AllReduce.name:
        method = AllGather.name
    if collective not in ("auto", AllGather.name) and collective in _collectives(c):
        method = collective
    if vote and method == AllGather.name:
        method = Vote.name
    return method


def check(cfg, c: Compressor) -> None:
    """Reject what the aggregation methods ``cfg`` asks of ``c`` cannot do (one-line ValueError)."""
    AGGREGATORS[c.aggregation].check(cfg, c)
    if cfg.collective != "auto":
        AGGREGATORS[cfg.collective].check(cfg, c)
    if cfg.vote:
        AGGREGATORS[Vote.name].check(cfg, c)


__all__ = [
    "AGGREGATORS",
    "TRANSPORTS",
    "COLLECTIVES",
    "Aggregator",
    "Transport",
    "AllToAll",
    "ParameterServer",
    "AllReduce",
    "AllGather",
    "Vote",
    "GTopK",
    "PowerSGD",
    "method_of",
    "check",
    "supporting",
]
