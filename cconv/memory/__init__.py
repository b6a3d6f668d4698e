"""Memory: what compression dropped is kept and sent later.

* ``error_feedback(c, ef_scale=1)``: error feedback / error accumulation (Seide et al. 2014; Stich,
  Cordonnier & Jaggi 2018; Karimireddy et al. 2019); ``ef_scale = 1/(1 + omega)`` makes it
  converge around an unbiased compressor with variance factor omega >= 1 (Stich & Karimireddy 2019).
* ``dgc(c, momentum)``: DGC's momentum correction with momentum-factor masking (Lin et al. 2018).
* ``ef21(c)``, ``ef21_sgdm(c, momentum)``: EF21 (Richtárik et al. 2021) and EF21-SGDM (Fatkhullin
  et al. 2023): compress the change of each worker's gradient estimate; the update is the
  server's estimate g (``Memory.receive``), so use them through the engine or ``Exchange``.

Both return a ``Compressor`` with the same wire format as ``c``, so they compose with any
compressor and with each other's consumers (the engine sees one compressor).  Both are built
from a ``Memory`` (``cconv.memory.base``): four pure hooks (init, absorb, settle, give_back) that
the aggregation methods call too.  ``MEMORIES`` maps each memory's name to its factory
``factory(c, **options) -> Memory`` (options: ``momentum``, ``masking``, ``ef_scale``).
"""

from collections.abc import Callable

from cconv.memory.base import Memory, no_memory, wrap
from cconv.memory.dgc import DGCState, dgc, dgc_memory
from cconv.memory.ef21 import EF21State, ef21, ef21_memory, ef21_sgdm, ef21_sgdm_memory
from cconv.memory.error_feedback import EFState, ef_memory, error_feedback

NONE = "none"  # the name of "no memory" (the engine's default)
MEMORIES: dict[str, Callable[..., Memory]] = {
    NONE: no_memory,
    "ef": ef_memory,
    "dgc": dgc_memory,
    "ef21": ef21_memory,
    "ef21_sgdm": ef21_sgdm_memory,
}


def get(name: str, c, **options) -> Memory:
    """The memory ``name`` for compressor ``c``; one-line ValueError for an unknown name."""
    if name not in MEMORIES:
        raise ValueError(f"unknown memory {name!r}; valid: {', '.join(MEMORIES)}")
    return MEMORIES[name](c, **options)


__all__ = [
    "Memory",
    "MEMORIES",
    "NONE",
    "get",
    "wrap",
    "no_memory",
    "ef_memory",
    "dgc_memory",
    "EFState",
    "error_feedback",
    "DGCState",
    "dgc",
    "EF21State",
    "ef21",
    "ef21_memory",
    "ef21_sgdm",
    "ef21_sgdm_memory",
]
