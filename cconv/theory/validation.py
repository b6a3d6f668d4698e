"""The per-iteration model against published scaling measurements it was not fitted to.

Each ``Case`` is one published multi-GPU measurement: a setting (workload, local batch, cluster,
collective algorithm, schedule), the published value (``scaling`` = throughput / (P x one GPU's),
or ``speedup`` over one GPU), its source, and what calibrated the prediction.  ``predict(case)``
runs ``cconv.theory.predict`` on it; ``table()`` gives (case, prediction, relative error).

What calibrates what (never the number being validated):

* device speed: a device preset (``cconv.theory.devices``, each derived from a published
  single-GPU throughput), or, where a report states its own single-GPU throughput, that number
  (``one_gpu``, samples/s): the device's sustained FLOP/s = one_gpu x the profile's FLOPs per
  sample.  The multi-GPU number of the same report is what is predicted;
* links: the presets of ``cconv.theory.network`` (the survey's transfer fits; NVLink and PCIe
  datasheets) and the rules for links named by rate;
* kappa (GPU interference of communication kernels): 0, except on the survey's own PCIe RTX
  2080Ti testbed, where its value was fitted to that testbed's 4-GPU BERT-Large number
  (``schedule.survey.INTERFERENCE``), not to the 32-GPU numbers checked here.

Compressed training: cases with a ``method`` other than the dense baseline (and the run's knob values
in ``knobs``) are predicted with that compressor, its payload bytes, its collective and its
compress/decompress cost (``cconv.theory.predict``).  They come from three independent sources, none
of them fitted: the GRACE benchmark's published data release (2-8 workers, one V100 each, 10 Gbit/s),
each beside its dense twin on the same backend; Espresso's Table 1 (EuroSys 2023: 8 machines of 8
V100, dense BytePS beside GPU-compressed runs, ``espresso_runs.json``); and the training logs of the
Global-QSGD release (one server of 4 A100, PyTorch DDP hooks, ``gqsgd_runs.json``), each compressed
run as its iteration time over the same release's dense run (``time_ratio``).  Methods in the data
files are their sources' own names (``espresso:DGC``), mapped by the compressor entry that declares
them (``Entry.known_as``), as GRACE's are.

Settings taken from the sources; where a source does not state one, the assumption is written in
the case's ``note``.  The collective algorithm follows the software of the time: NCCL 2's flat
ring for Horovod's 2017 benchmark (Horovod's hierarchical all-reduce came later), with that Horovod's
background loop (``fusion-2017``: a 5 ms sleep, then a tick negotiated through rank 0 by point-to-point
messages, ``schedules.Fusion``), the
hierarchical all-reduce (``HOROVOD_HIERARCHICAL_ALLREDUCE`` / NCCL's two-level rings) elsewhere.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

from cconv import compressors as C
from cconv.theory import cluster as CL
from cconv.theory import devices as D
from cconv.theory import implementation as IM
from cconv.theory import planner as PL
from cconv.theory import predict as PR
from cconv.theory import profiles
from cconv.theory.schedule.survey import INTERFERENCE

# Stated tolerances (tests/test_cluster_validation.py), issue 33's goals: every case within TOLERANCE of its
# published value except the KNOWN_MISSES (each with its reason, and checked to still miss), the median |error|
# within MEDIAN_TOLERANCE, and the sign of (compressed - dense) right for every compressed case with a dense twin
# except the SIGN_MISSES.  The model leaves out input pipelines, framework overheads and stragglers, so most
# dense predictions lie above the published values.
TOLERANCE = 0.35
MEDIAN_TOLERANCE = 0.20
MEDIAN_NOW = 0.14  # the median |error| as it stands (13.9 %): a change that makes it worse fails the test
_GRACE_POWERSGD_NCCL = (
    "GRACE's TensorFlow PowerSGD factorises each kernel as (kernel height x rest) (``Cost.view`` on TensorFlow's "
    "layout): 64 MB of factors a step, which the model overlaps with backpropagation and its 69 ms of per-tensor "
    "operations; the release's NCCL runs slow down with P (231, 280, 318 ms an iteration on 2, 4, 8 servers) as if "
    "that traffic were exposed.  GRACE issues two dependent all-reduces per tensor (Q waits for P's); charged as P's "
    "collective before Q's on the same channel, that changes no prediction by 0.1 % (the channel already serialises "
    "them), so the missing exposure is not that dependency alone"
)
_ESPRESSO_TWO_LEVEL = (
    "with Espresso's two-level collective (arch.TwoLevel) each GPU compresses 1/8 of the machine's sum and decodes "
    "8 payloads, and only the compressed shares cross the machines: the model makes compression nearly free and "
    "its traffic small, where the paper measured modest gains.  It has no term for GPU compression kernels "
    "competing with backpropagation and with the communication kernels for the GPU (Espresso, Sec. 3), nor for "
    "BytePS's partitioning and host copies; its dense prediction on this testbed is already 17-24 % optimistic"
)
_ESPRESSO_LSTM = (
    "compression slowed this PCIe / 25 Gbit/s run by 6.5 %; the model predicts it faster: with the two-level "
    "collective its DGC costs under a millisecond and saves the inter-machine part of the dense exchange, and it "
    "has no term for GPU compression kernels competing with backpropagation for the GPU (Espresso, Sec. 3)"
)
KNOWN_MISSES = {
    "Espresso 8x8 V100 GPT2 DGC 0.01": _ESPRESSO_TWO_LEVEL,
    "Espresso 8x8 V100 BERT-base SQuAD EFSignSGD": _ESPRESSO_TWO_LEVEL,
    "Espresso 8x8 V100 LSTM WikiText-2 DGC 0.01": _ESPRESSO_TWO_LEVEL + "; " + _ESPRESSO_LSTM,
}
_QUANT = (
    "a near tie in the release (compressed 2 % faster than dense); the model charges the elementwise quantizers' "
    "P decodes and byte codes too much here (QSGD and signSGD are 20-33 % too slow at 2, 4 and 8 workers)"
)
SIGN_MISSES = {
    "GRACE 8x1 10 Gbit/s PowerSGD r=1 (NCCL)": _GRACE_POWERSGD_NCCL,
    "GRACE 4x1 10 Gbit/s QSGD 64 (MPI)": _QUANT,
    "GRACE 4x1 10 Gbit/s signSGD (MPI)": _QUANT,
    "GRACE 4x1 10 Gbit/s random-k 0.01 EF (NCCL)": "its dense twin is predicted 13 % too fast (the 4-server NCCL run "
    "loses more than the model's ring charges)",
    "GRACE 8x1 10 Gbit/s random-k 0.5 EF (MPI)": "a near tie: 8.6 % faster than dense published, 0.7 % slower "
    "predicted",
    "Espresso 8x8 V100 LSTM WikiText-2 DGC 0.01": _ESPRESSO_LSTM,
    "GRACE 8x1 10 Gbit/s random-k 0.01 EF (NCCL)": "compression slows this run by 7 % in the release; the model "
    "predicts 13 % faster: it misses ~50 ms of GRACE's per-tensor random-k with its error-feedback memory ops over "
    "NCCL (the same method over MPI is predicted within 9 %)",
}

# the survey's seven methods as (schedule, planner method): BSP/WFBP/ByteScheduler x PS/all-to-all, MG-WFBP
DENSE = PL.identity_name()
DENSE_PS = f"{DENSE}-{PL.PS}"
SURVEY_SEVEN = tuple((s, m) for s in ("bsp", "wfbp", "bytescheduler") for m in (DENSE_PS, DENSE)) + (
    ("mg-wfbp", DENSE),
)


class Case(NamedTuple):
    name: str
    workload: str
    batch: int
    cluster: str  # NODESxGPUS
    intra: str
    network: str
    device: str  # a preset name, or a label when one_gpu is given
    metric: str  # "scaling", "speedup", or "time_ratio" (iteration time over the dense run's of the same source)
    published: float
    source: str
    one_gpu: float = 0.0  # samples/s on one GPU stated by the source (calibrates the device), 0: the preset
    mem_bw: float = 900e9  # with one_gpu: the GPU's datasheet memory bandwidth
    architecture: str = "hierarchical"
    schedule: str = "fusion"
    best_of_survey: bool = False  # the best of the survey's seven methods (as the survey reports)
    interference: float = 0.0
    note: str = ""
    method: str = DENSE  # a planner method (``cconv.theory.planner.all_methods``): the compressor the run used
    knobs: tuple[tuple[str, float], ...] = ()  # the compressor's knob values, e.g. (("ratio", 0.01),)
    implementation: str = "fused"  # how compression ran (``cconv.theory.implementation``)


DLE = "NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, training performance tables (pytorch-21.03)"
HVD = "Horovod README / docs/benchmarks (Sergeev & Del Balso 2018): 25 Gbit/s RoCE, 4 Pascal GPUs per server"
SURVEY = "Shi et al., Communication-Efficient Distributed Deep Learning: Survey, Evaluation, and Challenges"
I779 = "horovod/horovod issue #779: AWS p3.16xlarge (8 x V100-SXM2, 25 Gbps), tf_cnn_benchmarks synthetic"
GRACE = "GRACE data release (github.com/sands-lab/grace-data, Xu et al., ICDCS 2021)"
ESPRESSO = "Wang et al., Espresso, EuroSys 2023, Table 1 (github.com/zhuangwang93/Espresso, espresso_EuroSys23.pdf)"
GQSGD = "Global-QSGD code release (github.com/sands-lab/global-qsgd @ f0396e5, Xin et al., ECAI 2025)"
GRACE_ONE_GPU = 365.93  # the same release's 1-worker dense run (id 1ipvrhj50), total_images_per_sec
GRACE_NOTE = (
    "ImageNet ResNet-50, tf_cnn_benchmarks, one V100 per server over TCP; batch 64 (tf_cnn_benchmarks' default, "
    f"not stated); published = total_images_per_sec / (P x the 1-worker {GRACE_ONE_GPU})"
)
GRACE_CALIBRATION_GBPS = 25.0  # the declared calibration subset: every GRACE run at 25 Gbit/s
# GRACE's '1g' runs moved more than 1 Gbit/s (``link_bound_gbps``): not a setting the model can be checked on
GRACE_INCONSISTENT_GBPS = 1.0


def _grace_case(r: dict) -> Case:
    """One GRACE run (``grace_runs.json``, written by scripts/grace_runs.py from the release): its
    method as GRACE names it, mapped by the entry that declares it (``cconv.compressors.known_as``);
    Horovod over MPI is the ``mpi`` implementation, over NCCL ``per-tensor``."""
    method = C.known_as(r["method"]) if r["method"] else DENSE
    p = r["workers"]
    return Case(
        f"GRACE {r['label']}", "resnet50", 64, f"{p}x1", "PCIe3x16", f"{r['gbps']:g}GbE", "v100-grace", "scaling",
        r["ips"] / (p * GRACE_ONE_GPU), f"{GRACE}: run {r['run']} ({r['ips']} img/s)", one_gpu=GRACE_ONE_GPU,
        mem_bw=900e9, note=GRACE_NOTE, method=method, knobs=tuple(map(tuple, r["knobs"])),
        implementation="mpi" if r["backend"] == "mpi" else "per-tensor",
    )  # fmt: skip


def _grace_runs() -> list[dict]:
    return json.loads(Path(__file__).with_name("grace_runs.json").read_text(encoding="utf-8"))


GQSGD_TESTBED = ("1x4", "NVLink3", "100GbIB", "a100")  # one server of 4 A100-SXM4 (the network is not crossed)
# PyTorch DDP hooks: framework ops per DDP bucket, each bucket's collective as soon as it is ready
GQSGD_IMPLEMENTATION, GQSGD_SCHEDULE = "ddp-hook", "wfbp"


def _gqsgd_runs() -> dict:
    return json.loads(Path(__file__).with_name("gqsgd_runs.json").read_text(encoding="utf-8"))


def _gqsgd_cases() -> tuple[Case, ...]:
    """Global-QSGD's compressed runs (``gqsgd_runs.json``), each as its iteration time over the dense
    run of the same workload in the same release (``time_ratio``): the release gives no 1-GPU run,
    so the dense run is the reference, not a case.  Methods are the release's names
    (``gqsgd:qsgd_hook``), mapped by the entry that declares them (``cconv.compressors.known_as``).
    How the release runs them, from its code: PyTorch
    DDP communication hooks (``register_comm_hook``), framework ops on each DDP bucket at DDP's
    default bucket sizes (``ddp-hook``), each bucket's hook and collective issued as soon as the
    bucket is ready (DDP's reducer: ``wfbp`` over the buckets).  ``ddp-hook`` was added after these
    cases had been seen to miss under ``per-tensor`` (docs/clusters.md): they informed the model's
    structure and are no longer fully out-of-sample."""
    data = _gqsgd_runs()
    dense = {r["workload"]: r for r in data["runs"] if r["method"] is None}
    cluster, intra, network, device = GQSGD_TESTBED
    out = []
    for r in data["runs"]:
        if r["method"] is None:
            continue
        d = dense[r["workload"]]
        prof = profiles.get(r["workload"])
        out.append(
            Case(
                f"Global-QSGD 1x4 A100 {r['label']}", r["workload"], prof.batch, cluster, intra, network, device,
                "time_ratio", r["ms"] / d["ms"],
                f"{GQSGD}: {r['run']} ({r['ms']} ms) over {d['run']} ({d['ms']} ms)",
                note=f"{data['testbed']}; {r['statistic']}; {data['dense_note']}", method=C.known_as(r["method"]),
                knobs=tuple(map(tuple, r["knobs"])), implementation=GQSGD_IMPLEMENTATION,
                schedule=GQSGD_SCHEDULE,
            )
        )  # fmt: skip
    return tuple(out)


ESPRESSO_CLUSTER, ESPRESSO_DEVICE = "8x8", "v100"


ESPRESSO_ARCHITECTURE = "two-level"  # Table 1: "hierarchical communication"; compression across machines only
# GPU kernels on a flat pool of every gradient, vectors included (``implementation.ESPRESSO_VECTORS``)
ESPRESSO_IMPLEMENTATION = "espresso"


def _espresso_cases() -> tuple[Case, ...]:
    """Espresso's Table 1 (``espresso_runs.json``): three models on 8 machines of 8 V100, dense on
    BytePS (``none-ps``: one server per machine) and compressed with GPU kernels (``espresso``: cconv's
    fused program's cost, on a pool of every gradient, vectors included), each
    compressed run beside its dense twin.  Device: the V100 preset (the paper states no 1-GPU rate).
    The compressed runs use the two-level compressed collective (``arch.TwoLevel``): the table's
    caption says "hierarchical communication", and every communication type of Espresso's release
    (built on BytePS) reduces inside the machine and compresses only the inter-machine exchange.
    That architecture was added after these cases had been seen to miss (docs/clusters.md)."""
    data = json.loads(Path(__file__).with_name("espresso_runs.json").read_text(encoding="utf-8"))
    out = []
    for r in data["runs"]:
        dense = r["method"] is None
        out.append(
            Case(
                f"Espresso 8x8 V100 {r['label']}", r["workload"], r["batch"], ESPRESSO_CLUSTER, r["intra"],
                r["network"], ESPRESSO_DEVICE, "scaling", r["scaling"], f"{ESPRESSO} ({r['scaling']})",
                note=f"{data['testbed']}; {data['batches']}", method=DENSE_PS if dense else C.known_as(r["method"]),
                knobs=tuple(map(tuple, r["knobs"])), implementation=ESPRESSO_IMPLEMENTATION,
                architecture="hierarchical" if dense else ESPRESSO_ARCHITECTURE,
            )
        )  # fmt: skip
    return tuple(out)


def _dle(name: str, intra: str, device: str, batch: int, img_s: float, one: float, note: str, **calibration) -> Case:
    """A row of DeepLearningExamples' ResNet-50 tables: one DGX of 8 GPUs, scaling = img_s / (8 x the
    same table's 1-GPU img/s ``one``); ``calibration``: ``one_gpu``/``mem_bw`` where the device comes
    from that 1-GPU number."""
    return Case(
        name,
        "resnet50",
        batch,
        "1x8",
        intra,
        "PCIe3x16",
        device,
        "scaling",
        img_s / (8 * one),
        DLE,
        note=note,
        **calibration,
    )


# Horovod's charts (25 Gbit/s RoCE, 4 P100 a server, 32 images per GPU, flat ring): (servers, workload, label, scaling)
HOROVOD_CHARTS = (
    (32, "resnet101", "ResNet-101", 0.90),
    (32, "vgg16", "VGG-16", 0.79),
    (128, "resnet101", "ResNet-101", 0.90),
    (128, "vgg16", "VGG-16", 0.68),
)
# the survey's 32-GPU testbed (8 servers x 4 RTX 2080Ti, 100 Gbit/s InfiniBand): (workload, label, best speedup)
SURVEY_32 = (("resnet50", "ResNet-50", 31.6), ("bert-base", "BERT-Base", 23.2))
# horovod issue #779, p3.16xlarge servers of 8 V100: (servers, scaling)
I779_SCALING = ((2, 0.919), (4, 0.855), (8, 0.845), (16, 0.804))

# fmt: off
CASES: tuple[Case, ...] = (  # one case a block: the published setting in Case's field order, then keywords
    _dle(
        "DGX-1 8xV100 FP32 ResNet-50", "NVLink", "v100", 112, 2855, 367,
        "batch 112 (the repository's configs.yml, DGX1V FP32)",
    ),
    _dle("DGX A100 8xA100 TF32 ResNet-50", "NVLink3", "a100", 256, 7248, 938, "batch 256 (configs.yml, DGXA100 TF32)"),
    _dle(
        "DGX-1 8xV100 AMP ResNet-50", "NVLink", "v100-amp", 256, 8322, 1200,
        "batch 256 (configs.yml); device from the 1-GPU AMP 1200 img/s", one_gpu=1200, mem_bw=900e9,
    ),
    _dle(
        "DGX A100 8xA100 AMP ResNet-50", "NVLink3", "a100-amp", 256, 16621, 2470,
        "batch 256 (configs.yml); device from the 1-GPU AMP 2470 img/s", one_gpu=2470, mem_bw=2039e9,
    ),
    Case(
        "4xV100 NVLink BERT-Large b128", "bert-large", 128, "1x4", "NVLink", "PCIe3x16", "v100", "speedup", 3.82,
        SURVEY + " (Sec. 4.2.1)", note="4 V100 32 GB on NVLink, batch 128",
    ),
    *(
        Case(
            f"survey 8x4 2080Ti 100GbIB {label}", workload, 64, "8x4", "PCIe3x16", "100GbIB", "rtx2080ti", "speedup",
            best, SURVEY + " (Sec. 4.2.1, Fig. 4)", best_of_survey=True, interference=INTERFERENCE,
            note="best of the seven methods, as published",
        )
        for workload, label, best in SURVEY_32
    ),
    *(
        Case(
            f"Horovod {n}x4 P100 {label}", workload, 32, f"{n}x4", "PCIe3x16", "25GbRoCE", "p100", "scaling", scaling,
            HVD + f" ({4 * n}-GPU chart)", architecture="ring", schedule="fusion-2017",
            note="32 images per GPU (horovod#425)" + ("; P100 variant not stated (SXM2 preset)" if i == 0 else ""),
        )
        for i, (n, workload, label, scaling) in enumerate(HOROVOD_CHARTS)
    ),
    Case(
        "2x1 RTX 2080 10GbE ResNet-101", "resnet101", 64, "2x1", "PCIe3x16", "10GbE", "rtx2080", "scaling",
        291 / (2 * 172), "horovod/horovod issue #659 (1 GPU 172 img/s, 2 nodes 291 img/s, real data)",
        one_gpu=172, mem_bw=448e9, note="batch 64 (tf_cnn_benchmarks' default, not stated)",
    ),
    *(
        Case(
            f"p3.16xlarge {n}x8 V100 ResNet-50", "resnet50", 256, f"{n}x8", "NVLink", "25GbE", "v100-872", "scaling",
            eff, I779, one_gpu=872, mem_bw=900e9,
            note="1-GPU 872 img/s (mixed precision); batch 256 and fp32 gradients assumed (not stated)",
        )
        for n, eff in I779_SCALING
    ),
    # compressed training: the GRACE benchmark's ResNet-50 runs on 2, 4 and 8 servers of one V100 at 1 and 10
    # Gbit/s, not the 25 Gbit/s calibration subset, each with its dense twin on the same backend
    *(_grace_case(r) for r in _grace_runs() if r["gbps"] not in (GRACE_CALIBRATION_GBPS, GRACE_INCONSISTENT_GBPS)),
    # compressed training of other sources, each over its own dense run (``time_ratio``)
    *_gqsgd_cases(),
    *_espresso_cases(),
)
# fmt: on

# The calibration subset the per-tensor and MPI constants were fitted to (``calibrate``): never in CASES.
CALIBRATION: tuple[Case, ...] = tuple(_grace_case(r) for r in _grace_runs() if r["gbps"] == GRACE_CALIBRATION_GBPS)
# The runs at a link rate they exceeded (``link_bound_gbps``): shown, not counted.
INCONSISTENT: tuple[Case, ...] = tuple(_grace_case(r) for r in _grace_runs() if r["gbps"] == GRACE_INCONSISTENT_GBPS)


def link_bound_gbps(case: Case) -> float:
    """The Gbit/s a dense run's link must have carried at least: a ring all-reduce moves 2(P-1)/P x 4D
    bytes per worker per iteration, and the iteration took M P / throughput seconds (published)."""
    p = CL.parse(case.cluster).workers
    t_iter = case.batch / (case.published * device_of(case).flops / profiles.get(case.workload).flops_per_sample)
    return 2 * (p - 1) / p * 4 * profiles.get(case.workload).params * 8 / t_iter / 1e9


def dense_twin(case: Case, cases: tuple[Case, ...] = CASES) -> Case | None:
    """The dense run of the same setting and implementation as a compressed ``case`` (None: none)."""
    same = ("workload", "cluster", "network", "implementation")
    for c in cases:
        if is_dense(c) and c is not case and all(getattr(c, k) == getattr(case, k) for k in same):
            return c
    return None


def is_dense(case: Case) -> bool:
    """Whether ``case`` trains without compression (all-reduce or BytePS's parameter servers)."""
    return case.method in (DENSE, DENSE_PS)


def signs(rows: list[tuple[Case, float, float]]) -> list[tuple[Case, float, float]]:
    """(case, published, predicted) relative change of compressed over its dense twin, for every
    compressed row with a twin among ``rows``: > 0 means compression made training faster."""
    pred = {c.name: p for c, p, _ in rows}
    out = []
    for c, p, _ in rows:
        if c.metric == "time_ratio":  # the dense run is the reference: faster means a ratio below 1
            out.append((c, 1.0 / c.published - 1.0, 1.0 / p - 1.0))
            continue
        twin = dense_twin(c, tuple(r[0] for r in rows)) if not is_dense(c) else None
        if twin is not None:
            out.append((c, c.published / twin.published - 1.0, p / pred[twin.name] - 1.0))
    return out


def device_of(case: Case) -> D.Device:
    """The case's device: a preset, or the rate its source's own single-GPU throughput implies."""
    if not case.one_gpu:
        return D.get(case.device)
    per_sample = profiles.get(case.workload).flops_per_sample
    return D.Device(case.device, case.one_gpu * per_sample, case.mem_bw, D.LAUNCH_S, f"{case.one_gpu} samples/s")


def predict(case: Case, implementation: IM.Implementation | None = None) -> float:
    """The model's value of ``case.metric`` for ``case`` (``implementation``: overrides the case's
    implementation, e.g. with other constants while calibrating)."""
    c = CL.parse(case.cluster, case.intra, case.network, D.get("v100"))._replace(device=device_of(case))
    impl = implementation or IM.get(case.implementation)
    kw = dict(batch=case.batch, interference=case.interference, implementation=impl)
    if case.best_of_survey:
        rows = [PR.predict(c, case.workload, [m], schedule=s, **kw)[0] for s, m in SURVEY_SEVEN]
    else:
        rows = PR.predict(
            c,
            case.workload,
            [case.method],
            sweep={k: [v] for k, v in case.knobs},  # the run's knob value, not the planner's sweep
            schedule=case.schedule,
            architecture=case.architecture,
            **kw,
        )
    best = max(rows, key=lambda r: r.speedup)
    if case.metric == "time_ratio":
        dense = PR.predict(c, case.workload, [DENSE], schedule=case.schedule, architecture=case.architecture, **kw)[0]
        return best.iteration_time_s / dense.iteration_time_s
    return best.scaling_factor if case.metric == "scaling" else best.speedup


# The calibration's search: each constant on a geometric grid (``calibrate``)
GRIDS = {
    "op_s": tuple(10e-6 * 1.25**i for i in range(15)),
    "sort_passes": tuple(25.0 * 2**i for i in range(9)),
    "host_bw": tuple(0.5e9 * 1.25**i for i in range(14)),
    "round_s": tuple(10e-6 * 1.25**i for i in range(21)),
}


def calibration_loss(values: dict, cases: tuple[Case, ...] = CALIBRATION) -> float:
    """Mean squared log error of ``cases`` with the per-tensor/MPI constants ``values`` (op_s,
    sort_passes, host_bw, round_s; host staging only where the case's implementation stages)."""
    total = 0.0
    for case in cases:
        base = IM.get(case.implementation)
        impl = base._replace(**{k: v for k, v in values.items() if k != "host_bw" or base.host_bw})
        total += math.log(predict(case, impl) / case.published) ** 2
    return total / len(cases)


def calibrate(cases: tuple[Case, ...] = CALIBRATION, rounds: int = 4) -> dict:
    """The constants of ``cconv.theory.implementation`` fitted to ``cases`` (default: the declared
    GRACE 25 Gbit/s subset): coordinate descent on ``GRIDS``, minimising ``calibration_loss``,
    from the middle of each grid.  Deterministic; its result is what implementation.py states."""
    values = {k: g[len(g) // 2] for k, g in GRIDS.items()}
    for _ in range(rounds):
        before = dict(values)
        for k, grid in GRIDS.items():
            values[k] = min(grid, key=lambda v: calibration_loss({**values, k: v}, cases))
        if values == before:
            break
    return values


def table(cases: tuple[Case, ...] = CASES) -> list[tuple[Case, float, float]]:
    """(case, prediction, relative error prediction / published - 1) for every case."""
    out = []
    for case in cases:
        pred = predict(case)
        out.append((case, pred, pred / case.published - 1.0))
    return out


def source_of(case: Case) -> str:
    """The source a case's name starts with ("GRACE", "Global-QSGD", ...; a dense run of another
    source: its first word)."""
    return case.name.split()[0]


def summary(rows: list[tuple[Case, float, float]]) -> str:
    """Markdown: per group of cases (dense runs of the other sources, GRACE's dense runs, each
    source's compressed runs, all compressed runs, all) the count, median and largest |error|, and
    how many compressed cases get the sign of (compressed - dense) right."""
    import statistics

    compressed_sources = dict.fromkeys(source_of(c) for c, _, _ in rows if not is_dense(c))
    groups = {
        "dense, other sources": lambda c: source_of(c) != "GRACE" and is_dense(c),
        "GRACE dense": lambda c: source_of(c) == "GRACE" and is_dense(c),
        **{f"{s} compressed": (lambda c, s=s: source_of(c) == s and not is_dense(c)) for s in compressed_sources},
        "all compressed": lambda c: not is_dense(c),
        "all": lambda c: True,
    }
    signed = {c.name: (pub > 0) == (pred > 0) for c, pub, pred in signs(rows)}
    lines = ["| cases | n | median abs. error | largest abs. error | sign of compressed - dense right |"]
    lines.append("|---|---|---|---|---|")
    for label, keep in groups.items():
        errs = [abs(e) for c, _, e in rows if keep(c)]
        ok = [signed[c.name] for c, _, _ in rows if keep(c) and c.name in signed]
        sign = f"{sum(ok)} of {len(ok)}" if ok else "-"
        lines.append(f"| {label} | {len(errs)} | {statistics.median(errs):.1%} | {max(errs):.1%} | {sign} |")
    return "\n".join(lines)


def markdown(rows: list[tuple[Case, float, float]], sources: bool = True) -> str:
    """The table as Markdown (docs/clusters.md; ``sources=False``: the README's, without the
    source column)."""
    lines = [
        "| setting | metric | published | predicted | rel. error |" + (" source |" if sources else ""),
        "|---|---|---|---|---|" + ("---|" if sources else ""),
    ]
    for c, pred, err in rows:
        row = f"| {c.name} | {c.metric} | {c.published:.3g} | {pred:.3g} | {err:+.1%} |"
        lines.append(row + (f" {c.source}; {c.note} |" if sources else ""))
    return "\n".join(lines)


# Cases whose implementation, schedule or architecture was declared anew after the model had been seen to miss them
# (docs/clusters.md): their earlier declaration, so that the table before/after is computed, not transcribed.
# Those cases informed the model's structure and are no longer fully out-of-sample.
REDECLARED: dict[str, dict] = {
    **{c.name: {"implementation": "per-tensor", "schedule": "fusion"} for c in CASES if source_of(c) == "Global-QSGD"},
    **{c.name: {"architecture": "hierarchical"} for c in CASES if source_of(c) == "Espresso" and not is_dense(c)},
}


def _declared(case: Case) -> str:
    return f"{case.implementation}, {case.schedule}, {case.architecture}"


def before_after(cases: tuple[Case, ...] = CASES) -> str:
    """Markdown: each ``REDECLARED`` case predicted under its earlier declaration and its current one."""
    lines = [
        "| setting | published | before: declared | predicted | rel. error | now: declared | predicted | rel. error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        if case.name in REDECLARED:
            old = case._replace(**REDECLARED[case.name])
            a, b = predict(old), predict(case)
            lines.append(
                f"| {case.name} | {case.published:.3g} | {_declared(old)} | {a:.3g} | {a / case.published - 1:+.1%} "
                f"| {_declared(case)} | {b:.3g} | {b / case.published - 1:+.1%} |"
            )
    return "\n".join(lines)


__all__ = [
    "Case",
    "CASES",
    "CALIBRATION",
    "INCONSISTENT",
    "TOLERANCE",
    "MEDIAN_TOLERANCE",
    "KNOWN_MISSES",
    "SIGN_MISSES",
    "REDECLARED",
    "before_after",
    "calibrate",
    "calibration_loss",
    "link_bound_gbps",
    "dense_twin",
    "is_dense",
    "signs",
    "source_of",
    "summary",
    "predict",
    "table",
    "markdown",
    "device_of",
]
