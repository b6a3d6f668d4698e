"""Error feedback (EF, "memory", error accumulation).

    p = x + e;   payload = C(p);   e <- p - decompress(payload)

so that, per step, decompress(payload) + e_new == x + e_old exactly (up to float rounding):
nothing the compressor drops is lost, it is only delayed.  With a learning rate folded into x
(x = gamma * g) this is the EF-SGD of Stich et al. (2018) and Karimireddy et al. (2019), which
makes any delta-contractive compressor converge at the rate of SGD asymptotically.

The residual has x's shape and dtype.  The wrapper keeps the inner compressor's wire format,
aggregation and density; it is never unbiased (the residual carries a bias that is repaid later).

**Scaled error feedback** (``ef_scale`` = a in (0, 1]).  EF's guarantee needs a delta-contraction,
E||C(p) - p||^2 <= (1 - delta) ||p||^2.  An unbiased compressor with variance factor omega
(E C(p) = p, E||C(p) - p||^2 <= omega ||p||^2) is one only when omega < 1; QSGD with few levels
or scaled random-k are not, and EF around them can diverge.  The standard fix (Stich &
Karimireddy 2019, "The error-feedback framework"; Karimireddy et al. 2019, Remark on unbiased
compressors) scales: with a = 1/(1 + omega) the compressor C_a(p) = C(a p) is a contraction with
delta = 1/(1 + omega), for any unbiased C:

    E||C(a p) - p||^2 = E||C(a p) - a p||^2 + (1 - a)^2 ||p||^2
                     <= (omega a^2 + (1 - a)^2) ||p||^2 = (1 - 1/(1 + omega)) ||p||^2.

So with ``ef_scale = a``:  p = x + e;  payload = C(a p);  e <- p - decompress(payload).
The scale is applied to the compressor's *input* (inside the memory), so the payload, its wire
format and every aggregation path are unchanged; for positively homogeneous compressors
(QSGD, TernGrad, random-k, top-k: C(a p) = a C(p) for the same key) it is exactly the output
scaling C(p)/(1 + omega) of the papers (scaled random-k with a = k/d is unscaled random-k).
``ef_scale = 1`` is plain error feedback (the same functions, bit for bit).
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


def _settle_minus(state: EFState, p, inner, minus) -> EFState:
    # ``_settle`` with p - sent computed by the compressor from its payload (``Compressor.minus``)
    return EFState(inner, minus(p).astype(state.residual.dtype))


def _give_back(state: EFState, back) -> EFState:
    return state._replace(residual=state.residual + back)


def _scaled(a: float):
    """absorb / settle of error feedback with the compressor's input scaled by ``a``: the state
    between the two carries the full p = x + e (in the residual's slot), so that settle repays
    exactly p - sent."""

    def absorb(x, state: EFState):
        p = x + state.residual
        return jnp.asarray(a, p.dtype) * p, state.inner, state._replace(residual=p)

    def settle(state: EFState, scaled_p, inner, sent) -> EFState:
        del scaled_p
        return EFState(inner, (state.residual - sent).astype(state.residual.dtype))

    def settle_minus(state: EFState, scaled_p, inner, minus) -> EFState:
        del scaled_p
        return EFState(inner, minus(state.residual).astype(state.residual.dtype))

    return absorb, settle, settle_minus


def ef_memory(c: Compressor | None = None, ef_scale: float = 1.0, **options) -> Memory:
    """Error feedback as a ``Memory`` (ignores the engine's other memory options).

    ``ef_scale`` (a in (0, 1]): the compressor sees a (x + e) (module docstring; a = 1/(1 + omega)
    makes an unbiased compressor with variance factor omega a delta-contraction)."""
    del c, options
    if isinstance(ef_scale, bool) or not isinstance(ef_scale, (int, float)) or not 0 < ef_scale <= 1:
        raise ValueError(f"memory.ef: ef_scale must be a number in (0, 1], got {ef_scale!r}")
    if ef_scale == 1:
        return Memory("ef", _init, _absorb, _settle, _give_back, settle_minus=_settle_minus)
    absorb, settle, settle_minus = _scaled(float(ef_scale))
    return Memory(
        "ef", _init, absorb, settle, _give_back, hparams={"ef_scale": float(ef_scale)}, settle_minus=settle_minus
    )


def error_feedback(c: Compressor, ef_scale: float = 1.0) -> Compressor:
    """``c`` with error feedback: e <- (x + e) - decompress(C(ef_scale (x + e)))."""
    return wrap(c, ef_memory(c, ef_scale=ef_scale))
