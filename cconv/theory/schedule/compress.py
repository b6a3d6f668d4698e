"""Compression inside the schedule (the survey's open problem 5.4): compress and decompress as
operations of the iteration DAG, per layer, on the compute stream.

For a profile layer of d = grad_bytes / 4 elements and a compressor c (a registry entry with its
hyper-parameters), ``layer_costs`` gives the ``schedules.LayerCost`` the simulator runs:

* ``nbytes``: the message of the layer, ``Theory.wire_bytes`` (the paper's closed form; the
  compressor's own ``wire_bytes`` where the entry has no theory) of a flat d-vector; the
  ``kind``: the compressor's aggregation (``"allreduce"`` for summable payloads, ``"allgather"``
  otherwise; an aggregation that is not one network collective is one all-reduce of the summed
  payload leaves, as ``planner.calls`` plans it);
* ``compress_s`` = x_c(d) F(d) + launch, ``decompress_s`` = m x_d(d) F(d) + launch, where
  F(d) = 4 d / B is the device's memory *read floor* (one read of the fp32 gradient at memory
  bandwidth B), x_c and x_d are cconv's measured compress and decompress times as multiples of
  the read floor on the benchmark machine (``studies/benchmarks/results/*.json``, part (a),
  rows named by the registry entry, interpolated log-linearly in d between the measured sizes
  1e5 ... 2.5e7 and held constant outside; a compressor without a row gets an estimate and a
  warning, ``estimated_rows``), ``launch`` a fixed per-operation cost (GPU kernel
  launch; an assumption, ``Device.launch_s``), and m the number of payloads a worker decodes:
  P for an all-gather (the engine decompresses every gathered payload, batched in one ``vmap``,
  and sums), ceil(log2 P)
  for recursive doubling (gTop-k merges one payload per round), else 1;
* the identity compressor (the dense baseline) adds no operation.

A framework implementation (``cconv.theory.implementation``) charges each tensor's operations
instead (``_per_tensor_ops``); one with DDP buckets (``ddp-hook``) gives one ``LayerCost`` per
bucket (``bucket_layers``: the backward of its layers, then one flat tensor's compress, message
and decompress).  ``share`` < 1 (a two-level collective): each worker compresses that share.

Assumptions, stated: the ratio x is scale-free (a GPU kernel is as far from its read floor as
cconv's CPU kernel is from the CPU's), sparsifiers' x was measured at ratio 0.01 and is used for
every ratio (selection cost depends little on k), and the benchmark's ``--tuned-malloc`` table
(``cpu-tuned-malloc.json``) is the default because the default-malloc table's 1e7-element rows
are dominated by page faults of fresh mmaps (DEVELOPERS.md), not by the compressor.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from cconv import compressors as C
from cconv.compressors.base import Compressor
from cconv.theory import implementation as IM
from cconv.theory import planner as PL
from cconv.theory import workloads as W
from cconv.theory.devices import LAUNCH_S, Device
from cconv.theory.profiles import FLOAT_BYTES, Profile
from cconv.theory.schedule.schedules import LayerCost

RESULTS = Path(__file__).resolve().parents[3] / "studies" / "benchmarks" / "results"
DEFAULT_BENCH = RESULTS / "cpu-tuned-malloc.json"
RTX2080TI_MEM_BW = 616e9  # bytes/s: 352-bit GDDR6 at 14 Gb/s (NVIDIA's specification)


SURVEY_DEVICE = Device(
    "RTX2080Ti",
    W.SURVEY_DEVICE_FLOPS,
    RTX2080TI_MEM_BW,
    LAUNCH_S,
    "the survey's GPU: 3.66 TFLOP/s sustained on BERT-Large (workloads.py), 616 GB/s memory",
)


class Ratio(NamedTuple):
    """Measured times of one compressor as multiples of the read floor at ``d`` elements."""

    d: float
    compress_x: float
    decompress_x: float


def load_bench(path: str | Path | None = None) -> dict[str, tuple[Ratio, ...]]:
    """Compressor name -> measured ratios (sorted by d) from a benchmark JSON (part (a) rows)."""
    p = Path(path) if path is not None else DEFAULT_BENCH
    try:
        data = json.loads(p.read_text())
        rows = data["a"]["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read benchmark ratios from {p}: {e}") from None
    out: dict[str, list[Ratio]] = {}
    for r in rows:
        if all(k in r for k in ("name", "d", "compress_x", "decompress_x")):
            out.setdefault(r["name"], []).append(Ratio(float(r["d"]), float(r["compress_x"]), float(r["decompress_x"])))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def ratio_at(rows: Sequence[Ratio], d: float) -> tuple[float, float]:
    """(compress_x, decompress_x) at ``d`` elements: log-linear interpolation, constant outside."""
    if not rows:
        raise ValueError("no measured ratios")
    if d <= rows[0].d:
        return rows[0].compress_x, rows[0].decompress_x
    if d >= rows[-1].d:
        return rows[-1].compress_x, rows[-1].decompress_x
    for a, b in zip(rows, rows[1:]):
        if a.d <= d <= b.d:
            w = (math.log(d) - math.log(a.d)) / (math.log(b.d) - math.log(a.d))
            return a.compress_x + w * (b.compress_x - a.compress_x), a.decompress_x + w * (
                b.decompress_x - a.decompress_x
            )
    raise AssertionError("unreachable")  # pragma: no cover


# payloads a worker decodes per call, by network collective kind (default 1): implementation.decodes
DECODES = {k: (lambda p, k=k: IM.decodes(k, p)) for k in ("allgather", "recursive_doubling")}


class EstimatedCostWarning(UserWarning):
    """A compressor without a benchmark row: its compress/decompress cost is an estimate (the
    command line prints it as one line)."""

    one_line = True


def estimated_rows(name: str, bench: Mapping[str, Sequence[Ratio]]) -> tuple[Ratio, ...]:
    """Ratios for a compressor the benchmark did not measure (a new or user-registered one):
    its entry's ``Bench.target_x`` (the multiple of the read floor it is meant to reach) for
    compress and decompress where it declares one, else the median of the measured
    compressors' ratios at each d; warns (``EstimatedCostWarning``) with the estimate used."""
    e = C.entry(name)
    target = e.bench.target_x if e.bench is not None else None
    if target is not None:
        rows, how = (Ratio(1.0, float(target), float(target)),), f"its Bench.target_x = {target:g}"
    else:
        ds = sorted({r.d for rs in bench.values() for r in rs})
        if not ds:
            raise ValueError(f"no benchmark rows at all to estimate {name!r}'s compress/decompress cost from")
        med = lambda xs: float(sorted(xs)[len(xs) // 2])  # noqa: E731
        at = [[ratio_at(rs, d) for rs in bench.values() if rs] for d in ds]
        rows = tuple(Ratio(d, med([c for c, _ in a]), med([x for _, x in a])) for d, a in zip(ds, at))
        how = "the median of the measured compressors"
    warnings.warn(
        f"no benchmark row for {name!r}: its compress/decompress cost is estimated from {how} (x the read floor)",
        EstimatedCostWarning,
        stacklevel=4,  # estimated_rows <- _fused_ops <- layer_cost <- its caller (layer_parts, or a user's call)
    )
    return rows


def _wire(c: Compressor, shape: tuple[int, ...]) -> float:
    theory = C.entry_of(c).theory
    if theory is not None and theory.wire_bytes is not None:
        return float(theory.wire_bytes(c, tuple(shape), FLOAT_BYTES))
    return float(c.wire_bytes(tuple(shape), "float32"))


_LEAVES: dict[tuple, float] = {}


def _leaf_bytes(c: Compressor, shape: tuple[int, ...]) -> float:
    """Summed floating payload leaves of ``c`` on ``shape`` (``planner.payload_leaf_bytes``), cached."""
    key = (c.name, tuple(sorted((k, repr(v)) for k, v in c.hparams.items())), tuple(shape))
    if key not in _LEAVES:
        _LEAVES[key] = float(sum(PL.payload_leaf_bytes(c, tuple(shape))))
    return _LEAVES[key]


def _message(c: Compressor, kind: str, shapes: Sequence[tuple[int, ...]], d: int, impl: IM.Implementation) -> float:
    """Bytes of the layer's message: per tensor for a per-tensor aggregation (PowerSGD: its factors
    need the matrix shapes) or a per-tensor implementation (its codes unpacked, ``message_bytes``),
    else of the flat d-vector."""
    if PL.per_tensor(kind):
        return sum(_leaf_bytes(c, s) for s in shapes)
    if not impl.per_tensor:
        return _wire(c, (d,))
    return sum(IM.message_bytes(c, s, _wire(c, s), impl) for s in shapes)


def _fused_ops(c, method, d, kind, workers, device, bench) -> tuple[float, float]:
    """(compress, decompress) seconds of cconv's fused program on the layer (module docstring)."""
    rows = bench.get(method.compressor) or estimated_rows(method.compressor, bench)
    cx, dx = ratio_at(rows, d)
    floor = device.read_floor(d)
    m = IM.decodes(kind, workers)
    return cx * floor + device.launch_s, m * dx * floor + device.launch_s


def _per_tensor_ops(c, shapes, kind, workers, device, impl, sizes) -> tuple[float, float]:
    """(compress, decompress) seconds of framework ops on each tensor, with host staging over MPI
    (``cconv.theory.implementation``); ``sizes``: each tensor's message bytes."""
    m = IM.decodes(kind, workers)
    comp = dec = 0.0
    for s, b in zip(shapes, sizes):
        out, back = IM.staging_s(impl, kind, b, workers)
        comp += IM.compress_s(c, s, impl, device) + out
        dec += IM.decompress_s(c, s, impl, device, m) + back
    return comp, dec


def layer_cost(
    name: str,
    fwd_s: float,
    bwd_s: float,
    d: int,
    method: PL.Method,
    c: Compressor,
    workers: int,
    device: Device,
    bench: Mapping[str, Sequence[Ratio]],
    shapes: Sequence[tuple[int, ...]] = (),
    implementation: str | IM.Implementation = IM.DEFAULT,
    share: float = 1.0,
) -> LayerCost:
    """The ``LayerCost`` of one layer of ``d`` elements (tensors ``shapes``; () = one flat vector)
    under ``method`` with compressor ``c``, run by ``implementation`` (``cconv.theory.implementation``);
    ``share``: the fraction of the layer each worker compresses and decodes (a two-level collective's
    1/g: the fused program runs on share x d elements, framework ops on a share of the tensors)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    if d <= 0:
        return LayerCost(name, fwd_s, bwd_s, 0.0)
    impl = IM.get(implementation)
    shapes = tuple(tuple(s) for s in shapes) or ((int(d),),)
    kind = PL.kind_of(method, c)
    if kind == PL.PS:
        kind = "allreduce"  # the architecture decides push/pull
    if C.registered_name(c) == PL.identity_name():  # no compression; over MPI the gradient is staged through the host
        out, back = IM.staging_s(impl, "allreduce", FLOAT_BYTES * float(d), workers)
        return LayerCost(name, fwd_s, bwd_s, FLOAT_BYTES * float(d), share * out, share * back, kind)
    if impl.per_tensor:  # the matrices a framework implementation factorises (PowerSGD: shape[0] x rest)
        shapes = tuple(IM.tensor_view(c, s, impl) for s in shapes)
    sizes = [_message(c, kind, (s,), int(math.prod(s)), impl) for s in shapes]
    nbytes = _message(c, kind, shapes, d, impl)
    if PL.per_tensor(kind):  # not one network collective: all-reduce of the summed payload leaves
        kind = "allreduce"
    if impl.per_tensor:
        comp, dec = (share * t for t in _per_tensor_ops(c, shapes, kind, workers, device, impl, sizes))
    else:
        comp, dec = _fused_ops(c, method, max(1, round(share * d)), kind, workers, device, bench)
    return LayerCost(name, fwd_s, bwd_s, nbytes, comp, dec, kind, FLOAT_BYTES * float(d))


def _split(c: Compressor, kind: str, shapes: tuple, compress_vectors: bool, impl: IM.Implementation) -> tuple:
    """(compressed, dense) tensor shapes: the engine's rule for vectors (``implementation.split_vectors``)
    and, where the compressor works tensor by tensor, the implementation's rule for tensors not
    worth compressing (``implementation.worth_compressing``: DDP's PowerSGD hook)."""
    comp, dense = IM.split_vectors(shapes, compress_vectors)
    if not impl.min_compression_rate or not PL.per_tensor(kind):
        return comp, dense
    worth = {s: IM.worth_compressing(FLOAT_BYTES * math.prod(s), _leaf_bytes(c, IM.tensor_view(c, s, impl)), impl)
             for s in comp}  # fmt: skip
    return tuple(s for s in comp if worth[s]), dense + tuple(s for s in comp if not worth[s])


def layer_parts(
    name: str,
    fwd_s: float,
    bwd_s: float,
    d: int,
    method: PL.Method,
    c: Compressor,
    workers: int,
    device: Device,
    bench: Mapping[str, Sequence[Ratio]],
    shapes: Sequence[tuple[int, ...]] = (),
    implementation: str | IM.Implementation = IM.DEFAULT,
    share: float = 1.0,
    compress_vectors: bool = True,
) -> list[LayerCost]:
    """The ``LayerCost``s of one layer whose tensors ``shapes`` are sized one by one under the
    engine's rule (``implementation.split_vectors``): unless ``compress_vectors``, its 1-D tensors
    (biases, norm scales) travel dense, 4 bytes an element, in an all-reduce, and only its other
    tensors are compressed (``layer_cost`` on their d_c elements); so do the tensors that the
    implementation finds not worth compressing (``_split``: DDP's PowerSGD hook).  The dense bytes
    join the layer's message where that is an all-reduce too, else they are a second ``LayerCost``
    ``NAME:dense`` (no compute, ready with the layer); a layer of vectors only is one dense all-reduce.  Without
    ``shapes`` (a flat vector standing for the layer) everything is compressed, as ``layer_cost``."""
    real = tuple(tuple(s) for s in shapes)
    impl = IM.get(implementation)
    comp, dense = _split(c, PL.kind_of(method, c), real, compress_vectors or not real, impl)
    if not dense or C.registered_name(c) == PL.identity_name():
        return [layer_cost(name, fwd_s, bwd_s, d, method, c, workers, device, bench, real, implementation, share)]
    nd = FLOAT_BYTES * float(sum(math.prod(s) for s in dense))
    out, back = IM.staging_s(impl, "allreduce", nd, workers)
    vec = LayerCost(f"{name}:dense", 0.0, 0.0, nd, share * out, share * back, "allreduce")
    if not comp:
        return [vec._replace(name=name, fwd_s=fwd_s, bwd_s=bwd_s)]
    dc = int(sum(math.prod(s) for s in comp))
    lc = layer_cost(name, fwd_s, bwd_s, dc, method, c, workers, device, bench, comp, implementation, share)
    if (lc.kind or "allreduce") == "allreduce":  # one all-reduce carries both, as the engine's fused one
        reply = None if lc.reply_bytes is None else lc.reply_bytes + nd
        return [lc._replace(nbytes=lc.nbytes + nd, compress_s=lc.compress_s + vec.compress_s,
                            decompress_s=lc.decompress_s + vec.decompress_s, reply_bytes=reply)]  # fmt: skip
    return [lc, vec]


def layer_costs(
    profile: Profile,
    method: PL.Method | str,
    workers: int,
    device: Device = SURVEY_DEVICE,
    *,
    hparams: Mapping | Sequence[Mapping] | None = None,
    bench: Mapping[str, Sequence[Ratio]] | None = None,
    implementation: str | IM.Implementation = IM.DEFAULT,
    share: float = 1.0,
    compress_vectors: bool | None = None,
) -> list[LayerCost]:
    """``LayerCost``s of ``profile`` (backprop order) under ``method`` (a planner method or its
    name): FLOPs / ``device.flops`` for forward and backward, and per layer the message and the
    compress/decompress operations of the module docstring.  ``hparams``: the compressor's
    hyper-parameters, one mapping for every layer or one per layer (backprop order);
    ``implementation``: how compress/decompress run (``cconv.theory.implementation``); ``share``: the
    fraction of each layer a worker compresses (``layer_cost``; ``workers``: those it combines with);
    ``compress_vectors``: whether 1-D tensors are compressed (None: ``implementation.vectors_of``:
    the implementation's own rule, else the profile's, else the engine's default); a layer whose
    vectors travel dense in another collective than its compressed message gets a second
    ``LayerCost`` for them (``layer_parts``)."""
    table = PL.all_methods()
    if isinstance(method, str):
        if method not in table:
            raise ValueError(f"unknown method {method!r}; valid: {', '.join(table)}")
        method = table[method]
    per_layer = isinstance(hparams, Sequence) and not isinstance(hparams, (str, bytes))
    if per_layer and len(hparams) != len(profile.layers):
        raise ValueError(f"{len(hparams)} hyper-parameter sets for {len(profile.layers)} layers")
    bench = load_bench() if bench is None and method.compressor != PL.identity_name() else (bench or {})
    hps = [dict(hparams[i] if per_layer else (hparams or {})) for i in range(len(profile.layers))]
    impl = IM.get(implementation)
    vectors = IM.vectors_of(impl, compress_vectors, getattr(profile, "compress_vectors", None))
    if impl.bucket_limits:
        return _bucket_costs(profile, method, workers, device, hps, bench, impl, share, vectors)
    built: dict[tuple, Compressor] = {}
    out = []
    for i, lay in enumerate(profile.layers):
        hp = hps[i]
        key = tuple(sorted(hp.items()))
        if key not in built:
            built[key] = C.get(method.compressor, **hp)
        d = int(round(lay.grad_bytes / FLOAT_BYTES))
        fwd, bwd = lay.fwd_flops / device.flops, lay.bwd_flops / device.flops
        args = (method, built[key], workers, device, bench)
        out += layer_parts(lay.name, fwd, bwd, d, *args, lay.shapes, impl, share, vectors)
    return out


def _tensors(profile: Profile) -> list[tuple[int, tuple[int, ...]]]:
    """(layer index, shape) of every gradient tensor in DDP's order: the layers in backprop order,
    each layer's tensors in reverse registration order (a layer without shapes: one flat tensor)."""
    return [(i, tuple(s)) for i, lay in enumerate(profile.layers) if lay.grad_bytes > 0 for s in reversed(lay.tensors)]


class Bucket(NamedTuple):
    """One DDP bucket: ``layers`` whose backward it waits for, its tensors' ``shapes`` and the layer
    each tensor belongs to (``owners``)."""

    layers: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    owners: tuple[int, ...]


def bucket_layers(profile: Profile, limits: Sequence[float]) -> list[Bucket]:
    """DDP's buckets of ``profile`` (``implementation.buckets`` with byte ``limits``).  A bucket is
    ready when its last tensor's gradient is: a layer's backward belongs to the bucket of its first
    tensor (its other tensors, produced by the same backward, may open the next bucket), a layer
    without parameters to the bucket filled next (the last bucket after the last tensor)."""
    tensors = _tensors(profile)
    groups = IM.buckets([FLOAT_BYTES * math.prod(s) for _, s in tensors], limits) if tensors else [()]
    first: dict[int, int] = {}
    for b, idx in enumerate(groups):
        for t in idx:
            first.setdefault(tensors[t][0], b)
    owner, nxt = [0] * len(profile.layers), len(groups) - 1
    for i in reversed(range(len(profile.layers))):  # a layer without tensors: the next layer's bucket
        nxt = first.get(i, nxt)
        owner[i] = nxt
    return [
        Bucket(
            tuple(i for i in range(len(owner)) if owner[i] == b),
            tuple(tensors[t][1] for t in idx),
            tuple(tensors[t][0] for t in idx),
        )
        for b, idx in enumerate(groups)
    ]


def _bucket_costs(profile, method, workers, device, hps, bench, impl, share=1.0, vectors=True) -> list[LayerCost]:
    """One ``LayerCost`` per DDP bucket (``cconv.theory.implementation``, ``ddp-hook``): the backward
    and forward of its layers, its message and its compress/decompress as ``layer_cost`` gives them
    for one flat tensor of the bucket's elements (the hook compresses the bucket's buffer, vectors
    inside it), or for its tensors where the aggregation works per tensor (PowerSGD's hook loops over
    the bucket's matrices and all-reduces its vectors uncompressed unless ``vectors``)."""
    out = []
    for b, (layers, shapes, owners) in enumerate(bucket_layers(profile, impl.bucket_limits)):
        hp = {tuple(sorted(hps[i].items())) for i in owners} or {tuple(sorted(hps[0].items()))}
        if len(hp) > 1:
            raise ValueError(f"{impl.name}: bucket {b} holds layers with different hyper-parameters (one flat tensor)")
        c = C.get(method.compressor, **dict(next(iter(hp), ())))
        d = sum(math.prod(s) for s in shapes)
        tensors = PL.per_tensor(PL.kind_of(method, c))
        units = shapes if tensors else ((d,),)
        lays = [profile.layers[i] for i in layers]
        name = f"bucket{b}:" + (f"{lays[0].name}..{lays[-1].name}" if lays else "-")
        fwd, bwd = (sum(getattr(x, k) for x in lays) / device.flops for k in ("fwd_flops", "bwd_flops"))
        out += layer_parts(
            name, fwd, bwd, d, method, c, workers, device, bench, units, impl, share, vectors or not tensors
        )
    return out


__all__ = [
    "Device",
    "SURVEY_DEVICE",
    "Ratio",
    "load_bench",
    "ratio_at",
    "layer_cost",
    "layer_parts",
    "layer_costs",
    "bucket_layers",
    "Bucket",
    "DECODES",
    "DEFAULT_BENCH",
]
