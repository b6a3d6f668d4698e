"""Aggregation methods and the transports they use: one object each, looked up by name.

An aggregation method turns every worker's tensors ("units") into their average, identical on
every worker, through compressed payloads:

    agg, state = AGGREGATIONS[method].aggregate(comm, plan, units, state, key)

``state`` is ``{"units": per-unit (memory-wrapped) compressor states, "server": the server's
downlink states}``.  ``plan`` is the engine's static plan (``cconv.engine.exchange.Plan``); a
method reads ``plan.comp`` (the memory-wrapped compressor), ``plan.memory`` (its ``Memory``
hooks), ``plan.transport`` and ``plan.downlink``.

Methods (the open registry ``cconv.compressors.AGGREGATIONS``, re-exported here: a compressor
module or user code adds one with ``cconv.compressors.register_aggregation``).  Each states its
algebra (``Aggregation.algebra``) and every transport follows it, so a configuration computes the
same algorithm on every architecture or is refused (``check``):
  allreduce  SUM: summable payloads (casts, shared-key random-k): every worker compresses with
             the SAME key, the payloads are summed -- by an all-reduce, on the server, or after
             an all-gather (``collective="allgather"``) -- decompressed ONCE and divided by P.
  allgather  DECODE: every payload reaches every worker (or the server), each is decompressed
             (``Compressor.sum_gathered``), the sum divided by P.
  vote       signSGD with majority vote (Bernstein et al. 2018): sign(sum_w decompress(payload_w)),
             sign(0) = +1.
  gtopk      recursive-doubling global top-k (Shi et al. 2019, ``cconv.comm.gtopk``); entries a
             worker sent that did not survive go back to its memory (``Memory.give_back``).
  powersgd   its own reducer, defined with the compressor (``cconv.compressors.powersgd``).
  intsum     payloads are integer levels times a statistic the workers agreed on (e.g.
             a shared max scaler): per tensor, the levels are summed as int8/int16 by a
             ring all-reduce when that moves fewer bytes than gathering the payloads, else the
             payloads are gathered (``IntSum.sum_dtype``).

A compressor with an ``Agreement`` (``Compressor.agree``: a per-tensor statistic all workers
agree on before compressing) is handled by every method in ``_Method._compress``: each worker's
statistic of its (memory-absorbed) tensors, one reduction over the workers for all tensors
(``Transport.agree``, control traffic), then the compressor bound to the agreed value.

Transports (``TRANSPORTS``, one per architecture) move what a method hands them:
  all-to-all        collectives between the workers (ring allreduce / allgather).
  parameter-server  payloads are pushed to the server (rank 0), which decompresses and averages
                    (or votes), then replies with the dense average or, with a downlink
                    compressor, a compressed one (error feedback on the server).  Integer
                    leaves of summable payloads (a shared key) are identical everywhere and
                    stay home.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp

from cconv import memory as M
from cconv.comm.accounting import tree_bytes
from cconv.comm.gtopk import gtopk
from cconv.compressors.base import (
    AGGREGATIONS,
    DECODE,
    OWN,
    SUM,
    Aggregation,
    Compressor,
    aggregation,
    payload_bytes,
    register_aggregation,
)
from cconv.compressors.registry import entries, entry_of
from cconv.compressors.sparse import scatter

_SERVER_KEY = 1 << 20  # folded into the step key for the server's downlink compression


def _gathered_sum(comm, c: Compressor, stacked, like):
    """sum_w decompress(payload_w) of gathered payloads (stacked on a leading axis), by the
    compressor's algebra: summable payloads are summed (in ``comm.sum_dtype``) and decoded ONCE,
    as an all-reduce would; others are decoded and summed (``Compressor.sum_gathered``: the
    compressor's packed-domain ``gathered_sum`` hook where it has one)."""
    if c.summable:
        return c.decompress(c.sum_payloads(stacked, comm.sum_dtype), like)
    return c.sum_gathered(stacked, like)


def _note(comm, kind: str, c: Compressor, payloads) -> None:
    """Record the encoded size of ``payloads`` (this worker's, or the one every worker received)
    for a variable-length compressor; fixed formats move exactly what they encode."""
    if c.variable_length:
        comm.note_encoded(kind, tree_bytes(payloads), sum(c.encoded_bytes(p) for p in payloads))


# ----------------------------------------------------------------------------- transports


class Transport(Protocol):
    """How tensors and payloads travel for one architecture."""

    name: str

    def mean(self, comm, tree): ...
    def reduce(self, comm, c: Compressor, payloads, units) -> list: ...
    def gather(self, comm, c: Compressor, payloads, units) -> list: ...
    def reply(self, comm, agg, units, server, downlink, key) -> tuple[list, tuple]: ...
    def report_rank(self, workers: int) -> int: ...
    def agree(self, comm, stats, reduce: str): ...


class AllToAll:
    """Collectives between the workers; every worker ends with the aggregate."""

    name = "all-to-all"
    via_server = False  # messages go between the workers

    def mean(self, comm, tree):
        """Dense average: one allreduce."""
        return comm.allmean(tree)

    def reduce(self, comm, c, payloads, units):
        """sum_w decompress(payload_w) of summable payloads: allreduce, then decompress."""
        return [c.decompress(p, u) for p, u in zip(comm.allreduce(payloads), units)]

    def gather(self, comm, c, payloads, units):
        """sum_w decompress(payload_w): allgather, then decompress each."""
        gathered = comm.allgather(payloads)
        _note(comm, "allgather", c, payloads)
        return [_gathered_sum(comm, c, s, u) for s, u in zip(gathered, units)]

    def reply(self, comm, agg, units, server, downlink, key):
        return agg, server

    def report_rank(self, workers: int) -> int:
        return 0

    def agree(self, comm, stats, reduce):
        """The workers' statistics combined by ``reduce`` ("max"): one all-reduce (control)."""
        return comm.allmax(stats, control=True)


class ParameterServer:
    """Push to the server (rank 0), aggregate there, pull the reply (``comm.push`` / ``pull``)."""

    name = "parameter-server"
    via_server = True  # messages are pushed to and pulled from a server

    def mean(self, comm, tree):
        """Dense average: push, server mean, pull."""
        stacked = comm.push(tree)
        return comm.pull(jax.tree.map(lambda s: s.sum(0) / comm.size, stacked))

    def reduce(self, comm, c, payloads, units):
        """Summable payloads: their floating leaves are pushed; integer leaves (a shared key)
        are identical on every worker and stay home; the server sums them and decodes once."""
        leaves, treedef = jax.tree.flatten(payloads)
        is_f = [jnp.issubdtype(x.dtype, jnp.floating) for x in leaves]
        got = iter(comm.push([x for x, f in zip(leaves, is_f) if f]))
        stacked = jax.tree.unflatten(
            treedef, [next(got) if f else jnp.broadcast_to(x, (comm.size, *x.shape)) for x, f in zip(leaves, is_f)]
        )
        return [_gathered_sum(comm, c, s, u) for s, u in zip(stacked, units)]

    def gather(self, comm, c, payloads, units):
        pushed = comm.push(payloads)
        _note(comm, "ps_push", c, payloads)
        return [_gathered_sum(comm, c, s, u) for s, u in zip(pushed, units)]

    def reply(self, comm, agg, units, server, downlink, key):
        """The server's reply: ``agg`` dense, or compressed by ``downlink`` (whose states are
        ``server``); returns (what every worker receives, new server states)."""
        if downlink is None:
            return comm.pull(agg), server
        skey = jax.random.fold_in(key, _SERVER_KEY)
        down = [downlink.compress(a, s, jax.random.fold_in(skey, j)) for j, (a, s) in enumerate(zip(agg, server))]
        pulled = comm.pull([p for p, _ in down])
        _note(comm, "ps_pull", downlink, pulled)  # the server's reply, as every worker got it
        return [downlink.decompress(p, u) for p, u in zip(pulled, units)], tuple(s for _, s in down)

    def report_rank(self, workers: int) -> int:
        """A non-server worker's bytes are the ones to report."""
        return 1 if workers > 1 else 0

    def agree(self, comm, stats, reduce):
        """The workers' statistics pushed to the server, combined by ``reduce`` ("max") there
        and pulled back (control traffic)."""
        return comm.pull(jnp.max(comm.push(stats, control=True), axis=0), control=True)


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (AllToAll(), ParameterServer())}


# ----------------------------------------------------------------------------- methods


def _collectives(c: Compressor) -> tuple[str, ...]:
    """The extra collectives ``c``'s registry entry lists (none for one built by hand)."""
    try:
        return entry_of(c).collectives
    except ValueError:
        return ()


def supporting(option: str) -> list[str]:
    """Registered compressors whose entry lists ``option`` among its collectives."""
    return [e.name for e in entries() if option in e.collectives]


Aggregator = Aggregation  # the protocol (``cconv.compressors.base.Aggregation``)


def _agreed(comm, plan, units, states):
    """The statistic every worker agrees on per unit (``Compressor.agree``), or None: each
    worker's own on the input the compressor sees (after the memory), one reduction for all."""
    agree = plan.comp.agree
    if agree is None:
        return None
    if agree.reduce != "max":
        raise ValueError(f"{plan.comp.name}: an Agreement's reduce must be 'max', got {agree.reduce!r}")
    local = [agree.statistic(plan.memory.absorb(u, s)[0]) for u, s in zip(units, states)]
    return plan.transport.agree(comm, jnp.stack([jnp.asarray(v, jnp.float32) for v in local]), agree.reduce)


def _per_coder(fn, comm, coders, payloads, units):
    """``fn(comm, c, payloads, units)`` (a transport's reduce or gather) once when every unit
    has the same compressor, else once per unit with its own (bound to its agreed statistic)."""
    if all(c is coders[0] for c in coders):
        return fn(comm, coders[0], payloads, units)
    return [fn(comm, c, [p], [u])[0] for c, p, u in zip(coders, payloads, units)]


class Compressed(NamedTuple):
    payloads: list
    states: list
    coders: list  # per unit: the compressor that decompresses its payload
    agreed: object  # float32[units] agreed statistics, or None


class _Method(Aggregation):
    """The methods' shared steps: ``_compress`` (keys, agreement, memory), ``average`` (the
    summed decodings -> what every worker applies; a subclass overrides it, e.g. to keep the
    heavy hitters of a sketch, or ``_finish`` for a vote) and ``_reply`` (the transport's reply:
    a parameter server's downlink)."""

    def _compress(self, comm, plan, units, state, key) -> Compressed:
        """Every unit compressed by ``plan.comp``, or, with an ``Agreement``, by ``plan.comp``
        bound to the agreed statistic (wrapped in the plan's memory)."""
        if self.shared_key or plan.comp.summable:  # summable payloads are summed: one key for all
            keys = [jax.random.fold_in(key, j) for j in range(len(units))]
        else:
            keys = [jax.random.fold_in(jax.random.fold_in(key, comm.rank()), j) for j in range(len(units))]
        agreed = _agreed(comm, plan, units, state["units"])
        if agreed is None:
            coders = [plan.comp] * len(units)
        else:
            coders = [M.wrap(plan.comp.agree.bind(agreed[j]), plan.memory) for j in range(len(units))]
        pairs = [c.compress(u, s, k) for c, u, s, k in zip(coders, units, state["units"], keys)]
        return Compressed([p for p, _ in pairs], [s for _, s in pairs], coders, agreed)

    def _finish(self, comm, totals):
        return [t / comm.size for t in totals]

    def average(self, comm, plan, totals) -> list:
        """sum_w of the decoded payloads per unit -> the update every worker applies (the same
        on every worker): the mean by default."""
        return self._finish(comm, totals)

    def _reply(self, comm, plan, agg, units, states, state, key):
        agg, server = plan.transport.reply(comm, agg, units, state["server"], plan.downlink, key)
        return agg, {"units": tuple(states), "server": server}


class AllReduce(_Method):
    """SUM: the payloads are summed (all-reduce, or pushed and summed on the server) and
    decoded once."""

    name = "allreduce"
    algebra = SUM
    shared_key = True
    gatherable = True

    def aggregate(self, comm, plan, units, state, key):
        payloads, states, coders, _ = self._compress(comm, plan, units, state, key)
        totals = _per_coder(plan.transport.reduce, comm, coders, payloads, units)
        return self._reply(comm, plan, self.average(comm, plan, totals), units, states, state, key)


class AllGather(_Method):
    """Gather the payloads (all-gather, or push to the server) and combine them by the
    compressor's algebra (decoded each and summed; summed then decoded once if summable)."""

    name = "allgather"
    algebra = DECODE
    selectable = True

    def check(self, engine_cfg, c):
        if (
            engine_cfg.collective == self.name
            and c.aggregation != self.name
            and not AGGREGATIONS[c.aggregation].gatherable
        ):
            raise ValueError(f"{c.name}'s aggregation is {c.aggregation!r}; collective='allgather' does not apply")

    def aggregate(self, comm, plan, units, state, key):
        payloads, states, coders, _ = self._compress(comm, plan, units, state, key)
        totals = _per_coder(plan.transport.gather, comm, coders, payloads, units)
        return self._reply(comm, plan, self.average(comm, plan, totals), units, states, state, key)


class Vote(AllGather):
    """Majority vote over gathered payloads: sign(sum_w decompress(payload_w)); a tie (sum 0)
    gives +1.  Defined for sign payloads only: compressors whose registry entry has ``votes``."""

    name = "vote"
    selectable = False  # asked for by ``vote=True``, not by ``collective``

    def check(self, engine_cfg, c):
        try:
            votes = entry_of(c).votes
        except ValueError:  # a compressor built by hand carries no entry
            votes = False
        if not votes or c.aggregation != "allgather":
            ok = ", ".join(e.name for e in entries() if e.votes)
            raise ValueError(
                f"vote=True needs a sign compressor ({ok}: its registry entry declares votes) for signSGD's "
                f"majority vote (a tie gives +1), got {c.name!r}"
            )

    def _finish(self, comm, totals):
        return [jnp.where(t >= 0, 1, -1).astype(t.dtype) for t in totals]


class GTopK(_Method):
    name = "gtopk"
    algebra = OWN
    selectable = True

    def check(self, engine_cfg, c):
        ok = supporting(self.name)
        if self.name not in _collectives(c):
            raise ValueError(f"collective='gtopk' needs a top-k selection compressor ({', '.join(ok)}), got {c.name!r}")
        if engine_cfg.architecture != AllToAll.name:
            raise ValueError("collective='gtopk' is an all-to-all algorithm; use architecture='all-to-all'")
        if c.variable_length:
            raise ValueError(
                f"collective='gtopk' exchanges fixed (value, int32 index) pairs; {c.name} is configured with an "
                "entropy-coded format (e.g. positions='golomb'): use its default format"
            )

    def aggregate(self, comm, plan, units, state, key):
        payloads, states, _, _ = self._compress(comm, plan, units, state, key)
        out = []
        for j, (u, p) in enumerate(zip(units, payloads)):
            if plan.comp.density(u.shape) >= 1.0:  # k >= d: the dense array, nothing to select
                out.append(comm.allmean(p.values).reshape(u.shape).astype(u.dtype))
                continue
            v, i, alive = gtopk(comm, p.values, p.indices)
            out.append(scatter(v, i, u) / comm.size)
            lost = jnp.where(alive, jnp.zeros((), p.values.dtype), p.values)
            states[j] = plan.memory.give_back(states[j], scatter(lost, p.indices, u))
        return out, {**state, "units": tuple(states)}


class IntSum(_Method):
    """Payloads that are integer levels times an agreed statistic s (``Compressor.agree``; e.g.
    ternary codes times a shared max scaler):

        sum_w decompress(payload_w) = level_value(s) * sum_w levels(payload_w)

    or, for levels in another basis, the agreement's ``decode(sum_w levels_w, s, like)`` (THC:
    levels of a shared rotation, inverted once after the sum; ``Agreement.decode_sum``).

    Per unit, the levels are summed exactly as small integers by one ring all-reduce (all
    such units in one call) when that moves fewer bytes than gathering the payloads
    (``sum_dtype``, decided statically from P, d and the payload size), else the payloads are
    gathered and decompressed with the bound compressor.  A parameter server always gathers
    (pushing d integers costs more than the packed payload)."""

    name = "intsum"
    algebra = DECODE  # level_value(s) * sum_w levels_w = sum_w decompress(payload_w), exactly
    gatherable = True

    @staticmethod
    def sum_dtype(workers: int, d: int, level_max: int, payload_nbytes: int):
        """int8 when P * level_max <= 127, int16 when <= 32767 (never wider) -- if a ring
        all-reduce of d of them, 2(P-1)/P * d * itemsize bytes, moves fewer bytes than an
        allgather of the payloads, (P-1) * payload_nbytes; else None (gather).  Ternary codes
        (ceil(d/4) bytes): int8 wins for P > 8."""
        reach = workers * level_max
        dtype = jnp.int8 if reach <= 127 else jnp.int16 if reach <= 32767 else None
        if dtype is None or workers < 2:
            return None
        ring = 2.0 * (workers - 1) / workers * d * jnp.dtype(dtype).itemsize
        return dtype if ring < (workers - 1) * payload_nbytes else None

    def check(self, engine_cfg, c):
        a = c.agree
        if a is None or a.levels is None or a.level_value is None or a.level_max < 1:
            raise ValueError(
                f"{c.name}'s aggregation 'intsum' needs Compressor.agree with integer levels (levels, level_max >= 1)"
            )

    def aggregate(self, comm, plan, units, state, key):
        payloads, states, coders, agreed = self._compress(comm, plan, units, state, key)
        agree = plan.comp.agree
        ring = plan.transport.name == AllToAll.name
        levels = [agree.levels(p, u) for p, u in zip(payloads, units)]
        dts = [
            self.sum_dtype(comm.size, lv.size, agree.level_max, payload_bytes(p)) if ring else None
            for p, lv in zip(payloads, levels)
        ]
        levels = [lv.astype(dt) for lv, dt in zip(levels, dts) if dt is not None]
        summed = iter(comm.allreduce(levels, integers=True))
        rest = [j for j, dt in enumerate(dts) if dt is None]
        pick = lambda xs: [xs[j] for j in rest]
        gathered = _per_coder(plan.transport.gather, comm, pick(coders), pick(payloads), pick(units)) if rest else []
        gathered = iter(gathered)
        totals = [
            next(gathered) if dt is None else agree.decode_sum(next(summed), agreed[j], u)
            for j, (u, dt) in enumerate(zip(units, dts))
        ]
        return self._reply(comm, plan, self.average(comm, plan, totals), units, states, state, key)


for _m in (AllReduce(), AllGather(), Vote(), GTopK(), IntSum()):
    register_aggregation(_m)


class _Collectives(Sequence):
    """``"auto"`` and the registered methods a configuration may select (``collective``); read
    afresh on every use, so a method registered from user code is selectable at once."""

    def _names(self) -> tuple[str, ...]:
        return ("auto", *(n for n, m in AGGREGATIONS.items() if m.selectable))

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # a live view: not hashable


COLLECTIVES = _Collectives()


def method_of(c: Compressor, collective: str = "auto", vote: bool = False) -> str:
    """The aggregation method for compressor ``c`` (unwrapped or memory-wrapped):

    its own ``aggregation``; ``collective="allgather"`` gathers summable payloads (allreduce,
    intsum) instead of summing them; a collective the compressor's registry entry lists (``collectives``) replaces
    it; ``vote`` turns gathering into a majority vote.
    """
    method = c.aggregation
    if collective == AllGather.name and aggregation(method).gatherable:
        method = AllGather.name
    if collective not in ("auto", AllGather.name) and collective in _collectives(c):
        method = collective
    if vote and method == AllGather.name:
        method = Vote.name
    return method


def check(engine_cfg, c: Compressor) -> None:
    """Reject what the aggregation methods ``engine_cfg`` asks of ``c`` cannot do (one-line ValueError)."""
    own = aggregation(c.aggregation)
    if getattr(engine_cfg, "sync", None) == "gossip" and (own.algebra == OWN or not own.gossip):
        raise ValueError(
            f"sync='gossip' mixes payloads (summed or decoded); {c.name}'s aggregation {own.name!r} is its own "
            "reducer, which gossip cannot follow"
        )
    own.check(engine_cfg, c)
    if engine_cfg.collective != "auto":
        AGGREGATIONS[engine_cfg.collective].check(engine_cfg, c)
    if engine_cfg.vote:
        AGGREGATIONS[Vote.name].check(engine_cfg, c)


__all__ = [
    "AGGREGATIONS",
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
    "IntSum",
    "method_of",
    "check",
    "supporting",
    "register_aggregation",
    "SUM",
    "DECODE",
    "OWN",
]
