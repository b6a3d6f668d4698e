"""Every schedule with every compressor: ``cconv plan --methods all`` (open problem 5.4).

Each of the survey's seven methods (``survey.METHODS``: a schedule on an architecture) is
combined with every planner method (``planner.all_methods``: the registered compressors with
their aggregation or extra collective) at each of its knob's default values
(``planner.settings``); the layers carry the compressor's message and its compress and
decompress operations (``compress.layer_costs``), and the iteration is simulated
(``schedules.run``).  A row's speedup is P t_1 / t_iter with t_1 the one-GPU forward + backward
without compression, so compression compute counts against the method.

On a parameter-server architecture a gathered payload (top-k's pairs, signs with their scale,
...) is pushed by every worker; the server decodes and sums and replies with the dense sum (cconv's
engine, ``comm.aggregation.ParameterServer`` without a downlink compressor): push the payload,
pull the dense bytes (``arch.ParameterServer``); with dedicated servers on several machines the
servers' CPUs decode (not modelled, as their dense sums are not), so the workers' decompress is 0.

Left out, each with a note: gTop-k's recursive doubling on a parameter-server architecture (it is
an all-to-all algorithm), a method whose default hyper-parameters do not build (a
knob without default values), one without measured compress/decompress ratios, and one whose
message of a flat layer vector is not smaller than the gradient (a compressor that needs matrix
shapes, which a profile does not keep).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from cconv import compressors as C
from cconv.theory import network as N
from cconv.theory import planner as PL
from cconv.theory import profiles
from cconv.theory import workloads as W
from cconv.theory.profiles import FLOAT_BYTES
from cconv.theory.schedule import arch as A
from cconv.theory.schedule import compress as CC
from cconv.theory.schedule import schedules as S
from cconv.theory.schedule import survey as SV

PS_ARCHITECTURES = ("ps", "byteps")
GATHERABLE = ("allreduce", "allgather")  # what a parameter server aggregates (push, sum, pull)


class Row(NamedTuple):
    method: str  # "<survey method>+<planner method>"
    schedule: str
    architecture: str
    compressor: str
    setting: str
    iter_s: float
    compute_s: float  # compute stream busy time, compress and decompress included
    comm_exposed_s: float
    compress_s: float
    decompress_s: float
    bytes: float  # message bytes per worker per iteration
    speedup: float

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def profile_of(workload: str) -> profiles.Profile:
    """The workload's layer profile rescaled to the survey's C per sample (as ``survey.layers_of``)."""
    return profiles.scaled(profiles.get(workload), W.get(workload).flops_per_sample)


def _compresses(c, kind: str) -> bool:
    """The message of a flat vector is smaller than the gradient (false for matrix-only methods)."""
    d = 1 << 16
    if PL.per_tensor(kind):
        return sum(PL.payload_leaf_bytes(c, (d,))) < FLOAT_BYTES * d
    return True


def _planned(
    prof: profiles.Profile,
    comps: Sequence[str],
    table: Mapping[str, PL.Method],
    workers: int,
    device,
    sweep: Mapping[str, Sequence] | None,
    bench: Mapping,
    notes: list[str],
) -> list[tuple[PL.Method, dict, list[S.LayerCost]]]:
    """(method, setting, layer costs) of every compressor method at each knob value; what cannot be
    planned is left out with a note (module docstring)."""
    planned: list[tuple[PL.Method, dict, list[S.LayerCost]]] = []
    for name in comps:
        method = table[name]
        try:
            sets = PL.settings(method, dict(sweep or {}))
            built = [(hp, C.get(method.compressor, **hp)) for hp in sets]
        except ValueError as e:
            notes.append(f"{name} omitted: {' '.join(str(e).split())}")
            continue
        for hp, c in built:
            if not _compresses(c, PL.kind_of(method, c)):
                notes.append(f"{name} omitted: a flat layer vector is not compressed (it needs matrix shapes)")
                break
            try:
                lcs = CC.layer_costs(prof, method, workers, device, hparams=hp, bench=bench)
            except ValueError as e:
                notes.append(f"{name} omitted: {' '.join(str(e).split())}")
                break
            planned.append((method, hp, lcs))
    return planned


def _row(sm: str, arch, method: PL.Method, hp: dict, lcs: list[S.LayerCost], interference: float, p_t1: float) -> Row:
    """One survey method (schedule ``SV.METHODS[sm]`` on ``arch``) with one compressor setting;
    ``p_t1``: P t_1 (the speedup is P t_1 / iter_s)."""
    m = SV.METHODS[sm]
    if m.architecture in PS_ARCHITECTURES and not arch.workers_decode_gathered:  # servers decode, reply dense
        lcs = [lc._replace(decompress_s=0.0) if lc.kind == "allgather" else lc for lc in lcs]
    r = S.run(lcs, m.schedule, arch, interference=interference)
    setting = ", ".join(f"{k}={v}" for k, v in hp.items()) or "-"
    name = f"{sm}+{method.name}" + (f"({setting})" if hp else "")
    compress, decompress = sum(lc.compress_s for lc in lcs), sum(lc.decompress_s for lc in lcs)
    nbytes, speedup = sum(lc.nbytes for lc in lcs), p_t1 / r.iter_s
    return Row(name, m.schedule, m.architecture, method.name, setting, r.iter_s, r.compute_s, r.comm_exposed_s,
               compress, decompress, nbytes, speedup)  # fmt: skip


def _check_names(methods: Sequence[str] | None, compressors: Sequence[str] | None) -> tuple[list, dict, list]:
    """The chosen survey methods, the compressor methods' table (PS is an architecture here) and
    the chosen ones; one-line errors for unknown names."""
    chosen = list(SV.METHODS) if methods is None else list(methods)
    unknown = [m for m in chosen if m not in SV.METHODS]
    if unknown:
        raise ValueError(f"unknown survey method(s) {', '.join(unknown)}; valid: {', '.join(SV.METHODS)}")
    table = {k: m for k, m in PL.all_methods().items() if m.collective != PL.PS}
    comps = list(table) if compressors is None else list(compressors)
    bad = [m for m in comps if m not in table]
    if bad:
        raise ValueError(f"unknown compressor method(s) {', '.join(bad)}; valid: {', '.join(table)}")
    return chosen, table, comps


def rows(
    workload: str,
    workers: int,
    net: N.Network | N.Hierarchical,
    device_flops: float = W.SURVEY_DEVICE_FLOPS,
    *,
    servers: int | None = None,
    interference: float = SV.INTERFERENCE,
    topology: str | None = None,
    methods: Sequence[str] | None = None,
    compressors: Sequence[str] | None = None,
    sweep: Mapping[str, Sequence] | None = None,
    notes: list[str] | None = None,
    bench: Mapping | None = None,
    mem_bw: float = CC.RTX2080TI_MEM_BW,
) -> list[Row]:
    """One ``Row`` per (survey method, planner method, knob value); ``notes`` collects what was
    left out and why (module docstring)."""
    chosen, table, comps = _check_names(methods, compressors)
    notes = [] if notes is None else notes
    bench = CC.load_bench() if bench is None else bench
    prof = profile_of(workload)
    device = CC.SURVEY_DEVICE._replace(flops=float(device_flops), mem_bw=float(mem_bw))
    t1 = (prof.fwd_flops + prof.bwd_flops) / device.flops
    planned = _planned(prof, comps, table, workers, device, sweep, bench, notes)
    out = []
    for sm in chosen:
        ps = SV.METHODS[sm].architecture in PS_ARCHITECTURES
        arch = A.get(SV.METHODS[sm].architecture, net, workers, servers if ps else None, topology)
        for method, hp, lcs in planned:
            if not (ps and any((lc.kind or "allreduce") not in GATHERABLE for lc in lcs)):
                out.append(_row(sm, arch, method, hp, lcs, interference, workers * t1))
    if any(SV.METHODS[s].architecture in PS_ARCHITECTURES for s in chosen):
        notes.append(
            "parameter-server methods are combined with summable and gathered payloads (the server decodes, "
            "sums and replies dense, as cconv's engine); gTop-k's recursive doubling is an all-to-all method"
        )
    if not out:
        raise ValueError("no schedule x compressor combination left to plan")
    return out


__all__ = ["Row", "rows", "profile_of"]
