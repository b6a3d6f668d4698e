"""Gradient (or model-delta) exchange: compress per worker, communicate, decompress, average.

``make_plan`` decides statically, from the configuration and the tensors' shapes, which tensors
are compressed and how they travel; ``exchange(comm, plan, tree, state, key)`` runs it on one
worker and returns the averaged update (identical on every worker) and the new compressor state.

The compressed tensors ("units": one per tensor, or one flat buffer when fused) go through the
plan's aggregation method (the open registry ``cconv.comm.aggregation.AGGREGATIONS``: allreduce,
allgather, vote, gtopk, intsum, and what compressor modules or user code register, e.g.
powersgd) over the plan's transport (``TRANSPORTS``: all-to-all collectives or a
parameter server); memory effects go through the plan's ``Memory`` hooks.  Tensors left dense
by the filter (and all of them at density 1) travel together, in their common dtype, by one call
of the transport's mean (allreduce, or push + pull).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv import compressors as C
from cconv import memory as M
from cconv.comm.aggregation import TRANSPORTS, Transport, method_of
from cconv.compressors import keyed
from cconv.compressors.base import Compressor, aggregation
from cconv.engine.config import IDENTITY


class Plan(NamedTuple):
    comp: Compressor | None  # memory-wrapped compressor; None: everything dense
    mode: str  # aggregation method: a registered name (``cconv.compressors.AGGREGATIONS``)
    compressed: tuple  # per leaf: compressed (True) or sent dense
    fused: bool
    vote: bool
    ps: bool
    downlink: Compressor | None  # server-side (EF-wrapped) reply compressor
    density: float  # fraction of coordinates carried (for the metric)
    memory: M.Memory | None = None  # the memory's hooks (None: everything dense)
    transport: Transport = TRANSPORTS["all-to-all"]


def wrap_memory(c: Compressor, memory: str, momentum: float, masking: bool) -> Compressor:
    """``c`` wrapped in the memory named ``memory`` (``cconv.memory.MEMORIES``)."""
    return M.wrap(c, M.get(memory, c, momentum=momentum, masking=masking))


def make_plan(engine_cfg, base: Compressor | None, shapes, *, memory: str) -> Plan:
    """Static plan for tensors of ``shapes`` with the (unwrapped) compressor ``base``."""
    transport = TRANSPORTS[engine_cfg.architecture]
    ps = transport.name != "all-to-all"
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if base is None or (C.registered_name(base) == IDENTITY and memory == M.NONE and not ps):
        return Plan(None, "allreduce", (False,) * len(shapes), False, False, ps, None, 1.0, None, transport)
    mode = method_of(base, engine_cfg.collective, engine_cfg.vote)
    method = aggregation(mode)
    compressed = tuple(
        n > 0
        and n >= engine_cfg.min_compress_size
        and (engine_cfg.compress_vectors or len(s) > 1)
        and method.compresses(base, s)
        for s, n in zip(shapes, sizes)
    )
    fused = engine_cfg.granularity == "fused" and method.fusable
    units = (
        [(sum(n for n, c in zip(sizes, compressed) if c),)]
        if fused and any(compressed)
        else [s for s, c in zip(shapes, compressed) if c]
    )
    carried = sum(base.density(u) * math.prod(u) for u in units) + sum(n for n, c in zip(sizes, compressed) if not c)
    if engine_cfg.ps_downlink is not None:  # the server's reply, with error feedback on the server
        down = M.error_feedback(engine_cfg.ps_downlink)
    elif ps and engine_cfg.vote:  # the vote is a sign: the sign compressor carries it as is
        down = engine_cfg.compressor
    else:
        down = None
    mem = M.get(memory, base, momentum=engine_cfg.momentum, masking=engine_cfg.masking, ef_scale=engine_cfg.ef_scale)
    return Plan(
        M.wrap(base, mem),
        mode,
        compressed,
        fused,
        bool(engine_cfg.vote),
        ps,
        down,
        float(carried / max(sum(sizes), 1)),
        mem,
        transport,
    )


# ----------------------------------------------------------------------------- state


def _units(plan: Plan, leaves):
    xs = [x for x, c in zip(leaves, plan.compressed) if c]
    if plan.fused and xs:
        dtype = jnp.result_type(*xs)
        return [jnp.concatenate([x.reshape(-1).astype(dtype) for x in xs])]
    return xs


def _split_units(plan: Plan, units, like_leaves):
    """Inverse of ``_units``: per-leaf arrays (None for dense leaves)."""
    like = [x for x, c in zip(like_leaves, plan.compressed) if c]
    if plan.fused and like:
        sizes = np.cumsum([x.size for x in like])[:-1]
        units = [p.reshape(x.shape).astype(x.dtype) for p, x in zip(jnp.split(units[0], sizes), like)]
    it = iter(units)
    return [next(it) if c else None for c in plan.compressed]


def init_state(plan: Plan, leaves) -> dict:
    if plan.comp is None:
        return {"units": (), "server": ()}
    units = _units(plan, leaves)
    server = tuple(plan.downlink.init(u) for u in units) if plan.downlink is not None else ()
    return {"units": tuple(plan.comp.init(u) for u in units), "server": server}


# ----------------------------------------------------------------------------- exchange


def average(comm, plan: Plan, tree):
    """Average of a dense tree over workers: allreduce, or PS push + server mean + pull."""
    return plan.transport.mean(comm, tree)


def _deliver(plan: Plan, agg, state: dict):
    """The memory's ``receive`` per unit: the update from the aggregated average (EF21's
    server estimate g + average); the average itself for every other memory."""
    if plan.memory is None or plan.memory.receive is None:
        return agg, state
    pairs = [plan.memory.deliver(s, a) for s, a in zip(state["units"], agg)]
    return [a for a, _ in pairs], {**state, "units": tuple(s for _, s in pairs)}


def exchange(comm, plan: Plan, tree, state: dict, key):
    """Average ``tree`` over workers through ``plan``; returns (average, new state)."""
    leaves, treedef = jax.tree.flatten(tree)
    dense = [x for x, c in zip(leaves, plan.compressed) if not c]
    out = [None] * len(leaves)
    if dense:
        # One collective for all dense leaves, each in the leaves' common dtype (the bytes of one
        # flat buffer), but not concatenated: XLA combines the leaves into one tuple all-reduce,
        # while a concatenated 1.3M-element buffer made XLA:CPU's dense step ~1.5x slower
        # (the copy in and out, and one serial reduction of the whole buffer).
        dtype = jnp.result_type(*dense)
        avg = average(comm, plan, [x.astype(dtype) for x in dense])
        it = iter(a.astype(x.dtype) for a, x in zip(avg, dense))
        out = [None if c else next(it) for c in plan.compressed]
    if any(plan.compressed):
        with keyed.once_per_key():  # what a payload regenerates from a shared key: traced once
            agg, state = aggregation(plan.mode).aggregate(comm, plan, _units(plan, leaves), state, key)
            agg, state = _deliver(plan, agg, state)
        for i, a in enumerate(_split_units(plan, agg, leaves)):
            if a is not None:
                out[i] = a.astype(leaves[i].dtype)
    return jax.tree.unflatten(treedef, out), state
