"""The drop-in API: compressed gradient averaging inside *your* ``jax.shard_map`` / ``jax.pmap`` /
``jax.vmap(axis_name=...)`` (every worker on one device; partial permutations are detected and
completed there, ``cconv.comm.backend.MeshComm``).

``Exchange`` is the engine's gradient exchange as one object (the engine's step calls it too:
one implementation).  Called on a worker's own gradient inside the map, it compresses (with
memory), communicates over the named axis, decompresses and averages::

    ex = Exchange(compressors.topk(ratio=0.01), memory="ef", axis_name="data")
    state = ex.init(grads)                         # inside the map; leaves (1, ...): P("data")
    avg, state, traffic = ex(grads, state, key)    # key: the same on every worker

``traffic`` holds the bytes the engine logs for the same configuration (``traffic_metrics``):
``bytes_sent``/``bytes_received`` moved by this call's collectives, ``bytes_encoded_*`` (the
variable-length payloads at their encoded sizes) and ``bytes_control`` (control collectives;
the engine's also carries its metrics' all-reduce).

``as_optax(compressor, memory=..., axis_name=..., seed=...)`` wraps it as an
``optax.GradientTransformation`` (key and step counter in its state), e.g.
``optax.chain(as_optax(topk(ratio=0.01), memory="ef", axis_name="data"), optax.adamw(1e-3))``.

Compression needs each worker's *own* gradient.  Under ``jax.shard_map``'s default
``check_vma=True``, ``jax.grad`` of replicated parameters is already summed over the axis;
``Exchange`` detects such gradients (their type does not vary along the axis) and raises.

What DDP users expect around it (the optimizer state laid out per worker and its partition specs,
per-worker PRNG keys, BatchNorm statistics kept in sync) is in ``cconv.engine.ddp``; recipes for
optax, Flax Linen and Flax NNX are in ``examples/`` and ``docs/dropin.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from cconv import memory as M
from cconv._text import shown_names
from cconv.comm.accounting import Collective, encoded_traffic, total_traffic, traffic
from cconv.comm.aggregation import TRANSPORTS
from cconv.comm.backend import Comm, MeshComm
from cconv.compressors import registry
from cconv.compressors.base import Compressor
from cconv.engine.config import EngineConfig
from cconv.engine.exchange import Plan, exchange, init_state, make_plan

TRAFFIC_KEYS = ("bytes_sent", "bytes_received", "bytes_control", "bytes_encoded_sent", "bytes_encoded_received")
SERVER_KEYS = tuple(f"server_{k}" for k in TRAFFIC_KEYS if k != "bytes_control")  # under a parameter server


def encoded_sizes(comm: Comm) -> tuple[tuple[str, ...], jax.Array]:
    """The kinds of the variable-length collectives noted in this trace, and this worker's
    encoded bytes per kind placed in its row of a (P, kinds) table, flattened (summed over
    workers, every worker learns the whole table); empty when every payload is fixed-size."""
    kinds = tuple(dict.fromkeys(k for k, _, _ in comm.encoded))
    own = jnp.stack([sum(e for k, _, e in comm.encoded if k == kind) for kind in kinds]) if kinds else jnp.zeros(0)
    rows = jnp.arange(comm.size) == comm.rank()
    return kinds, (rows[:, None] * own[None, :].astype(jnp.float32)).reshape(-1)


def traffic_metrics(comm: Comm, rank: int, kinds: Sequence[str] = (), table=None) -> dict:
    """This trace's bytes as metrics, for worker ``rank``: moved (from the trace's ledger) and
    encoded (the moved bytes of variable-length calls replaced by their encoded sizes, ``table``:
    workers x ``kinds``; ``cconv.comm.accounting.encoded_traffic``)."""
    sent, recv = total_traffic(comm.ledger, comm.size, control=False)
    ctl, _ = total_traffic(comm.ledger, comm.size, control=True)
    out = {"bytes_sent": sent[rank], "bytes_received": recv[rank], "bytes_control": ctl[rank]}
    ranks = {"": rank, "server_": 0} if any(c.kind.startswith("ps_") for c in comm.ledger) else {"": rank}
    for prefix, r in ranks.items():
        out.update({f"{prefix}bytes_sent": sent[r], f"{prefix}bytes_received": recv[r]})
        enc_s, enc_r = jnp.float32(sent[r]), jnp.float32(recv[r])
        for j, kind in enumerate(kinds):
            moved = sum(m for k, m, _ in comm.encoded if k == kind)
            ms, mr = traffic(Collective(kind, moved), comm.size)
            es, er = encoded_traffic(kind, table[:, j], r)
            enc_s, enc_r = enc_s - ms[r] + es, enc_r - mr[r] + er
        out.update({f"{prefix}bytes_encoded_sent": enc_s, f"{prefix}bytes_encoded_received": enc_r})
    return {k: jnp.float32(v) for k, v in out.items()}


def _vma(x) -> frozenset:
    """The mesh axes ``x`` varies along (empty outside shard_map's check_vma)."""
    t = jax.typeof(x)
    mat = getattr(t, "mat", None)  # jax 0.10: ManualAxisType(varying, ...); older: .vma
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(t, "vma", ()))


def _axis_size(axis: str) -> int:
    try:
        return int(lax.axis_size(axis))
    except NameError:
        raise ValueError(
            f"Exchange: axis {axis!r} is not bound: call it inside jax.shard_map, jax.pmap or jax.vmap over that axis"
        ) from None


class Exchange:
    """Average a pytree over the workers of a named axis through compressed payloads.

    One worker's view: ``avg = 1/P sum_w D(C(g_w + e_w))`` (with the memory's hooks, e.g. error
    feedback ``e_w <- g_w + e_w - D(C(g_w + e_w))``, Seide et al. 2014; Karimireddy et al. 2019),
    where C/D are the compressor's compress/decompress and the aggregation follows the
    compressor's registry entry (all-reduce of summable payloads, all-gather, vote, gTop-k,
    PowerSGD) over all-to-all collectives or a parameter server.

    compressor         a ``Compressor`` or a registered name (None: no compression)
    memory             "none" | "ef" | "dgc" | "ef21" | "ef21_sgdm" (``cconv.memory.MEMORIES``);
                       ``momentum`` (DGC's, or EF21-SGDM's beta), ``masking``
    axis_name          the worker axis of the surrounding shard_map / pmap / vmap
    workers            P; None: the bound axis size (checked against it when given)
    collective, vote, granularity, min_compress_size, compress_vectors, architecture,
    ps_downlink        as ``EngineConfig`` (same validation: one is built, ``self.config``)
    platform           where bf16 sums travel as fp32 ("cpu"); None: ``jax.default_backend()``
    """

    def __init__(
        self,
        compressor: Compressor | str | None = None,
        memory: str = M.NONE,
        axis_name: str = "data",
        workers: int | None = None,
        *,
        collective: str = "auto",
        vote: bool = False,
        granularity: str = "layerwise",
        min_compress_size: int = 0,
        compress_vectors: bool = EngineConfig.compress_vectors,
        architecture: str = "all-to-all",
        ps_downlink: Compressor | str | None = None,
        momentum: float = 0.9,
        masking: bool = True,
        platform: str | None = None,
        **unknown,
    ):
        if unknown:
            raise ValueError(_unknown_options("Exchange", compressor, unknown))
        cfg = EngineConfig(
            workers=1 if workers is None else workers,
            compressor=compressor,
            memory=memory,
            momentum=momentum,
            masking=masking,
            granularity=granularity,
            min_compress_size=min_compress_size,
            compress_vectors=compress_vectors,
            architecture=architecture,
            collective=collective,
            vote=vote,
            ps_downlink=ps_downlink,
            axis_name=axis_name,
        )
        if platform is not None and not isinstance(platform, str):
            raise ValueError(f"Exchange: platform must be a string or None, got {platform!r}")
        self._setup(cfg, cfg.compressor, cfg.memory, workers, platform)

    @classmethod
    def from_config(cls, cfg: EngineConfig, compressor: Compressor | None, memory: str) -> Exchange:
        """The exchange of one engine phase: ``compressor`` (None: everything dense) + ``memory``."""
        ex = cls.__new__(cls)
        ex._setup(cfg, compressor, memory, cfg.workers, None)
        return ex

    def _setup(self, cfg, compressor, memory, workers, platform):
        self.config, self.compressor, self.memory = cfg, compressor, memory
        self.workers, self.platform = workers, platform
        self._plans: dict[tuple, Plan] = {}

    def __repr__(self) -> str:
        name = None if self.compressor is None else self.compressor.name
        return f"Exchange({name!r}, memory={self.memory!r}, axis_name={self.config.axis_name!r})"

    # ------------------------------------------------------------------ plan and state
    def plan(self, shapes: Sequence[Sequence[int]]) -> Plan:
        """The static plan for tensors of ``shapes`` (the tree's leaves, in order); cached."""
        shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        if shapes not in self._plans:
            self._plans[shapes] = make_plan(self.config, self.compressor, shapes, memory=self.memory)
        return self._plans[shapes]

    def plan_of(self, tree) -> Plan:
        return self.plan([x.shape for x in jax.tree.leaves(tree)])

    def init_worker(self, tree) -> dict:
        """One worker's state for trees like ``tree`` (no worker axis; the engine's layout)."""
        return init_state(self.plan_of(tree), jax.tree.leaves(tree))

    def init(self, tree) -> dict:
        """One worker's state, every leaf with a leading axis of size 1 (call inside the map;
        ``out_specs=P(axis_name)`` stacks the workers' states)."""
        return jax.tree.map(lambda x: x[None], self.init_worker(tree))

    # ------------------------------------------------------------------ exchange
    def exchange(self, comm: Comm, tree, state: dict, key) -> tuple[Any, dict]:
        """(average of ``tree`` over ``comm``'s workers, new worker state); the engine's entry
        point (its comm, its un-stacked state; the collectives are recorded in ``comm.ledger``)."""
        return exchange(comm, self.plan_of(tree), tree, state, key)

    def average(self, comm: Comm, tree):
        """Dense average of ``tree`` by this exchange's transport (e.g. BatchNorm statistics)."""
        return TRANSPORTS[self.config.architecture].mean(comm, tree)

    def report_rank(self, workers: int) -> int:
        """Whose bytes ``traffic`` reports (a non-server worker under a parameter server)."""
        return TRANSPORTS[self.config.architecture].report_rank(workers)

    def __call__(self, grads, state: dict, key) -> tuple[Any, dict, dict]:
        """(average of ``grads`` over the workers, new state, traffic) -- inside the map.

        ``grads`` are this worker's own; ``key`` must be the same on every worker (shared-key
        compressors rely on it).  One extra control all-reduce carries the encoded sizes when a
        payload is variable-length; fixed-size payloads add no collective."""
        avg, new, tr, _ = self._call(grads, state, key)
        return avg, new, tr

    def _call(self, grads, state: dict, key):
        """``__call__``'s work, and the payload bytes the reported worker put into the collectives."""
        axis = self.config.axis_name
        size = _axis_size(axis)
        if self.workers is not None and self.workers != size:
            raise ValueError(f"Exchange: workers={self.workers} but axis {axis!r} has size {size}")
        _check_per_worker(grads, axis)
        _check_compiled(grads)
        comm = MeshComm(axis, size, self.platform or jax.default_backend())
        avg, new = self.exchange(comm, grads, jax.tree.map(lambda x: x[0], state), key)
        kinds, own = encoded_sizes(comm)
        table = comm.allreduce(own, control=True).reshape(size, len(kinds)) if kinds else None
        rank = self.report_rank(size)
        tr = traffic_metrics(comm, rank, kinds, table)
        return avg, jax.tree.map(lambda x: x[None], new), tr, payload_bytes(comm.ledger, rank)


def payload_bytes(ledger, rank: int) -> jax.Array:
    """The bytes worker ``rank`` contributes to a step's training collectives: the sum of each call's
    per-worker payload (``Collective.bytes`` x ``count``; a broadcast or parameter-server pull is the
    server's, rank 0's).  The collectives move a multiple of it: (P - 1) x for an all-gather ring,
    2 (P - 1) / P x for an all-reduce ring (``cconv.comm.accounting``)."""
    own = lambda c: rank == 0 or c.kind not in ("ps_pull", "broadcast")
    return jnp.float32(sum(float(c.bytes) * c.count for c in ledger if not c.control and own(c)))


OPTIONS = tuple(
    p for p in inspect.signature(Exchange.__init__).parameters if p not in ("self", "compressor", "unknown")
)


def _unknown_options(owner: str, compressor, unknown: dict) -> str:
    """One line naming the valid options, and the compressor's hyper-parameters when the unknown
    ones are those (``as_optax(name, <a knob>=...)``: the knob belongs to the compressor)."""
    names = shown_names(sorted(unknown))
    msg = f"{owner}: unknown option(s) {names}; valid: {', '.join(OPTIONS)}"
    try:  # a name, or the entry the compressor carries (never found from its name)
        e = registry.entry(compressor) if isinstance(compressor, str) else registry.entry_of(compressor)
        base, schema = e.name, e.schema.names
    except ValueError:
        base, schema = None, []
    hp = {k: v for k, v in unknown.items() if k in schema}
    if hp:
        args = ", ".join(f"{k}={v!r}" for k, v in hp.items())
        msg += (
            f". {', '.join(hp)} belong(s) to the compressor: pass cconv.compressors.get({base!r}, {args}) "
            f"({base}'s hyper-parameters: {', '.join(schema)})"
        )
    return msg


def _check_per_worker(grads, axis: str) -> None:
    """Under check_vma, floating gradients that do not vary along ``axis`` were summed by
    ``jax.grad`` already (replicated parameters): compressing them would be wrong."""
    if axis not in _vma(lax.axis_index(axis)):  # check_vma off, or pmap: types carry no axes
        return
    summed = [x for x in jax.tree.leaves(grads) if jnp.issubdtype(x.dtype, jnp.floating) and axis not in _vma(x)]
    if summed:
        raise ValueError(
            f"Exchange: gradients are replicated over {axis!r} (jax.grad already summed them): "
            f'differentiate w.r.t. lax.pcast(params, {axis!r}, to="varying") or use shard_map(check_vma=False)'
        )


EAGER_SHARD_MAP = (
    "cconv: the exchange runs in a shard_map outside jax.jit / nnx.jit: each of its operations would be "
    "a separate program with its own collectives across the devices, and XLA:CPU aborts the process when "
    "dozens are in flight; jit the step (jax.jit(jax.shard_map(...)), or nnx.jit around nnx.shard_map)"
)


def _check_compiled(grads) -> None:
    """Refuse an eager ``jax.shard_map`` (its values are shard_map tracers, not a jit trace's):
    op-by-op dispatch launches one collective program per operation on every device."""
    if any(type(x).__name__ == "ShardMapTracer" for x in jax.tree.leaves(grads)):
        raise ValueError(EAGER_SHARD_MAP)


# ----------------------------------------------------------------------------- optax


class CompressedState(NamedTuple):
    """``as_optax``'s state; every leaf has a leading worker axis of size 1 (shards as P(axis)).

    ``count`` is int32 when the state belongs to a worker: made inside the map
    (``jax.shard_map(tx.init, ...)``, ``cconv.init_state``) or laid out per worker by
    ``cconv.nnx_split`` / ``cconv.nnx_shard``.  ``tx.init`` outside any map (``nnx.Optimizer``
    does that) makes one row with a uint32 ``count``: a state that is nobody's yet, which
    ``update`` and ``cconv.check_specs`` refuse (replicated, every worker would train worker 0's
    residuals and the checkpoint would keep only those)."""

    exchange: dict  # the Exchange state (memory residuals, ...)
    key: jax.Array  # (1, 2) uint32: PRNG key data, the same on every worker
    count: jax.Array  # (1,) int32: steps taken (folded into the key); uint32: not laid out yet
    traffic: dict  # the last update's bytes (``Exchange`` traffic + bytes_payload), each (1,) float32


UNPLACED = jnp.uint32  # the dtype of ``CompressedState.count`` before the state is a worker's


def _axis_bound(axis: str) -> bool:
    try:
        lax.axis_index(axis)
    except NameError:
        return False
    return True


def not_laid_out(axis_name: str) -> str:
    """The one-line error for a state made outside the map that reached the workers as it was."""
    return (
        f"cconv: as_optax's state was created outside the map (tx.init, nnx.Optimizer) and was not laid out "
        f"per worker: use cconv.nnx_shard / cconv.nnx_split (NNX) or cconv.init_state (optax), whose specs "
        f"put it at P({axis_name!r})"
    )


def as_optax(
    compressor: Compressor | str | None,
    memory: str = M.NONE,
    axis_name: str = "data",
    seed: int = 0,
    **options,
) -> optax.GradientTransformation:
    """An ``optax.GradientTransformation`` whose update is the workers' compressed average
    (``Exchange(compressor, memory, axis_name, **options)``), for use inside a shard_map / pmap /
    vmap over ``axis_name``; chain an optimizer after it.  Step t uses key fold_in(PRNGKey(seed), t)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"as_optax: seed must be an integer, got {seed!r}")
    unknown = {k: v for k, v in options.items() if k not in OPTIONS}
    if unknown:
        raise ValueError(_unknown_options("as_optax", compressor, unknown).replace("valid: ", "valid: seed, ", 1))
    ex = Exchange(compressor, memory=memory, axis_name=axis_name, **options)
    keys = TRAFFIC_KEYS + (SERVER_KEYS if ex.config.architecture != "all-to-all" else ()) + ("bytes_payload",)

    def init_fn(params):
        return CompressedState(
            ex.init(params),
            jax.random.key_data(jax.random.PRNGKey(seed))[None],
            jnp.zeros((1,), jnp.int32 if _axis_bound(axis_name) else UNPLACED),
            {k: jnp.zeros((1,), jnp.float32) for k in keys},
        )

    def update_fn(updates, state, params=None):
        del params
        if state.count.shape != (1,):  # the whole (P, ...) state reached every worker
            raise ValueError(
                f"as_optax: its state has {state.count.shape[0]} rows inside the map, one per worker expected: "
                f"its partition spec must be P({axis_name!r}) (cconv.state_specs / cconv.init_state)"
            )
        if state.count.dtype == UNPLACED:  # made outside the map, then replicated: worker 0's for all
            raise ValueError(not_laid_out(axis_name))
        key = jax.random.fold_in(state.key[0], state.count[0])
        avg, new, tr, payload = ex._call(updates, state.exchange, key)
        tr = {**tr, "bytes_payload": payload}
        return avg, CompressedState(new, state.key, state.count + 1, {k: tr[k][None] for k in keys})

    return optax.GradientTransformation(init_fn, update_fn)


__all__ = [
    "Exchange",
    "as_optax",
    "CompressedState",
    "traffic_metrics",
    "encoded_sizes",
    "payload_bytes",
    "TRAFFIC_KEYS",
]
