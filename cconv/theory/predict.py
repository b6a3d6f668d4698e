"""Per-iteration time of every method on a ``Cluster``: compute, compression and communication.

For a workload's layer profile (``cconv.theory.profiles``: per-layer forward and backward FLOPs
and gradient bytes, at local batch M) on a cluster of P = N x G devices (``cconv.theory.cluster``):

* compute: every layer's FLOPs / the device's sustained FLOP/s (``cconv.theory.devices``);
* compression: the compressor's compress and decompress operations on the compute stream, as the
  ``implementation`` runs them (``cconv.theory.implementation``): ``fused`` (default), cconv's
  program, multiples of the device's memory read floor measured by cconv's benchmark
  (``cconv.theory.schedule.compress``); ``per-tensor``, framework ops on each tensor (launches,
  memory passes, a framework top-k's sort, one decode per gathered payload); ``mpi``, per-tensor
  ops with every payload staged through host memory; ``ddp-hook``, framework ops per PyTorch DDP
  bucket (one step of the schedule per bucket).  The dense baseline adds none (over MPI: the
  staging of its gradient);
* communication: each message's collective on the cluster's two-level network
  (``Cluster.network()``: hierarchical all-reduce, NCCL/Horovod style), issued as the
  ``schedule`` says (default ``fusion``: Horovod's tensor fusion, wait-free backpropagation
  with a 64 MiB buffer and a 5 ms cycle; also ``bsp``, ``wfbp``, ``mg-wfbp``, ``bytescheduler``),
  simulated by ``cconv.theory.schedule.schedules.run``.  The parameter-server method
  (``<identity>-ps``) runs on BytePS's architecture with one server per node.  ``architecture=
  "two-level"`` (``schedule.arch.TwoLevel``): a dense reduce inside each node and the compressed
  exchange across nodes only; the architecture's ``compression_scope`` then has each device
  compress a 1/G share of every layer and decode the N nodes' payloads.

Per row: ``iteration_time_s`` = ``compute_s`` + ``compress_s`` + ``comm_s`` where ``comm_s`` is the
communication left exposed (not hidden behind backpropagation); ``speedup`` = P t_1 / t_iter with
t_1 one device's forward + backward (no communication, no compression); ``scaling_factor`` =
speedup / P (throughput over P x one device's).  Interference of communication kernels with
compute (``interference``, kappa) is 0 by default: the survey's fitted kappa (0.84,
``schedule.survey.INTERFERENCE``) describes a PCIe-only RTX 2080Ti server where NCCL copies
through host memory, not NVLink machines; pass it explicitly to use it.

Messages are sized per tensor from the profile's tensor shapes (``Layer.shapes``), so PowerSGD's
rank-r factors of each matrix are planned (its matmuls and orthogonalisation on the compute stream
under the per-tensor implementations), with the engine's rule for vectors: a 1-D tensor (a bias, a
norm scale) is sent dense in an all-reduce and costs no compression unless ``compress_vectors``
(``implementation.vectors_of``: the plan's setting, else what the published implementation's code
does, ``Implementation.compress_vectors``, else the run config's own, ``Profile.compress_vectors``,
else the engine's default, ``ENGINE_DEFAULTS``: dense).  For a profile without shapes, a compressor whose message
of a flat layer vector is not smaller than the gradient is left out with a note, as are methods
whose defaults do not build (a knob without default values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from cconv import compressors as C
from cconv.theory import implementation as IM
from cconv.theory import planner as PL
from cconv.theory import profiles
from cconv.theory.cluster import Cluster
from cconv.theory.schedule import arch as A
from cconv.theory.schedule import compress as CC
from cconv.theory.schedule import schedules as S
from cconv.theory.schedule.compressed import GATHERABLE, _compresses

A2A = ("hierarchical", "ring", "tree", "two-level")  # collectives of the all-to-all methods
MAX_BATCH = 1 << 24


class Row(NamedTuple):
    """One method at one knob setting on the cluster (module docstring for the columns)."""

    method: str
    knobs: dict
    schedule: str
    architecture: str
    iteration_time_s: float
    compute_s: float
    comm_s: float
    compress_s: float
    bytes: float  # message bytes per worker per iteration
    speedup: float
    scaling_factor: float

    @property
    def setting(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.knobs.items()) or "-"

    def as_dict(self) -> dict[str, Any]:
        return {**self._asdict(), "setting": self.setting}


def profile_at(workload: str | profiles.Profile, batch: int | None = None) -> profiles.Profile:
    """The workload's layer profile, its FLOPs rescaled to local batch ``batch`` (linear in M)."""
    prof = workload if isinstance(workload, profiles.Profile) else profiles.get(workload)
    if batch is None or batch == prof.batch:
        return prof
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be an integer in [1, {MAX_BATCH}], got {batch!r}")
    f = batch / prof.batch
    layers = tuple(lay._replace(fwd_flops=lay.fwd_flops * f, bwd_flops=lay.bwd_flops * f) for lay in prof.layers)
    return prof._replace(layers=layers, batch=batch)


def _layer_costs(prof, method, hp, cluster, bench, notes, implementation, scope, vectors) -> list[S.LayerCost] | None:
    c = C.get(method.compressor, **hp)
    shaped = any(lay.shapes for lay in prof.layers)
    if not shaped and not _compresses(c, PL.kind_of(method, c)):
        notes.append(f"{method.name} omitted: a flat layer vector is not compressed (it needs matrix shapes)")
        return None
    try:
        share, peers = scope  # the architecture's: each GPU compresses a share, combined among peers
        return CC.layer_costs(
            prof, method, peers, cluster.device, hparams=hp, bench=bench, implementation=implementation, share=share,
            compress_vectors=vectors,
        )  # fmt: skip
    except ValueError as e:
        notes.append(f"{method.name} omitted: {' '.join(str(e).split())}")
        return None


def _planned(methods, sweep, fixed, notes):
    table = PL.all_methods()
    chosen = list(table) if methods is None else list(methods)
    unknown = [m for m in chosen if m not in table]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(table)}")
    out = []
    for name in chosen:
        try:
            sets = PL.settings(table[name], dict(sweep or {}), fixed)
            for hp in sets:
                C.get(table[name].compressor, **hp)
        except ValueError as e:
            if methods is not None:
                raise
            notes.append(f"{name} omitted: {' '.join(str(e).split())}")
            continue
        out.append((table[name], sets))
    return out


def _row(method, hp, lcs, sched, arch, interference, p, t1) -> Row:
    """The row of one method at one setting: its layers simulated under ``sched`` on ``arch``."""
    r = S.run(lcs, sched, arch, interference=interference)
    fb = sum(lc.fwd_s + lc.bwd_s for lc in lcs)
    cx = sum(lc.compress_s + lc.decompress_s for lc in lcs)
    exposed = max(0.0, r.iter_s - fb - cx)
    nbytes = sum(lc.nbytes for lc in lcs)
    return Row(method.name, dict(hp), sched.name, arch.name, r.iter_s, fb, exposed, cx, nbytes, p * t1 / r.iter_s,
               t1 / r.iter_s)  # fmt: skip


def predict(
    cluster: Cluster,
    workload: str | profiles.Profile,
    methods: Sequence[str] | None = None,
    *,
    sweep: Mapping[str, Sequence] | None = None,
    fixed: Mapping[str, Any] | None = None,
    schedule: str = "fusion",
    architecture: str = "hierarchical",
    interference: float = 0.0,
    batch: int | None = None,
    servers: int | None = None,
    topology: str | None = None,
    bench: Mapping | None = None,
    notes: list[str] | None = None,
    implementation: str | IM.Implementation = IM.DEFAULT,
    compress_vectors: bool | None = None,
) -> list[Row]:
    """One ``Row`` per (method, knob value) on ``cluster``; ``notes`` collects what was left out;
    ``implementation``: how compression runs (``cconv.theory.implementation``: fused, per-tensor, mpi, ddp-hook,
    espresso); ``compress_vectors``: whether 1-D tensors are compressed (None: ``implementation.vectors_of``, the
    implementation's own rule, else the profile's, else the engine's default: sent dense)."""
    implementation = IM.get(implementation)
    if architecture not in A2A:
        raise ValueError(f"architecture must be one of {', '.join(A2A)} (PS is the <identity>-ps method)")
    sched = S.get(schedule)
    notes = [] if notes is None else notes
    prof = profile_at(workload, batch)
    t1 = (prof.fwd_flops + prof.bwd_flops) / cluster.device.flops
    p, net = cluster.workers, cluster.network()
    rows = []
    for method, sets in _planned(methods, sweep, fixed, notes):
        ps = method.collective == PL.PS
        arch = A.get("byteps" if ps else architecture, net, p, servers if ps else None, topology)
        scope = getattr(arch, "compression_scope", (1.0, p))  # two-level: a 1/g share, among the N nodes
        for hp in sets:
            lcs = _layer_costs(prof, method, hp, cluster, bench, notes, implementation, scope, compress_vectors)
            if lcs is None:
                break
            if ps and any((lc.kind or "allreduce") not in GATHERABLE for lc in lcs):
                notes.append(f"{method.name} omitted: a parameter server aggregates summable or gathered payloads")
                break
            rows.append(_row(method, hp, lcs, sched, arch, interference, p, t1))
    if not rows:
        raise ValueError("no method left to plan: " + "; ".join(notes[:3]))
    return rows


__all__ = ["Row", "predict", "profile_at", "A2A"]
