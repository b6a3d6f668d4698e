"""A target cluster as it is built: N nodes of G GPUs, an intra-node link, one inter-node network.

``Cluster(nodes, gpus_per_node, intra, inter, device)`` is frozen; ``parse("8x8", intra="NVLink",
network="25GbE", device="v100")`` builds one from the command line's words (``--cluster``,
``--intra``, ``--network``, ``--device``; ``options`` / ``from_args``).  Its ``network()`` is
what the simulator and the cost functions take: a ``Hierarchical`` network with ``per_node = G``
(a flat ``inter`` link when G = 1).

Collectives run as NCCL and Horovod's hierarchical mode run them, two levels, with the node's G
GPUs sharing its NIC(s) (``cconv.theory.network.hierarchical_time``, g = G, N = nodes, i/e =
intra/inter links, n payload bytes per GPU):

    allreduce   2(g-1)(alpha_i + n/g beta_i)              reduce-scatter, then all-gather, in the node
              + 2(N-1) alpha_e + 2(N-1)/N n beta_e        g concurrent rings of n/g bytes across nodes,
                                                          sharing the NIC: g x n/g = n bytes per step
    allgather   (N-1)(alpha_e + g n beta_e) + (g-1)(alpha_i + N n beta_i)

A node with K NICs (``--network 4x100GbIB``) divides beta_e by K (NCCL stripes its rings over the
NICs).  Presets and the rules for links named by rate: ``cconv.theory.network.presets``; devices:
``cconv.theory.devices``.
"""

from __future__ import annotations

import argparse
import re
from typing import NamedTuple

from cconv.cli_schema import Option, add_options
from cconv.theory import devices as D
from cconv.theory import network as N
from cconv.theory.devices import Device
from cconv.theory.network import Hierarchical, Network

DEFAULT_INTRA = "NVLink"
DEFAULT_NETWORK = "10GbE"
DEFAULT_DEVICE = "v100"
MAX_WORKERS = 1 << 20  # a million GPUs: anything above is a typo (and unplannable)
INTRA_LINKS = ("NVLink", "NVLink2", "NVLink3", "NVLink4", "PCIe3x16", "PCIe3x16-peak", "PCIe4x16")

_SHAPE = re.compile(r"^\s*(\d{1,7})\s*[xX*]\s*(\d{1,7})\s*$")


class Cluster(NamedTuple):
    """``nodes`` machines of ``gpus_per_node`` ``device``s on ``intra``, the nodes on ``inter``."""

    nodes: int
    gpus_per_node: int
    intra: Network
    inter: Network
    device: Device

    @property
    def workers(self) -> int:
        """P = nodes x GPUs per node."""
        return self.nodes * self.gpus_per_node

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node} {self.device.name}, {self.intra.name} + {self.inter.name}"

    def network(self) -> Network | Hierarchical:
        """The two-level network (``per_node`` = GPUs per node); the inter-node link when G = 1."""
        if self.gpus_per_node == 1:
            return self.inter
        return Hierarchical(
            f"{self.nodes}x{self.gpus_per_node}:{self.intra.name}+{self.inter.name}",
            self.intra,
            self.inter,
            self.gpus_per_node,
            f"{self.gpus_per_node} GPUs per node on {self.intra.name}, nodes on {self.inter.name}",
        )

    def collective_time(self, kind: str, nbytes: float, *, servers: int = 1) -> float:
        """Seconds of one collective of ``kind`` with ``nbytes`` per GPU among all P GPUs."""
        return N.collective_time(kind, nbytes, self.workers, self.network(), servers=servers)


def _link(what: str, name: str) -> Network:
    net = N.get(name)
    if not isinstance(net, Network):
        raise ValueError(f"{what} {name!r} is a two-level testbed; give a single link (e.g. 25GbE, NVLink)")
    return net


def parse(
    cluster: str,
    intra: str | Network = DEFAULT_INTRA,
    network: str | Network = DEFAULT_NETWORK,
    device: str | Device = DEFAULT_DEVICE,
) -> Cluster:
    """A ``Cluster`` from ``NODESxGPUS`` (``8x8``; ``4x1`` = four single-GPU machines) and the names
    of its links and device.  ValueError with one line on bad input."""
    m = _SHAPE.match(cluster) if isinstance(cluster, str) else None
    if m is None:
        raise ValueError(f"--cluster expects NODESxGPUS such as 8x8, got {str(cluster)[:40]!r}")
    nodes, per_node = int(m.group(1)), int(m.group(2))
    if nodes < 1 or per_node < 1:
        raise ValueError(f"--cluster {cluster.strip()}: nodes and GPUs per node must be >= 1")
    if nodes * per_node > MAX_WORKERS:
        raise ValueError(f"--cluster {cluster.strip()}: {nodes * per_node} GPUs is more than {MAX_WORKERS}")
    return Cluster(nodes, per_node, _link("--intra", intra), _link("--network", network), D.get(device))


CLUSTER = Option("--cluster", metavar="NODESxGPUS", help="the target cluster, e.g. 8x8 (8 nodes of 8 GPUs)")
INTRA = Option("--intra", help=lambda: f"intra-node link: {', '.join(INTRA_LINKS)} (default {DEFAULT_INTRA})")
NETWORK = Option(
    "--network",
    help=lambda: (
        "inter-node network: any <N>GbE (TCP/IP), <N>GbIB or <N>GbRoCE (RDMA), FDR, EDR, HDR, NDR, "
        f"K x LINK for K NICs per node, or a preset: {', '.join(N.names())} (default {DEFAULT_NETWORK})"
    ),
)
DEVICE = Option("--device", help=lambda: f"GPU: {', '.join(D.names())} (default {DEFAULT_DEVICE})")


def options(*, network: bool = True) -> tuple[Option, ...]:
    """The command-line table of a cluster: ``--cluster NODESxGPUS``, ``--intra``, ``--network``,
    ``--device`` (``network=False``: the command has its own ``--network``, read by ``from_args``
    as the inter-node network)."""
    return (CLUSTER, INTRA, NETWORK, DEVICE) if network else (CLUSTER, INTRA, DEVICE)


def add_arguments(parser: argparse.ArgumentParser, *, network: bool = True) -> None:
    """``options(network=network)`` on ``parser``."""
    add_options(parser, options(network=network))


def from_args(args: argparse.Namespace) -> Cluster:
    """The ``Cluster`` the parsed ``--cluster/--intra/--network/--device`` options name."""
    if getattr(args, "cluster", None) is None:
        raise ValueError("--cluster NODESxGPUS is required (e.g. --cluster 8x8)")
    return parse(
        args.cluster,
        args.intra or DEFAULT_INTRA,
        args.network or DEFAULT_NETWORK,
        args.device or DEFAULT_DEVICE,
    )


__all__ = [
    "Cluster",
    "parse",
    "options",
    "add_arguments",
    "from_args",
    "DEFAULT_INTRA",
    "DEFAULT_NETWORK",
    "DEFAULT_DEVICE",
]
