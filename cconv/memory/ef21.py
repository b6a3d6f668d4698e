"""EF21 (Richtárik, Sokolov & Fatkhullin, NeurIPS 2021) and EF21-SGDM (Fatkhullin, Tyurin &
Richtárik, NeurIPS 2023, "Momentum provably improves error feedback!").

Each worker i keeps an estimate g_i of its gradient and sends the compressed *change*:

    c_i = C(x_i - g_i);   g_i <- g_i + c_i                       (EF21)
    v_i <- (1 - eta) v_i + eta x_i;  c_i = C(v_i - g_i);  g_i <- g_i + c_i   (EF21-SGDM)

and the server (or every worker, holding the same copy) keeps g = 1/P sum_i g_i, updated by the
average of the compressed differences, g <- g + 1/P sum_i c_i; the update every worker applies
is g (not the average of the c_i).  With a delta-contractive C, EF21 converges for smooth
nonconvex f at O(1/T) in ||grad f||^2 without bounded gradients (Theorem 1: step size
gamma <= 1 / (L + L~ sqrt(beta/theta)), theta = 1 - sqrt(1 - delta), beta = (1 - delta)/(1 - sqrt(1 - delta)));
EF21-SGDM adds momentum to make stochastic gradients converge with any contractive C.

As a ``Memory``: ``absorb`` hands C the difference p = x - g_i (or v_i - g_i), ``settle`` adds
what was sent to g_i, and ``receive`` (called by the exchange after the aggregation, with the
average of the decoded payloads, identical on every worker) adds it to g and returns g.
``give_back`` (an aggregation that drops part of what a worker sent: gTop-k) takes the dropped
part back out of g_i, so that g = 1/P sum_i g_i stays exact.

State per tensor: the compressor's, g_i and g (and v_i for EF21-SGDM), each of x's shape and
dtype: 2 (3) arrays the size of the gradient, against error feedback's 1.  Initial g_i = g = 0
(v_i = 0), so the first step sends C(x_i) (the papers' g_i^0 = C(grad f_i(x^0))).

The memory's option ``momentum`` is beta = 1 - eta for EF21-SGDM (the engine's DGC momentum
knob, default 0.9: eta = 0.1); EF21 ignores it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from cconv.compressors.base import Array, Compressor
from cconv.memory.base import Memory, wrap


class EF21State(NamedTuple):
    inner: Any  # the wrapped compressor's state
    local: Array  # g_i: this worker's gradient estimate
    shared: Array  # g = 1/P sum_i g_i, identical on every worker
    velocity: Array  # v_i (EF21-SGDM); zeros of shape () for EF21


def _zeros(x):
    return jnp.zeros(x.shape, x.dtype)


def _settle(state: EF21State, p, inner, sent) -> EF21State:
    return state._replace(inner=inner, local=(state.local + sent).astype(state.local.dtype))


def _give_back(state: EF21State, back) -> EF21State:
    return state._replace(local=state.local - back.astype(state.local.dtype))


def _receive(state: EF21State, average):
    """g <- g + average of the decoded differences; the update is g."""
    g = (state.shared + average.astype(state.shared.dtype)).astype(state.shared.dtype)
    return g, state._replace(shared=g)


def ef21_memory(c: Compressor | None = None, **options) -> Memory:
    """EF21 as a ``Memory`` (ignores the engine's memory options)."""
    del c, options

    def init(x, inner_init):
        return EF21State(inner_init(x), _zeros(x), _zeros(x), jnp.zeros((), x.dtype))

    def absorb(x, state: EF21State):
        return x - state.local, state.inner, state

    return Memory("ef21", init, absorb, _settle, _give_back, receive=_receive)


def ef21_sgdm_memory(c: Compressor | None = None, momentum: float = 0.9, **options) -> Memory:
    """EF21-SGDM as a ``Memory``: v_i <- momentum * v_i + (1 - momentum) x_i, then EF21 on v_i."""
    del c, options
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
        raise ValueError(f"memory.ef21_sgdm: momentum (beta = 1 - eta) must be in [0, 1), got {momentum!r}")
    beta = float(momentum)

    def init(x, inner_init):
        return EF21State(inner_init(x), _zeros(x), _zeros(x), _zeros(x))

    def absorb(x, state: EF21State):
        v = jnp.asarray(beta, x.dtype) * state.velocity + jnp.asarray(1 - beta, x.dtype) * x
        return v - state.local, state.inner, state._replace(velocity=v.astype(state.velocity.dtype))

    return Memory("ef21_sgdm", init, absorb, _settle, _give_back, hparams={"momentum": beta}, receive=_receive)


def ef21(c: Compressor) -> Compressor:
    """``c`` with EF21's worker side: its payload is C(x - g_i); the average of the decoded
    payloads is the change of g (``Memory.receive``, applied by ``cconv.engine`` / ``Exchange``)."""
    return wrap(c, ef21_memory(c))


def ef21_sgdm(c: Compressor, momentum: float = 0.9) -> Compressor:
    """``c`` with EF21-SGDM's worker side (see ``ef21``)."""
    return wrap(c, ef21_sgdm_memory(c, momentum=momentum))
