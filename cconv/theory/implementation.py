"""What compression costs on a GPU, by *implementation*: cconv's fused program, framework ops per
tensor, per-tensor ops with host-staged MPI, or framework ops per PyTorch DDP bucket.

The same compressor costs very different times depending on how it is run (GRACE, Xu et al.,
ICDCS 2021; Agarwal et al., "On the utility of gradient compression", MLSys 2022): a jitted program
over a whole layer is a few passes over memory, while a framework's op-by-op implementation pays a
launch per operation per tensor, a framework top-k that sorts, one decode per gathered payload and,
over MPI, copies through host memory.  ``IMPLEMENTATIONS`` (``cconv plan --implementation``):

* ``fused``: cconv's own jitted program (``cconv.theory.schedule.compress``: cconv's measured
  compress and decompress times as multiples of the memory read floor, one launch per layer);
* ``per-tensor``: framework operations per gradient tensor, as GRACE's TensorFlow/PyTorch
  compressors and Horovod's per-tensor hooks run them, on the GPU (NCCL);
* ``mpi``: ``per-tensor`` plus host staging, as Horovod over MPI without CUDA-aware transport
  (GRACE's allgather runs): every payload is copied device -> host before the collective and the
  received payloads host -> device after it;
* ``ddp-hook``: framework operations per PyTorch DDP *bucket*, as DDP communication hooks run them
  (``register_comm_hook``: PyTorch's PowerSGD hook, Global-QSGD's hooks): the gradients are grouped
  into buckets (``buckets``) and the hook sees each bucket as one flat tensor, so an elementwise
  compressor pays its operations once per bucket over the bucket's n elements, not once per
  tensor; a compressor that needs each tensor's matrix shape (an aggregation that is not one
  network collective, ``planner.per_tensor``: PowerSGD) still loops over the bucket's tensors, as
  PyTorch's ``powerSGD_hook`` does (``for tensor in bucket.gradients()``), with one message per
  bucket.  On the GPU (NCCL), no host staging.

DDP's buckets (``buckets``, ``DDP_BUCKET_LIMITS``): the parameters in reverse registration order
(the order backpropagation produces their gradients; DDP rebuilds its buckets in the measured
gradient-ready order after the first iteration) are added one by one to the open bucket, which
closes as soon as it holds at least its byte limit; the first bucket's limit is 1 MiB, every later
one's ``bucket_cap_mb`` = 25 MiB (PyTorch's defaults: ``kDefaultFirstBucketBytes = 1024 * 1024``
and ``kDefaultBucketBytesCap = 25 * 1024 * 1024`` in torch/csrc/distributed/c10d/reducer.hpp;
``compute_bucket_assignment_by_size`` and ``Reducer::rebuild_buckets`` in reducer.cpp; the
``bucket_cap_mb`` argument of ``torch.nn.parallel.DistributedDataParallel``, documented "default
25 MiB").  A bucket is ready, and its hook runs, when the last of its gradients is produced.

For a tensor of n elements with the entry's facts (``cconv.compressors.Cost``: ``ops_c``,
``passes_c``, ``select``, ``ops_d``, ``passes_d``, ``flops``), on a device with memory bandwidth B,
sustained rate R, read floor F(n) = 4 n / B, and m payloads decoded per call (P after an all-gather,
ceil(log2 P) for recursive doubling, else 1), ``per-tensor`` charges:

    compress   = ops_c t_op + passes_c F(n) + select(n) + flops_c / R
    decompress = m (ops_d t_op + passes_d F(n)) + flops_d / R
    select(n)  = SORT_PASSES F(n) (a framework top-k), RADIX_PASSES F(n) (radix select),
                 F(n) ("compare": a fixed threshold, or "sample": one estimated on a sample), 0

and ``mpi`` adds the staging of each call, with b the call's payload bytes per worker:

    stage_out = b / HOST_BW                    (device -> host, before the collective)
    stage_in  = r / HOST_BW                    (host -> device: r = P b after an all-gather,
                                                b after an all-reduce)

The dense baseline has no compress/decompress; over MPI it pays the staging of its gradient.
Under ``ddp-hook`` the same formulas apply to one bucket of n elements (the flat tensor), or, for a
per-tensor aggregation, to each of its tensors.

Constants (``Implementation`` fields): ``t_op`` (``OP_S``), ``SORT_PASSES`` and ``HOST_BW`` were
fitted together on a declared calibration subset of the GRACE data release (ResNet-50 on 8 V100
servers at 25 Gbit/s: ``cconv.theory.validation.CALIBRATION``; ``cconv.theory.validation.calibrate``
reproduces them) and are checked on runs they were not fitted to (``cconv.theory.validation``,
docs/clusters.md).  For scale: 47.7 us per operation is TensorFlow graph-mode dispatch plus a
kernel launch, several times a bare CUDA launch (``Device.launch_s`` = 5 us); 400 read floors is
~45 ms for ResNet-50's 25.6 M gradient elements on a V100, a framework top-k that sorts each
tensor; 2.38 GB/s is below PCIe 3.0 x16's 15.75 GB/s (its datasheet): pageable copies plus MPI's
own buffer copies over TCP.
``RADIX_PASSES`` is the structure of a radix select of 32-bit keys with 8-bit digits: four
histogram passes and one selection pass (Alabi et al., "Fast k-selection algorithms for graphics
processing units", JEA 2012; PyTorch's ``torch.topk`` uses it).
``ddp-hook`` adds no constant: it reuses ``OP_S`` and ``SORT_PASSES`` as fitted (a structure, not a
fit; it was added after the Global-QSGD validation cases had been seen to miss under ``per-tensor``,
docs/clusters.md), and DDP's bucket limits are PyTorch's defaults.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from cconv import compressors as C
from cconv.compressors.base import Compressor
from cconv.theory.devices import Device

FLOAT_BYTES = 4

# Fitted on the calibration subset (module docstring): points of ``cconv.theory.validation.GRIDS``
# that ``cconv.theory.validation.calibrate()`` returns (tests check they are the fit's optimum).
OP_S = 10e-6 * 1.25**7  # 47.7 us per framework operation on one tensor (op dispatch + kernel launch)
SORT_PASSES = 400.0  # a framework top-k costs 400 read floors of the tensor (a sort, not a pass)
HOST_BW = 0.5e9 * 1.25**7  # 2.38 GB/s of device <-> host staging on the MPI path (D2H, H2D, MPI's copies)
RADIX_PASSES = 5.0  # radix select of 32-bit keys, 8-bit digits: 4 histogram passes + 1 selection pass
# PyTorch DDP's bucket byte limits (torch/csrc/distributed/c10d/reducer.hpp): the first bucket
# kDefaultFirstBucketBytes = 1 MiB, every later one kDefaultBucketBytesCap = bucket_cap_mb = 25 MiB
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024
DDP_BUCKET_LIMITS = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)
DDP_SOURCE = (
    "PyTorch DDP communication hooks: framework ops per bucket (torch/csrc/distributed/c10d/reducer.hpp's "
    "default bucket limits, 1 MiB then 25 MiB); t_op and SORT_PASSES as fitted on GRACE (not refitted)"
)
FIT_SOURCE = (
    "fitted on the GRACE data release's ResNet-50 runs on 8 V100 servers at 25 Gbit/s "
    "(cconv.theory.validation.CALIBRATION)"
)


class Implementation(NamedTuple):
    """How compress/decompress run: ``per_tensor`` (framework ops, on each tensor or, with
    ``bucket_limits``, on each DDP bucket; else cconv's fused program), ``op_s`` seconds per op,
    ``sort_passes`` the cost of a framework top-k in read floors, ``host_bw`` bytes/s of host
    staging (0: payloads stay on the GPU), ``bucket_limits`` the byte limits of DDP's buckets, the
    last repeated (``buckets``; (): no buckets, a compressor sees each tensor)."""

    name: str
    per_tensor: bool
    op_s: float = 0.0
    sort_passes: float = 0.0
    host_bw: float = 0.0
    source: str = ""
    bucket_limits: tuple[float, ...] = ()

    @property
    def packs_bits(self) -> bool:
        """Sub-byte codes travel bit-packed (cconv's program); framework tensors have no sub-byte
        dtype, so a per-tensor implementation sends each code in a byte (``Cost.code_bytes``)."""
        return not self.per_tensor


IMPLEMENTATIONS: dict[str, Implementation] = {
    "fused": Implementation("fused", False, source="cconv's jitted program: its benchmarked cost (schedule.compress)"),
    "per-tensor": Implementation("per-tensor", True, OP_S, SORT_PASSES, 0.0, FIT_SOURCE),
    "mpi": Implementation("mpi", True, OP_S, SORT_PASSES, HOST_BW, FIT_SOURCE),
    "ddp-hook": Implementation("ddp-hook", True, OP_S, SORT_PASSES, 0.0, DDP_SOURCE, DDP_BUCKET_LIMITS),
}
DEFAULT = "fused"


def names() -> list[str]:
    """Names of the implementations."""
    return list(IMPLEMENTATIONS)


def get(name: str | Implementation) -> Implementation:
    """An implementation by name; ValueError (one line) for an unknown one."""
    if isinstance(name, Implementation):
        return name
    if isinstance(name, str) and name in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[name]
    raise ValueError(f"unknown implementation {str(name)[:40]!r}; valid: {', '.join(names())}")


def decodes(kind: str, workers: int) -> int:
    """Payloads a worker decodes per call of collective ``kind``: P after an all-gather (each
    gathered payload decoded, then summed), ceil(log2 P) for recursive doubling (gTop-k merges one
    payload a round), else 1."""
    if kind == "allgather":
        return workers
    if kind == "recursive_doubling":
        return max(1, math.ceil(math.log2(workers))) if workers > 1 else 1
    return 1


def buckets(nbytes: Sequence[float], limits: Sequence[float] = DDP_BUCKET_LIMITS) -> list[tuple[int, ...]]:
    """DDP's bucket assignment (PyTorch's ``compute_bucket_assignment_by_size`` for tensors of one
    dtype and device): the tensors of ``nbytes`` bytes, in the order given (gradient-ready order),
    each added to the open bucket, which closes once it holds >= its limit (``limits[i]`` for the
    i-th bucket, the last limit repeated); what remains is the last bucket.  Indices per bucket."""
    if not limits or any(not (lim > 0) for lim in limits):
        raise ValueError(f"bucket limits must be positive bytes, got {tuple(limits)!r}")
    out: list[tuple[int, ...]] = []
    cur: list[int] = []
    size = 0.0
    for i, b in enumerate(nbytes):
        cur.append(i)
        size += float(b)
        if size >= limits[min(len(out), len(limits) - 1)]:
            out.append(tuple(cur))
            cur, size = [], 0.0
    if cur:
        out.append(tuple(cur))
    return out


def select_s(select: str | None, n: float, impl: Implementation, device: Device) -> float:
    """Seconds of a selection over n elements (module docstring)."""
    passes = {None: 0.0, "sort": impl.sort_passes, "radix": RADIX_PASSES, "compare": 1.0, "sample": 1.0}
    if select not in passes:
        raise ValueError(f"unknown selection {select!r}; valid: {', '.join(map(str, passes))}")
    return passes[select] * device.read_floor(n)


def compress_s(c: Compressor, shape: tuple[int, ...], impl: Implementation, device: Device) -> float:
    """Seconds of one per-tensor compress of a tensor of ``shape`` (module docstring)."""
    cost = C.entry_of(c).cost
    n = float(math.prod(shape))
    t = cost.compress_ops * impl.op_s + cost.compress_passes * device.read_floor(n)
    t += select_s(cost.select, n, impl, device)
    if cost.flops is not None:
        t += cost.flops(c, tuple(shape)) / device.flops
    return t


def decompress_s(c: Compressor, shape: tuple[int, ...], impl: Implementation, device: Device, m: int) -> float:
    """Seconds of decoding ``m`` payloads of a tensor of ``shape`` (and summing them)."""
    cost = C.entry_of(c).cost
    n = float(math.prod(shape))
    t = m * (cost.decompress_ops * impl.op_s + cost.decompress_passes * device.read_floor(n))
    if cost.decompress_flops is not None:
        t += cost.decompress_flops(c, tuple(shape)) / device.flops
    return t


def message_bytes(c: Compressor, shape: tuple[int, ...], wire: float, impl: Implementation) -> float:
    """Bytes of one tensor's message under ``impl``: its ``wire`` bytes, or at least
    ``Cost.code_bytes`` per element where the implementation does not pack bits."""
    code = C.entry_of(c).cost.code_bytes
    return wire if impl.packs_bits or not code else max(wire, code * float(math.prod(shape)))


def staging_s(impl: Implementation, kind: str, nbytes: float, workers: int) -> tuple[float, float]:
    """(device -> host, host -> device) seconds of one call of ``nbytes`` per worker: 0 without
    host staging; after an all-gather the P payloads come back, after an all-reduce their sum."""
    if impl.host_bw <= 0:
        return 0.0, 0.0
    back = nbytes * (workers if kind == "allgather" else 1)
    return nbytes / impl.host_bw, back / impl.host_bw


__all__ = [
    "Implementation",
    "IMPLEMENTATIONS",
    "DEFAULT",
    "names",
    "get",
    "decodes",
    "buckets",
    "select_s",
    "compress_s",
    "decompress_s",
    "staging_s",
    "message_bytes",
    "OP_S",
    "SORT_PASSES",
    "HOST_BW",
    "RADIX_PASSES",
    "DDP_FIRST_BUCKET_BYTES",
    "DDP_BUCKET_BYTES",
    "DDP_BUCKET_LIMITS",
]
