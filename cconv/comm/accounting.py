"""Byte accounting: what one collective moves, per worker, under its algorithm.

Every collective the engine issues is recorded (at trace time, from the payload arrays' static
shapes) as a ``Collective(kind, bytes, count, control)``: ``bytes`` is the payload one worker
contributes to one call, ``count`` how many such calls.  ``traffic(c, P)`` turns it into the
bytes each rank sends and receives, with the standard bandwidth-optimal algorithms
(Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009), D = ``bytes``:

=====================  ==============================  =====================================
kind                   sent per rank                   received per rank
=====================  ==============================  =====================================
allreduce (ring)       2 (P-1)/P * D                   2 (P-1)/P * D
allgather (ring)       (P-1) * D                       (P-1) * D
recursive_doubling     log2(P) * D   (one D per round)  log2(P) * D
  P not a power of two  ranks j < r: (log2 p' + 1) D    the same; p' = 2^floor(log2 P),
  (fold, double,        ranks r..p'-1: log2(p') D       r = P - p' (``cconv.comm.gtopk``)
  unfold)               ranks >= p': D (fold)           D (unfold)
ps_push                D (workers 1..P-1), 0 (server)  (P-1) * D at the server (rank 0)
ps_pull                (P-1) * D at the server         D (workers 1..P-1)
broadcast (from 0)     (P-1) * D at rank 0             D (ranks 1..P-1)
permute (gossip)       D (one full permutation)         D
=====================  ==============================  =====================================

The parameter server is co-located with worker 0 (its own push and pull are local copies).

Variable-length (entropy-coded) payloads move a fixed-capacity buffer, but a transport that sends
only the used bits would move less: ``encoded_traffic(kind, e, rank)`` gives rank ``rank``'s
bytes for per-worker encoded sizes ``e[w]`` (known only at run time), under the same algorithms:
allgather (ring: rank r forwards every block but its successor's) sends sum(e) - e[r+1] and
receives sum(e) - e[r]; ps_push sends e[r] (workers) and receives sum over w != 0 of e[w] (the
server); ps_pull / broadcast send (P-1) e[0] (rank 0) and receive e[0].  All-reduces and
recursive doubling combine payloads on the way, so only fixed-size payloads take them.
``control=True`` marks traffic that is not part of the training algorithm (the all-reduce
that averages logged metrics); it is counted separately (``bytes_control``) so that the
compiled program's collectives are accounted for exactly (``cconv.comm.hlo``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import payload_bytes

KINDS = ("allreduce", "allgather", "recursive_doubling", "ps_push", "ps_pull", "broadcast", "permute")


class Collective(NamedTuple):
    """One kind of call a step makes: ``count`` calls, each with ``bytes`` of payload per worker."""

    kind: str
    bytes: float
    count: int = 1
    control: bool = False


# Bytes of the leaves of a pytree (arrays, tracers or ShapeDtypeStructs): one implementation,
# ``cconv.compressors.base.payload_bytes`` (the lower layer); this name is kept for the comm layer.
tree_bytes = payload_bytes


def traffic(c: Collective, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """(sent, received) bytes per rank, arrays of length ``workers``, for ``c``'s ``count`` calls."""
    if c.kind not in KINDS:
        raise ValueError(f"unknown collective kind {c.kind!r}; valid: {', '.join(KINDS)}")
    p, d = int(workers), float(c.bytes) * c.count
    sent, recv = np.zeros(p), np.zeros(p)
    if p == 1:
        return sent, recv
    if c.kind == "allreduce":
        sent[:] = recv[:] = 2.0 * (p - 1) / p * d
    elif c.kind == "allgather":
        sent[:] = recv[:] = (p - 1) * d
    elif c.kind == "recursive_doubling":
        # fold ranks p'+j -> j, recursive doubling among the first p', unfold j -> p'+j
        p2 = 1 << (p.bit_length() - 1)
        sent[:p2] = recv[:p2] = math.log2(p2) * d
        sent[: p - p2] += d  # unfold
        recv[: p - p2] += d  # fold
        sent[p2:] = recv[p2:] = d
    elif c.kind == "permute":  # a full permutation (gossip, cconv.comm.topology): one message each
        sent[:] = recv[:] = d
    elif c.kind == "ps_push":
        sent[1:] = d
        recv[0] = (p - 1) * d
    else:  # ps_pull, broadcast: from rank 0 to every other rank
        sent[0] = (p - 1) * d
        recv[1:] = d
    return sent, recv


def total_traffic(collectives: Iterable[Collective], workers: int, control: bool | None = None):
    """Summed (sent, received) per rank; ``control``: None = all, True/False = only those."""
    sent, recv = np.zeros(workers), np.zeros(workers)
    for c in collectives:
        if control is not None and c.control != control:
            continue
        s, r = traffic(c, workers)
        sent += s
        recv += r
    return sent, recv


def merge(collectives: Iterable[Collective]) -> list[Collective]:
    """Group equal (kind, bytes, control) entries, summing their counts (order kept)."""
    out: dict[tuple, int] = {}
    for c in collectives:
        key = (c.kind, float(c.bytes), c.control)
        out[key] = out.get(key, 0) + c.count
    return [Collective(k, b, n, ctl) for (k, b, ctl), n in out.items()]


VARIABLE_KINDS = ("allgather", "ps_push", "ps_pull", "broadcast")


def encoded_traffic(kind: str, e, rank: int):
    """(sent, received) bytes of rank ``rank`` when worker w's payload encodes to ``e[w]`` bytes
    (``e``: array of length P, traced or not; module docstring)."""
    if kind not in VARIABLE_KINDS:
        raise ValueError(f"encoded sizes apply to {', '.join(VARIABLE_KINDS)} collectives, not {kind!r}")
    e = jnp.asarray(e, jnp.float32)
    p = e.shape[0]
    zero = jnp.zeros((), jnp.float32)
    if p == 1:
        return zero, zero
    total = e.sum()
    if kind == "allgather":
        return total - e[(rank + 1) % p], total - e[rank]
    if kind == "ps_push":
        return (zero, total - e[0]) if rank == 0 else (e[rank], zero)
    return ((p - 1) * e[0], zero) if rank == 0 else (zero, e[0])
