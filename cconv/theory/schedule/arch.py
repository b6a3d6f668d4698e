"""System architectures: how one gradient message travels, as stages on communication resources.

An ``Architecture`` turns a message (``kind``, ``nbytes`` payload bytes per worker) into a chain
of ``(resource, seconds)`` stages; the event simulator runs each stage as a task on its resource
(one message at a time per resource).  Times come from ``cconv.theory.network``'s alpha-beta
formulas; g = workers per node, N = P/g nodes, i/e = intra/inter-node link (``Hierarchical``).

All-to-all (one channel ``"comm"``; Horovod/NCCL run one collective at a time):

    ring          flat ring over all P ranks; on a two-level network every step is limited by the
                  slowest hop:  2(P-1)(max alpha + n/P max beta)           (Thakur et al. 2005)
    tree          NCCL's double binary tree (Sanders, Speck & Traeff 2009), pipelined: a reduce
                  and a broadcast, each moving n over the slowest hop:
                  flat 2 ceil(log2 P) alpha + 2 n beta;
                  two levels 2(g-1) alpha_i + 2 ceil(log2 N) alpha_e + 2 n max(beta_i, beta_e)
    hierarchical  NCCL-style two-level all-reduce (intra reduce-scatter, inter ring, intra
                  all-gather): ``network.hierarchical_time`` (= ring on a flat link)

Other kinds (``allgather``, ``recursive_doubling``, ``broadcast``) use ``network.collective_time``
for every all-to-all algorithm.

Parameter server (summable payloads, kind ``allreduce``; push on resource ``"push"`` and pull on
``"pull"``, the two directions of full-duplex links, so one tensor's pull overlaps the next one's
push; every tensor's keys are spread over the S servers):

    ps            S servers co-located with workers (cconv's engine for S = 1): push and pull each
                  ``network.ps_time`` = alpha + (P-1)/S n beta on a flat link (today's planner
                  model), ``hierarchical_time("ps_push")`` on two levels
    byteps        BytePS (Jiang et al. OSDI 2020) with S dedicated server machines: each node
                  first reduces its g gradients over PCIe (reduce-scatter, (g-1)(alpha_i + n/g
                  beta_i)) and copies each GPU's 1/g of the sum to host memory (alpha_i + n/g
                  beta_i; BytePS's CPU-assisted aggregation on PCIe-only machines), then pushes n
                  over its NIC; a server receives n/S from each of the N nodes.  Stages:
                  pcie g(alpha_i + n/g beta_i), push alpha_e + max(1, N/S) n beta_e, pull (the
                  same), pcie (the same), the two pcie stages on one resource.  On one machine
                  BytePS runs NCCL without servers: pcie (g-1)(alpha_i + n/g beta_i) twice (= the
                  ring all-reduce).  On a flat link g = 1, N = P: push and pull only.

Topology factors (``NETWORK_TOPOLOGIES``, optional): multipliers on the inter-node beta per architecture
family, with their source; ``fat-tree`` (full bisection, Al-Fares et al. SIGCOMM 2008) is 1.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

from cconv.theory import network as N


class Topology(NamedTuple):
    """Multipliers on the inter-node beta for all-to-all and PS traffic, with their source."""

    name: str
    a2a_beta: float
    ps_beta: float
    source: str


NETWORK_TOPOLOGIES: dict[str, Topology] = {
    "fat-tree": Topology(
        "fat-tree", 1.0, 1.0, "full bisection bandwidth between any servers (Al-Fares et al. SIGCOMM 2008)"
    ),
    "bcube": Topology(
        "bcube",
        1.0,
        1.0,
        "full link bandwidth per server (Guo et al. SIGCOMM 2009); the survey (Sec. 3.3) finds PS "
        "'slightly better' than on fat-tree but gives no number, so no factor",
    ),
    "torus": Topology(
        "torus",
        0.5,
        1.0,
        "a 2-D torus runs two rings at once (survey Sec. 3.3: the vector is split over the horizontal "
        "and vertical rings), halving a ring all-reduce's per-link bytes",
    ),
}


def get_topology(name: str) -> Topology:
    if isinstance(name, str) and name.lower() in NETWORK_TOPOLOGIES:
        return NETWORK_TOPOLOGIES[name.lower()]
    raise ValueError(f"unknown topology {name!r}; valid: {', '.join(NETWORK_TOPOLOGIES)}")


def _scaled(net: N.Network | N.Hierarchical, factor: float) -> N.Network | N.Hierarchical:
    """``net`` with its inter-node (or only) beta multiplied by ``factor``."""
    if factor == 1.0:
        return net
    if isinstance(net, N.Hierarchical):
        return net._replace(inter=net.inter._replace(beta=net.inter.beta * factor))
    return net._replace(beta=net.beta * factor)


class Architecture(Protocol):
    """How a message travels: ``stages(kind, nbytes, reply)`` -> ((resource, seconds), ...);
    ``reply`` is what a parameter server sends back per worker for a gathered payload (the dense
    sum, or the sum compressed by a downlink compressor), None where it is not known."""

    name: str

    def stages(self, kind: str, nbytes: float, reply: float | None = None) -> tuple[tuple[str, float], ...]: ...


def cost(arch: Architecture, kind: str, nbytes: float, reply: float | None = None) -> float:
    """Seconds of one message alone on idle links: the sum of its stages."""
    return float(sum(t for _, t in arch.stages(kind, nbytes, reply)))


def _levels(net: N.Network | N.Hierarchical, workers: int) -> tuple[int, int, N.Network, N.Network]:
    """(g, nodes, intra, inter) of ``net`` for ``workers``; a flat link is g = 1, N = P."""
    if isinstance(net, N.Hierarchical) and workers > net.per_node:
        g = int(net.per_node)
        if workers % g:
            raise ValueError(f"network {net.name!r}: workers={workers} must be a multiple of per_node={g}")
        return g, workers // g, net.intra, net.inter
    link = net.intra if isinstance(net, N.Hierarchical) else net
    return 1, workers, link, link


def peer_latency_s(arch: Architecture) -> float:
    """Seconds of one small point-to-point message from one rank to each of the P - 1 others in
    turn: (g - 1) alpha_i + (P - g) alpha_e (g - 1 peers in its node, the rest across the nodes)."""
    workers = int(getattr(arch, "workers", 1))
    g, _, i, e = _levels(arch.net, workers)  # type: ignore[attr-defined]
    return (g - 1) * i.alpha + (workers - g) * e.alpha


class AllToAll(NamedTuple):
    """All-reduce by ``algorithm`` (ring, tree, hierarchical) on one channel ``"comm"``."""

    name: str
    algorithm: str
    net: N.Network | N.Hierarchical
    workers: int

    gpu_resources: tuple[str, ...] = ("comm",)  # NCCL runs the whole collective as GPU kernels

    def allreduce(self, n: float) -> float:
        p = self.workers
        if p == 1 or n == 0:
            return 0.0
        g, nodes, i, e = _levels(self.net, p)
        a, b = max(i.alpha, e.alpha), max(i.beta, e.beta)
        if self.algorithm == "ring":
            return 2 * (p - 1) * (a + n / p * b)
        if self.algorithm == "tree":
            if g == 1:
                return 2 * math.ceil(math.log2(p)) * e.alpha + 2 * n * e.beta
            return 2 * (g - 1) * i.alpha + 2 * math.ceil(math.log2(nodes)) * e.alpha + 2 * n * b
        return N.collective_time("allreduce", n, p, self.net)

    def stages(self, kind: str, nbytes: float, reply: float | None = None) -> tuple[tuple[str, float], ...]:
        n = float(nbytes)
        t = self.allreduce(n) if kind == "allreduce" else N.collective_time(kind, n, self.workers, self.net)
        return (("comm", t),)


class TwoLevel(NamedTuple):
    """A two-level compressed collective: the dense gradient is reduced inside each node, only the
    exchange between nodes is compressed, and the result spread inside the node again (Espresso,
    Wang et al., EuroSys 2023, built on BytePS: its communication types "intra-node FP16 +
    inter-node compression + allgather" / "+ alltoall + allgather", github.com/zhuangwang93/Espresso;
    Table 1's "hierarchical communication").  With g GPUs a node, N nodes, d the layer's dense bytes
    and n its compressed bytes: the g GPUs reduce-scatter the dense gradient over the intra link,
    each compresses its 1/g share of the node's sum, the g shares cross the nodes in g concurrent
    collectives of the compressor's kind among the N nodes (sharing the node's NIC), each GPU
    decodes its N peers' payloads, and an intra-node all-gather spreads the decoded shares:

        intra (twice) = (g-1)(alpha_i + d/g beta_i)
        inter         = T_kind(n/g, N, alpha_e, g beta_e)     e.g. all-gather (N-1)(alpha_e + n beta_e)

    A dense message (n = d) costs the hierarchical all-reduce.  ``compression_scope``: the share of
    each layer a GPU compresses (1/g) and the workers whose payloads its collective combines (N)."""

    name: str
    net: N.Network | N.Hierarchical
    workers: int

    gpu_resources: tuple[str, ...] = ("comm",)  # NCCL kernels

    @property
    def compression_scope(self) -> tuple[float, int]:
        g, nodes, _, _ = _levels(self.net, self.workers)
        return 1.0 / g, nodes

    def stages(self, kind: str, nbytes: float, reply: float | None = None) -> tuple[tuple[str, float], ...]:
        n = float(nbytes)
        d = n if reply is None else float(reply)
        g, nodes, i, e = _levels(self.net, self.workers)
        intra = (g - 1) * (i.alpha + d / g * i.beta) if g > 1 and d > 0 else 0.0
        inter = N.collective_time(kind, n / g, nodes, e._replace(beta=g * e.beta)) if nodes > 1 and n > 0 else 0.0
        return (("comm", intra), ("comm", inter), ("comm", intra))


class ParameterServer(NamedTuple):
    """Push/pull through ``servers`` servers: co-located (``ps``) or dedicated (``byteps``)."""

    name: str
    net: N.Network | N.Hierarchical
    workers: int
    servers: int
    dedicated: bool

    @property
    def gpu_resources(self) -> tuple[str, ...]:
        return ("pcie",) if self.dedicated else ()

    @property
    def one_machine(self) -> bool:
        """All workers in one node of a two-level network (BytePS then runs NCCL, no server)."""
        return isinstance(self.net, N.Hierarchical) and self.workers <= self.net.per_node

    @property
    def workers_decode_gathered(self) -> bool:
        """Whether the workers decode gathered payloads: with dedicated servers on several machines
        the servers do (their CPUs; not modelled) and reply dense; co-located, the server is a
        worker; on one machine BytePS runs NCCL's all-gather."""
        return not self.dedicated or self.one_machine or self.workers == 1

    def stages(self, kind: str, nbytes: float, reply: float | None = None) -> tuple[tuple[str, float], ...]:
        if kind not in ("allreduce", "allgather"):
            raise ValueError(
                f"architecture {self.name!r} exchanges summable (allreduce) or gathered (allgather) payloads, "
                f"got {kind!r}"
            )
        if kind == "allgather":
            return self._gathered(float(nbytes), reply)
        n, p, s = float(nbytes), self.workers, self.servers
        if p == 1 or n == 0:
            return (("push", 0.0), ("pull", 0.0))
        if not self.dedicated:
            t = N.collective_time("ps_push", n, p, self.net, servers=s)
            return (("push", t), ("pull", t))
        g, nodes, i, e = _levels(self.net, p)
        if self.one_machine:  # NCCL, no server
            g, nodes = p, 1
        local = (g - 1) * (i.alpha + n / g * i.beta)  # intra-node reduce-scatter (and all-gather)
        if nodes == 1:
            return (("pcie", local), ("pcie", local))
        wire = e.alpha + max(1.0, nodes / s) * n * e.beta
        out = (("push", wire), ("pull", wire))
        host = i.alpha + n / g * i.beta  # each GPU's 1/g of the node sum to (from) host memory
        return (("pcie", local + host), *out, ("pcie", local + host)) if g > 1 else out

    def _gathered(self, n: float, reply: float | None) -> tuple[tuple[str, float], ...]:
        """A payload that does not sum (top-k's pairs, ...): every worker pushes its own, the
        server decodes and sums them (server compute not modelled, as for the dense sum) and
        replies with ``reply`` bytes per worker: the dense sum, as cconv's engine does
        (``comm.aggregation.ParameterServer``), or that sum compressed by a downlink compressor."""
        if reply is None:
            raise ValueError(f"architecture {self.name!r}: a gathered payload needs the size of the server's reply")
        d, p, s = float(reply), self.workers, self.servers
        if p == 1 or (n == 0 and d == 0):
            return (("push", 0.0), ("pull", 0.0))
        if not self.dedicated:
            return (
                ("push", N.collective_time("ps_push", n, p, self.net, servers=s)),
                ("pull", N.collective_time("ps_pull", d, p, self.net, servers=s)),
            )
        g, nodes, i, e = _levels(self.net, p)
        if self.one_machine:  # NCCL's all-gather
            return (("pcie", N.collective_time("allgather", n, p, i)),)
        push = e.alpha + max(1.0, nodes / s) * g * n * e.beta  # the node's NIC carries its g payloads
        pull = e.alpha + max(1.0, nodes / s) * d * e.beta  # one reply per node
        if g == 1:
            return (("push", push), ("pull", pull))
        to_host = i.alpha + n * i.beta  # each GPU copies its payload to host memory (own lanes)
        spread = g * (i.alpha + d / g * i.beta)  # 1/g of the sum to each GPU, then the node all-gather
        return (("pcie", to_host), ("push", push), ("pull", pull), ("pcie", spread))


def _servers(servers: int | None, net: N.Network | N.Hierarchical, workers: int, dedicated: bool) -> int:
    nodes = _levels(net, workers)[1]
    if servers is None:
        return nodes  # BytePS: as many servers as worker machines
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"servers must be an integer >= 1, got {servers!r}")
    if not dedicated and servers > nodes:
        raise ValueError(f"servers must be at most the {nodes} worker machines when co-located, got {servers}")
    return servers


def _a2a(algorithm: str):
    def make(net, workers, servers=None):
        return AllToAll(algorithm, algorithm, net, workers)

    return make


def _ps(dedicated: bool):
    def make(net, workers, servers=None):
        name = "byteps" if dedicated else "ps"
        return ParameterServer(name, net, workers, _servers(servers, net, workers, dedicated), dedicated)

    return make


# name -> factory(net, workers, servers) -> Architecture
ARCHITECTURES = {
    "ring": _a2a("ring"),
    "tree": _a2a("tree"),
    "hierarchical": _a2a("hierarchical"),
    "two-level": lambda net, workers, servers=None: TwoLevel("two-level", net, workers),
    "ps": _ps(False),
    "byteps": _ps(True),
}


def get(
    name: str,
    net: N.Network | N.Hierarchical,
    workers: int,
    servers: int | None = None,
    topology: str | None = None,
) -> Architecture:
    """An architecture by name on ``net`` with ``workers`` workers (``servers`` for PS)."""
    if not isinstance(name, str) or name.lower() not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; valid: {', '.join(ARCHITECTURES)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not isinstance(net, (N.Network, N.Hierarchical)):
        net = N.get(net)
    name = name.lower()
    if topology is not None:
        topo = get_topology(topology)
        net = _scaled(net, topo.ps_beta if name in ("ps", "byteps") else topo.a2a_beta)
    return ARCHITECTURES[name](net, workers, servers)


def names() -> list[str]:
    return list(ARCHITECTURES)


__all__ = [
    "Architecture",
    "AllToAll",
    "ParameterServer",
    "TwoLevel",
    "Topology",
    "NETWORK_TOPOLOGIES",
    "ARCHITECTURES",
    "get",
    "get_topology",
    "names",
    "cost",
    "peer_latency_s",
]
