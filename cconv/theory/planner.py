"""``cconv plan``: predicted iteration time, speedup and traffic of every compressor on a network.

Model (``theory/planner.md``): P workers each process a local mini-batch of M samples of a
model with D parameters and C FLOPs per sample (forward + backward) on a device sustaining F
FLOP/s, then exchange their (compressed) gradients:

    t_comp = M C / F
    t_iter(P) = t_comp + t_comm(P)              (BSP: communication after backpropagation)
    t_iter(P) = t_comp + exposed(P)             (``--overlap``: wait-free backprop, Zhang et al.
                                                 2017, behind a backward pass of 2/3 t_comp)
    speedup(P) = P t_comp / t_iter(P)           (throughput over one worker, weak scaling, as
                                                 in the survey's evaluation)

t_comm is ``cconv.theory.network.step_comm_time`` of the collectives the method issues, with
payload sizes from the compressors' own ``wire_bytes``.  Compression compute (selection,
packing) is not modelled, and lossy methods may need more iterations to reach the same
accuracy: the speedup is per iteration, not time-to-accuracy.

Columns: payload/worker is what one worker contributes per iteration (the compressors'
``wire_bytes``); sent/worker is what it puts on its link under the flat algorithms of
``cconv.theory.network.bytes_sent`` (also for two-level networks).

Granularity ``fused`` (default): the gradient is one flat vector of D entries (tensor fusion,
as Horovod and the gTop-k paper do), one call per step.  ``layerwise``: one call per tensor
(needs the workload's tensor shapes), as each tensor's gradient becomes ready.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NamedTuple, Sequence

import numpy as np

from cconv import compressors as C
from cconv.compressors.powersgd import is_compressed as _psgd_compressed, matrix_shape as _psgd_matrix
from cconv.theory import constants as K
from cconv.theory import network as N
from cconv.theory import workloads as W

DEFAULT_RATIOS = (0.1, 0.01, 0.001)
DEFAULT_RANKS = (1, 4)
DEFAULT_LEVELS = (4, 16)
BACKWARD_SHARE = 2.0 / 3.0          # backward ~ 2x forward
FUSION_BYTES = 64 * 2 ** 20         # Horovod's default fusion buffer

# method -> (registered compressor, collective kind, lossless, which hyper-parameter sweeps)
METHODS = {
    "none": ("none", "allreduce", True, None),
    "none-ps": ("none", "ps", True, None),
    "fp16": ("fp16", "allreduce", False, None),
    "randomk": ("randomk", "allreduce", False, "ratio"),
    "topk": ("topk", "allgather", False, "ratio"),
    "gtopk": ("topk", "recursive_doubling", False, "ratio"),
    "dgc": ("dgc", "allgather", False, "ratio"),
    "stc": ("stc", "allgather", False, "ratio"),
    "qsgd": ("qsgd", "allgather", False, "levels"),
    "terngrad": ("terngrad", "allgather", False, None),
    "signsgd": ("signsgd", "allgather", False, None),
    "scaled_sign": ("scaled_sign", "allgather", False, None),
    "onebit": ("onebit", "allgather", False, None),
    "powersgd": ("powersgd", "powersgd", False, "rank"),
}


class Row(NamedTuple):
    method: str
    setting: str
    payload_bytes: float      # payload bytes one worker contributes per iteration
    sent_bytes: float         # bytes one worker sends per iteration under the algorithms
    comm_s: float             # communication seconds (exposed seconds with overlap)
    iter_s: float
    speedup: float
    lossless: bool
    constant: str = ""        # the compressor's class on a D-vector: omega=..., delta=..., biased


class Plan(NamedTuple):
    workload: W.Workload
    network: N.Network | N.Hierarchical
    workers: int
    device_flops: float
    compute_s: float
    rows: list[Row]
    notes: list[str]

    def best(self, lossless_only: bool = False, contractive_only: bool = False) -> Row:
        """The fastest row; ``lossless_only``: dense methods; ``contractive_only``: methods with a
        contraction delta > 0 (error feedback's guarantee, theory/convergence.md) or lossless."""
        rows = [r for r in self.rows if r.lossless or not lossless_only]
        if contractive_only:
            rows = [r for r in rows if r.lossless or r.constant.startswith("delta=")]
        return max(rows, key=lambda r: (r.speedup, -r.sent_bytes))


def _calls(method: str, hp: dict, workload: W.Workload, workers: int, granularity: str,
           servers: int) -> list[tuple[str, float, int]]:
    """(kind, bytes, tensor index) of every call, in forward order of the tensors."""
    name, kind, _, _ = METHODS[method]
    c = C.get(name, **hp)
    shapes = workload.shapes if granularity == "layerwise" else ((workload.params,),)
    calls: list[tuple[str, float, int]] = []
    if kind == "powersgd":
        r = hp["rank"]
        fused_p = fused_q = 0.0
        for i, s in enumerate(workload.shapes):
            if _psgd_compressed(s, r):
                n, m = _psgd_matrix(s)
                p_b, q_b = 4.0 * r * n, 4.0 * r * m
            else:
                p_b, q_b = 4.0 * int(np.prod(s)), 0.0
            if granularity == "layerwise":
                calls.append(("allreduce", p_b, i))
                if q_b:
                    calls.append(("allreduce", q_b, i))
            else:
                fused_p += p_b
                fused_q += q_b
        if granularity != "layerwise":
            calls = [("allreduce", fused_p, 0), ("allreduce", fused_q, 0)]
        return calls
    for i, s in enumerate(shapes):
        b = float(c.wire_bytes(s, "float32"))
        if kind == "ps":
            calls += [("ps_push", b, i), ("ps_pull", b, i)]
        else:
            calls.append((kind, b, i))
    return calls


def _settings(method: str, ratios, ranks, levels) -> list[dict]:
    sweep = METHODS[method][3]
    if sweep == "ratio":
        return [dict(ratio=r) for r in ratios]
    if sweep == "rank":
        return [dict(rank=r) for r in ranks]
    if sweep == "levels":
        return [dict(levels=s) for s in levels]
    return [{}]


def _constant(method: str, hp: dict, workload: W.Workload) -> str:
    """The compressor's worst-case constant on the flat D-vector (cconv.theory.constants)."""
    name = METHODS[method][0]
    if name == "powersgd":
        return "delta>=0"
    k = K.constants(C.get(name, **hp), (workload.params,))
    if k.kind == "unbiased":
        return f"omega={k.omega:.3g}"
    if k.kind == "contractive":
        return f"delta={k.delta:.3g}"
    return "delta>=0" if k.delta == 0.0 else "biased"


def plan(workload: W.Workload, workers: int, net: N.Network | N.Hierarchical, device_flops: float = W.SURVEY_DEVICE_FLOPS,
         *, ratios: Sequence[float] = DEFAULT_RATIOS, ranks: Sequence[int] = DEFAULT_RANKS,
         levels: Sequence[int] = DEFAULT_LEVELS, granularity: str = "fused", overlap: bool = False,
         methods: Sequence[str] | None = None, servers: int | None = None) -> Plan:
    """Predict every method's iteration time on ``net`` (see the module docstring for the model)."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not (isinstance(device_flops, (int, float)) and math.isfinite(device_flops) and device_flops > 0):
        raise ValueError(f"device_flops must be a number > 0, got {device_flops!r}")
    if granularity not in ("fused", "layerwise"):
        raise ValueError(f"granularity must be one of fused, layerwise; got {granularity!r}")
    methods = list(METHODS) if methods is None else list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(METHODS)}")
    if servers is None:   # one server per worker machine, as the survey's BytePS runs
        servers = max(1, workers // net.per_node) if isinstance(net, N.Hierarchical) else workers
    notes = []
    layered = len(workload.shapes) > 1
    if granularity == "layerwise" and not layered:
        notes.append("layerwise granularity without tensor shapes: the model is one tensor")
    if "powersgd" in methods and not layered:
        methods.remove("powersgd")
        notes.append("powersgd needs the tensor shapes (use --workload); omitted")
    compute = workload.batch * workload.flops_per_sample / device_flops
    backward = BACKWARD_SHARE * compute
    # ready time of each tensor's gradient: backprop runs from the last tensor to the first,
    # each tensor taking a share of the backward pass proportional to its size.
    sizes = np.array([float(np.prod(s)) for s in workload.shapes])
    ready_of = backward * np.cumsum(sizes[::-1])[::-1] / sizes.sum()
    rows = []
    for m in methods:
        _, _, lossless, _ = METHODS[m]
        for hp in _settings(m, ratios, ranks, levels):
            calls = _calls(m, hp, workload, workers, granularity, servers)
            colls = [(k, b) for k, b, _ in calls]
            payload = sum(b for k, b, _ in calls if k != "ps_pull")
            sent = sum(N.bytes_sent(k, b, workers, servers=servers) for k, b in colls)
            if overlap:
                if granularity == "layerwise":
                    ready = [float(ready_of[i]) for _, _, i in calls]
                else:
                    ready = [backward] * len(calls)
                ov = N.Overlap(backward, FUSION_BYTES if granularity == "layerwise" else 0, ready)
                comm = N.step_comm_time(colls, workers, net, ov, servers=servers)
            else:
                comm = N.step_comm_time(colls, workers, net, servers=servers)
            it = compute + comm
            setting = ", ".join(f"{k}={v}" for k, v in hp.items()) or "-"
            rows.append(Row(m, setting, payload, sent, comm, it, workers * compute / it, lossless,
                            _constant(m, hp, workload)))
    if not rows:
        raise ValueError("no method left to plan")
    return Plan(workload, net, workers, float(device_flops), compute, rows, notes)


# --------------------------------------------------------------------------- printing


def human_bytes(n: float) -> str:
    """Decimal units with 3 significant digits: 1.34 GB, 80.0 kB, 12 B."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def _describe(net) -> str:
    if isinstance(net, N.Hierarchical):
        return (f"{net.name}: {net.per_node} workers per node on {_describe(net.intra)}, "
                f"nodes on {_describe(net.inter)}")
    return f"{net.name} (alpha={net.alpha * 1e6:.2f} us, beta={net.beta:.4g} s/B, {net.bandwidth / 1e9:.3g} GB/s)"


def format_plan(p: Plan, overlap: bool = False, granularity: str = "fused") -> str:
    w, net = p.workload, p.network
    lines = [
        f"workload {w.name}: D={w.params:,} params, C={w.flops_per_sample:.4g} FLOP/sample, "
        f"I=C/D={w.intensity:.1f}, M={w.batch} per worker, P={p.workers}",
        f"network {_describe(net)}; device {p.device_flops:.4g} FLOP/s",
        f"compute {p.compute_s * 1e3:.1f} ms/iteration; granularity {granularity}; "
        f"overlap {'WFBP' if overlap else 'none (BSP)'}; compression compute not modelled",
        "",
        f"{'method':<12} {'setting':<12} {'payload/worker':>14} {'sent/worker':>12} "
        f"{'comm ms':>9} {'iter ms':>9} {'speedup':>8}  {'constant':<14}",
    ]
    for r in p.rows:
        lines.append(f"{r.method:<12} {r.setting:<12} {human_bytes(r.payload_bytes):>14} "
                     f"{human_bytes(r.sent_bytes):>12} {r.comm_s * 1e3:>9.2f} {r.iter_s * 1e3:>9.1f} "
                     f"{r.speedup:>7.2f}x  {r.constant:<14}")
    best, best_ll, best_c = p.best(), p.best(lossless_only=True), p.best(contractive_only=True)
    lines.append("")
    lines.append(f"fastest: {best.method} ({best.setting}) {best.speedup:.2f}x; "
                 f"fastest contractive (EF-compatible): {best_c.method} ({best_c.setting}) "
                 f"{best_c.speedup:.2f}x; fastest lossless: {best_ll.method} {best_ll.speedup:.2f}x")
    lines.append("lossy speedups are per iteration, not time-to-accuracy: see the constant column "
                 "(omega = variance factor, delta = contraction; theory/compressors.md)")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def _pos_int(text: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(v)


def _pos_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _list(conv):
    def parse(text: str):
        try:
            return [conv(t) for t in text.split(",") if t.strip()]
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise argparse.ArgumentTypeError(f"bad list {text!r}: {e}") from None
    return parse


def _ratio(text: str) -> float:
    v = _pos_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"ratio must be in (0, 1], got {text!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", help=f"a survey workload preset: {', '.join(W.names())}")
    p.add_argument("--params", type=_pos_int, help="D, number of parameters")
    p.add_argument("--flops-per-sample", type=_pos_float, help="C, FLOPs per sample (forward + backward)")
    p.add_argument("--batch", type=_pos_int, help="M, local mini-batch per worker")
    p.add_argument("--workers", type=_pos_int, required=True, help="P, number of workers")
    p.add_argument("--network", required=True,
                   help=f"preset(s), comma-separated: {', '.join(N.names())}; or a name for --alpha/--beta")
    p.add_argument("--alpha", type=float, help="custom network: seconds per message")
    p.add_argument("--beta", type=float, help="custom network: seconds per byte")
    p.add_argument("--device-flops", type=_pos_float, default=W.SURVEY_DEVICE_FLOPS,
                   help="F, sustained FLOP/s of one worker (default: the survey's RTX 2080Ti on "
                        "BERT-Large, 597e9/0.163 s = 3.66e12)")
    p.add_argument("--ratios", type=_list(_ratio), default=list(DEFAULT_RATIOS),
                   help="sparsifier ratios k/d (default 0.1,0.01,0.001)")
    p.add_argument("--ranks", type=_list(_pos_int), default=list(DEFAULT_RANKS), help="PowerSGD ranks")
    p.add_argument("--levels", type=_list(_pos_int), default=list(DEFAULT_LEVELS), help="QSGD levels s")
    p.add_argument("--methods", type=_list(str), default=None, help=f"subset of: {', '.join(METHODS)}")
    p.add_argument("--granularity", choices=("fused", "layerwise"), default="fused")
    p.add_argument("--overlap", action="store_true",
                   help="model wait-free backprop (backward = 2/3 of compute) with 64 MiB tensor fusion")
    p.add_argument("--servers", type=_pos_int, default=None,
                   help="parameter servers for none-ps (default: one per worker, as BytePS in the survey)")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``plan`` sub-command to ``cconv``'s argparse sub-parsers."""
    p = subparsers.add_parser("plan", help="predict iteration time and speedup of every compressor",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def _workload(args) -> W.Workload:
    given = {k: getattr(args, k) for k in ("params", "flops_per_sample", "batch")}
    if args.workload is not None:
        w = W.get(args.workload)
        if given["params"] is not None and given["params"] != w.params:
            w = W.custom(given["params"], w.flops_per_sample, w.batch, name=f"{w.name}(custom D)")
        if given["flops_per_sample"] is not None:
            w = w._replace(flops_per_sample=given["flops_per_sample"])
        if given["batch"] is not None:
            w = w._replace(batch=given["batch"])
        return w
    missing = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is None]
    if missing:
        raise ValueError(f"give --workload ({', '.join(W.names())}) or all of --params, "
                         f"--flops-per-sample, --batch (missing {', '.join(missing)})")
    return W.custom(given["params"], given["flops_per_sample"], given["batch"])


def _networks(args) -> list[N.Network]:
    if args.alpha is not None or args.beta is not None:
        if args.alpha is None or args.beta is None:
            raise ValueError("a custom network needs both --alpha (s per message) and --beta (s per byte)")
        return [N.from_config({"name": args.network, "alpha": args.alpha, "beta": args.beta})]
    return [N.get(n.strip()) for n in args.network.split(",") if n.strip()]


def run(args) -> int:
    """Print the plan; 0 on success, 2 with one line on stderr for bad input."""
    try:
        w = _workload(args)
        nets = _networks(args)
        if not nets:
            raise ValueError(f"--network is empty; presets: {', '.join(N.names())}")
        out = []
        for net in nets:
            p = plan(w, args.workers, net, args.device_flops, ratios=args.ratios, ranks=args.ranks,
                     levels=args.levels, granularity=args.granularity, overlap=args.overlap,
                     methods=args.methods, servers=args.servers)
            out.append(format_plan(p, args.overlap, args.granularity))
    except ValueError as e:
        print(f"cconv plan: error: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(out))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cconv.theory.planner ...`` (the same as ``cconv plan ...``)."""
    parser = argparse.ArgumentParser(prog="cconv plan", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
