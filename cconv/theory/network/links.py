"""The two kinds of network in the alpha-beta model: a flat link and a two-level (node) network.

``Network(name, alpha, beta)``: a point-to-point message of n bytes takes alpha + beta n seconds
(Hockney 1994).  ``Hierarchical(name, intra, inter, per_node)``: workers grouped in nodes on a
fast intra-node link, the nodes' NICs on a slower one.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Network(NamedTuple):
    """A link in the alpha-beta model: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    name: str
    alpha: float
    beta: float
    source: str = ""

    @property
    def bandwidth(self) -> float:
        """Asymptotic bandwidth 1/beta in bytes per second."""
        return 1.0 / self.beta

    @property
    def gbps(self) -> float:
        """Asymptotic bandwidth in Gb/s (10^9 bits per second)."""
        return 8.0 / self.beta / 1e9


class Hierarchical(NamedTuple):
    """Two levels: ``per_node`` workers per node on ``intra`` (PCIe/NVLink), nodes on ``inter``.

    Workers are numbered node-major (ranks 0..g-1 on node 0, ...); every node has one ``inter``
    link (NIC) shared by its g workers.  Collective times: see ``hierarchical_time``.
    """

    name: str
    intra: Network
    inter: Network
    per_node: int
    source: str = ""


# The range of a link the model is meant for: beyond it a value is a typo, and the times computed
# from it overflow (inf) or vanish (a speedup of nan); issue 34.
MAX_ALPHA = 1.0  # seconds per message
MIN_BETA = 1e-15  # seconds per byte: 8 Pb/s, above any link (the fastest named rate is 100 Tb/s)
MAX_BETA = 1.0  # seconds per byte: 8 b/s


def _validate(name: str, alpha: float, beta: float) -> Network:
    shown_name = repr(str(name)[:40])
    for what, v in (("alpha", alpha), ("beta", beta)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"network {shown_name}: {what} must be a finite number, got {str(v)[:40]!r}")
    if not 0 <= alpha <= MAX_ALPHA:
        raise ValueError(
            f"network {shown_name}: alpha (seconds per message) must be in [0, {MAX_ALPHA:g}], got {alpha!r}"
        )
    if not MIN_BETA <= beta <= MAX_BETA:
        raise ValueError(
            f"network {shown_name}: beta (seconds per byte) must be in [{MIN_BETA:g}, {MAX_BETA:g}], got {beta!r}"
        )
    return Network(str(name), float(alpha), float(beta))
