"""Error feedback (EF, "memory", error accumulation).

    p = x + e;   payload = C(p);   e <- p - decompress(payload)

so that, per step, decompress(payload) + e_new == x + e_old exactly (up to float rounding):
nothing the compressor drops is lost, it is only delayed.  With a learning rate folded into x
(x = gamma * g) this is the EF-SGD of Stich et al. (2018) and Karimireddy et al. (2019), which
makes any delta-contractive compressor converge at the rate of SGD asymptotically.

The residual has x's shape and dtype.  The wrapper keeps the inner compressor's wire format,
aggregation and density; it is never unbiased (the residual carries a bias that is repaid later).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from cconv.compressors.base import Array, Compressor
from cconv.memory.base import Memory, wrap


class EFState(NamedTuple):
    inner: Any  # the wrapped compressor's state
    residual: Array  # e, same shape/dtype as x


def _init(x, inner_init):
    return EFState(inner_init(x), jnp.zeros(x.shape, x.dtype))


def _absorb(x, state: EFState):
    return x + state.residual, state.inner, state


def _settle(state: EFState, p, inner, sent) -> EFState:
    # p - sent in p's dtype; cast to the residual's (a no-op unless p was widened, as PowerSGD's
    # float32 matrices of a bfloat16 tensor are)
    return EFState(inner, (p - sent).astype(state.residual.dtype))


def _give_back(state: EFState, back) -> EFState:
    return state._replace(residual=state.residual + back)


def ef_memory(c: Compressor | None = None, **options) -> Memory:
    """Error feedback as a ``Memory`` (ignores the engine's memory options)."""
    del c, options
    return Memory("ef", _init, _absorb, _settle, _give_back)


def error_feedback(c: Compressor) -> Compressor:
    """``c`` with error feedback: e <- (x + e) - decompress(C(x + e))."""
    return wrap(c, ef_memory(c))
