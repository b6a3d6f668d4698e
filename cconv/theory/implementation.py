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

A compressor whose framework implementation loops until a data-dependent condition holds
(``Cost.rounds``: GRACE's DGC re-thresholds until the selected count is within bounds) adds

    loop       = rounds(n) (ROUND_S + round_passes F(n))

with rounds(n) the loop's expected rounds on a tensor of n elements (the compressor's own model
of its loop) and ROUND_S what a round costs beyond its passes: the host reads the loop's
predicate (a device -> host copy it waits for) before it issues the next round.

Constants (``Implementation`` fields): ``t_op`` (``OP_S``), ``SORT_PASSES``, ``HOST_BW`` and
``ROUND_S`` were fitted together on a declared calibration subset of the GRACE data release (ResNet-50 on 8 V100
servers at 25 Gbit/s: ``cconv.theory.validation.CALIBRATION``; ``cconv.theory.validation.calibrate``
reproduces them) and are checked on runs they were not fitted to (``cconv.theory.validation``,
docs/clusters.md).  For scale: 47.7 us per operation is TensorFlow graph-mode dispatch plus a
kernel launch, several times a bare CUDA launch (``Device.launch_s`` = 5 us); 400 read floors is
~45 ms for ResNet-50's 25.6 M gradient elements on a V100, a framework top-k that sorts each
tensor; 2.38 GB/s is below PCIe 3.0 x16's 15.75 GB/s (its datasheet): pageable copies plus MPI's
own buffer copies over TCP; 74.5 us a loop round is one and a half operations: a kernel, its
predicate copied to the host, the wait for it (the fit without the loop term kept the other three
constants where they are, at a calibration loss of 0.0277; with it, 0.0265).
``RADIX_PASSES`` is the structure of a radix select of 32-bit keys with 8-bit digits: four
histogram passes and one selection pass (Alabi et al., "Fast k-selection algorithms for graphics
processing units", JEA 2012; PyTorch's ``torch.topk`` uses it).
``ddp-hook`` adds no constant: it reuses ``SORT_PASSES`` as fitted (a structure, not a fit; it was
added after the Global-QSGD validation cases had been seen to miss under ``per-tensor``,
docs/clusters.md), and DDP's bucket limits are PyTorch's defaults.

Queued operations (``Implementation.queued``, ``op_cost``): PyTorch's eager operations are queued
asynchronously ("By default, GPU operations are asynchronous. When you call a function that uses
the GPU, the operations are enqueued to the particular device, but not necessarily executed until
later", PyTorch docs, notes/cuda.rst, "Asynchronous execution"), and a DDP hook runs on the host
while the GPU still executes the backward kernels queued before it.  The host's dispatch of an
operation (``op_s``) then runs ahead of the GPU; what holds the compute stream is the kernel's
own per-launch cost, ``Device.launch_s`` (5 us; back-to-back asynchronous launches of an empty
kernel sustain ~334,000 a second, ~3 us each: Boyer, "CUDA kernel overhead",
cs.virginia.edu/~mwb7w/cuda_support/kernel_overhead.html).  TensorFlow 1's graph executor (GRACE's
runs), from which ``OP_S`` was fitted, is not given this: its fit already is what an operation cost
there.  The host stays ahead while its dispatch of an iteration's operations takes less than the
GPU's work (NVIDIA's Nsight Systems guide measured ~20 us for a PyTorch element-wise kernel on a
V100, host to device; Wide ResNet-101-2's PowerSGD hook issues ~3,000 per 100 ms iteration: ~60
ms); the model does not check it.  ``ddp-hook`` is queued; it was made so after the Global-QSGD
PowerSGD case had been seen to miss (+123 %, docs/clusters.md), and adds no constant.
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
ROUND_S = 10e-6 * 1.25**9  # 74.5 us per round of a framework's data-dependent loop: the host reads its predicate
RADIX_PASSES = 5.0  # radix select of 32-bit keys, 8-bit digits: 4 histogram passes + 1 selection pass
# PyTorch DDP's bucket byte limits (torch/csrc/distributed/c10d/reducer.hpp): the first bucket
# kDefaultFirstBucketBytes = 1 MiB, every later one kDefaultBucketBytesCap = bucket_cap_mb = 25 MiB
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024
DDP_BUCKET_LIMITS = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)
# PyTorch's PowerSGD hook: PowerSGDState's default min_compression_rate (DDP_VECTORS)
DDP_MIN_COMPRESSION_RATE = 2.0
DDP_SOURCE = (
    "PyTorch DDP communication hooks: framework ops per bucket (torch/csrc/distributed/c10d/reducer.hpp's "
    "default bucket limits, 1 MiB then 25 MiB); t_op and SORT_PASSES as fitted on GRACE (not refitted)"
)
FIT_SOURCE = (
    "fitted on the GRACE data release's ResNet-50 runs on 8 V100 servers at 25 Gbit/s "
    "(cconv.theory.validation.CALIBRATION)"
)


# How a framework lays out a parameter tensor, from a profile's shape (cconv.theory.profiles: Flax's
# order, kernels (kh, kw, in, out), dense kernels (in, out)).  TensorFlow's is the same: tf.nn.conv2d's
# filter is [filter_height, filter_width, in_channels, out_channels] and a Dense kernel (input_dim, units)
# (TensorFlow API docs).  PyTorch's puts the outputs first: Conv2d.weight (out_channels, in_channels, kH,
# kW), Linear.weight (out_features, in_features) (PyTorch docs, torch.nn).
FLAX, TENSORFLOW, PYTORCH = "flax", "tensorflow", "pytorch"
LAYOUTS = {
    FLAX: lambda s: s,
    TENSORFLOW: lambda s: s,
    PYTORCH: lambda s: s if len(s) < 2 else (s[-1], s[-2], *s[:-2]),
}


class Implementation(NamedTuple):
    """How compress/decompress run: ``per_tensor`` (framework ops, on each tensor or, with
    ``bucket_limits``, on each DDP bucket; else cconv's fused program), ``op_s`` seconds per op,
    ``sort_passes`` the cost of a framework top-k in read floors, ``host_bw`` bytes/s of host
    staging (0: payloads stay on the GPU), ``bucket_limits`` the byte limits of DDP's buckets, the
    last repeated (``buckets``; (): no buckets, a compressor sees each tensor), ``queued`` whether
    the framework queues its operations asynchronously on the GPU (``op_cost``), ``round_s`` seconds
    per round of a data-dependent loop (``Cost.rounds``: the host reads the loop's predicate),
    ``layout`` how the framework lays out a parameter tensor (``LAYOUTS``; ``tensor_view``),
    ``compress_vectors`` whether the published implementation compresses 1-D tensors (biases, norm
    scales) or sends them dense (None: cconv's own program, which follows the plan's setting, by
    default the engine's ``EngineConfig.compress_vectors``; ``vectors_of``), ``vectors_source``
    the file and function of the implementation's code that decides it; ``min_compression_rate``:
    where the compressor works tensor by tensor (an aggregation per tensor: PowerSGD), a tensor
    whose message would not be this many times smaller than the tensor is sent dense with the
    vectors (0: every tensor compressed; ``worth_compressing``)."""

    name: str
    per_tensor: bool
    op_s: float = 0.0
    sort_passes: float = 0.0
    host_bw: float = 0.0
    source: str = ""
    bucket_limits: tuple[float, ...] = ()
    queued: bool = False
    round_s: float = 0.0
    layout: str = FLAX
    compress_vectors: bool | None = None  # None: the plan's setting (cconv's engine: ``vectors_of``)
    vectors_source: str = ""  # where the implementation's code decides it
    min_compression_rate: float = 0.0

    def framework_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` (a profile's, Flax's axis order: kernels (kh, kw, in, out), dense (in, out)) as
        this implementation's framework lays the tensor out (``LAYOUTS``)."""
        return LAYOUTS[self.layout](tuple(shape))

    def op_cost(self, device: Device) -> float:
        """Seconds one framework operation holds the compute stream: ``op_s`` (dispatch and launch,
        in line), or, where the framework queues its operations asynchronously (``queued``: PyTorch
        eager), the device's own per-kernel cost ``Device.launch_s`` (the host's dispatch, ``op_s``,
        runs ahead of the GPU and hides behind the kernels already queued; module docstring)."""
        return device.launch_s if self.queued else self.op_s

    @property
    def packs_bits(self) -> bool:
        """Sub-byte codes travel bit-packed (cconv's program); framework tensors have no sub-byte
        dtype, so a per-tensor implementation sends each code in a byte (``Cost.code_bytes``)."""
        return not self.per_tensor


# Whether each published implementation compresses 1-D tensors, read in its code (file, function):
GRACE_VECTORS = (
    "GRACE compresses every gradient tensor Horovod hands it, vectors included: grace_dl/tensorflow/__init__.py, "
    "Communicator.step (compensate, compress, send_receive for any tensor); grace_dl/tensorflow/compressor/topk.py, "
    "sparsify (k = max(1, int(n x ratio)) on any tensor).  Only its PowerSGD sends vectors dense, inside the "
    "compressor (grace_dl/tensorflow/compressor/powersgd.py, PowerSGDCompressor.compress: tensor_dims == 1 -> "
    "[tensor]), as cconv's powersgd entry does itself"
)
DDP_VECTORS = (
    "PyTorch's PowerSGD hook all-reduces vectors uncompressed: torch/distributed/algorithms/ddp_comm_hooks/"
    "powerSGD_hook.py (Global-QSGD's copy: gqsgd/powerSGD_hook.py), powerSGD_hook, step I: 'Rest of the tensors "
    "will be directly allreduced without compression, including all the vector tensors (for biases)' "
    "(_should_compress on the (n, 1) view), and so is every matrix that its rule finds not worth compressing: "
    "PowerSGDState(min_compression_rate=2), _should_compress: compressed iff (rows + cols) x rank x "
    "min_compression_rate < rows x cols (torch's hook and gqsgd/powerSGD_hook.py alike).  "
    "An elementwise hook compresses the bucket as one flat tensor, "
    "vectors inside it (gqsgd/ddphook.py, qsgd_hook: bucket.buffer()); the bucket model sizes that flat tensor"
)
ESPRESSO_VECTORS = (
    "Espresso compresses a flat pool of every gradient, vectors included: byteps/torch/mergeComp/memory/"
    "memory_pool.py, MemoryPool.initialize (every parameter with requires_grad in one buffer) and partition "
    "(the pool cut into the fused tensors it compresses) (github.com/zhuangwang93/Espresso at a0294e3)"
)
ESPRESSO_SOURCE = (
    "Espresso's GPU compression library (EuroSys 2023, Sec. 5.1): a compiled kernel per fused tensor, "
    "cconv's fused program's benchmarked cost (schedule.compress) stands for it"
)

IMPLEMENTATIONS: dict[str, Implementation] = {
    "fused": Implementation("fused", False, source="cconv's jitted program: its benchmarked cost (schedule.compress)"),
    "per-tensor": Implementation(
        "per-tensor",
        True,
        OP_S,
        SORT_PASSES,
        0.0,
        FIT_SOURCE,
        round_s=ROUND_S,
        layout=TENSORFLOW,
        compress_vectors=True,
        vectors_source=GRACE_VECTORS,
    ),
    "mpi": Implementation(
        "mpi",
        True,
        OP_S,
        SORT_PASSES,
        HOST_BW,
        FIT_SOURCE,
        round_s=ROUND_S,
        layout=TENSORFLOW,
        compress_vectors=True,
        vectors_source=GRACE_VECTORS,
    ),
    "ddp-hook": Implementation(
        "ddp-hook",
        True,
        OP_S,
        SORT_PASSES,
        0.0,
        DDP_SOURCE,
        DDP_BUCKET_LIMITS,
        queued=True,
        round_s=ROUND_S,
        layout=PYTORCH,
        compress_vectors=False,
        vectors_source=DDP_VECTORS,
        min_compression_rate=DDP_MIN_COMPRESSION_RATE,
    ),
    "espresso": Implementation(
        "espresso", False, source=ESPRESSO_SOURCE, compress_vectors=True, vectors_source=ESPRESSO_VECTORS
    ),
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


def vectors_of(impl: Implementation, given: bool | None = None, own: bool | None = None) -> bool:
    """Whether 1-D tensors (biases, norm scales) are compressed: ``given`` (the plan's explicit
    setting, ``cconv plan --compress-vectors``), else what the published implementation did
    (``Implementation.compress_vectors``), else ``own`` (a run config's own value, carried by its
    profile, ``Profile.compress_vectors``), else the engine's default
    (``cconv.engine.config.ENGINE_DEFAULTS``: 1-D tensors dense, as DDP's PowerSGD hook)."""
    for value in (given, impl.compress_vectors, own):
        if value is not None:
            return bool(value)
    from cconv.engine.config import ENGINE_DEFAULTS  # the engine's default, written once there

    return bool(ENGINE_DEFAULTS["compress_vectors"])


def split_vectors(shapes: Sequence[tuple[int, ...]], compress_vectors: bool) -> tuple[tuple, tuple]:
    """(compressed, dense) tensor shapes under the engine's rule (``cconv.engine.exchange.make_plan``):
    a tensor of ndim <= 1 is sent dense unless ``compress_vectors``."""
    shapes = tuple(tuple(s) for s in shapes)
    if compress_vectors:
        return shapes, ()
    return tuple(s for s in shapes if len(s) > 1), tuple(s for s in shapes if len(s) <= 1)


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


def tensor_view(c: Compressor, shape: tuple[int, ...], impl: Implementation) -> tuple[int, ...]:
    """The shape compressor ``c`` works on when ``impl`` runs it on a tensor of (profile) ``shape``:
    a framework implementation (``per_tensor``) applies the entry's ``Cost.view`` to the tensor as
    its framework lays it out (``Implementation.layout``: PowerSGD factorises (shape[0], rest), so
    on TensorFlow's (kh, kw, in, out) kernels the kernel height x rest); cconv's fused program, and
    a compressor without a view, see ``shape`` itself."""
    view = C.entry_of(c).cost.view
    if view is None or not impl.per_tensor:
        return tuple(shape)
    return tuple(view(impl.framework_shape(tuple(shape))))


def worth_compressing(tensor_bytes: float, message_bytes: float, impl: Implementation) -> bool:
    """Does ``impl`` compress a tensor of ``tensor_bytes`` into a message of ``message_bytes``
    (``Implementation.min_compression_rate``: DDP's PowerSGD hook, ``_should_compress``: the
    message must be more than that many times smaller)?"""
    return message_bytes * impl.min_compression_rate < tensor_bytes


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
    t = cost.compress_ops * impl.op_cost(device) + cost.compress_passes * device.read_floor(n)
    t += select_s(cost.select, n, impl, device)
    if cost.flops is not None:
        t += cost.flops(c, tuple(shape)) / device.flops
    if cost.rounds is not None:  # a data-dependent loop: its expected rounds x (a host round trip + its passes)
        t += cost.rounds(c, tuple(shape)) * (impl.round_s + cost.round_passes * device.read_floor(n))
    return t


def decompress_s(c: Compressor, shape: tuple[int, ...], impl: Implementation, device: Device, m: int) -> float:
    """Seconds of decoding ``m`` payloads of a tensor of ``shape`` (and summing them)."""
    cost = C.entry_of(c).cost
    n = float(math.prod(shape))
    t = m * (cost.decompress_ops * impl.op_cost(device) + cost.decompress_passes * device.read_floor(n))
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
    "vectors_of",
    "split_vectors",
    "buckets",
    "tensor_view",
    "LAYOUTS",
    "select_s",
    "compress_s",
    "decompress_s",
    "staging_s",
    "message_bytes",
    "OP_S",
    "SORT_PASSES",
    "HOST_BW",
    "ROUND_S",
    "RADIX_PASSES",
    "DDP_FIRST_BUCKET_BYTES",
    "DDP_BUCKET_BYTES",
    "DDP_BUCKET_LIMITS",
    "DDP_MIN_COMPRESSION_RATE",
    "worth_compressing",
]
