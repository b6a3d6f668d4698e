"""Network presets fitted to the survey's measurements, and the least-squares fit itself.

* ``10GbE``, ``100GbE`` (TCP/IP) and ``100GbIB`` (RDMA): least-squares fits of (alpha, beta) to
  the survey's transfer measurements (Shi et al., "Communication-Efficient Distributed Deep
  Learning: Survey, Evaluation, and Challenges", Sec. 2), in binary units ("1 MB" = 2^20 bytes).
* ``PCIe3x16``: beta calibrated on the survey's BERT-Large example (1.34 GB all-reduced in 441 ms
  on 4 GPUs: 4.56 GB/s effective); ``PCIe3x16-peak``: 15.75 GB/s nominal; ``NVLink``: 150 GB/s.
* ``survey-10GbE``, ``survey-100GbE``, ``survey-100GbIB``: the survey's 32-GPU testbed, 4 GPUs
  per node on ``PCIe3x16``, the nodes on the named network.

Derivations and sources: ``theory/network.md`` and the ``cconv.theory.network`` docstring.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from cconv.theory.network.links import Hierarchical, Network

KIB = 1024
MIB = 1024 * 1024


# --------------------------------------------------------------------------- calibration


class Measurement(NamedTuple):
    """One transfer measurement: ``nbytes`` took ``seconds``, reported as ``gbps`` effective."""

    nbytes: int
    seconds: float
    gbps: float


# Shi et al., survey Sec. 2 ("Communication Performance"); sizes in binary units (see module doc).
SURVEY_MEASUREMENTS: dict[str, tuple[Measurement, ...]] = {
    "10GbE": (Measurement(16 * KIB, 0.11e-3, 1.2), Measurement(MIB, 1.02e-3, 8.2)),
    "100GbE": (Measurement(16 * KIB, 0.03e-3, 4.6), Measurement(MIB, 0.51e-3, 16.5)),
    "100GbIB": (Measurement(16 * KIB, 0.008e-3, 16.7), Measurement(MIB, 0.1e-3, 83.2)),
}


def fit_alpha_beta(measurements: Iterable[Measurement]) -> tuple[float, float]:
    """Least-squares (alpha, beta) minimising the squared relative error of T(n) = alpha + beta n.

    Every measurement contributes two observations: its stated time and the time implied by its
    stated throughput, 8 n / (gbps 1e9).  Relative errors weight the 16 KB and 1 MB points
    equally (absolute errors would let the 1 MB point dominate).
    """
    rows, rhs = [], []
    for m in measurements:
        for t in (m.seconds, 8.0 * m.nbytes / (m.gbps * 1e9)):
            rows.append([1.0 / t, m.nbytes / t])
            rhs.append(1.0)
    if len(rows) < 2:
        raise ValueError("fit_alpha_beta: needs at least one measurement")
    (alpha, beta), *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(rhs), rcond=None)
    return float(alpha), float(beta)


# The survey's BERT-Large example (Sec. 2): 336 M parameters, 1.34 GB in fp32, 4 GPUs over PCIe 3.0,
# 441 ms of all-reduce per iteration, 163 ms of computation, 1.08x speedup.  335,141,888 is the
# parameter count of BERT-Large from its tensor shapes (cconv.theory.workloads), 1.34 GB in fp32.
BERT_LARGE_BYTES = 335_141_888 * 4
BERT_LARGE_ALLREDUCE_S = 0.441
BERT_LARGE_COMPUTE_S = 0.163
BERT_LARGE_GPUS = 4
INTRA_NODE_ALPHA = 5e-6
PCIE3_X16_PEAK = 16 * 8e9 * (128 / 130) / 8  # bytes/s per direction: 15.75 GB/s
NVLINK2_V100 = 6 * 25e9  # bytes/s per direction per V100 GPU


def _pcie_effective_beta(alpha: float = INTRA_NODE_ALPHA) -> float:
    """beta such that one fused ring all-reduce of BERT-Large's gradients on 4 GPUs takes 441 ms."""
    p = BERT_LARGE_GPUS
    return (BERT_LARGE_ALLREDUCE_S - 2 * (p - 1) * alpha) / (2 * (p - 1) / p * BERT_LARGE_BYTES)


def _presets() -> dict[str, Network]:
    out = {}
    for name, ms in SURVEY_MEASUREMENTS.items():
        a, b = fit_alpha_beta(ms)
        proto = "RDMA" if "IB" in name else "TCP/IP"
        out[name] = Network(name, a, b, f"fit to the survey's 16 KB / 1 MB transfer times ({proto})")
    out["PCIe3x16"] = Network(
        "PCIe3x16",
        INTRA_NODE_ALPHA,
        _pcie_effective_beta(),
        "survey's 4x RTX 2080Ti server: BERT-Large all-reduce 441 ms (effective bus bandwidth 4.56 GB/s)",
    )
    out["PCIe3x16-peak"] = Network(
        "PCIe3x16-peak",
        INTRA_NODE_ALPHA,
        1.0 / PCIE3_X16_PEAK,
        "PCI Express 3.0 x16 nominal: 8 GT/s x 16, 128b/130b = 15.75 GB/s",
    )
    out["NVLink"] = Network(
        "NVLink", INTRA_NODE_ALPHA, 1.0 / NVLINK2_V100, "NVLink 2.0 on V100: 6 links x 25 GB/s per direction = 150 GB/s"
    )
    return out


PRESETS: dict[str, Network] = _presets()

# The survey's 32-GPU testbed: 8 nodes of 4 RTX 2080Ti on PCIe 3.0, nodes on one of the three networks.
HIERARCHICAL: dict[str, Hierarchical] = {
    f"survey-{name}": Hierarchical(
        f"survey-{name}",
        PRESETS["PCIe3x16"],
        PRESETS[name],
        4,
        f"the survey's testbed: 4 GPUs per node on PCIe3x16, nodes on {name}",
    )
    for name in SURVEY_MEASUREMENTS
}


# --------------------------------------------------------------------------- rules for named links
#
# A link named by its line rate (``25GbE``, ``200GbIB``, ``25GbRoCE``), an InfiniBand generation
# (``FDR``, ``EDR``, ``HDR``, ``NDR``), or ``K x`` a link (``4x100GbIB``: K NICs per node, striped as
# NCCL does with one ring per NIC) is derived from the fitted presets by two stated rules:
#
# * Ethernet with TCP/IP (``<N>GbE``): alpha of the fitted ``10GbE`` (the TCP/IP stack's latency, not
#   the line rate's), asymptotic bandwidth = N Gb/s x the fitted ``10GbE``'s efficiency (its
#   asymptotic 9.06 Gb/s over the 10 Gb/s line rate, 0.906).  The exact name ``100GbE`` stays the
#   survey's measured IPoIB preset (17.2 Gb/s asymptotic: a single TCP stream over InfiniBand).
# * RDMA (``<N>GbIB``, ``<N>GbRoCE``, the InfiniBand generations): alpha of the fitted ``100GbIB``,
#   bandwidth = N Gb/s x its efficiency (89.3 / 100).  RoCE runs the same verbs over Ethernet; its
#   latency is taken equal to InfiniBand's (an assumption).
#
# InfiniBand generations, 4x links, data rates after line coding (InfiniBand Trade Association,
# "InfiniBand Roadmap"; IBTA Architecture Specification Vol. 2): FDR 4 x 14.0625 Gbaud with 64b/66b =
# 54.5 Gb/s, EDR 100 Gb/s, HDR 200 Gb/s, NDR 400 Gb/s.
#
# Intra-node links beyond the fitted ones (nominal per-direction bandwidth per GPU, upper bounds on
# what NCCL reaches): ``NVLink3`` (A100: 12 links x 25 GB/s = 300 GB/s, NVIDIA A100 Tensor Core GPU
# Architecture whitepaper, 2020), ``NVLink4`` (H100: 18 links x 25 GB/s = 450 GB/s, NVIDIA H100
# whitepaper, 2022); ``NVLink2`` is ``NVLink``.  ``PCIe4x16``: the ``PCIe3x16`` effective bandwidth
# x 2 (PCIe 4.0 doubles the transfer rate to 16 GT/s, same coding: a rule).

IB_GENERATIONS = {"FDR": 4 * 14.0625 * 64 / 66, "EDR": 100.0, "HDR": 200.0, "NDR": 400.0}  # Gb/s data rate
NVLINK = {"NVLink2": NVLINK2_V100, "NVLink3": 12 * 25e9, "NVLink4": 18 * 25e9}  # bytes/s per direction
MAX_RATE_GBPS = 1e5  # a line rate above 100 Tb/s is a typo, not a network
MIN_RATE_GBPS = 1e-3  # nor one below 1 Mb/s (0.000...1GbE: times of inf seconds, speedups of nan)
MAX_NICS = 64


def _rate_link(name: str, gbps: float, rdma: bool) -> Network:
    if not (math.isfinite(gbps) and MIN_RATE_GBPS <= gbps <= MAX_RATE_GBPS):
        raise ValueError(f"network {name[:40]!r}: the line rate must be in [{MIN_RATE_GBPS:g}, {MAX_RATE_GBPS:g}] Gb/s")
    base = PRESETS["100GbIB" if rdma else "10GbE"]
    line = 100.0 if rdma else 10.0
    efficiency = base.gbps / line
    rule = "RDMA: alpha and efficiency of the fitted 100GbIB" if rdma else "TCP/IP: alpha and efficiency of 10GbE"
    return Network(name, base.alpha, 8.0 / (efficiency * gbps * 1e9), f"{gbps:g} Gb/s line rate; {rule}")


_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*gb(e|ib|roce)$", re.IGNORECASE)
_MULTI = re.compile(r"^(\d+)\s*x\s*(.+)$", re.IGNORECASE)


def _derived(name: str) -> Network | None:
    """A link by rule (the comment above), or None if ``name`` follows none."""
    key = name.strip()
    m = _MULTI.match(key)
    if m:
        k, inner = int(m.group(1)), get(m.group(2))
        if not 1 <= k <= MAX_NICS or not isinstance(inner, Network):
            raise ValueError(f"network {name[:40]!r}: K x LINK needs 1 <= K <= {MAX_NICS} and a single-level link")
        return Network(key, inner.alpha, inner.beta / k, f"{k} x {inner.name} striped (one ring per NIC)")
    m = _RATE.match(key)
    if m:
        return _rate_link(key, float(m.group(1)), m.group(2).lower() != "e")
    for gen, gbps in IB_GENERATIONS.items():
        if key.upper() in (gen, f"{gen}IB", f"{gen}-IB"):
            return _rate_link(key, gbps, True)._replace(source=f"InfiniBand {gen} 4x: {gbps:.1f} Gb/s data rate (IBTA)")
    for nv, bw in NVLINK.items():
        if key.lower() == nv.lower():
            return Network(nv, INTRA_NODE_ALPHA, 1.0 / bw, f"{nv}: {bw / 1e9:g} GB/s per direction per GPU (NVIDIA)")
    if key.lower() == "pcie4x16":
        pcie = PRESETS["PCIe3x16"]
        rule = "PCIe 4.0 x16: the PCIe3x16 effective bandwidth x 2 (rule)"
        return Network("PCIe4x16", pcie.alpha, pcie.beta / 2, rule)
    return None


def names() -> list[str]:
    """Names of the network presets (flat links, then the survey's two-level testbeds); any
    ``<N>GbE``, ``<N>GbIB``, ``<N>GbRoCE``, FDR/EDR/HDR/NDR, NVLink2/3/4, PCIe4x16 and ``K x LINK``
    are accepted too (rules in the comment above)."""
    return list(PRESETS) + list(HIERARCHICAL)


def get(name: str) -> Network | Hierarchical:
    """A preset by name (case-insensitive), e.g. ``get("10GbE")`` or ``get("survey-100GbIB")``, or a
    link by rule: ``get("25GbE")``, ``get("HDR")``, ``get("4x100GbIB")``."""
    if isinstance(name, (Network, Hierarchical)):
        return name
    if isinstance(name, str):
        for key, net in {**PRESETS, **HIERARCHICAL}.items():
            if key.lower() == name.strip().lower():
                return net
        net = _derived(name)
        if net is not None:
            return net
    raise ValueError(
        f"unknown network {str(name)[:40]!r}; valid presets: {', '.join(names())}, any <N>GbE / <N>GbIB / "
        "<N>GbRoCE, FDR, EDR, HDR, NDR, NVLink2/3/4, PCIe4x16, K x LINK (or a dict with name, alpha, beta)"
    )
