"""DGC momentum correction and momentum-factor masking (Lin et al., ICLR 2018).

For each worker, with momentum m:

    u <- m u + g                (momentum, accumulated locally)
    v <- v + u                  (momentum-corrected accumulation)
    payload = C(v);  s = decompress(payload)
    v <- v - s                  (= zeroing the sent coordinates for a sparsifier)
    u <- u * (s == 0)           (momentum-factor masking, when ``masking``)

The optimizer that applies the aggregated update must be plain SGD (the momentum is here).
Masking exists because a sent coordinate's momentum would otherwise be applied again from a
stale accumulation; it only applies when C actually sparsifies (density < 1).  At density 1
(e.g. ``topk`` with k >= d) nothing is delayed, no masking happens, v is flushed every step and
DGC reduces exactly to momentum SGD: update_t = m update_{t-1} + g_t.
"Sent" means a nonzero decompressed value, so the memory is meant for sparsifiers: with a
compressor whose output is dense although density < 1 (PowerSGD) masking clears all of u (use
``masking=False``), and with scaled random-k v keeps (1 - d/k) v on the sent coordinates.
Local gradient clipping (threshold scaled by N^-1/2) is applied by the engine before this.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from cconv.compressors.base import Array, Compressor
from cconv.memory.base import Memory, wrap

# DGC's momentum m (Lin et al., ICLR 2018: momentum SGD with m = 0.9 in their experiments; the
# authors' code, synxlin/deep-gradient-compression, sets the optimizer's momentum to 0.9 in
# configs/__init__.py and the DGC memory's to the optimizer's in configs/dgc/__init__.py).  The
# engine's ``momentum`` default is this constant (``cconv.engine.config.EngineConfig``).
MOMENTUM = 0.9


class DGCState(NamedTuple):
    inner: Any
    u: Array  # momentum
    v: Array  # accumulated velocity (the residual)


def dgc_memory(c: Compressor, momentum: float = MOMENTUM, masking: bool = True, **options) -> Memory:
    """DGC's memory for compressor ``c`` (its density decides whether masking applies)."""
    del options
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
        raise ValueError(f"memory.dgc: momentum must be in [0, 1), got {momentum!r}")
    m = float(momentum)

    def init(x, inner_init):
        z = jnp.zeros(x.shape, x.dtype)
        return DGCState(inner_init(x), z, z)

    def absorb(g, state: DGCState):
        u = jnp.asarray(m, g.dtype) * state.u + g
        v = state.v + u
        return v, state.inner, DGCState(state.inner, u, v)

    def settle(state: DGCState, v, inner, sent) -> DGCState:
        u = state.u
        if masking and c.density(v.shape) < 1.0:
            u = jnp.where(sent != 0, jnp.zeros((), v.dtype), u)
        return DGCState(inner, u, v - sent)

    def give_back(state: DGCState, back) -> DGCState:
        return state._replace(v=state.v + back)

    return Memory("dgc_memory", init, absorb, settle, give_back, hparams={"momentum": m, "masking": masking})


def dgc(c: Compressor, momentum: float = MOMENTUM, masking: bool = True) -> Compressor:
    """``c`` with DGC's momentum correction (and momentum-factor masking)."""
    return wrap(c, dgc_memory(c, momentum=momentum, masking=masking))
