"""Alpha-beta (Hockney) communication-cost model, network presets and collective times.

A point-to-point message of n bytes takes

    T(n) = alpha + beta * n          (Hockney 1994)

with alpha the per-message start-up latency (seconds) and beta the inverse bandwidth (seconds
per byte).  Collective times follow Thakur, Rabenseifner & Gropp (IJHPCA 2005) and, for gTop-k,
Shi et al. (ICDCS 2019); P is the number of workers and n the payload bytes *per worker*:

    ring allreduce          2(P-1) alpha + 2(P-1)/P * n * beta
    ring allgather          (P-1) alpha + (P-1) * n * beta
    recursive doubling      r(P) (alpha + n beta),  r(P) = log2 P  (P a power of two), else
      (gTop-k's exchange)   floor(log2 P) + 2 (fold the extra ranks in, then out)
    PS push / pull          alpha + (P-1)/S * n * beta   (S <= P servers co-located with
                            workers, as cconv's engine puts the server on worker 0: a server's
                            link carries a 1/S shard from each of the P-1 other workers)
    broadcast               min(binomial tree ceil(log2 P)(alpha + n beta),
                                scatter + ring allgather (ceil(log2 P) + P - 1) alpha
                                + 2(P-1)/P n beta)     (MPICH picks by size; we take the min)

Presets (see ``theory/network.md`` for the derivations and sources):

* ``10GbE``, ``100GbE`` (TCP/IP) and ``100GbIB`` (RDMA): least-squares fits of (alpha, beta) to
  the survey's transfer measurements (Shi et al., "Communication-Efficient Distributed Deep
  Learning: Survey, Evaluation, and Challenges", Sec. 2): 1 MB in 1.02 / 0.51 / 0.1 ms and 16 KB
  in 0.11 / 0.03 / 0.008 ms, i.e. 8.2 / 16.5 / 83.2 and 1.2 / 4.6 / 16.7 Gb/s effective.  The
  stated throughputs are reproduced only if "1 MB" = 2^20 bytes and "16 KB" = 2^14 bytes
  (with 10^6 bytes 1.02 ms would be 7.8 Gb/s, not 8.2), so the fit uses binary units.  Each
  size gives two observations (the stated time, and the time implied by the stated throughput);
  the fit minimises the sum of squared *relative* errors over all four.
* ``PCIe3x16``: the survey's 4 x RTX 2080Ti server (PCIe 3.0 x16).  beta is calibrated on the
  survey's BERT-Large example (1.34 GB of fp32 gradients all-reduced in 441 ms on 4 GPUs): a
  ring all-reduce moving 2(P-1)/P * D bytes per GPU in 441 ms means an effective bus bandwidth
  of 4.56 GB/s, 29 % of the 15.75 GB/s PCIe 3.0 x16 peak (8 GT/s x 16 lanes, 128b/130b).
* ``PCIe3x16-peak``: the nominal PCIe 3.0 x16 bandwidth, 15.75 GB/s per direction (PCI-SIG,
  PCI Express Base Specification 3.0, 2010).
* ``NVLink``: NVLink 2.0 on a V100, 6 links x 25 GB/s per direction = 150 GB/s (NVIDIA Tesla
  V100 GPU Architecture whitepaper, 2017): nominal, an upper bound on what NCCL achieves.

Two-level networks (``Hierarchical(name, intra, inter, per_node)``, ``hierarchical_time``): the
survey's 32-GPU testbed is 8 nodes of 4 GPUs on PCIe 3.0, the nodes on 10GbE, 100GbE or
100GbIB; presets ``survey-10GbE``, ``survey-100GbE``, ``survey-100GbIB`` combine ``PCIe3x16``
with each (hierarchical all-reduce and friends, each node's NIC shared by its GPUs).

The intra-node presets' alpha (5 us) is not identifiable from the survey's single
large-message measurement; ``tests/test_theory_network.py`` checks that the 441 ms reproduction
moves by < 0.1 % when alpha ranges over 0 to 50 us.

Modules: ``links`` (``Network``, ``Hierarchical``), ``presets`` (the fit and the presets, ``get``,
``names``), ``config`` (``from_config``), ``cost`` (collective times, ``bytes_sent``),
``overlap`` (``Overlap``, ``step_comm_time``).  This package re-exports their public names.
"""

from cconv.theory.network.config import from_config
from cconv.theory.network.cost import (
    COLLECTIVES,
    allgather_time,
    allreduce_time,
    broadcast_time,
    bytes_sent,
    collective_time,
    effective_gbps,
    hierarchical_time,
    p2p_time,
    ps_time,
    recursive_doubling_rounds,
    recursive_doubling_time,
)
from cconv.theory.network.links import MAX_ALPHA, MAX_BETA, MIN_BETA, Hierarchical, Network
from cconv.theory.network.overlap import Overlap, step_comm_time, wfbp_finish
from cconv.theory.network.presets import (
    BERT_LARGE_ALLREDUCE_S,
    BERT_LARGE_BYTES,
    BERT_LARGE_COMPUTE_S,
    BERT_LARGE_GPUS,
    HIERARCHICAL,
    INTRA_NODE_ALPHA,
    KIB,
    MIB,
    NVLINK2_V100,
    PCIE3_X16_PEAK,
    PRESETS,
    SURVEY_MEASUREMENTS,
    Measurement,
    fit_alpha_beta,
    get,
    names,
)

__all__ = [
    "Network",
    "Hierarchical",
    "MAX_ALPHA",
    "MAX_BETA",
    "MIN_BETA",
    "Measurement",
    "SURVEY_MEASUREMENTS",
    "fit_alpha_beta",
    "PRESETS",
    "HIERARCHICAL",
    "names",
    "get",
    "from_config",
    "COLLECTIVES",
    "p2p_time",
    "effective_gbps",
    "recursive_doubling_rounds",
    "allreduce_time",
    "allgather_time",
    "recursive_doubling_time",
    "ps_time",
    "broadcast_time",
    "hierarchical_time",
    "collective_time",
    "bytes_sent",
    "Overlap",
    "wfbp_finish",
    "step_comm_time",
    "KIB",
    "MIB",
    "BERT_LARGE_BYTES",
    "BERT_LARGE_ALLREDUCE_S",
    "BERT_LARGE_COMPUTE_S",
    "BERT_LARGE_GPUS",
    "INTRA_NODE_ALPHA",
    "PCIE3_X16_PEAK",
    "NVLINK2_V100",
]
