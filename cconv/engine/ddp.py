"""What a DDP user takes for granted, for cconv's drop-in API inside your own ``jax.shard_map``.

``as_optax`` keeps one state per worker (error-feedback residuals, its key and byte counters): its
leaves carry a leading worker axis and must be sharded ``P(axis)``, while the optimizer chained
after it keeps the usual replicated state, ``P()``.  Getting a spec wrong fails silently under
``check_vma=False`` (every worker would read worker 0's residuals), so the helpers here derive,
lay out and check those specs:

    opt_state, specs = init_state(tx, params, mesh)       # per-worker copies placed, specs derived
    check_specs(opt_state, my_specs)                      # ValueError naming the first wrong leaf
    specs = nnx_shard(model, optimizer, mesh)             # flax.nnx, in place (nnx.jit / nnx.shard_map)
    graphdef, state, specs = nnx_split(model, optimizer, mesh)   # flax.nnx, functional (the values move)
    traffic(opt_state)                                    # the last step's payload and moved bytes

and, inside the mapped step,

    key = worker_key(key)                 # fold_in(key, worker index): dropout differs per worker
    stats = sync_model_state(stats)       # running BatchNorm statistics averaged (pmean) over workers
    stats = sync_model_state(stats, mode="check")   # keep them per worker; warn once if they differ

For synchronized batch statistics in the forward pass itself (PyTorch's ``SyncBatchNorm``) give
Flax's BatchNorm the axis: ``nn.BatchNorm(axis_name="data")`` / ``nnx.BatchNorm(..., axis_name=
"data")`` average the batch mean and variance over the workers (one small all-reduce per layer).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cconv.engine.dropin import UNPLACED, CompressedState, not_laid_out

MODES = ("mean", "check")


class ModelStateDivergenceWarning(UserWarning):
    """Per-worker model state (BatchNorm running statistics) differs between workers."""


_WARNED: set = set()  # what has been warned about in this process (the warnings are one-time)


def _is_cconv(x) -> bool:
    """cconv's state: a ``CompressedState``, or one as NNX holds it (an ``nnx.State`` / dict with its
    fields as keys, after ``nnx.split`` or ``nnx.state``)."""
    if isinstance(x, CompressedState):
        return True
    keys = getattr(x, "keys", None)
    return callable(keys) and not isinstance(x, tuple) and set(keys()) == set(CompressedState._fields)


def _field(node, name: str):
    return getattr(node, name) if isinstance(node, CompressedState) else node[name]


def _array(x):
    """The array of a leaf that may be an NNX Variable."""
    return x.get_value() if hasattr(x, "get_value") else x


def _cconv_nodes(tree) -> list:
    """Every cconv state in ``tree`` (an optax state, an NNX State, or NNX objects)."""
    if not isinstance(tree, (nnx.State, dict, tuple, list, CompressedState)) and nnx.graph.is_graph_node(tree):
        tree = nnx.state(tree)
    return [x for x in jax.tree.leaves(tree, is_leaf=_is_cconv) if _is_cconv(x)]


def _unplaced(node) -> bool:
    return jnp.dtype(_array(_field(node, "count")).dtype) == UNPLACED


def _path_names(path) -> tuple:
    """A key path as plain names (NNX turns NamedTuples and tuples into dicts keyed by field/index)."""
    out = []
    for k in path:
        for attr in ("name", "key", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)


def state_specs(opt_state, axis_name: str = "data"):
    """The partition specs of an optax state: ``P(axis_name)`` on every leaf of cconv's
    ``CompressedState`` (per worker), ``P()`` elsewhere (replicated)."""

    def spec(sub):
        if _is_cconv(sub):
            return jax.tree.map(lambda _: P(axis_name), sub)
        return P()

    return jax.tree.map(spec, opt_state, is_leaf=_is_cconv)


def init_state(tx, params, mesh, axis_name: str = "data"):
    """``(opt_state, specs)``: ``tx.init(params)`` run inside ``shard_map`` over ``mesh``'s
    ``axis_name`` (one state per worker for cconv's part, replicated for the rest), and the
    specs to give your step's ``in_specs``/``out_specs`` for it."""
    abstract = jax.eval_shape(tx.init, params)
    specs = state_specs(abstract, axis_name)
    init = jax.shard_map(tx.init, mesh=mesh, in_specs=P(), out_specs=specs, check_vma=False)
    return jax.jit(init)(params), specs


def check_specs(opt_state, specs, axis_name: str = "data", workers: int | None = None) -> None:
    """Raise a one-line ValueError when ``specs`` would not keep cconv's state per worker: a
    leaf of ``CompressedState`` must be ``P(axis_name)`` and (given ``workers``) have that
    leading size; every other leaf of ``opt_state`` must not be split along ``axis_name``.
    ``opt_state`` is an optax state or an NNX one (``nnx.split((model, optimizer))``'s state);
    a state that ``tx.init`` made outside the map and nothing laid out per worker is refused."""
    if any(_unplaced(node) for node in _cconv_nodes(opt_state)):
        raise ValueError(not_laid_out(axis_name))
    want = state_specs(opt_state, axis_name)
    want_paths = jax.tree_util.tree_leaves_with_path(want, is_leaf=lambda x: isinstance(x, P))
    state_leaves = jax.tree.leaves(opt_state)
    is_spec = lambda x: isinstance(x, P) or x is None
    prefix = jax.tree_util.tree_structure(specs, is_leaf=is_spec)  # specs may be a prefix of the state
    try:
        subtrees = prefix.flatten_up_to(opt_state)
    except (ValueError, TypeError):
        raise ValueError(
            f"cconv: the partition specs do not match the optimizer state's structure: "
            f"use cconv.state_specs(opt_state, {axis_name!r})"
        ) from None
    spec_leaves = jax.tree.leaves(specs, is_leaf=is_spec)
    got_leaves = [g for g, sub in zip(spec_leaves, subtrees) for _ in jax.tree.leaves(sub)]
    for (path, w), g, leaf in zip(want_paths, got_leaves, state_leaves):
        where = "opt_state" + jax.tree_util.keystr(path)
        if w == P(axis_name) and g != w:
            raise ValueError(
                f"cconv: {where} is per-worker state of cconv.as_optax and needs spec P({axis_name!r}), "
                f"got {g}: use cconv.state_specs(opt_state, {axis_name!r})"
            )
        if w == P() and axis_name in jax.tree.leaves(tuple(g)):
            raise ValueError(f"cconv: {where} is replicated optimizer state: its spec must be P(), got {g}")
        if w == P(axis_name) and workers is not None and np.shape(leaf)[:1] != (workers,):
            raise ValueError(
                f"cconv: {where} has shape {np.shape(leaf)}, not one row per worker ({workers}): "
                f"create it with cconv.init_state(tx, params, mesh)"
            )


def worker_key(key, axis_name: str = "data"):
    """This worker's PRNG key inside the map: ``fold_in(key, axis_index(axis_name))``.  Give the
    step one key (the same on every worker) and derive dropout / noise keys from this, so that
    workers draw different masks (DDP's per-rank seeds); the compression key stays shared."""
    return jax.random.fold_in(key, lax.axis_index(axis_name))


def sync_model_state(tree, axis_name: str = "data", mode: str = "mean"):
    """Per-worker model state (BatchNorm running statistics) after a step, inside the map.

    ``mode="mean"``: averaged over the workers (``lax.pmean`` of every floating leaf), as cconv's
    engine does every step; all workers then hold the same statistics.
    ``mode="check"``: returned unchanged, and a one-time ``ModelStateDivergenceWarning`` is
    emitted on the host when the workers' values differ (max |x_w - mean_w x| > 0): with
    ``out_specs=P()`` and ``check_vma=False`` JAX would otherwise keep worker 0's silently."""
    if mode not in MODES:
        raise ValueError(f"sync_model_state: mode must be one of {', '.join(MODES)}, got {mode!r}")
    floating = lambda x: jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
    if mode == "mean":
        return jax.tree.map(lambda x: lax.pmean(x, axis_name) if floating(x) else x, tree)
    spreads = [jnp.max(jnp.abs(x - lax.pmean(x, axis_name))) for x in jax.tree.leaves(tree) if floating(x)]
    if spreads:
        spread = lax.pmax(jnp.max(jnp.stack(spreads)), axis_name)
        jax.debug.callback(_warn_divergence, spread, axis_name)
    return tree


def _warn_divergence(spread, axis_name: str) -> None:
    if float(spread) > 0 and ("diverge", axis_name) not in _WARNED:
        _WARNED.add(("diverge", axis_name))
        warnings.warn(
            f"cconv: model state (e.g. BatchNorm running statistics) differs across the workers of "
            f"{axis_name!r} by up to {float(spread):.3g}: average it with "
            f"cconv.sync_model_state(state, {axis_name!r}) or use BatchNorm(axis_name={axis_name!r})",
            ModelStateDivergenceWarning,
            stacklevel=2,
        )


# ----------------------------------------------------------------------------- flax.nnx


MOVED = (
    "cconv: this model/optimizer was moved into the state cconv.nnx_split returned, and training that state "
    "does not change it: use nnx.merge(graphdef, state) for the trained ones, or nnx.update((model, optimizer), "
    "state) to bring these up to date (or keep them live: cconv.nnx_shard lays them out in place)"
)


class Moved:
    """What a Variable of a model or optimizer holds after ``nnx_split`` moved its value out:
    any use (a layer reading its kernel, arithmetic, ``jnp.asarray``) raises ``MOVED``, so that
    evaluating the stale original cannot quietly measure the initial weights.  A pytree without
    children (jit passes it through, the layer's read inside raises).  ``nnx.update`` restores."""

    __slots__ = ()

    def _fail(self, *args, **kwargs):
        raise ValueError(MOVED)

    __getitem__ = __array__ = __jax_array__ = __iter__ = __len__ = __float__ = __int__ = __bool__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _fail
    __matmul__ = __rmatmul__ = __neg__ = __pow__ = __lt__ = __le__ = __gt__ = __ge__ = _fail

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise ValueError(MOVED)

    def __repr__(self) -> str:
        return "<moved by cconv.nnx_split>"


jax.tree_util.register_pytree_node(Moved, lambda m: ((), None), lambda aux, children: Moved())


class NNXSplit(NamedTuple):
    """``nnx_split``'s handles: ``nnx.merge(graphdef, state)`` gives ``(model, optimizer)``."""

    graphdef: Any
    state: Any  # nnx.State of (model, optimizer), placed on the mesh
    specs: Any  # the partition specs of ``state`` (give them to in_specs / out_specs)


class NNXSpecs(NamedTuple):
    """``nnx_shard``'s specs, for ``nnx.shard_map``'s ``in_specs`` (updates flow back through them)."""

    model: Any  # P(): the model is replicated
    optimizer: Any  # nnx.StateSharding: cconv's state P(axis_name), the rest P()


def _layout(model, optimizer, mesh, axis_name: str):
    """(graphdef, placed state, specs) of ``(model, optimizer)``: cconv's state one row per worker."""
    workers = mesh.shape[axis_name]
    per_worker = {  # the optax state's per-worker leaves, as NNX names them under "opt_state"
        _path_names(path)
        for path, spec in jax.tree_util.tree_leaves_with_path(
            state_specs(nnx.as_pure(optimizer.opt_state), axis_name), is_leaf=lambda x: isinstance(x, P)
        )
        if spec == P(axis_name)
    }
    graphdef, state = nnx.split((model, optimizer))

    def is_per_worker(path) -> bool:
        names = _path_names(path)
        names = names[:-1] if names[-1:] == ("value",) else names  # the Variable's array
        return "opt_state" in names and names[names.index("opt_state") + 1 :] in per_worker

    specs = jax.tree_util.tree_map_with_path(lambda path, _: P(axis_name) if is_per_worker(path) else P(), state)
    found = sum(is_per_worker(path) for path, _ in jax.tree_util.tree_leaves_with_path(state))
    if found != len(per_worker):  # never fall back to replicating cconv's state silently
        raise ValueError(
            f"nnx_split: found {found} of the {len(per_worker)} per-worker leaves of the optimizer's cconv state "
            f"in nnx.state((model, optimizer)); was the optimizer built as nnx.Optimizer(model, tx, wrt=...)?"
        )

    def place(path, x):
        if is_per_worker(path):
            if x.shape[:1] != (1,):
                raise ValueError(f"nnx_split: cconv's state was laid out already (leading axis {x.shape[0]}, not 1)")
            names = [n for n in _path_names(path) if n != "value"]
            x = x.astype(jnp.int32) if names[-1] == "count" else x  # now a worker's (CompressedState)
            x = jnp.repeat(x, workers, axis=0)  # a row per worker, the same initial state
            return jax.device_put(x, NamedSharding(mesh, P(axis_name)))
        return jax.device_put(x, NamedSharding(mesh, P()))

    return graphdef, jax.tree_util.tree_map_with_path(place, state), specs


def nnx_split(model, optimizer, mesh, axis_name: str = "data") -> NNXSplit:
    """``(graphdef, state, specs)`` for a Flax NNX ``model`` and its ``nnx.Optimizer`` built with
    a transformation that contains ``cconv.as_optax``, placed on ``mesh``: the optimizer's cconv
    state is copied once per worker (leading axis = the workers, spec ``P(axis_name)``), all else
    is replicated (``P()``).  Inside the map, ``nnx.merge(graphdef, state)`` gives
    ``(model, optimizer)``; return ``nnx.state((model, optimizer))`` with ``out_specs=specs``.

    The values move: ``model`` and ``optimizer`` are left holding ``Moved`` (any use raises),
    because training ``state`` never changes them and evaluating them would quietly measure the
    initial weights.  ``nnx.merge(graphdef, state)`` gives the trained pair;
    ``nnx.update((model, optimizer), state)`` brings the originals back to life.  To keep using
    ``model`` and ``optimizer`` themselves (``nnx.jit`` / ``nnx.shard_map``), use ``nnx_shard``."""
    graphdef, state, specs = _layout(model, optimizer, mesh, axis_name)
    for node in (model, optimizer):
        for _, v in nnx.graph.iter_graph(node):
            if isinstance(v, nnx.Variable):
                v.set_raw_value(Moved())
    return NNXSplit(graphdef, state, specs)


def nnx_shard(model, optimizer, mesh, axis_name: str = "data", replicate=()) -> NNXSpecs:
    """Lay ``model`` and its ``nnx.Optimizer`` (whose transformation contains ``cconv.as_optax``)
    out on ``mesh`` in place: cconv's state one row per worker (``P(axis_name)``), everything else
    replicated.  Returns the specs for ``nnx.shard_map(..., in_specs=(specs.model,
    specs.optimizer, ...))``; the model stays the one you train and evaluate (Flax's ``nnx.jit``
    style: no split, no stale copy).  ``replicate``: the step's other NNX objects
    (``nnx.MultiMetric``, ``nnx.Rngs``), placed replicated on ``mesh`` too; left on one device,
    the first step moves them and the second compiles the step again."""
    _, state, specs = _layout(model, optimizer, mesh, axis_name)
    nnx.update((model, optimizer), state)
    everywhere = NamedSharding(mesh, P())
    for node in replicate:
        nnx.update(node, jax.tree.map(lambda x: jax.device_put(x, everywhere), nnx.state(node)))
    pure = lambda tree: jax.tree.map(_array, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return NNXSpecs(P(), nnx.StateSharding(pure(specs[1])))


# ----------------------------------------------------------------------------- bytes


class Traffic(NamedTuple):
    """One worker's bytes in the last step of ``cconv.as_optax`` (``traffic(state)``).

    ``payload`` is what the worker puts into the step's collectives (its compressed gradient, at
    the payload's fixed size); ``sent``/``received`` are the bytes the collectives *move* for it,
    a multiple of the payload: (P - 1) x payload for an all-gather ring (7 x over 8 workers),
    2 (P - 1) / P x for an all-reduce ring (``cconv.comm.accounting``).  ``encoded_*`` count a
    variable-length payload at its encoded size; ``control`` is the small all-reduce of those
    sizes.  Under a parameter server the worker is one that is not the server."""

    payload: float
    sent: float
    received: float
    encoded_sent: float
    encoded_received: float
    control: float
    workers: int


def _row0(x) -> float:
    x = _array(x)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return float(np.asarray(jax.device_get(x)).reshape(-1)[0])


def traffic(state) -> Traffic:
    """The bytes of the last step, per worker, from an optax state (``opt_state``), an NNX
    state (``nnx.split``'s) or the NNX objects themselves (``optimizer``, ``(model, optimizer)``)."""
    nodes = _cconv_nodes(state)
    if len(nodes) != 1:
        raise ValueError(f"cconv.traffic: found {len(nodes)} cconv.as_optax states in the given state, expected one")
    tr = _field(nodes[0], "traffic")
    if "bytes_payload" not in tr:
        raise ValueError("cconv.traffic: this state has no bytes_payload (made by an older cconv): init it again")
    first = jax.tree.leaves(tr["bytes_sent"])[0]
    return Traffic(
        payload=_row0(tr["bytes_payload"]),
        sent=_row0(tr["bytes_sent"]),
        received=_row0(tr["bytes_received"]),
        encoded_sent=_row0(tr["bytes_encoded_sent"]),
        encoded_received=_row0(tr["bytes_encoded_received"]),
        control=_row0(tr["bytes_control"]),
        workers=int(np.shape(first)[0]),
    )


__all__ = [
    "state_specs",
    "init_state",
    "check_specs",
    "worker_key",
    "sync_model_state",
    "nnx_split",
    "nnx_shard",
    "traffic",
    "Traffic",
    "NNXSplit",
    "NNXSpecs",
    "ModelStateDivergenceWarning",
]
