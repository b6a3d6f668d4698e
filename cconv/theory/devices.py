"""Accelerators: sustained FLOP/s, memory bandwidth and per-operation launch cost, with sources.

A ``Device`` is what the time model asks of a worker's GPU: ``flops``, the *sustained* rate at
which training runs (FLOPs counted as ``cconv.theory.profiles`` counts them: 2 per
multiply-accumulate, backward = 2 x forward), ``mem_bw``, the memory bandwidth that bounds
memory-bound kernels (compression: ``cconv.theory.schedule.compress``), and ``launch_s``, a fixed
cost per kernel launch.  ``peak_flops`` is the datasheet's dense peak at the same precision, kept
to show how far training is from it.

How ``flops`` is derived (sustained, not peak): a published single-GPU training throughput of a
model whose FLOPs the profiles count, times those FLOPs:

    flops = samples/s (published, one GPU) x C (FLOPs per sample, ``profiles``)

ResNet-50 at 224 x 224: C = 2.430e10 (``profiles.resnet50``).  BERT-Large at 64 tokens:
C = 1.172e11 (``profiles.bert``).  ``mem_bw`` is the datasheet peak (an upper bound: compression
kernels are memory bound at best, ``compress`` scales them from it).

==========  =========  ==================  ===============  =========================================
device      precision  sustained FLOP/s    peak (datasheet)  throughput it is derived from
==========  =========  ==================  ===============  =========================================
p100        fp32       5.32e12 (50 %)      10.6e12           219 img/s ResNet-50, TF benchmarks, DGX-1
v100        fp32       8.92e12 (57 %)      15.7e12           367 img/s ResNet-50, NVIDIA DLE, DGX-1
a100        tf32       2.28e13 (15 %)      156e12            938 img/s ResNet-50, NVIDIA DLE, DGX A100
h100        tf32       7.23e13 (15 %)      494.7e12          a100 share of peak (14.6 %) x 494.7e12 (rule)
h200        tf32       7.23e13 (15 %)      494.7e12          h100's rule (the same GH100 compute)
rtx2080ti   fp32       5.75e12 (43 %)      13.4e12           BERT-Large 163 ms at batch 8 (survey)
==========  =========  ==================  ===============  =========================================

Sources: NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, "Training performance" tables
(pytorch-21.03 container): DGX-1 16 GB, 1 x V100 FP32 367 img/s; DGX A100 80 GB, 1 x A100 TF32
938 img/s.  TensorFlow performance benchmarks (tensorflow.org/performance/benchmarks, 2017):
DGX-1, 1 x P100, synthetic data, batch 64, ResNet-50 219 img/s.  Shi et al., "Communication-
Efficient Distributed Deep Learning: Survey, Evaluation, and Challenges", Sec. 2: BERT-Large on one
RTX 2080Ti, 163 ms of computation per iteration at local batch 8.  Datasheets: NVIDIA Tesla P100
(SXM2: 10.6 TFLOP/s fp32, 732 GB/s HBM2), V100 (SXM2: 15.7 TFLOP/s fp32, 900 GB/s HBM2), A100
(SXM 80 GB: 19.5 fp32, 156 TF32 tensor, 2,039 GB/s HBM2e), H100 (SXM5: 494.7 TF32 tensor dense,
3.35 TB/s HBM3), H200 (SXM: the H100's GH100 die and compute, 4.8 TB/s HBM3e), GeForce RTX 2080 Ti
(13.4 TFLOP/s fp32 boost, 616 GB/s GDDR6).  H100 has no
published single-GPU ResNet-50 number in those tables, so its sustained rate is A100's measured
share of peak (14.6 %) times H100's TF32 peak: a rule, stated, not a measurement; H200 takes the
same rate (its compute is the H100's) and its own memory bandwidth.

``launch_s`` = 5 us for every device (an assumption; kernel launch cost is not in datasheets).
"""

from __future__ import annotations

import math
from typing import NamedTuple

FLOAT_BYTES = 4
LAUNCH_S = 5e-6  # seconds per GPU kernel launch (an assumption, not measured here)

RESNET50_FLOPS_PER_IMAGE = 2.4299077632e10  # profiles.resnet50().flops_per_sample (tests check it)
BERT_LARGE_FLOPS_PER_SAMPLE = 1.17178368e11  # profiles.bert("bert-large", ...).flops_per_sample


class Device(NamedTuple):
    """A worker's accelerator: sustained FLOP/s, memory bandwidth (bytes/s), per-op launch cost."""

    name: str
    flops: float
    mem_bw: float
    launch_s: float = LAUNCH_S
    source: str = ""
    peak_flops: float = 0.0  # the datasheet's dense peak at the precision of ``flops`` (0: unknown)
    precision: str = "fp32"

    def read_floor(self, elements: float) -> float:
        """Seconds to read ``elements`` fp32 values once."""
        return FLOAT_BYTES * elements / self.mem_bw


def _sustained(name: str, rate: float, per_sample: float, mem_bw: float, peak: float, precision: str, src: str):
    return Device(name, rate * per_sample, mem_bw, LAUNCH_S, src, peak, precision)


_A100 = _sustained(
    "a100",
    938.0,
    RESNET50_FLOPS_PER_IMAGE,
    2039e9,
    156e12,
    "tf32",
    "NVIDIA DeepLearningExamples ResNet50 v1.5 (PyTorch): 1 x A100 80GB TF32, 938 img/s; datasheet 2,039 GB/s",
)

_H100 = Device(
    "h100",
    _A100.flops / _A100.peak_flops * 494.7e12,
    3.35e12,
    LAUNCH_S,
    "rule: A100's measured share of its TF32 peak (14.6 %) x H100 SXM's 494.7 TFLOP/s TF32; datasheet 3.35 TB/s",
    494.7e12,
    "tf32",
)

DEVICES: dict[str, Device] = {
    "p100": _sustained(
        "p100",
        219.0,
        RESNET50_FLOPS_PER_IMAGE,
        732e9,
        10.6e12,
        "fp32",
        "TensorFlow benchmarks (2017): DGX-1, 1 x P100, ResNet-50 synthetic batch 64, 219 img/s; datasheet 732 GB/s",
    ),
    "v100": _sustained(
        "v100",
        367.0,
        RESNET50_FLOPS_PER_IMAGE,
        900e9,
        15.7e12,
        "fp32",
        "NVIDIA DeepLearningExamples ResNet50 v1.5 (PyTorch): 1 x V100 16GB FP32, 367 img/s; datasheet 900 GB/s",
    ),
    "a100": _A100,
    "h100": _H100,
    "h200": _H100._replace(  # the same GH100 compute, its own memory
        name="h200",
        mem_bw=4.8e12,
        source="rule: H100's (the same GH100 compute: A100's share of peak x 494.7 TFLOP/s TF32); "
        "datasheet 4.8 TB/s HBM3e",
    ),
    "rtx2080ti": Device(
        "rtx2080ti",
        8 * BERT_LARGE_FLOPS_PER_SAMPLE / 0.163,
        616e9,
        LAUNCH_S,
        "survey (Shi et al.): BERT-Large 163 ms per iteration at batch 8 on one RTX 2080Ti; datasheet 616 GB/s",
        13.4e12,
        "fp32",
    ),
}


def names() -> list[str]:
    """Names of the device presets."""
    return list(DEVICES)


def get(name: str | Device) -> Device:
    """A preset by name (case-insensitive, ``-`` and ``_`` ignored: ``RTX-2080Ti`` = ``rtx2080ti``)."""
    if isinstance(name, Device):
        return name
    if isinstance(name, str):
        key = name.lower().replace("-", "").replace("_", "").replace(" ", "")
        if key in DEVICES:
            return DEVICES[key]
    raise ValueError(f"unknown device {str(name)[:40]!r}; valid: {', '.join(names())}")


def custom(name: str, flops: float, mem_bw: float, launch_s: float = LAUNCH_S) -> Device:
    """A device from its numbers, checked: finite, flops and mem_bw > 0, launch_s >= 0."""
    for what, v, low in (("flops", flops, 0.0), ("mem_bw", mem_bw, 0.0), ("launch_s", launch_s, None)):
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or (v <= low if low is not None else v < 0):
            raise ValueError(f"device {name!r}: {what} must be a finite number {'> 0' if low is not None else '>= 0'}")
    return Device(str(name), float(flops), float(mem_bw), float(launch_s), "custom")


__all__ = ["Device", "DEVICES", "names", "get", "custom", "LAUNCH_S", "RESNET50_FLOPS_PER_IMAGE"]
