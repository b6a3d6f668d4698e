"""The ``Memory`` protocol: what a memory does around a compressor, as four pure functions.

A memory keeps, per tensor, what compression has not delivered yet.  One step with compressor C:

    p, inner, s = absorb(x, state)                 # p: the input C sees; inner: C's state
    payload, inner = C.compress(p, inner, key)
    state = settle(s, p, inner, decompress(payload))   # what left is no longer owed

A memory whose new state needs only ``y - sent`` for some ``y`` (error feedback: e = p - sent)
says so with ``settle_minus(s, p, inner, minus)``, ``minus(y) = y - sent``; ``wrap`` then lets
the compressor compute it from its payload (``Compressor.minus``: a sparse payload subtracts
with one scatter-add, without materialising the dense ``sent``).

and an aggregation that drops part of what a worker sent (gTop-k) hands it back:

    state = give_back(state, back)

and a memory that keeps a server-side estimate (EF21: g = 1/P sum_i g_i) turns the average the
aggregation delivered (identical on every worker) into the update it applies:

    update, state = receive(state, average)        # default: (average, state)

PowerSGD's aggregation runs the same ``absorb`` / ``settle`` around the *aggregated*
approximation (error feedback on the aggregate, Vogels et al. 2019), so no consumer of a memory
needs to know its state type.  ``wrap(c, memory)`` turns a compressor and a memory into one
``Compressor`` with the same wire format (what ``error_feedback`` and ``dgc`` return).

``MEMORIES`` maps a name to a factory ``factory(c, **options) -> Memory``; the engine passes its
memory options (``momentum``, ``masking``, ``ef_scale``) as keywords and a memory ignores those it
does not use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from cconv.compressors.base import Array, Compressor


class Memory(NamedTuple):
    """One memory kind (see the module docstring).

    name       prefix of the wrapped compressor's name: ``f"{name}({c.name})"``
    init       (x, inner_init) -> state;  ``inner_init(x)`` is the compressor's initial state
    absorb     (x, state) -> (p, inner, state'): the compressor's input, its state, and the
               memory state having taken x in (e.g. DGC's new momentum)
    settle     (state', p, inner, sent) -> new state after ``sent`` (decompressed) left
    give_back  (state, back) -> state with ``back`` owed again (entries the aggregation dropped)
    hparams    added to the wrapped compressor's ``hparams``
    settle_minus  optional (state', p, inner, minus) -> new state, where ``minus(y) = y - sent``:
               the same state as ``settle``, for a memory that needs ``sent`` only through a
               difference (``wrap`` prefers it: the compressor computes the difference from the
               payload, see ``Compressor.minus``)
    transparent  True for "no memory": ``wrap`` returns the compressor itself
    receive    optional (state, average) -> (update, state): what the workers apply given the
               average of the decoded payloads (EF21: g + average); None: the average itself
    """

    name: str
    init: Callable[[Array, Callable[[Array], Any]], Any]
    absorb: Callable[[Array, Any], tuple]
    settle: Callable[[Any, Array, Any, Array], Any]
    give_back: Callable[[Any, Array], Any]
    hparams: dict = {}
    transparent: bool = False
    settle_minus: Callable[[Any, Array, Any, Callable[[Array], Array]], Any] | None = None
    receive: Callable[[Any, Array], tuple[Array, Any]] | None = None

    def deliver(self, state, average):
        """(update, state) from the aggregated ``average`` (``receive``, or the average)."""
        return (average, state) if self.receive is None else self.receive(state, average)


def no_memory(c: Compressor | None = None, **options) -> Memory:
    """No memory: the state is the compressor's own; what it drops is lost."""
    del c, options
    return Memory(
        "none",
        init=lambda x, inner_init: inner_init(x),
        absorb=lambda x, state: (x, state, state),
        settle=lambda state, p, inner, sent: inner,
        give_back=lambda state, back: state,
        transparent=True,
    )


def wrap(c: Compressor, memory: Memory) -> Compressor:
    """``c`` with ``memory``: same wire format, aggregation, density and facts (``c.entry``, kept by
    ``_replace``: the theory and the engine read the wrapped compressor's); never unbiased."""
    if memory.transparent:
        return c

    def init(x):
        return memory.init(x, c.init)

    def compress(x, state, key):
        p, inner, state = memory.absorb(x, state)
        payload, inner = c.compress(p, inner, key)
        if memory.settle_minus is not None:
            return payload, memory.settle_minus(state, p, inner, lambda y: c.minus(y, payload))
        return payload, memory.settle(state, p, inner, c.decompress(payload, p))

    hparams = {**c.hparams, **memory.hparams} if memory.hparams else c.hparams
    return c._replace(init=init, compress=compress, name=f"{memory.name}({c.name})", unbiased=False, hparams=hparams)
