"""``cconv plan --cluster NODESxGPUS --measure CONFIG``: the planner's prediction beside each
method's real training step on this machine.

The planner (``cconv.theory.predict``) models a workload on a cluster; a measurement needs a model
cconv can train, so ``--measure CONFIG`` names a run config: its model on its local batch
(``batch_size / P``) is the planned workload (its layer profile, ``cconv.experiments.clock
.profile_of``), and each planned row (method, knob setting) is that config with the row's
compressor (a parameter-server method: ``architecture: parameter-server``), ``workers`` = the
cluster's P, one seed and the config's launcher, its real step timed by
``cconv.experiments.clock.measure_step`` (one device per worker: on CPU, P simulated devices; per
phase the median of ``--measure-steps`` steps after the compiling one).  A measured step is of the
machine it ran on, not of the cluster named: with ``--device-profile`` from ``cconv calibrate`` on
the same machine the two columns describe the same hardware, except for the network, which the
model takes from ``--network`` / ``--intra``.

On a cluster: started in every process by ``srun``, ``mpirun`` or with ``CCONV_COORDINATOR``,
``CCONV_NUM_PROCESSES`` and ``CCONV_PROCESS_ID`` set (``cconv.distributed.launched_processes``), the command
joins ``jax.distributed`` (``cconv.distributed.initialize``) and times each row's step over every
process's devices, one worker per device (P must equal them; the config's launcher must run
across processes: ``shard_map``); process 0 prints the table.

This module sits above ``cconv.theory`` (it builds and runs trainers), so the option is added to
the ``plan`` command here and ``python -m cconv.theory.plan_cli`` does not have it.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings

from cconv.advisor import steptime
from cconv.cli_schema import Command, Option, error_line
from cconv.theory import cluster, device_profile, plan_cli, planner, predict
from cconv.theory.schedule import compress

MAX_REPEATS = 1000
DEFAULT_REPEATS = 10


def _check(args: argparse.Namespace) -> int:
    """The options ``--measure`` can honour (one-line ValueError); the repeats."""
    n = DEFAULT_REPEATS if args.measure_steps is None else args.measure_steps
    if not 1 <= n <= MAX_REPEATS:
        raise ValueError(f"--measure-steps must be an integer in [1, {MAX_REPEATS}], got {n}")
    if args.cluster is None:
        raise ValueError("--measure CONFIG needs --cluster NODESxGPUS (the cluster the model predicts for)")
    keys = ("workload", "params", "flops_per_sample", "batch")
    given = [f"--{k.replace('_', '-')}" for k in keys if getattr(args, k) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: --measure CONFIG takes the model and its batch from the config")
    if args.implementation not in (None, "fused"):
        raise ValueError(
            f"--implementation {args.implementation}: --measure times cconv's own (fused) program; drop it"
        )
    return n


def _config(path: str, workers: int):
    """The config at ``path`` for P = ``workers`` (one seed, no network, logging off)."""
    from cconv.experiments.config import from_dict, load_run

    cfg = load_run(path)
    raw = cfg.to_dict()
    raw.update(workers=workers, seed=cfg.seeds()[0], network=None, wandb=False, tensorboard=False, advise=None)
    raw.update(schedule=None, servers=None)
    cfg = from_dict(raw, source=path)
    if cfg.batch_size % workers:
        raise ValueError(f"{path}: batch_size {cfg.batch_size} is not divisible by the cluster's {workers} workers")
    return cfg


def _built(raw: dict, source: str):
    """(RunConfig, built Problem) of ``raw``, or the line of the loader or engine that refuses it
    (the config's warnings, e.g. on the learning rate, were given when the config was planned)."""
    from cconv.experiments import build
    from cconv.experiments.config import from_dict

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = from_dict(raw, source=source)
            build.check_names(cfg)
            return cfg, build.problem(cfg)
    except ValueError as e:
        return str(e).splitlines()[0][:160]


def _candidate(cfg, method, knobs: dict):
    """(RunConfig, Problem) of one planned row, or why not (a refusal; no run config performs its
    collective).  A parameter-server method runs with ``architecture: parameter-server``; a method
    that names a collective kind (gTop-k's ``recursive_doubling``) with the run-config
    ``collective`` whose step performs that kind (``Trainer.step_work``), found by trying each."""
    from cconv.engine.config import COLLECTIVES

    raw = {**cfg.to_dict(), "compressor": {"name": method.compressor, **knobs}, "memory": "none"}
    src = f"{method.name} {knobs}"
    if method.collective is None:
        return _built(raw, src)
    if method.collective == planner.PS:
        return _built({**raw, "architecture": "parameter-server"}, src)
    for c in COLLECTIVES:
        got = _built({**raw, "collective": c}, src)
        if not isinstance(got, str) and any(
            k.kind == method.collective for k in got[1].trainer.step_work(0).collectives
        ):
            return got
    return f"no run config performs its {method.collective} collective"


def _measure_rows(cfg, rows: list, repeats: int, notes: list) -> dict:
    """Measured seconds per step by (method, setting) (NaN: not measurable here, with a note)."""
    from cconv.experiments import clock

    table, out = planner.all_methods(), {}
    for r in rows:
        key = (r.method, r.setting)
        if key in out:
            continue
        got = _candidate(cfg, table[r.method], dict(r.knobs))
        if isinstance(got, str):
            notes.append(f"{r.method} ({r.setting}) not measured: {got}")
            out[key] = math.nan
            continue
        out[key] = clock.measure_step(got[1], repeats, steps=min(64, got[0].steps))
    return out


def _plan(args: argparse.Namespace, repeats: int) -> tuple[str, list]:
    """(text, JSON records) of the measured plan."""
    from cconv import distributed
    from cconv._startup import quiet_libraries, stdout_to_stderr

    cl0 = cluster.from_args(args)
    distributed.start_devices(cl0.workers)  # before jax starts its backend
    quiet_libraries()
    import jax

    from cconv.experiments import build, clock

    steptime.check_devices("--measure", "method", cl0.workers)
    cfg = _config(args.measure, cl0.workers)
    profile = clock.profile_of(build.problem(cfg))
    device, bench = args.device or cluster.DEFAULT_DEVICE, None
    if args.device_profile is not None:
        if args.device is not None:
            raise ValueError("give --device or --device-profile, not both")
        device, measured = device_profile.load(args.device_profile)
        bench = {**compress.load_bench(), **measured}
    nets = [n.strip() for n in (args.network or cluster.DEFAULT_NETWORK).split(",") if n.strip()]
    clusters = [cluster.parse(args.cluster, args.intra or cluster.DEFAULT_INTRA, n, device) for n in nets]
    sweep = planner._sweep(plan_cli.sweep_of(args), {"ratios": args.ratios, "ranks": args.ranks, "levels": args.levels})
    notes: list = []
    kw = dict(sweep=sweep, fixed=plan_cli.fixed_of(args), schedule=args.schedule or "fusion", bench=bench, notes=notes)
    kw |= dict(architecture=args.architecture or "hierarchical", interference=args.interference or 0.0)
    per_cluster = [(c, predict.predict(c, profile, args.methods, **kw)) for c in clusters]
    with stdout_to_stderr(jax.process_count() > 1):  # gloo's C++ prints its connections on stdout
        secs = _measure_rows(cfg, per_cluster[0][1], repeats, notes)
    where, texts, records = clock.device_label(), [], []
    for c, rows in per_cluster:
        texts.append(format_measured(c, args.measure, cfg, rows, secs, where, repeats, sorted(set(notes))))
        head = {"config": args.measure, "cluster": f"{c.nodes}x{c.gpus_per_node}", "network": c.inter.name}
        head |= {"device": c.device.name, "workers": c.workers, "measured_on": where, "measure_steps": repeats}
        for r in rows:
            m = secs[(r.method, r.setting)]
            records.append({**head, **r.as_dict(), "modelled_s": r.iteration_time_s, "measured_s": m})
    return "\n\n".join(texts), records


def format_measured(c, path, cfg, rows, secs, where, repeats, notes) -> str:
    """The measured plan's table: the model's iteration time beside the measured step."""
    model = cfg.model["name"]
    lines = [
        f"{path} (model {model}, {cfg.batch_size // c.workers} per worker) on {c.name} (P={c.workers}); "
        f"schedule {rows[0].schedule}",
        f"modelled on {c.device.name}; measured on {where} (median of {repeats} steps per phase, compilation "
        "excluded): a measured step is of this machine, not of the cluster",
        "",
        f"{'method':<12} {'setting':<14} {'bytes/worker':>12} {'modelled ms':>12} {'measured ms':>12} {'ratio':>7}",
    ]
    for r in rows:
        m = secs[(r.method, r.setting)]
        ratio = f"{m / r.iteration_time_s:>6.2f}x" if math.isfinite(m) else f"{'-':>7}"
        shown = f"{m * 1e3:>12.3f}" if math.isfinite(m) else f"{'-':>12}"
        lines.append(
            f"{r.method:<12} {r.setting:<14} {plan_cli.human_bytes(r.bytes):>12} {r.iteration_time_s * 1e3:>12.3f} "
            f"{shown} {ratio}"
        )
    lines.append("ratio = measured / modelled")
    return "\n".join(lines + [f"note: {n}" for n in notes])


def run(args: argparse.Namespace) -> int:
    """``cconv plan``: the planner's table, or with ``--measure`` the measured one; 0, or 2 with
    one line on stderr for bad input."""
    if args.measure is None:
        if args.measure_steps is not None:
            print(error_line("--measure-steps needs --measure CONFIG"), file=sys.stderr)
            return 2
        return plan_cli.run(args)
    try:
        repeats = _check(args)
        plan_cli._refuse_outside_mode(args)
        text, records = _plan(args, repeats)
        text = plan_cli._dumps(records) if args.json else plan_cli.check_finite(text)
    except ValueError as e:
        print(error_line(str(e)), file=sys.stderr)
        return 2
    if steptime.leads():  # across processes (jax.distributed) one table, process 0's timings
        print(text)
    return 0


OPTIONS = (
    Option(
        "--measure",
        metavar="CONFIG",
        help="with --cluster: plan the run config's model and time each method's real training step on this "
        "machine (one device per worker; simulated CPU devices on CPU) beside the prediction",
    ),
    Option(
        "--measure-steps",
        type=plan_cli._int_in(MAX_REPEATS),
        metavar="N",
        help="with --measure: timed steps per phase after compilation, median taken (default 10)",
    ),
)

COMMAND: Command = plan_cli.COMMAND._replace(options=plan_cli.OPTIONS + OPTIONS, handler=run)
"""``cconv plan`` with ``--measure`` (``cconv.cli.COMMANDS`` holds this one)."""
