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


def names() -> list[str]:
    """Names of the network presets (flat links, then the survey's two-level testbeds)."""
    return list(PRESETS) + list(HIERARCHICAL)


def get(name: str) -> Network | Hierarchical:
    """A preset by name (case-insensitive), e.g. ``get("10GbE")`` or ``get("survey-100GbIB")``."""
    if isinstance(name, (Network, Hierarchical)):
        return name
    if isinstance(name, str):
        for key, net in {**PRESETS, **HIERARCHICAL}.items():
            if key.lower() == name.lower():
                return net
    raise ValueError(
        f"unknown network {name!r}; valid presets: {', '.join(names())} (or a dict with name, alpha, beta)"
    )
