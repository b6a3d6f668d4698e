"""1-bit Adam (Tang, Gan, Awan, Rajbhandari, Li, Lian, Liu, Zhang & He, ICML 2021, "1-bit Adam:
Communication Efficient Large-Scale Training with Adam's Convergence Speed") as an
``optax.GradientTransformation`` that does its own communication, for use inside a shard_map /
pmap / vmap over ``axis_name`` (the drop-in API's setting, ``cconv.engine.dropin``).

Warm-up (steps t < ``warmup_steps``): vanilla Adam on the dense average of the workers' gradients
g = 1/P sum_i g_i (one all-reduce, ``Exchange`` without compression):

    m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,
    update = -lr (m / (1 - b1^(t+1))) / (sqrt(v / (1 - b2^(t+1))) + eps)

Compression stage (t >= ``warmup_steps``): v is frozen (its bias correction too, at
1 - b2^warmup_steps); each worker forms its local momentum from the shared m and its own
gradient, and the momenta are averaged through a 1-bit compressor with error feedback (the
paper's compressed momentum; default ``scaled_sign``, i.e. ||.||_1 / d * sign, on every tensor,
``memory="ef"``: e_i <- m_i + e_i - C(m_i + e_i)):

    m_i = b1 m + (1 - b1) g_i,   m <- 1/P sum_i C(m_i + e_i),
    update = -lr m / (sqrt(v_hat) + eps)            (no momentum bias correction: t is large)

In a run config (``optimizer: {name: onebit_adam, warmup_steps, b1, b2, eps, compressor}``,
``cconv run`` / ``sweep`` / ``advise``) the same rules run inside the engine's step instead
(``onebit_adam_engine``, a ``cconv.engine.optimizers.MessageTransformation``): each worker sends
``message`` = g_i during the warm-up and m_i = b1 m + (1 - b1) g_i after it, through the engine's
own exchange, which the optimizer configures (``engine``: its compressor with ``memory="ef"``, and
``Warmup(dense_steps=warmup_steps)``, so the warm-up steps travel dense); ``update`` receives the
average and applies the rules above.  The logged bytes are that exchange's: the dense all-reduce
of the gradient during the warm-up, the 1-bit payloads of the momentum after it.

``exp_avg_mask`` (DeepSpeed's option of the same name): a pytree like the parameters, 1 where a
coordinate learns and 0 where it must not (e.g. embedding rows a shorter sequence never reaches),
multiplied into m after each compressed average, m <- M * m: a 1-bit message cannot say 0, so a
coordinate whose momentum should stay exactly 0 would otherwise move by +-lr scale / (sqrt(v) + eps)
every step (with v = 0 there: lr scale / eps).  The warm-up is not masked (as DeepSpeed).

The switch is a ``lax.cond`` on the step counter (one branch's collectives run; under
``jax.vmap`` both are evaluated and the reported traffic is the taken branch's).  The paper's
server-side compression of the averaged momentum (its second error-feedback stage) is what
``architecture="parameter-server", ps_downlink=...`` gives the compressed ``Exchange``; by default
the average travels as all-to-all collectives of the 1-bit payloads.

State (every leaf with a leading worker axis of size 1, like ``as_optax``'s): the step count, m
and v (identical on every worker), both exchanges' states (the compressed one holds e_i), the key
and the last step's traffic (``Exchange`` byte metrics).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from cconv import compressors as C
from cconv.compressors.base import Compressor
from cconv.compressors.scaled_sign import scaled_sign as one_bit  # the paper's 1 bit + scale per tensor
from cconv.engine.config import Warmup
from cconv.engine.dropin import SERVER_KEYS, TRAFFIC_KEYS, Exchange
from cconv.engine.optimizers import MessageTransformation, register


class OneBitAdamState(NamedTuple):
    count: jax.Array  # (1,) int32
    mu: Any  # m, params-like, each leaf (1, ...)
    nu: Any  # v
    dense: dict  # the warm-up exchange's state
    compressed: dict  # the compressed exchange's state (error-feedback residuals)
    key: jax.Array  # (1, 2) uint32
    traffic: dict  # the last update's bytes, each (1,) float32


EVERY_TENSOR = True  # compress_vectors: the momentum of every tensor travels as 1 bit, biases included
# (DeepSpeed's OnebitAdam and ZeroOneAdam compress the whole flattened momentum buffer), unlike the
# engine's default for gradient compressors, which leaves 1-D tensors dense


def _check(b1, b2, eps, warmup_steps, seed) -> None:
    """One-line ValueErrors for bad hyper-parameters."""
    for name, v in (("b1", b1), ("b2", b2)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"onebit_adam: {name} must be in [0, 1), got {v!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"onebit_adam: eps must be a number >= 0, got {eps!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise ValueError(f"onebit_adam: warmup_steps must be an integer >= 1, got {warmup_steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"onebit_adam: seed must be an integer, got {seed!r}")


def check_mask(mask: Any, params: Any) -> None:
    """One-line ValueError unless ``mask`` (``exp_avg_mask``) is None or a pytree of the parameters'
    structure whose leaves have their shapes."""
    if mask is None:
        return
    if jax.tree.structure(mask) != jax.tree.structure(params):
        raise ValueError("onebit_adam: exp_avg_mask must be a pytree of the parameters' structure (0/1 per coordinate)")
    for m, p in zip(jax.tree.leaves(mask), jax.tree.leaves(params)):
        if jnp.shape(m) != jnp.shape(p):
            raise ValueError(
                f"onebit_adam: exp_avg_mask leaf of shape {jnp.shape(m)} for a parameter of shape {p.shape}"
            )


def masked(mu: Any, mask: Any) -> Any:
    """m <- M * m (``exp_avg_mask``; None: m)."""
    return mu if mask is None else jax.tree.map(lambda m, k: (m * jnp.asarray(k, m.dtype)).astype(m.dtype), mu, mask)


def _stages(dense: Exchange, comp: Exchange, b1: float, b2: float, keys: tuple, mask: Any = None):
    """(warm, compressed): the two branches of a step, (grads, state, key) -> (m, v, dense
    state, compressed state, traffic)."""

    def traffic(tr):
        return {k: jnp.asarray(tr.get(k, 0.0), jnp.float32)[None] for k in keys}

    def warm(grads, state, key):
        avg, new, tr = dense(grads, state.dense, key)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g[None], state.mu, avg)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g[None]), state.nu, avg)
        return mu, nu, new, state.compressed, traffic(tr)

    def compressed(grads, state, key):
        local = jax.tree.map(lambda m, g: b1 * m[0] + (1 - b1) * g, state.mu, grads)
        avg, new, tr = comp(local, state.compressed, key)
        return jax.tree.map(lambda a: a[None], masked(avg, mask)), state.nu, state.dense, new, traffic(tr)

    return warm, compressed


def adam_updates(mu, nu, like, t, step, b1: float, b2: float, eps: float, warmup_steps: int):
    """-lr m_hat / (sqrt(v_hat) + eps) in the dtypes of ``like``: m_hat = m / (1 - b1^(t+1))
    during the warm-up, m after it; v_hat = v / (1 - b2^min(t+1, warmup_steps)) (frozen with v)."""
    c1 = jnp.where(t < warmup_steps, 1 - b1 ** (t + 1).astype(jnp.float32), 1.0)
    c2 = 1 - b2 ** jnp.minimum(t + 1, warmup_steps).astype(jnp.float32)
    return jax.tree.map(lambda m, v, g: (-step * (m / c1) / (jnp.sqrt(v / c2) + eps)).astype(g.dtype), mu, nu, like)


def onebit_adam(
    learning_rate: float | optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    warmup_steps: int = 100,
    compressor: Compressor | str | None = None,
    axis_name: str = "data",
    seed: int = 0,
    exp_avg_mask: Any = None,
    **options,
) -> optax.GradientTransformation:
    """1-bit Adam (module docstring); ``options`` go to the compressed ``Exchange``
    (``architecture``, ``ps_downlink``, ``granularity``, ...; ``compress_vectors`` defaults to
    True here, ``EVERY_TENSOR``: DeepSpeed compresses biases too); ``compressor`` defaults to the
    paper's sign with one scale per tensor; ``exp_avg_mask``: DeepSpeed's momentum mask (module
    docstring).  Bad values: one-line ValueError."""
    _check(b1, b2, eps, warmup_steps, seed)
    options = {"compress_vectors": EVERY_TENSOR, **options}
    dense = Exchange(None, axis_name=axis_name, **{k: v for k, v in options.items() if k == "architecture"})
    comp = Exchange(compressor if compressor is not None else one_bit(), memory="ef", axis_name=axis_name, **options)
    keys = TRAFFIC_KEYS + (SERVER_KEYS if comp.config.architecture != "all-to-all" else ())
    lr = learning_rate if callable(learning_rate) else (lambda count: learning_rate)

    def init_fn(params):
        check_mask(exp_avg_mask, params)
        zeros = jax.tree.map(lambda p: jnp.zeros((1, *p.shape), p.dtype), params)
        return OneBitAdamState(
            jnp.zeros((1,), jnp.int32),
            zeros,
            zeros,
            dense.init(params),
            comp.init(params),
            jax.random.key_data(jax.random.PRNGKey(seed))[None],
            {k: jnp.zeros((1,), jnp.float32) for k in keys},
        )

    warm, compressed = _stages(dense, comp, b1, b2, keys, exp_avg_mask)

    def update_fn(updates, state, params=None):
        del params
        if state.count.shape != (1,):
            raise ValueError(
                f"onebit_adam: its state has {state.count.shape[0]} rows inside the map, one per worker expected: "
                f"its partition spec must be P({axis_name!r})"
            )
        t = state.count[0]
        key = jax.random.fold_in(state.key[0], t)
        mu, nu, dstate, cstate, traffic = lax.cond(t < warmup_steps, warm, compressed, updates, state, key)
        first = lambda tree: jax.tree.map(lambda x: x[0], tree)
        out = adam_updates(first(mu), first(nu), updates, t, lr(t), b1, b2, eps, warmup_steps)
        return out, OneBitAdamState(state.count + 1, mu, nu, dstate, cstate, state.key, traffic)

    return optax.GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------- in the engine


class OneBitAdamEngineState(NamedTuple):
    """``onebit_adam_engine``'s state (one worker's; the engine lays it out per worker)."""

    count: jax.Array  # () int32: steps taken
    mu: Any  # m (the workers' average: identical on every worker)
    nu: Any  # v (frozen after the warm-up)


def compressor_of(spec: Compressor | str | dict | None) -> Compressor:
    """The momentum's compressor: a ``Compressor``, a registered name or a ``{name, **knobs}``
    mapping (a run config's); None: the paper's sign with one scale per tensor."""
    if spec is None:
        return one_bit()
    if isinstance(spec, Compressor):
        return spec
    if isinstance(spec, str):
        return C.get(spec)
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        return C.get(spec["name"], **{k: v for k, v in spec.items() if k != "name"})
    raise ValueError(f"onebit_adam: compressor must be a name or {{name, **knobs}}, got {spec!r}")


def onebit_adam_engine(
    learning_rate: float | optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    warmup_steps: int = 100,
    compressor: Compressor | str | dict | None = None,
    exp_avg_mask: Any = None,
) -> MessageTransformation:
    """1-bit Adam for the engine's step (module docstring): the worker's message is g_i for t <
    ``warmup_steps`` and b1 m + (1 - b1) g_i after; ``update`` receives their average a:

        t < warmup_steps:  m <- b1 m + (1 - b1) a,  v <- b2 v + (1 - b2) a^2  (Adam on the average)
        t >= warmup_steps: m <- a (M * a with ``exp_avg_mask`` M; v frozen)
        update = -lr m_hat / (sqrt(v_hat) + eps)  (``adam_updates``)

    ``engine``: the exchange that carries the messages (``compressor`` with error feedback, dense
    for the first ``warmup_steps`` steps).  Bad values: one-line ValueError."""
    _check(b1, b2, eps, warmup_steps, 0)
    comp = compressor_of(compressor)
    lr = learning_rate if callable(learning_rate) else (lambda count: learning_rate)

    def init_fn(params):
        check_mask(exp_avg_mask, params)
        zeros = jax.tree.map(jnp.zeros_like, params)
        return OneBitAdamEngineState(jnp.zeros((), jnp.int32), zeros, zeros)

    def message(grads, state):
        warm = state.count < warmup_steps
        return jax.tree.map(lambda m, g: jnp.where(warm, g, b1 * m + (1 - b1) * g).astype(g.dtype), state.mu, grads)

    def update_fn(avg, state, params=None):
        del params
        t = state.count
        warm = t < warmup_steps
        after = masked(avg, exp_avg_mask)
        mu = jax.tree.map(
            lambda m, a, c: jnp.where(warm, b1 * m + (1 - b1) * a, c).astype(m.dtype), state.mu, avg, after
        )
        nu = jax.tree.map(
            lambda v, a: jnp.where(warm, b2 * v + (1 - b2) * jnp.square(a), v).astype(v.dtype), state.nu, avg
        )
        out = adam_updates(mu, nu, avg, t, lr(t), b1, b2, eps, warmup_steps)
        return out, OneBitAdamEngineState(t + 1, mu, nu)

    engine = {
        "compressor": comp,
        "memory": "ef",
        "warmup": Warmup((), dense_steps=warmup_steps),
        "compress_vectors": EVERY_TENSOR,
    }
    return MessageTransformation(init_fn, update_fn, message, engine, label="1-bit Adam")


register("onebit_adam", onebit_adam_engine)

__all__ = ["onebit_adam", "OneBitAdamState", "onebit_adam_engine", "OneBitAdamEngineState", "adam_updates"]
