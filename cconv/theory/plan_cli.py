"""``cconv plan``: predicted iteration time, speedup and traffic of every compressor on a network.

The command-line half of ``cconv.theory.planner`` (the model): arguments, the workload and
networks they name, and the printed table.  ``python -m cconv.theory.plan_cli ...`` is the same
as ``cconv plan ...``.

Sweeps: ``--sweep NAME=v1,v2`` sets the values of the knob NAME (a compressor entry's
``Knob``: ratio, rank, levels, tau, clip, ...; repeatable); ``--ratios``, ``--ranks`` and
``--levels`` are aliases of ``--sweep ratio=``, ``rank=`` and ``levels=``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cconv import compressors as C
from cconv._text import shown, shown_name, shown_names
from cconv.cli_schema import Command, Option, add_options, error_line, standalone
from cconv.theory import cluster as CL
from cconv.theory import device_profile as DP
from cconv.theory import gossip as G
from cconv.theory import implementation as IM
from cconv.theory import network as N
from cconv.theory import planner as PL
from cconv.theory import predict as PR
from cconv.theory import profiles
from cconv.theory import workloads as W
from cconv.theory.schedule import compress as CC
from cconv.theory.schedule import ratios
from cconv.theory.schedule import schedules as S
from cconv.theory.schedule import survey as SV
from cconv.theory.schedule.sets import METHOD_SETS

# --------------------------------------------------------------------------- printing


def human_bytes(n: float) -> str:
    """Decimal units with 3 significant digits: 1.34 GB, 80.0 kB, 12 B."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"


def _describe(net: N.Network | N.Hierarchical) -> str:
    if isinstance(net, N.Hierarchical):
        return f"{net.name}: {net.per_node} workers per node on {_describe(net.intra)}, nodes on {_describe(net.inter)}"
    return f"{net.name} (alpha={net.alpha * 1e6:.2f} us, beta={net.beta:.4g} s/B, {net.bandwidth / 1e9:.3g} GB/s)"


def format_plan(p: PL.Plan, overlap: bool = False, granularity: str = "fused") -> str:
    """The plan as the table ``cconv plan`` prints, with the winners and the notes."""
    w, net = p.workload, p.network
    lines = [
        f"workload {w.name}: D={w.params:,} params, C={w.flops_per_sample:.4g} FLOP/sample, "
        f"I=C/D={w.intensity:.1f}, M={w.batch} per worker, P={p.workers}",
        f"network {_describe(net)}; device {p.device_flops:.4g} FLOP/s",
        f"compute {p.compute_s * 1e3:.1f} ms/iteration; granularity {granularity}; "
        f"overlap {'WFBP' if overlap else 'none (BSP)'}; compression compute not modelled",
    ]
    whole = [r for r in p.rows if r.phase in ("", PL.MEAN)]  # a method's step, or an optimizer's mean step
    wm, ws = max(12, *(len(r.method) for r in whole)), max(12, *(len(r.setting) for r in whole))
    lines += [
        "",
        f"{'method':<{wm}} {'setting':<{ws}} {'payload/worker':>14} {'sent/worker':>12} "
        f"{'comm ms':>9} {'iter ms':>9} {'speedup':>8}  {'constant':<14}",
    ]
    for r in whole:
        lines.append(
            f"{r.method:<{wm}} {r.setting:<{ws}} {human_bytes(r.payload_bytes):>14} "
            f"{human_bytes(r.sent_bytes):>12} {r.comm_s * 1e3:>9.2f} {r.iter_s * 1e3:>9.1f} "
            f"{r.speedup:>7.2f}x  {r.constant:<14}"
        )
    best = p.best()
    winners = [f"fastest: {best.method} ({best.setting}) {best.speedup:.2f}x"]
    if any(r.lossless or r.constant.startswith("delta=") for r in whole):
        best_c = p.best(contractive_only=True)
        winners.append(f"fastest contractive (EF-compatible): {best_c.method} ({best_c.setting}) {best_c.speedup:.2f}x")
    if any(r.lossless for r in whole):
        best_ll = p.best(lossless_only=True)
        winners.append(f"fastest lossless: {best_ll.method} {best_ll.speedup:.2f}x")
    lines.append("")
    lines.append("; ".join(winners))
    lines.append(
        "lossy speedups are per iteration, not time-to-accuracy: see the constant column "
        "(omega = variance factor, delta = contraction; theory/compressors.md)"
    )
    lines += format_phases(p)
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def format_phases(p: PL.Plan) -> list[str]:
    """Each optimizer method's phases: the seconds and bytes of one step of each (what it sends:
    dense, its compressor's payloads, or nothing), and how many of the run's steps it covers; the
    table's row of that method is their mean over the run (total time / steps)."""
    lines = []
    for mean in (r for r in p.rows if r.phase == PL.MEAN):
        rows = [r for r in p.rows if r.method == mean.method and r.knobs == mean.knobs and r.phase != PL.MEAN]
        lines += [
            "",
            f"{mean.method} ({mean.setting}) over {mean.steps:,} steps: one step of each phase; its row above is "
            "their mean over the run (total time / steps)",
            f"  {'sends':<12} {'steps':>9} {'share':>7} {'payload/worker':>14} {'sent/worker':>12} {'comm ms':>9} "
            f"{'iter ms':>9} {'speedup':>8}  step kinds",
        ]
        for r in rows:
            lines.append(
                f"  {r.phase:<12} {r.steps:>9,} {100 * r.steps / mean.steps:>6.1f}% {human_bytes(r.payload_bytes):>14} "
                f"{human_bytes(r.sent_bytes):>12} {r.comm_s * 1e3:>9.2f} {r.iter_s * 1e3:>9.1f} {r.speedup:>7.2f}x  "
                f"{', '.join(r.kinds)}"
            )
    return lines


# --------------------------------------------------------------------------- arguments


# Upper bounds on the numbers a plan takes: beyond them a value is a typo, and planning it would
# overflow or take unbounded time (issue 26, rule 9).
MAX_INT = 2**31 - 1  # any integer knob value (ranks, levels, ...)
MAX_RANK = 1 << 16
MAX_PARAMS = 10**13
MAX_BATCH = 1 << 24
MAX_FLOPS = 1e18  # FLOPs per sample or FLOP/s of one device
MIN_FLOPS = 1.0  # a FLOP per sample or per second: below it, times overflow (--device-flops 1e-300: inf s)
MAX_LIST = 64  # values in one list option
_SHOWN = 40  # characters of a bad value echoed in a message


def _int_in(limit: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text[:_SHOWN]!r}") from None
        if not math.isfinite(v) or v < 1 or v != int(v):
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text[:_SHOWN]!r}")
        if v > limit:
            raise argparse.ArgumentTypeError(f"expected an integer <= {limit}, got {text[:_SHOWN]!r}")
        return int(v)

    return parse


_pos_int = _int_in(MAX_INT)


def _float_in(limit: float, zero: bool = False, low: float = 0.0) -> Callable[[str], float]:
    """A finite number in [``low``, ``limit``] (0 allowed only with ``zero``)."""
    what = "a number >= 0" if zero else "a positive number"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text[:_SHOWN]!r}") from None
        if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text[:_SHOWN]!r}")
        if v > limit or (0 < v < low):
            raise argparse.ArgumentTypeError(f"expected a number in [{low:g}, {limit:g}], got {text[:_SHOWN]!r}")
        return v

    return parse


_pos_float = _float_in(MAX_FLOPS)
_flops = _float_in(MAX_FLOPS, low=MIN_FLOPS)


def _list(conv: Callable[[str], Any]) -> Callable[[str], list]:
    def parse(text: str) -> list:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of values, got {text[:_SHOWN]!r}")
        if len(items) > MAX_LIST:
            raise argparse.ArgumentTypeError(f"at most {MAX_LIST} values, got {len(items)}")
        try:
            return [conv(t) for t in items]
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise argparse.ArgumentTypeError(f"bad list {text[:_SHOWN]!r}: {e}") from None

    return parse


def _ratio(text: str) -> float:
    v = _pos_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"ratio must be in (0, 1], got {text!r}")
    return v


def _sweep_item(text: str) -> tuple[str, list[str]]:
    name, eq, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not eq or not name.strip() or not items:
        raise argparse.ArgumentTypeError(f"expected NAME=v1,v2,..., got {text[:_SHOWN]!r}")
    if len(items) > MAX_LIST:
        raise argparse.ArgumentTypeError(f"at most {MAX_LIST} values, got {len(items)}")
    return name.strip(), items


def knob_value(name: str, text: str, option: str = "--sweep", knobs_only: bool = True) -> Any:
    """``text`` as a value of knob ``name``, typed by the schema of an entry that sweeps it (or,
    with ``knobs_only=False``, of any entry that has a hyper-parameter of that name)."""
    param = next(
        (
            p
            for e in C.entries()
            if not knobs_only or (e.knob is not None and e.knob.name == name)
            for p in e.schema.params
            if p.name == name
        ),
        None,
    )
    if param is None and not knobs_only:
        raise ValueError(f"{option} {name}: no registered compressor has a hyper-parameter {name!r}")
    kind = param.type if param is not None else "any"
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if kind == "str":
            return text
        v = float(text)
        if not math.isfinite(v) or abs(v) > MAX_INT:
            raise ValueError
        if kind == "float":
            return v
        if kind == "int" or (kind == "any" and v.is_integer() and "." not in text and "e" not in text.lower()):
            if not v.is_integer():
                raise ValueError
            return int(v)
        return v
    except ValueError:
        bound = "" if kind in ("bool", "str") else f", finite, |v| <= {MAX_INT}"
        raise ValueError(
            f"{option} {name}: bad value {text[:_SHOWN]!r} (expected {kind if kind != 'any' else 'a number'}{bound})"
        ) from None


def sweep_of(args: argparse.Namespace) -> dict[str, list]:
    """Knob name -> values from ``--sweep`` (the aliases are passed to ``plan`` separately)."""
    out: dict[str, list] = {}
    for name, items in getattr(args, "sweep", None) or []:
        if name in out:
            raise ValueError(f"--sweep {name} given twice")
        out[name] = [knob_value(name, t) for t in items]
    return out


def fixed_of(args: argparse.Namespace) -> dict[str, Any]:
    """Hyper-parameter name -> value from ``--hparam NAME=VALUE``; a knob (``ratio=0.5``) is then
    the one value planned (refused when ``--sweep`` or its alias names it too)."""
    out: dict[str, Any] = {}
    swept = {name for name, _ in getattr(args, "sweep", None) or []} | {
        knob
        for alias, knob in (("ratios", "ratio"), ("ranks", "rank"), ("levels", "levels"))
        if getattr(args, alias, None)
    }
    for item in getattr(args, "hparam", None) or []:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--hparam expects NAME=VALUE, got {shown(item)}")
        if name in swept:
            raise ValueError(
                f"--hparam {shown_name(name)}: the knob is swept too; give its values once (--sweep or --hparam)"
            )
        own = {k: v for f in PL.optimizer_methods().values() for k, v in PL.optimizer_params(f).items()}
        if name in own and not any(p.name == name for e in C.entries() for p in e.schema.params):
            out[name] = _optimizer_value(name, text, own[name])
            continue
        out[name] = knob_value(name, text, "--hparam", knobs_only=False)
        choices = {c for e in C.entries() for p in e.schema.params if p.name == name for c in (p.choices or ())}
        if choices and out[name] not in choices:
            raise ValueError(f"--hparam {name}: {text!r} is not one of {', '.join(sorted(map(str, choices)))}")
    return out


def _optimizer_value(name: str, text: str, default: Any) -> Any:
    """``--hparam NAME=TEXT`` for an optimizer's hyper-parameter, typed by its default."""
    kind = "bool" if isinstance(default, bool) else type(default).__name__
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        v = float(text)
        if not math.isfinite(v) or abs(v) > MAX_INT or (kind == "int" and not v.is_integer()):
            raise ValueError
        return int(v) if kind == "int" else v
    except ValueError:
        raise ValueError(f"--hparam {name}: bad value {text[:_SHOWN]!r} (expected {kind})") from None


OPTIONS: tuple[Option, ...] = (
    # the workload (preset or D, C, M), the workers and the network
    Option("--workload", help=lambda: f"a workload preset: {', '.join(W.names())}"),
    Option("--params", type=_int_in(MAX_PARAMS), help="D, number of parameters"),
    Option("--flops-per-sample", type=_flops, help="C, FLOPs per sample (forward + backward)"),
    Option("--batch", type=_int_in(MAX_BATCH), help="M, local mini-batch per worker"),
    Option("--workers", type=_int_in(CL.MAX_WORKERS), help="P, number of workers (not with --cluster)"),
    Option(
        "--network",
        help=lambda: (
            f"preset(s), comma-separated: {', '.join(N.names())}, any <N>GbE, <N>GbIB, <N>GbRoCE, FDR, "
            "EDR, HDR, NDR, K x LINK; or a name for --alpha/--beta.  With --cluster: the inter-node network(s)"
        ),
    ),
    Option("--alpha", type=_float_in(N.MAX_ALPHA, zero=True), help="custom network: seconds per message"),
    Option("--beta", type=_float_in(N.MAX_BETA, low=N.MIN_BETA), help="custom network: seconds per byte"),
    Option(
        "--device-flops",
        type=_flops,
        help="F, sustained FLOP/s of one worker (default: the survey's RTX 2080Ti on "
        "BERT-Large, 597e9/0.163 s = 3.66e12; with --cluster use --device)",
    ),
    # the cluster mode: nodes x GPUs, links, device, schedule and all-reduce algorithm
    *CL.options(network=False),
    Option(
        "--schedule",
        choices=S.names,
        help="with --cluster: how messages are issued (default fusion: Horovod's tensor fusion with WFBP)",
    ),
    Option(
        "--architecture",
        choices=PR.A2A,
        help="with --cluster: the all-reduce algorithm (default hierarchical, as NCCL/Horovod on multi-GPU nodes; "
        "two-level: a dense reduce inside each node, compression only across nodes, as Espresso/BytePS)",
    ),
    Option(
        "--device-profile",
        metavar="FILE",
        help="with --cluster: the device as cconv calibrate measured it (FLOP/s, memory bandwidth, launch cost, "
        "compressor costs), instead of --device",
    ),
    Option(
        "--implementation",
        choices=IM.names(),
        help="with --cluster: how compression runs (default fused: cconv's jitted program; per-tensor: framework "
        "ops per tensor, as GRACE/Horovod; mpi: per-tensor with payloads staged through host memory; ddp-hook: "
        "framework ops per PyTorch DDP bucket, as DDP communication hooks; espresso: fused's cost on a pool of "
        "every gradient, as Espresso)",
    ),
    # which methods are planned and their knob values
    Option(
        "--sweep",
        type=_sweep_item,
        action="append",
        metavar="NAME=v1,v2",
        help=lambda: "values of a compressor knob (repeatable); knobs: " + ", ".join(PL.knob_names()),
    ),
    Option(
        "--ratios",
        type=_list(_ratio),
        help="alias of --sweep ratio=... (sparsifier ratios k/d; default 0.1,0.01,0.001)",
    ),
    Option("--ranks", type=_list(_int_in(MAX_RANK)), help="alias of --sweep rank=... (PowerSGD ranks)"),
    Option("--levels", type=_list(_pos_int), help="alias of --sweep levels=... (QSGD levels s)"),
    Option(
        "--methods",
        type=_list(str),
        help=lambda: (
            f"subset of: {', '.join(PL.all_methods())}; optimizers (planned per phase over --steps): "
            f"{', '.join(PL.optimizer_methods())}; or a method set: survey (the survey's seven "
            "lossless schedule x architecture methods, simulated per layer)"
        ),
    ),
    Option(
        "--steps",
        type=_int_in(PL.MAX_STEPS),
        help="the run's length over which an optimizer method is planned (the share of its dense, compressed "
        "and silent phases); without --methods it adds the optimizers to the plan",
    ),
    # how the exchange is modelled, and the output
    Option("--granularity", choices=("fused", "layerwise"), help="default fused"),
    Option(
        "--compress-vectors",
        action="store_true",
        help="compress the 1-D tensors (biases, norm scales) too; default: what --implementation's published code "
        "does (per-tensor, mpi, espresso: compressed; ddp-hook: dense), else the engine's default (dense, "
        "EngineConfig.compress_vectors); with --measure the config's compress_vectors sets it",
    ),
    Option("--gossip", action="store_true", help="also print gossip steps (ring, torus, exponential, complete)"),
    Option(
        "--overlap",
        action="store_true",
        help="model wait-free backprop (backward = 2/3 of compute) with 64 MiB tensor fusion",
    ),
    Option(
        "--servers",
        type=_int_in(CL.MAX_WORKERS),
        help="parameter servers for the -ps method (default: one per worker, as BytePS in the survey)",
    ),
    Option(
        "--hparam",
        action="append",
        metavar="NAME=VALUE",
        help="a hyper-parameter for every compressor that has it (repeatable), e.g. positions=golomb; "
        "a knob (ratio=0.5) is planned at that one value",
    ),
    Option(
        "--bytes",
        choices=PL.BYTES,
        help="payload sizes: the buffers the collectives move (default), or the expected encoded messages "
        "of entropy-coded formats (what a variable-length transport would send)",
    ),
    Option("--json", action="store_true", help="print the rows as JSON (any method list)"),
    # the simulated schedules (method sets, --cluster, per-layer values)
    Option(
        "--interference",
        type=_float_in(1e3, zero=True),
        help="with a method set or --cluster: kappa, the share of the GPU communication kernels take while "
        "overlapping (method sets' default: fitted to the survey's 4-GPU BERT-Large 1.2x, "
        "cconv.theory.schedule.survey.INTERFERENCE; --cluster's default 0, see cconv.theory.predict)",
    ),
    Option("--topology", help="with a method set: fat-tree, bcube or torus (beta factors)"),
    Option(
        "--per-layer-ratios",
        metavar="METHOD=VALUE",
        help="per-layer knob values of a compressor method (e.g. topk=0.01) minimising the simulated iteration "
        "time under the error budget of that global value (cconv.theory.schedule.ratios)",
    ),
    Option(
        "--ratio-method",
        help="with --per-layer-ratios: the survey method (schedule x architecture) to simulate (default MG-WFBP)",
    ),
)
"""The ``plan`` options, in the order of ``--help``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``plan`` options on ``p``."""
    add_options(p, OPTIONS)


def parser() -> argparse.ArgumentParser:
    """``cconv plan`` as a program of its own (usage errors: one line, exit 2)."""
    return standalone(COMMAND, "cconv plan")


def _workload(args: argparse.Namespace) -> W.Workload:
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
        raise ValueError(
            f"give --workload ({', '.join(W.names())}) or all of --params, "
            f"--flops-per-sample, --batch (missing {', '.join(missing)})"
        )
    return W.custom(given["params"], given["flops_per_sample"], given["batch"])


def _networks(args: argparse.Namespace) -> list[N.Network | N.Hierarchical]:
    if args.alpha is not None or args.beta is not None:
        if args.alpha is None or args.beta is None:
            raise ValueError("a custom network needs both --alpha (s per message) and --beta (s per byte)")
        return [N.from_config({"name": args.network, "alpha": args.alpha, "beta": args.beta})]
    return [N.get(n.strip()) for n in args.network.split(",") if n.strip()]


def format_method_set(name: str, workload: str, workers: int, net: N.Network | N.Hierarchical, rows: list) -> str:
    """A method set's rows as the table ``cconv plan --methods survey`` prints."""
    wd = max(20, *(len(r.method) for r in rows))
    lines = [
        f"method set {name}: workload {workload}, P={workers}, network {_describe(net)}",
        f"{'method':<{wd}} {'iter ms':>9} {'speedup':>8} {'exposed comm ms':>16}",
    ]
    for r in rows:
        lines.append(f"{r.method:<{wd}} {r.iter_s * 1e3:>9.1f} {r.speedup:>7.2f}x {r.comm_exposed_s * 1e3:>16.1f}")
    top = max(rows, key=lambda r: r.speedup)
    lines.append(f"fastest: {top.method} {top.speedup:.2f}x")
    return "\n".join(lines)


def run_method_set(args: argparse.Namespace, name: str) -> str:
    """Rows of a method set (``cconv.theory.schedule.sets.METHOD_SETS``) for every network."""

    if args.workload is None or args.workload.lower() not in profiles.names():
        raise ValueError(f"--methods {name} needs --workload with a layer profile: {', '.join(profiles.names())}")
    if any(getattr(args, k) is not None for k in ("params", "flops_per_sample", "batch")):
        raise ValueError(
            f"--methods {name} takes the workload from its profile; drop --params/--flops-per-sample/--batch"
        )
    kappa = SV.INTERFERENCE if args.interference is None else args.interference
    if not (math.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"--interference must be a finite number >= 0, got {kappa!r}")
    nets = _networks(args)
    if not nets:
        raise ValueError(f"--network is empty; presets: {', '.join(N.names())}")
    fn, w = METHOD_SETS[name], args.workload.lower()
    out, records = [], []
    for net in nets:
        rows = fn(
            w, args.workers, net, args.device_flops, servers=args.servers, interference=kappa, topology=args.topology
        )
        out.append(format_method_set(name, w, args.workers, net, rows))
        for r in rows:
            records.append({"workload": w, "network": net.name, "workers": args.workers, **r._asdict()})
    return _dumps(records) if args.json else "\n\n".join(out)


def run_per_layer_ratios(args: argparse.Namespace) -> str:
    """``--per-layer-ratios METHOD=VALUE``: the chosen values and the gain over the global value."""

    name, eq, text = args.per_layer_ratios.partition("=")
    table = PL.all_methods()
    if not eq or name not in table or table[name].knob is None:
        knobbed = [m for m, v in table.items() if v.knob is not None]
        raise ValueError(f"--per-layer-ratios expects METHOD=VALUE with METHOD one of {', '.join(knobbed)}")
    value = knob_value(table[name].knob.name, text, "--per-layer-ratios", knobs_only=False)
    if args.workload is None or args.workload.lower() not in profiles.names():
        raise ValueError(f"--per-layer-ratios needs --workload with a layer profile: {', '.join(profiles.names())}")
    kappa = SV.INTERFERENCE if args.interference is None else args.interference
    out, records = [], []
    for net in _networks(args):
        plan, prof = ratios.survey_plan(
            args.workload.lower(),
            args.workers,
            net,
            name,
            value,
            args.ratio_method,
            args.device_flops,
            servers=args.servers,
            interference=kappa,
            topology=args.topology,
        )
        out.append(
            f"{args.workload} on {_describe(net)}, P={args.workers}, {args.ratio_method}\n"
            + ratios.format_plan(plan, prof)
        )
        rec = {**plan._asdict(), "gain": plan.gain, "layers": [lay.name for lay in prof.layers]}
        records.append({"workload": args.workload.lower(), "network": net.name, "workers": args.workers, **rec})
    return _dumps(records, default=str) if args.json else "\n\n".join(out)


def _refuse_outside_mode(args: argparse.Namespace) -> None:
    """Options that mean something only in one mode are refused in the others (never ignored)."""
    if getattr(args, "measure", None) is not None and args.compress_vectors:
        raise ValueError("--compress-vectors: with --measure the config's compress_vectors sets it (one value)")
    if args.cluster is None:
        given = [
            f"--{k.replace('_', '-')}"
            for k in ("intra", "device", "schedule", "architecture", "implementation", "device_profile")
            if getattr(args, k) is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} need(s) --cluster NODESxGPUS")
        if args.workers is None or args.network is None:
            raise ValueError("give --workers P and --network NAME, or --cluster NODESxGPUS (e.g. --cluster 8x8)")
    else:
        _refuse_optimizers(args, "--cluster")
        given = [
            f"--{k.replace('_', '-')}"
            for k in ("params", "flops_per_sample", "device_flops", "granularity", "bytes", "alpha", "beta")
            if getattr(args, k) is not None
        ] + [f"--{k.replace('_', '-')}" for k in ("overlap", "gossip") if getattr(args, k)]
        if args.per_layer_ratios is not None:
            given.append("--per-layer-ratios")
        if given:
            raise ValueError(
                f"{', '.join(given)} cannot be combined with --cluster (the workload's layer profile, --device "
                "and --schedule set them)"
            )
    if args.ratio_method is not None:
        if args.per_layer_ratios is None:
            raise ValueError("--ratio-method needs --per-layer-ratios METHOD=VALUE")
        if args.ratio_method not in SV.METHODS:
            raise ValueError(f"--ratio-method {args.ratio_method[:40]!r}: valid: {', '.join(SV.METHODS)}")


def _legacy_defaults(args: argparse.Namespace) -> None:
    for key, value in (("device_flops", W.SURVEY_DEVICE_FLOPS), ("granularity", "fused"), ("bytes", "moved")):
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.ratio_method is None:
        args.ratio_method = "MG-WFBP"


def format_cluster(
    c: CL.Cluster, workload: str, rows: list[PR.Row], notes: list[str], implementation: str = IM.DEFAULT
) -> str:
    """The rows of ``cconv plan --cluster`` as a table."""
    r0 = rows[0]
    lines = [
        f"workload {workload} on {c.name} (P={c.workers}); schedule {r0.schedule}, all-reduce {r0.architecture}, "
        f"compression {implementation}",
        f"device {c.device.name}: {c.device.flops:.3g} FLOP/s sustained ({c.device.precision}), "
        f"{c.device.mem_bw / 1e9:.0f} GB/s; network {_describe(c.network())}",
        "",
        f"{'method':<12} {'setting':<14} {'bytes/worker':>12} {'iter ms':>9} {'compute':>8} {'compress':>9} "
        f"{'comm ms':>8} {'speedup':>8} {'scaling':>8}",
    ]
    for r in rows:
        lines.append(
            f"{r.method:<12} {r.setting:<14} {human_bytes(r.bytes):>12} {r.iteration_time_s * 1e3:>9.1f} "
            f"{r.compute_s * 1e3:>8.1f} {r.compress_s * 1e3:>9.2f} {r.comm_s * 1e3:>8.1f} {r.speedup:>7.2f}x "
            f"{r.scaling_factor:>8.2f}"
        )
    top = max(rows, key=lambda r: r.speedup)
    lines += ["", f"fastest: {top.method} ({top.setting}) {top.speedup:.2f}x, scaling factor {top.scaling_factor:.2f}"]
    lines.append("speedups are per iteration, not time-to-accuracy (lossy methods may need more steps)")
    return "\n".join(lines + [f"note: {n}" for n in notes])


def _vectors(args: argparse.Namespace) -> bool | None:
    """``--compress-vectors``: True; not given: None (the implementation's rule, else the engine's default)."""
    return True if args.compress_vectors else None


def run_cluster(args: argparse.Namespace) -> str:
    """``cconv plan --cluster``: every method on each named cluster (cconv.theory.predict)."""

    if args.workload is None or args.workload.lower() not in profiles.names():
        raise ValueError(f"--cluster needs --workload with a layer profile: {', '.join(profiles.names())}")
    if any(m in METHOD_SETS for m in args.methods or []):
        raise ValueError("method sets are not planned on a --cluster; give --schedule and --architecture instead")
    nets = [n.strip() for n in (args.network or CL.DEFAULT_NETWORK).split(",") if n.strip()]
    if not nets:
        raise ValueError("--network is empty")
    intra, device, bench = args.intra or CL.DEFAULT_INTRA, args.device or CL.DEFAULT_DEVICE, None
    if args.device_profile is not None:
        if args.device is not None:
            raise ValueError("give --device or --device-profile, not both")
        device, measured = DP.load(args.device_profile)
        bench = {**CC.load_bench(), **measured}  # compressors it did not time: cconv's benchmark rows
    clusters = [CL.parse(args.cluster, intra, n, device) for n in nets]
    if args.workers is not None and args.workers != clusters[0].workers:
        raise ValueError(f"--workers {args.workers} disagrees with --cluster {args.cluster} ({clusters[0].workers})")
    sweep = PL._sweep(sweep_of(args), {"ratios": args.ratios, "ranks": args.ranks, "levels": args.levels})
    w, out, records = args.workload.lower(), [], []
    impl = args.implementation or IM.DEFAULT
    for c in clusters:
        notes: list[str] = []
        rows = PR.predict(
            c,
            w,
            args.methods,
            sweep=sweep,
            fixed=fixed_of(args),
            schedule=args.schedule or "fusion",
            architecture=args.architecture or "hierarchical",
            interference=args.interference or 0.0,
            batch=args.batch,
            servers=args.servers,
            topology=args.topology,
            notes=notes,
            implementation=impl,
            bench=bench,
            compress_vectors=_vectors(args),
        )
        out.append(format_cluster(c, w, rows, notes, impl))
        head = {"workload": w, "cluster": f"{c.nodes}x{c.gpus_per_node}", "intra": c.intra.name}
        head |= {"network": c.inter.name, "device": c.device.name, "workers": c.workers, "implementation": impl}
        records += [{**head, **r.as_dict()} for r in rows]
    return _dumps(records) if args.json else "\n\n".join(out)


def plan_records(p: PL.Plan) -> list[dict]:
    """A plan's rows as ``--json`` records (compression compute is not modelled here: compress_s null)."""
    out = []
    for r in p.rows:
        out.append(
            {
                "workload": p.workload.name,
                "network": p.network.name,
                "workers": p.workers,
                "method": r.method,
                "knobs": dict(r.knobs),
                "setting": r.setting,
                "iteration_time_s": r.iter_s,
                "compute_s": p.compute_s,
                "comm_s": r.comm_s,
                "compress_s": None,
                "speedup": r.speedup,
                "scaling_factor": r.speedup / p.workers,
                "payload_bytes": r.payload_bytes,
                "sent_bytes": r.sent_bytes,
                "lossless": r.lossless,
                "constant": r.constant,
                "phase": r.phase,
                "steps": r.steps,
                "kinds": list(r.kinds),
            }
        )
    return out


def run_plan(args: argparse.Namespace) -> str:
    """The planner's table (or ``--json`` records) for every network."""

    w = _workload(args)
    nets = _networks(args)
    if not nets:
        raise ValueError(f"--network is empty; presets: {', '.join(N.names())}")
    sweep, fixed = sweep_of(args), fixed_of(args)
    out, records = [], []
    for net in nets:
        p = PL.plan(
            w,
            args.workers,
            net,
            args.device_flops,
            sweep=sweep,
            ratios=args.ratios,
            ranks=args.ranks,
            levels=args.levels,
            granularity=args.granularity,
            overlap=args.overlap,
            methods=args.methods,
            servers=args.servers,
            nbytes=args.bytes,
            fixed=fixed,
            steps=args.steps,
            compress_vectors=_vectors(args),
        )
        records += plan_records(p)
        out.append(format_plan(p, args.overlap, args.granularity))
        if args.gossip:  # dense gossip steps next to the all-reduce (cconv.theory.gossip)
            rows = G.gossip_rows(4.0 * w.params, args.workers, net)
            out[-1] += "\n\n" + G.format_rows(rows, p.compute_s, human_bytes)
    return _dumps(records) if args.json else "\n\n".join(out)


def _dispatch(args: argparse.Namespace) -> str:
    _refuse_outside_mode(args)
    if args.cluster is not None:
        return run_cluster(args)
    _legacy_defaults(args)
    if args.per_layer_ratios is not None:
        _refuse_optimizers(args, "--per-layer-ratios")
        return run_per_layer_ratios(args)
    sets = [m for m in args.methods or [] if m in METHOD_SETS]
    if sets:
        if len(args.methods) != 1:
            raise ValueError(f"--methods {sets[0]} is a method set: give it alone")
        _refuse_optimizers(args, f"the method set {sets[0]}")
        return run_method_set(args, sets[0])
    if args.interference is not None or args.topology is not None:
        raise ValueError(
            f"--interference and --topology need a method set (--methods {', '.join(METHOD_SETS)}) or --cluster"
        )
    table = list(PL.all_methods())
    if any(m not in table for m in args.methods or []):  # the optimizers are read only when named
        table += list(PL.optimizer_methods())
    unknown = [m for m in args.methods or [] if m not in table]
    if unknown:
        raise ValueError(
            f"unknown method(s) {shown_names(unknown)}; valid: {', '.join(table)}, "
            f"or one method set: {', '.join(METHOD_SETS)}"
        )
    return run_plan(args)


def _refuse_optimizers(args: argparse.Namespace, where: str) -> None:
    """An optimizer method (and --steps, its run length) is planned by the flat model only."""
    opts = [m for m in args.methods or [] if m in PL.optimizer_methods()]
    if opts:
        raise ValueError(
            f"--methods {shown_names(opts)}: an optimizer is planned with --workers and --network, not with {where}"
        )
    if args.steps is not None:
        raise ValueError(f"--steps is the run length of an optimizer method: it cannot be combined with {where}")


# a number printed as inf or nan (Python's formats; ``allow_nan=False`` keeps them out of --json)
_NOT_FINITE = re.compile(r"(?<![A-Za-z0-9_.+-])[-+]?(?:inf|nan)(?![A-Za-z])")


def check_finite(text: str) -> str:
    """``text`` when every number in it is finite; else the ValueError that refuses the input
    (a rate so small, or a size so large, that an answer overflows: ``inf`` s, ``nan`` x)."""
    m = _NOT_FINITE.search(text)
    if m:
        line = text[: m.start()].rsplit("\n", 1)[-1] + m.group(0)
        raise ValueError(
            f"the plan's numbers are not finite ({shown(line.strip(), 60)}): a rate, size or time given is "
            "out of the range the model is meant for"
        )
    return text


def _dumps(records: list, **kw) -> str:
    """--json's text: strict JSON, so a number that is not finite refuses the input (``check_finite``)."""
    import json

    try:
        return json.dumps(records, indent=1, allow_nan=False, **kw)
    except ValueError:
        return check_finite(json.dumps(records, indent=1, **kw).replace("NaN", "nan").replace("Infinity", "inf"))


def run(args: argparse.Namespace) -> int:
    """Print the plan; 0 on success, 2 with one line on stderr for bad input (a plan whose numbers
    are not finite included: ``check_finite``)."""
    try:
        text = check_finite(_dispatch(args))
    except ValueError as e:
        print(error_line(str(e)), file=sys.stderr)
        return 2
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cconv.theory.plan_cli ...`` (the same as ``cconv plan ...``)."""
    return run(parser().parse_args(argv))


COMMAND = Command(
    "plan",
    help="predict iteration time and speedup of every compressor",
    description=__doc__.split("\n\n")[0],
    options=OPTIONS,
    handler=run,
)


if __name__ == "__main__":
    sys.exit(main())
