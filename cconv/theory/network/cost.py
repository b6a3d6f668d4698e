"""Collective times and bytes in the alpha-beta model (P workers, n payload bytes per worker).

    ring allreduce          2(P-1) alpha + 2(P-1)/P * n * beta
    ring allgather          (P-1) alpha + (P-1) * n * beta
    recursive doubling      r(P) (alpha + n beta),  r(P) = log2 P  (P a power of two), else
      (gTop-k's exchange)   floor(log2 P) + 2 (fold the extra ranks in, then out)
    PS push / pull          alpha + (P-1)/S * n * beta   (S <= P co-located servers)
    broadcast               min(binomial tree, scatter + ring allgather)
    permute (gossip)        alpha + n beta  (one message to a neighbour, every worker at once)

Thakur, Rabenseifner & Gropp (IJHPCA 2005); gTop-k: Shi et al. (ICDCS 2019).  Two-level
networks: ``hierarchical_time``.  ``collective_time`` dispatches on the collective kind (the
engine's ``Collective.kind``) through ``FLAT_TIMES``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cconv.theory.network.links import Hierarchical, Network
from cconv.theory.network.presets import names

COLLECTIVES = ("allreduce", "allgather", "recursive_doubling", "ps_push", "ps_pull", "broadcast", "permute")


def _check_network(net: object) -> Network:
    if not isinstance(net, Network):
        raise ValueError(
            f"expected a cconv.theory.network.Network, got {type(net).__name__}; "
            f"use network.get(name) with one of: {', '.join(names())}"
        )
    return net


def _check_args(nbytes, workers) -> tuple[float, int]:
    if (
        isinstance(nbytes, bool)
        or not isinstance(nbytes, (int, float, np.integer, np.floating))
        or not math.isfinite(nbytes)
        or nbytes < 0
    ):
        raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return float(nbytes), int(workers)


def p2p_time(nbytes: float, net: Network) -> float:
    """One point-to-point message: alpha + beta n (0 for an empty message)."""
    n, _ = _check_args(nbytes, 1)
    net = _check_network(net)
    return 0.0 if n == 0 else net.alpha + net.beta * n


def effective_gbps(nbytes: float, net: Network) -> float:
    """Effective throughput of one message, 8 n / T(n), in Gb/s."""
    t = p2p_time(nbytes, net)
    return 8.0 * nbytes / t / 1e9 if t > 0 else 0.0


def recursive_doubling_rounds(workers: int) -> int:
    """Rounds of recursive doubling: log2 P for a power of two, else floor(log2 P) + 2."""
    _, p = _check_args(0, workers)
    if p == 1:
        return 0
    lg = p.bit_length() - 1
    return lg if (1 << lg) == p else lg + 2


def allreduce_time(nbytes: float, workers: int, net: Network) -> float:
    """Ring all-reduce (reduce-scatter + allgather): 2(P-1) alpha + 2(P-1)/P n beta."""
    n, p = _check_args(nbytes, workers)
    net = _check_network(net)
    if p == 1 or n == 0:
        return 0.0
    return 2 * (p - 1) * net.alpha + 2 * (p - 1) / p * n * net.beta


def allgather_time(nbytes: float, workers: int, net: Network, algorithm: str = "ring") -> float:
    """All-gather of n bytes per worker.

    ``ring`` (NCCL's): (P-1)(alpha + n beta).  ``recursive_doubling`` (MPI, P a power of two):
    log2(P) alpha + (P-1) n beta (the message doubles every round).
    """
    n, p = _check_args(nbytes, workers)
    net = _check_network(net)
    if p == 1 or n == 0:
        return 0.0
    if algorithm == "ring":
        return (p - 1) * (net.alpha + n * net.beta)
    if algorithm == "recursive_doubling":
        return recursive_doubling_rounds(p) * net.alpha + (p - 1) * n * net.beta
    raise ValueError(f"allgather algorithm must be one of ring, recursive_doubling; got {algorithm!r}")


def recursive_doubling_time(nbytes: float, workers: int, net: Network) -> float:
    """gTop-k's exchange (Shi et al. 2019): r(P) rounds, each sending n bytes (k index-value pairs).

    With n = 8k bytes this is gTop-k's alpha log P + 2k log P beta (beta per 4-byte element in the
    paper).
    """
    n, p = _check_args(nbytes, workers)
    net = _check_network(net)
    if p == 1 or n == 0:
        return 0.0
    return recursive_doubling_rounds(p) * (net.alpha + n * net.beta)


def ps_time(nbytes: float, workers: int, net: Network, servers: int = 1) -> float:
    """Parameter-server push (or pull): alpha + (P-1)/S n beta.

    S servers co-located with S of the workers, each owning a 1/S shard of the model (BytePS
    shards the same way; the survey runs as many servers as worker machines).  The bottleneck is
    a server's link, which receives (push) or sends (pull) a shard of n/S bytes from/to each of
    the P-1 other workers.  S = 1 is cconv's engine (server on worker 0).
    """
    n, p = _check_args(nbytes, workers)
    net = _check_network(net)
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or not 1 <= servers <= p:
        raise ValueError(f"servers must be an integer in [1, workers={p}], got {servers!r}")
    if n == 0 or p == 1:
        return 0.0
    return net.alpha + (p - 1) / servers * n * net.beta


def broadcast_time(nbytes: float, workers: int, net: Network) -> float:
    """Broadcast from one root: the cheaper of a binomial tree and scatter + ring allgather."""
    n, p = _check_args(nbytes, workers)
    net = _check_network(net)
    if p == 1 or n == 0:
        return 0.0
    lg = math.ceil(math.log2(p))
    tree = lg * (net.alpha + n * net.beta)
    scatter_allgather = (lg + p - 1) * net.alpha + 2 * (p - 1) / p * n * net.beta
    return min(tree, scatter_allgather)


def hierarchical_time(kind: str, nbytes: float, workers: int, net: Hierarchical, *, servers: int = 1) -> float:
    """Collective time on a two-level network: g = per_node workers per node, N = P/g nodes.

    Each node's g workers share one NIC, so g concurrent inter-node transfers of m bytes cost
    alpha_e + g m beta_e.  With T_i / T_e the intra / inter links:

        allreduce            reduce-scatter in the node, g concurrent inter-node ring all-reduces
                             of n/g bytes, all-gather in the node (hierarchical all-reduce):
                             2(g-1)(alpha_i + n/g beta_i) + 2(N-1) alpha_e + 2(N-1)/N n beta_e
        allgather            g concurrent inter-node ring all-gathers (peers of equal local
                             rank), then an intra-node all-gather of the N payloads each holds:
                             (N-1)(alpha_e + g n beta_e) + (g-1)(alpha_i + N n beta_i)
        recursive_doubling   log2 g intra rounds, then log2 N inter rounds with g concurrent
                             partners per NIC: log2(g)(alpha_i + n beta_i) + log2(N)(alpha_e + g n beta_e)
        ps_push / ps_pull    S <= N servers on distinct nodes: a server's NIC carries the remote
                             workers' shards, its PCIe the local ones (in parallel):
                             max(alpha_e + (P-g) n/S beta_e, alpha_i + (g-1) n/S beta_i)
        broadcast            across the nodes, then within the node (each with the flat
                             broadcast below): T_bcast(n, N, e) + T_bcast(n, g, i)
        permute              a neighbour message, taken to cross the nodes with all g workers
                             of a node sending at once (a bound; a ring placed by rank sends
                             only 2 of them across): alpha_e + g n beta_e

    With N = 1 (P <= g) everything runs on ``intra`` (flat formulas).  P must be <= g or a
    multiple of g.
    """
    n, p = _check_args(nbytes, workers)
    if not isinstance(net, Hierarchical):
        raise ValueError(f"expected a Hierarchical network, got {type(net).__name__}")
    g = int(net.per_node)
    if p <= g:
        return collective_time(kind, n, p, net.intra, servers=servers)
    if p % g:
        raise ValueError(f"network {net.name!r}: workers={p} must be a multiple of per_node={g} (or at most {g})")
    nodes = p // g
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(COLLECTIVES)}")
    if n == 0:
        return 0.0
    i, e = net.intra, net.inter
    if kind == "allreduce":
        return (
            2 * (g - 1) * (i.alpha + n / g * i.beta) + 2 * (nodes - 1) * e.alpha + 2 * (nodes - 1) / nodes * n * e.beta
        )
    if kind == "allgather":
        return (nodes - 1) * (e.alpha + g * n * e.beta) + (g - 1) * (i.alpha + nodes * n * i.beta)
    if kind == "recursive_doubling":
        return recursive_doubling_rounds(g) * (i.alpha + n * i.beta) + recursive_doubling_rounds(nodes) * (
            e.alpha + g * n * e.beta
        )
    if kind == "permute":
        return e.alpha + g * n * e.beta
    if kind in ("ps_push", "ps_pull"):
        if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or not 1 <= servers <= nodes:
            raise ValueError(f"servers must be an integer in [1, nodes={nodes}] on {net.name!r}, got {servers!r}")
        return max(e.alpha + (p - g) * n / servers * e.beta, i.alpha + (g - 1) * n / servers * i.beta)
    return broadcast_time(n, nodes, e) + broadcast_time(n, g, i)


def collective_time(kind: str, nbytes: float, workers: int, net: Network | Hierarchical, *, servers: int = 1) -> float:
    """Seconds for one collective of ``kind`` (the engine's ``Collective.kind``) with ``nbytes``
    payload bytes per worker among ``workers`` workers on ``net``."""
    if isinstance(net, Hierarchical):
        return hierarchical_time(kind, nbytes, workers, net, servers=servers)
    if kind not in FLAT_TIMES:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(COLLECTIVES)}")
    return FLAT_TIMES[kind](nbytes, workers, net, servers)


# kind -> time(nbytes, workers, net, servers) on one flat link
FLAT_TIMES: dict[str, Callable[[float, int, Network, int], float]] = {
    "allreduce": lambda n, p, net, s: allreduce_time(n, p, net),
    "allgather": lambda n, p, net, s: allgather_time(n, p, net),
    "recursive_doubling": lambda n, p, net, s: recursive_doubling_time(n, p, net),
    "ps_push": ps_time,
    "ps_pull": ps_time,
    "broadcast": lambda n, p, net, s: broadcast_time(n, p, net),
    "permute": lambda n, p, net, s: 0.0 if p == 1 else p2p_time(n, net),
}


def bytes_sent(kind: str, nbytes: float, workers: int, *, servers: int = 1) -> float:
    """Bytes one worker puts on its link for one collective (the algorithms above).

    For a worker that is not a server or root (cconv.comm.accounting's convention): allreduce
    2(P-1)/P n; allgather (P-1) n; recursive doubling ceil(log2 P) n (the busiest rank: with P not
    a power of two, a fold partner receives the folded rank's n, runs log2 of the rest rounds and
    sends the result back; ``recursive_doubling_rounds`` counts the fold as a round for time); permute
    (a gossip neighbour message) n; ps_push
    (1 - 1/S) n with S
    co-located servers (n for S = 1: the whole payload goes to the server); ps_pull and broadcast 0.
    """
    n, p = _check_args(nbytes, workers)
    if p == 1:
        return 0.0
    if kind == "allreduce":
        return 2 * (p - 1) / p * n
    if kind == "allgather":
        return (p - 1) * n
    if kind == "recursive_doubling":  # the busiest rank (a fold partner): ceil(log2 P) messages
        return (p - 1).bit_length() * n
    if kind == "ps_push":
        return n if servers < p else (1 - 1 / servers) * n
    if kind in ("ps_pull", "broadcast"):
        return 0.0
    if kind == "permute":  # one message to a neighbour
        return n
    raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(COLLECTIVES)}")
