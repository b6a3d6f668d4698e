"""Decentralized gossip training: D-PSGD and CHOCO-SGD, one worker's step as pure functions.

No server and no all-reduce: each worker keeps its own model x_i and, after its local optax
update (adapt-then-combine), mixes with its neighbours through the topology's mixing matrix W
(``cconv.comm.topology``; messages travel by ``comm.permute`` along full permutations).

**D-PSGD** (Lian et al. 2017, NeurIPS), ``gossip: dpsgd``::

    x_i^{t+1/2} = optax update of x_i^t with its own gradient
    x_i^{t+1}   = sum_j W_ij x_j^{t+1/2}

With the complete graph (W = 1/P) this is BSP on the models: for SGD and heavy-ball momentum
(linear in the gradient, identical starting points) the models stay equal and
sum_j x_j/P = x - lr * mean_j(g_j) -- the same update as averaging gradients, up to float
rounding (the averages are summed in another order).  With a compressor Q, ``dpsgd`` is the
naive compressed gossip of Koloskova et al. 2019 (their eq. 4, the baseline they show does not
converge: the compression error on the *models* never vanishes)::

    x_i^{t+1} = x_i^{t+1/2} + gamma sum_j W_ij (Q(x_j^{t+1/2}) - Q(x_i^{t+1/2}))

**CHOCO-SGD** (Koloskova, Stich & Jaggi 2019, ICML, Algorithm 2), ``gossip: choco`` with
``gossip_gamma`` = gamma in (0, 1] (None, the default: gamma = delta of the compressor on each
tensor, ``cconv.theory.gossip.safe_gamma``; an explicit value above it warns once): public
copies x_hat (initially 0) known to all neighbours;
only compressed *differences* travel::

    q_i       = Q(x_i^{t+1/2} - x_hat_i)                 (any cconv compressor; its payload is sent)
    x_hat_j  += q_j   for j = i and every neighbour j
    x_i^{t+1} = x_i^{t+1/2} + gamma sum_j W_ij (x_hat_j - x_hat_i)

Memory-efficient form (as in their appendix): a worker need not store its neighbours' copies, only
s_i = sum_j W_ij x_hat_j (updated by s_i += sum_j W_ij q_j), since
sum_j W_ij (x_hat_j - x_hat_i) = s_i - x_hat_i (rows of W sum to 1).  State per worker:
(x_hat_i, s_i, compressor state), checkpointed with the rest.  With the identity compressor and
gamma = 1, x_hat = x^{t+1/2} after every step and x^{t+1} = s = D-PSGD's update (up to float
rounding: s accumulates the differences instead of summing the models afresh).

Received payloads combine by the compressor's declared algebra (``Compressor.summable``):
payloads that decode one by one (``DECODE``) are decoded and mixed, sum_j W_ij Q(x_j), with keys
folded with the worker's rank (no shared randomness needed); summable payloads (``SUM``, e.g. a
linear sketch) are compressed with the SAME key on every worker, mixed in compressed form and
decoded once, Q(sum_j W_ij payload_j) -- as an all-reduce of them would.  Aggregations that are
their own reducer (PowerSGD) are refused (``cconv.comm.aggregation.check``).
``consensus_distance`` = mean_i ||x_i - x_bar||^2.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cconv import compressors as C
from cconv.comm import topology as topo
from cconv.comm.backend import DryComm
from cconv.compressors.base import Compressor
from cconv.engine.config import ENGINE_DEFAULTS, Phase
from cconv.engine.modes import GOSSIP  # the algorithms EngineConfig.gossip names
from cconv.engine.step import apply_update, local_grad, reduce_metrics
from cconv.engine.sync import SYNC_MODES, SyncMode
from cconv.theory.gossip import safe_gamma

# the engine fields gossip leaves at their defaults (ENGINE_DEFAULTS): it mixes models directly
AT_THEIR_DEFAULTS = (
    "memory",
    "local_steps",
    "post_local_switch",
    "architecture",
    "collective",
    "vote",
    "warmup",
    "ps_downlink",
    "compress_delta",
)


class ChocoState(NamedTuple):
    """One worker's CHOCO state: its public copy, s = sum_j W_ij x_hat_j, the compressor states."""

    hat: Any
    s: Any
    comp: Any


class GossipStep(NamedTuple):
    """Static description of a gossip exchange."""

    algorithm: str  # "dpsgd" | "choco"
    mixing: topo.Mixing
    compressor: Compressor | None  # None: models (dpsgd) / differences (choco) travel dense
    gamma: float | None = None  # None: safe_gamma(compressor, shape) per tensor


class GossipGammaWarning(UserWarning):
    """An explicit ``gossip_gamma`` above the compressor's safe value (printed as one line)."""

    one_line = True


def gammas(step: GossipStep, tree) -> Any:
    """The consensus step of each leaf of ``tree``: the explicit gamma, or the safe one of its shape."""
    if step.gamma is not None:
        return jax.tree.map(lambda x: step.gamma, tree)
    return jax.tree.map(lambda x: safe_gamma(step.compressor, x.shape), tree)


_WARNED: set = set()  # (compressor, gamma, safe) already warned about in this process


def check_gamma(engine_cfg, shapes) -> None:
    """The consensus step of a gossip config on tensors of ``shapes``: with the default (None), a
    one-line ValueError when some tensor has no safe value; an explicit gamma above the smallest
    safe value (or where none exists) warns once (``GossipGammaWarning``)."""
    step = step_of(engine_cfg)
    if step.compressor is None:
        return
    try:
        # once per distinct shape, in first-seen order (the first failing shape names the error)
        safe = min((safe_gamma(step.compressor, s) for s in dict.fromkeys(tuple(s) for s in shapes)), default=1.0)
    except ValueError as e:
        if step.gamma is None:
            raise ValueError(f"sync='gossip': {str(e).splitlines()[0]}; set gossip_gamma explicitly") from None
        safe, reason = None, f"{str(e).splitlines()[0]}: convergence is not guaranteed"
    else:
        if step.gamma is None or step.gamma <= safe:
            return
        reason = f"is above the safe value {safe:.3g} (delta of {step.compressor.name}) and can diverge"
    if (step.compressor.name, step.gamma, safe) in _WARNED:
        return
    _WARNED.add((step.compressor.name, step.gamma, safe))
    import warnings

    warnings.warn(f"gossip_gamma {step.gamma:g} {reason}", GossipGammaWarning, stacklevel=2)


@functools.lru_cache(maxsize=64)
def _mixing(topology: str, workers: int, torus, mixing) -> topo.Mixing:
    return topo.get(topology, workers, torus=torus, mixing=mixing)


def mixing_of(engine_cfg) -> topo.Mixing:
    """The validated ``Mixing`` of an ``EngineConfig`` (cached: the checks run once)."""
    return _mixing(engine_cfg.topology, int(engine_cfg.workers), engine_cfg.torus, engine_cfg.mixing)


def step_of(engine_cfg) -> GossipStep:
    """The ``GossipStep`` of an ``EngineConfig`` with ``sync="gossip"`` (the identity compressor
    sends dense models / differences without calling it)."""
    c = engine_cfg.compressor
    comp = None if c is None or C.registered_name(c) == C.IDENTITY else c
    return GossipStep(engine_cfg.gossip, mixing_of(engine_cfg), comp, engine_cfg.gossip_gamma)


def init(step: GossipStep, params) -> Any:
    """One worker's gossip state for ``params`` (no worker axis): () for D-PSGD without
    compressor state, the compressors' states for naive compressed D-PSGD, ``ChocoState`` for CHOCO."""
    comp = _comp_init(step.compressor, params)
    if step.algorithm == "dpsgd":
        return {"comp": comp}
    zeros = jax.tree.map(jnp.zeros_like, params)
    return ChocoState(zeros, zeros, comp)


def _comp_init(c: Compressor | None, params):
    if c is None:
        return ()
    return tuple(c.init(x) for x in jax.tree.leaves(params))


def _send(comm, step: GossipStep, tree, comp_state, key):
    """Compress ``tree`` leaf-wise (or not), send it to every neighbour: (own decoded tree,
    sum_j W_ij of the decoded trees (own included), new compressor state)."""
    c = step.compressor
    if c is None:
        return tree, topo.combine(comm, step.mixing, tree, topo.neighbours(comm, step.mixing, tree)), comp_state
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key if c.summable else jax.random.fold_in(key, comm.rank()), max(len(leaves), 1))
    payloads, states = [], []
    for x, st, k in zip(leaves, comp_state, keys):
        p, st = c.compress(x, st, k)
        payloads.append(p)
        states.append(st)
    decode = lambda ps: jax.tree.unflatten(  # noqa: E731
        treedef, [c.decompress(p, x).astype(x.dtype) for p, x in zip(ps, leaves)]
    )
    if c.summable:  # mix the payloads, decode once
        return decode(payloads), decode(_mix_payloads(comm, step.mixing, payloads)), tuple(states)
    own = decode(payloads)
    received = topo.neighbours(comm, step.mixing, payloads)
    return own, topo.combine(comm, step.mixing, own, [decode(r) for r in received]), tuple(states)


def _mix_payloads(comm, mixing: topo.Mixing, own):
    """sum_j W_ij payload_j of summable payloads: only the floating leaves travel and are mixed
    (in float32, back in their dtype); integer leaves (a shared key) are identical everywhere and
    stay home, as in an all-reduce."""
    leaves, treedef = jax.tree.flatten(own)
    is_f = [jnp.issubdtype(x.dtype, jnp.floating) for x in leaves]
    floats = [x for x, f in zip(leaves, is_f) if f]
    up = lambda xs: [x.astype(jnp.float32) for x in xs]  # noqa: E731
    mixed = iter(topo.combine(comm, mixing, up(floats), [up(r) for r in topo.neighbours(comm, mixing, floats)]))
    return jax.tree.unflatten(treedef, [next(mixed).astype(x.dtype) if f else x for x, f in zip(leaves, is_f)])


def gossip(comm, step: GossipStep, params, state, key) -> tuple[Any, Any]:
    """Mix this worker's (locally updated) ``params`` with its neighbours': (new params, new state)."""
    if step.algorithm == "dpsgd":
        own, mixed, comp = _send(comm, step, params, state["comp"], key)
        if step.compressor is None:
            return mixed, {"comp": comp}
        gamma = gammas(step, params)  # naive compressed gossip: x + gamma (sum_j W_ij Q(x_j) - Q(x_i))
        new = jax.tree.map(lambda x, m, o, g: (x + g * (m - o)).astype(x.dtype), params, mixed, own, gamma)
        return new, {"comp": comp}
    diff = jax.tree.map(jnp.subtract, params, state.hat)
    q, mixed, comp = _send(comm, step, diff, state.comp, key)
    hat = jax.tree.map(jnp.add, state.hat, q)
    s = jax.tree.map(jnp.add, state.s, mixed)
    gamma = gammas(step, params)
    new = jax.tree.map(lambda x, si, hi, g: (x + g * (si - hi)).astype(x.dtype), params, s, hat, gamma)
    return new, ChocoState(hat, s, comp)


def consensus_distance(comm, params) -> tuple[jax.Array, Any]:
    """(||x_i - x_bar||^2 of this worker, x_bar): the mean over workers of the first is the
    ``consensus_distance`` metric.  x_bar travels in one control all-reduce."""
    mean = comm.allmean(params, control=True)
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(mean))
    sq = sum(jnp.sum(jnp.square((x - m).astype(jnp.float32))) for x, m in pairs)
    return jnp.asarray(sq, jnp.float32), mean


def density(step: GossipStep, params) -> float:
    """Fraction of the model's coordinates a message carries."""
    sizes = [x.size for x in jax.tree.leaves(params)]
    if step.compressor is None:
        return 1.0
    kept = sum(step.compressor.density(x.shape) * x.size for x in jax.tree.leaves(params))
    return float(kept / max(sum(sizes), 1))


class Gossip(SyncMode):
    """``sync="gossip"``: D-PSGD or CHOCO-SGD (module docstring) as a synchronization mode.

    One phase ("gossip"); the gossip state (x_hat, s and the compressor states for CHOCO; the
    compressor states for naive compressed D-PSGD) lives in ``WorkerState.sync`` (checkpointed);
    the evaluated model is the workers' average x_bar.  A step waits for its neighbours only;
    the simulated clock treats it as waiting for all (lockstep), a bound for synchronous gossip
    under stragglers."""

    name = "gossip"

    def check(self, engine_cfg) -> None:
        if engine_cfg.workers < 2:
            raise ValueError(f"sync='gossip' needs at least 2 workers, got workers={engine_cfg.workers}")
        values = {k: getattr(engine_cfg, k) for k in AT_THEIR_DEFAULTS}
        bad = [f"{k}={v!r}" for k, v in values.items() if v != ENGINE_DEFAULTS[k]]
        if bad:
            raise ValueError(f"sync='gossip' does not combine with {', '.join(bad)} (gossip mixes models directly)")
        mixing_of(engine_cfg)  # validates topology, torus and mixing
        if engine_cfg.gossip_gamma is None:  # a default without a safe value; the model's shapes: init, runner
            check_gamma(engine_cfg, [(1000,)])

    def init(self, engine_cfg, params):
        check_gamma(engine_cfg, [x.shape for x in jax.tree.leaves(params)])
        return init(step_of(engine_cfg), params)

    def phase(self, engine_cfg, step: int) -> Phase:
        return Phase(None, "gossip")

    def compresses(self, engine_cfg, phase) -> bool:
        return False  # the phase's Exchange is unused; the gossip step compresses itself

    def average_view(self, engine_cfg) -> bool:
        return True

    def exchange_work(self, engine_cfg, plan, grads):
        """The gossip step's own exchange: compress the model (D-PSGD) or x - x_hat (CHOCO) once,
        decode one message per neighbour (a shape-only ``DryComm`` stands in for the permutes);
        ``grads`` stands in for the model (same shapes)."""
        del plan
        comm, step = DryComm(engine_cfg.workers), step_of(engine_cfg)
        return jax.jit(lambda x, s, k: gossip(comm, step, x, s, k)), (grads, init(step, grads))

    def dry(self, comm, ex, ws, phase) -> None:
        params, _ = gossip(comm, step_of(ex.config), ws.params, ws.sync, jax.random.PRNGKey(0))
        consensus_distance(comm, params)  # x_bar's control all-reduce (for the metric)

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        """Own gradient -> local clip -> optax update -> gossip with the neighbours (adapt then
        combine); metrics as BSP's plus ``consensus_distance`` (mean_i ||x_i - x_bar||^2 after
        the step).  The model state (e.g. BatchNorm statistics) stays local."""
        ex = ctx.exchanges[phase]
        gstep = step_of(ex.config)
        k_loss, k_comm = jax.random.split(key)
        loss, model_state, aux, grads = local_grad(comm, ctx, s.params, s.model_state, batch, k_loss)
        params, opt_state = apply_update(ctx, grads, s.opt_state, s.params)
        params, gstate = gossip(comm, gstep, params, s.sync, k_comm)
        dist, _ = consensus_distance(comm, params)
        values = {"loss": loss, **aux, "consensus_distance": dist}
        metrics = reduce_metrics(comm, ctx, ex, grads, values, {"density": jnp.float32(density(gstep, params))})
        return s._replace(params=params, model_state=model_state, opt_state=opt_state, sync=gstate), metrics


SYNC_MODES[Gossip.name] = Gossip()  # registered here (this module imports the protocol)


__all__ = [
    "Gossip",
    "mixing_of",
    "step_of",
    "density",
    "GOSSIP",
    "ChocoState",
    "GossipStep",
    "GossipGammaWarning",
    "gammas",
    "check_gamma",
    "init",
    "gossip",
    "consensus_distance",
]
