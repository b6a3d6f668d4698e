"""The survey's seven lossless methods (Shi et al., "Communication-Efficient Distributed Deep
Learning: Survey, Evaluation, and Challenges", Sec. 4, Table 2, Fig. 4) as schedule x architecture:

    BSP-PS, WFBP-PS, ByteScheduler-PS     BytePS with one dedicated server per worker machine
    BSP-A2A, WFBP-A2A, ByteScheduler-A2A  Horovod/NCCL hierarchical all-reduce
    MG-WFBP                               the optimal merge on the hierarchical all-reduce

A workload is its layer profile (``cconv.theory.profiles``: the shape of the FLOPs and bytes
over the layers) rescaled to the survey's C per sample (``cconv.theory.workloads``: I x D, or
BERT-Large's measured 597 GFLOPs), on a device of ``device_flops`` (default: the rate fitted to
BERT-Large's 163 ms).  speedup = P t_1 / t_iter with t_1 the one-GPU iteration (forward +
backward, no communication), the survey's throughput over one RTX 2080Ti.

``rows`` is the method set ``cconv plan --methods survey`` (``cconv.theory.schedule.sets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from cconv.theory import network as N
from cconv.theory import profiles
from cconv.theory import workloads as W
from cconv.theory.schedule import arch as A
from cconv.theory.schedule import schedules as S

# kappa, the share of a GPU that communication kernels on it take while they run (intra-node
# NCCL collectives and BytePS's PCIe stages; ``schedules.run``'s ``interference``).  Fitted, by
# bisection (``fit_interference``), to one number: the survey's best 4-GPU BERT-Large speedup,
# 1.2x (Sec. 4.2.1); the bisection gives 0.838.  Nothing held out was used.
INTERFERENCE = 0.84
BERT_LARGE_4GPU_BEST = 1.2


class Method(NamedTuple):
    name: str
    schedule: str
    architecture: str


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("BSP-PS", "bsp", "byteps"),
        Method("BSP-A2A", "bsp", "hierarchical"),
        Method("WFBP-PS", "wfbp", "byteps"),
        Method("WFBP-A2A", "wfbp", "hierarchical"),
        Method("MG-WFBP", "mg-wfbp", "hierarchical"),
        Method("ByteScheduler-PS", "bytescheduler", "byteps"),
        Method("ByteScheduler-A2A", "bytescheduler", "hierarchical"),
    )
}


class Row(NamedTuple):
    method: str
    schedule: str
    architecture: str
    iter_s: float
    compute_s: float
    comm_exposed_s: float
    speedup: float

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def layers_of(workload: str, device_flops: float = W.SURVEY_DEVICE_FLOPS) -> list[S.LayerCost]:
    """The workload's layer profile rescaled to the survey's C per sample, in seconds on the device."""
    prof = profiles.scaled(profiles.get(workload), W.get(workload).flops_per_sample)
    return S.layer_costs(prof.layers, device_flops)


def rows(
    workload: str,
    workers: int,
    net: N.Network | N.Hierarchical,
    device_flops: float = W.SURVEY_DEVICE_FLOPS,
    *,
    servers: int | None = None,
    methods: Sequence[str] | None = None,
    layers: Sequence[S.LayerCost] | None = None,
    interference: float = INTERFERENCE,
    topology: str | None = None,
) -> list[Row]:
    """One ``Row`` per method (default: all seven, in the survey's order); ``layers`` overrides
    the workload's profile."""
    chosen = list(METHODS) if methods is None else list(methods)
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown survey method(s) {', '.join(unknown)}; valid: {', '.join(METHODS)}")
    lays = S.check_layers(layers if layers is not None else layers_of(workload, device_flops))
    t1 = sum(lc.fwd_s + lc.bwd_s for lc in lays)
    out = []
    for name in chosen:
        m = METHODS[name]
        a = A.get(m.architecture, net, workers, servers if m.architecture in ("ps", "byteps") else None, topology)
        r = S.run(lays, m.schedule, a, interference=interference)
        out.append(
            Row(name, m.schedule, m.architecture, r.iter_s, r.compute_s, r.comm_exposed_s, workers * t1 / r.iter_s)
        )
    return out


def best(rs: Sequence[Row]) -> Row:
    """The fastest row (ties: the earlier one)."""
    return max(rs, key=lambda r: r.speedup)


def fit_interference(target: float = BERT_LARGE_4GPU_BEST, lo: float = 0.0, hi: float = 2.0, steps: int = 12) -> float:
    """kappa at which the best of the seven methods on BERT-Large, 4 GPUs in one node (PCIe),
    reaches ``target`` (bisection; the best speedup falls as kappa grows)."""
    net = N.get("survey-100GbIB")  # 4 workers = one node: only the PCIe level is used
    lays = layers_of("bert-large")
    for _ in range(steps):
        mid = (lo + hi) / 2
        if best(rows("bert-large", 4, net, layers=lays, interference=mid)).speedup > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


__all__ = [
    "Method",
    "METHODS",
    "Row",
    "rows",
    "best",
    "layers_of",
    "fit_interference",
    "INTERFERENCE",
]
