"""The ``cconv`` command line: run, sweep, plot, report, doctor, advise, plan, calibrate.

    cconv run CONFIG [--set KEY=VALUE ...] [--out DIR]
    cconv sweep SWEEP [--out DIR] [--no-figure]
    cconv plot RESULTS... [--kind curves|ratio-summary] [--x bytes|bytes_encoded|steps|time] [--y METRIC]
               [--network NAME] [--panels auto|family|single] [--band minmax|std|sem|ci95|none]
               [--legend auto|outside|inside|none] [--target VALUE] [--metric METRIC] [--title TEXT] [--out FILE]
    cconv report RESULTS... [--target VALUE] [--metric METRIC] [--aggregate] [--csv FILE]
    cconv doctor [--platform cuda|rocm|tpu|all] [--full] [--json FILE]
    cconv advise CONFIG --cluster NODESxGPUS [--intra LINK] [--network NET] [--device GPU]
                 [--target METRIC=VALUE] [--budget B] [--seeds N] [--verify N] [--json] [--out DIR]
                 [--set KEY=VALUE ...] [--timing modelled|measured [--measure-steps N]]
    cconv plan (--workload NAME | --params D --flops-per-sample C --batch M) --workers P --network NET[,NET...]
               [--alpha SECONDS --beta SECONDS_PER_BYTE] [--device-flops F] [--methods M1,M2 | --methods survey]
               [--sweep KNOB=v1,v2 ...] [--ratios R1,R2] [--ranks R1,R2] [--levels S1,S2] [--hparam NAME=VALUE ...]
               [--granularity fused|layerwise] [--compress-vectors] [--overlap] [--gossip] [--servers N]
               [--bytes moved|encoded]
               [--interference KAPPA] [--topology NAME] [--per-layer-ratios METHOD=VALUE [--ratio-method NAME]]
               [--steps N (optimizer methods: onebit_adam, zero_one_adam)] [--json]
    cconv plan --workload NAME --cluster NODESxGPUS [--intra LINK] [--network NET] [--device GPU]
               [--schedule NAME] [--architecture hierarchical|ring|tree|two-level]
               [--implementation fused|per-tensor|mpi|ddp-hook|espresso] [--compress-vectors] [--device-profile FILE]
               [--interference KAPPA] [--json]
    cconv plan --cluster NODESxGPUS --measure CONFIG [--measure-steps N] [--methods M1,M2] [--ratios R1,R2] [--json]
    cconv calibrate --out FILE [--methods M1,M2] [--sizes N1,N2] [--repeats N]

Every command also takes ``--debug`` (before or after the command).  The options are declared as
one table per command, beside its handler (``COMMANDS``, ``cconv.cli_schema``); this block names
exactly the options of those tables (``tests/test_cli_schema.py``).

Bad input (an unknown option, a bad choice or a missing argument of any command; malformed YAML,
unknown key/compressor, out-of-range value, missing data, unwritable output directory) prints one
line ``cconv: error: ...`` (no usage block) and exits with status 2 before anything is written;
``--debug`` shows the traceback instead.  SIGTERM / SIGINT while ``run`` or ``sweep``
trains: the step is finished and checkpointed, the run marked ``interrupted``, exit 143 / 130
(``cconv.experiments.signals``, docs/signals.md).

Devices: on CPU, ``workers`` data-parallel workers are simulated as CPU devices.  Before jax
starts its backend, the CLI appends ``--xla_force_host_platform_device_count=<workers>`` (the
largest ``workers`` of a sweep) to ``XLA_FLAGS`` unless that flag is already set there (runs with
``launcher: vmap`` run every worker on one device and need none).  The flag only affects the CPU
platform, so it is harmless on GPU machines, where a run with more ``workers`` than GPUs runs
them all on one GPU (``launcher: vmap``, chosen automatically; one line says so).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from cconv import cli_schema, doctor
from cconv._startup import configure_devices
from cconv._startup import quiet_libraries as _quiet_libraries
from cconv.advisor import cli as advise_cli
from cconv.advisor import plan_measure
from cconv.cli_schema import Command, Option
from cconv.experiments.plotting import BANDS, LEGEND, PANELS, X_AXES
from cconv.theory import calibrate_cli

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def simulated_devices(configs) -> int:
    """The CPU devices to simulate for these run configs: the most workers among the runs whose
    launcher needs one device per worker (``launcher: vmap`` runs every worker on one)."""
    from cconv.engine.launchers import LAUNCHERS

    return max([c.workers for c in configs if not LAUNCHERS[c.launcher].one_device], default=1)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    if isinstance(e, KeyError) and text.startswith("'"):
        text = text.strip("'")
    first = text.splitlines()[0] if text else type(e).__name__
    return first


# --------------------------------------------------------------------------- commands


def cmd_run(args) -> int:
    from cconv.experiments.config import load_run

    cfg = load_run(args.config, args.set)
    configure_devices(simulated_devices([cfg]))
    _quiet_libraries()
    from cconv.experiments import build, io, rundir, runner

    build.check_names(cfg)
    build.check_devices(cfg.workers, cfg.launcher)
    out = args.out or os.path.join("results", os.path.splitext(os.path.basename(args.config))[0])
    # a finished run of this config: nothing to do, nothing written (also on a read-only file
    # system); a different config or a file cconv did not create there is refused
    if os.path.isdir(out) and rundir.stored_run(out, cfg) == "finished":
        s = io.read_summary(out)
        print(f"{out}: already {s['status']}; nothing to do")
        return 0
    io.check_creatable(out)  # nothing is created before the data and the model are known to load
    problem = build.problem(cfg)
    from cconv.experiments.config import ConfigError

    try:
        res = runner.execute(cfg, out, problem=problem)
    except (ConfigError, io.RunLocked, io.OutputError, io.ForeignFileError):  # refused before training:
        # another run's directory, one another process is training, an unusable output path, a
        # file cconv did not create
        raise
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        where = (
            f"recorded in {out}/summary.json"
            if rundir.failure_recorded(out, e)
            else f"could not be recorded in {out}/summary.json"
        )
        print(
            f"cconv: run failed: {type(e).__name__}: {_one_line(e)} ({where}; --debug shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(_describe(out, res.summary))
    return 0


def _describe(out: str, s: dict) -> str:
    if s.get("status") == "diverged":
        return f"{out}: diverged ({s.get('error')})"
    fin = s.get("final")
    if fin is None:  # several seeds: the mean of their final lines
        finals = [p["final"] for p in (s.get("per_seed") or {}).values() if p.get("final")]
        fin = {
            k: sum(f[k] for f in finals) / len(finals)
            for k in ("loss", "test_loss", "test_accuracy", "cum_bytes")
            if finals and all(isinstance(f.get(k), (int, float)) for f in finals)
        }
        if finals:
            out = f"{out} ({len(finals)} seeds, mean)"
    bits = [f"{out}: {s.get('status')}"]
    for k in ("loss", "test_loss", "test_accuracy"):
        if isinstance(fin.get(k), (int, float)):
            bits.append(f"{k}={fin[k]:.4g}")
    if isinstance(fin.get("cum_bytes"), (int, float)):
        bits.append(f"cum_bytes={fin['cum_bytes']:.4g}")
    return " ".join(bits)


def _config_keys() -> str:
    from cconv.experiments.config import field_help

    return "config keys (default, meaning):\n" + field_help()


RUN = Command(
    "run",
    help="train one config; resumes from its checkpoint when interrupted",
    description="Train one YAML config into a run directory (config.yaml, metrics.jsonl, "
    "summary.json, checkpoints/). Running it again resumes an interrupted run "
    "and does nothing for a finished one. While it trains, the run directory "
    "is locked (an flock on <out>/.lock): a second `cconv run` or sweep on it "
    "is refused with exit status 2.",
    epilog=_config_keys,
    raw=True,
    options=(
        Option("config", help="run config (YAML)"),
        Option(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key (dotted for nested: compressor.ratio=0.01); repeatable",
        ),
        Option("--out", help="run directory (default: results/<config name>)"),
    ),
    handler=cmd_run,
)


def cmd_sweep(args) -> int:
    from cconv.experiments.sweep import load_sweep

    _, runs = load_sweep(args.config)
    configure_devices(simulated_devices([r.config for r in runs]))
    _quiet_libraries()
    from cconv.experiments import sweep

    res = sweep.run_sweep(args.config, args.out, figure=not args.no_figure)
    busy = f", {res['busy']} in use by another process (skipped)" if res.get("busy") else ""
    print(
        f"sweep {res['out']}: {res['completed']} completed, {res['diverged']} diverged, "
        f"{res['failed']} failed, {res['skipped']} already done{busy}"
    )
    for o in res["outputs"]:
        print(f"  wrote {o}")
    for e in res["errors"]:
        print(f"  failed: {e.splitlines()[0]}", file=sys.stderr)
    return EXIT_FAILED if res["failed"] else 0


SWEEP = Command(
    "sweep",
    help="run a grid of configs; skips finished runs, resumes interrupted ones",
    description="Run every point of a sweep file's grid (base + grid) into "
    "<out>/<point>/, then write report.csv and convergence_vs_traffic.png. "
    "Safe to interrupt at any moment and run again. Several sweeps may share "
    "one --out: a run another process is training (its directory is locked) "
    "is skipped and reported as in use, not waited for; run the sweep again "
    "afterwards for the complete report. A run already in --out whose stored config differs "
    "from the sweep file's is refused (exit 2, nothing written), as is a non-empty --out that "
    "is not a sweep directory (it has no sweep.json).",
    raw=True,
    options=(
        Option("config", help="sweep file (YAML with 'base' and 'grid')"),
        Option("--out", help="sweep directory (default: results/<sweep name>)"),
        Option("--no-figure", action="store_true", help="skip the figure at the end"),
    ),
    handler=cmd_sweep,
)


def cmd_plot(args) -> int:
    from cconv.experiments import io, plotting, report

    summary = args.kind == "ratio-summary"
    report.check_target(args.target, args.metric)
    if summary and args.panels != "auto":
        raise ValueError("--panels applies to --kind curves, not to the ratio summary")
    if summary and args.network:
        raise ValueError("--network applies to --kind curves (the ratio summary's time is the first network's)")
    if args.out:
        out = args.out
    else:
        base = args.results[0] if len(args.results) == 1 and os.path.isdir(args.results[0]) else "."
        name = (
            f"ratio_summary_{args.x}"
            if summary
            else f"{args.y}_vs_{args.x}{'_' + args.network if args.network else ''}"
        )
        out = os.path.join(base, name + ".png")
    plotting.check_outputs(out)
    io.check_writable(os.path.dirname(os.path.abspath(out)))
    opts = {"band": args.band, "legend": args.legend, "title": args.title, "out": out}
    if summary:
        runs = report.load_runs(args.results, target=args.target, metric=args.metric)
        outs = plotting.ratio_summary(runs, x=args.x, **opts)
    else:
        df = report.load_metrics(args.results)
        if plotting.panels_for(df, args.panels) == "family":
            order = report.sweep_order(args.results)
            outs = plotting.family_grid(df, x=args.x, y=args.y, network=args.network, order=order, **opts)
        else:
            tgt = args.target if args.metric == args.y else None
            outs = plotting.curves(df, x=args.x, y=args.y, network=args.network, target=tgt, **opts)
    for o in outs:
        print(f"wrote {o}")
    return 0


PLOT = Command(
    "plot",
    help="plot metrics of runs/sweeps against bytes, steps or time; or the ratio summary",
    description="Plot a metric of every run under RESULTS against cumulative traffic, steps "
    "or (simulated) time, seeds averaged with a band; or (--kind ratio-summary) the traffic, "
    "steps or time to reach a target against the compression ratio. Legends name each run by "
    "the settings that vary between the runs. Writes the PNG and a PDF next to it.",
    options=(
        Option("results", nargs="+", help="run or sweep directories"),
        Option(
            "--kind",
            choices=("curves", "ratio-summary"),
            default="curves",
            help="curves: the metric against --x (default); ratio-summary: what --x counts until the "
            "target (--target, default: the configs' target_loss) against the compression ratio, EF vs none",
        ),
        Option(
            "--x",
            choices=X_AXES,
            default="bytes",
            help="x axis: cumulative bytes per worker moved by the collectives (log), the same for the encoded "
            "messages (bytes_encoded), steps, or simulated time (default: bytes)",
        ),
        Option("--y", default="loss", help="metric on the y axis (loss, test_loss, test_accuracy, ...)"),
        Option("--network", help="network whose simulated time to use with --x time (e.g. 10GbE)"),
        Option(
            "--panels",
            choices=PANELS,
            default="auto",
            help="family: one panel per compressor family (the sweep file's order), the dense baseline on "
            "each; single: every run in one panel; auto (default): family when the runs hold two or more "
            "compressed families (a sweep), else single",
        ),
        Option(
            "--band",
            choices=BANDS,
            default="minmax",
            help="band over seeds around their mean: min-max (default: every seed's range, no distribution "
            "assumed, right for the few seeds of a sweep), +-1 std, +-1 standard error, 95%% confidence "
            "interval (Student's t, n-1 dof), or none",
        ),
        Option(
            "--legend",
            choices=LEGEND,
            default="auto",
            help="legend placement: auto (inside at the best spot; outside the axes for more than 5 runs), "
            "outside, inside, none (default: auto)",
        ),
        Option(
            "--target",
            type=float,
            help="target value of --metric: the ratio summary's target (default: the configs' target_loss); "
            "with curves of that metric, a dotted line",
        ),
        Option("--metric", default="loss", help="metric --target refers to (default: loss)"),
        Option("--title", help="figure title"),
        Option(
            "--out",
            help="output file (.png or .pdf; default: RESULTS/<y>_vs_<x>.png, RESULTS/ratio_summary_<x>.png)",
        ),
    ),
    handler=cmd_plot,
)


def cmd_report(args) -> int:
    from cconv.experiments import io, report

    report.check_target(args.target, args.metric)
    if args.csv and args.csv != "-":
        io.check_output(args.csv, "--csv")
    df = report.table(args.results, target=args.target, metric=args.metric)
    show = report.format_table
    if args.aggregate:
        df = report.aggregate(df)
        show = report.format_aggregate
    if args.csv == "-":
        sys.stdout.write(df.to_csv(index=False))
        return 0
    print(show(df))
    if not any(c.startswith("bytes_to_target") for c in df.columns):
        print("(no target: pass --target LOSS or set target_loss in the config for bytes-to-target)")
    if args.csv:
        io.check_writable(os.path.dirname(os.path.abspath(args.csv)))
        io.atomic_write_text(args.csv, df.to_csv(index=False))
        print(f"wrote {args.csv}")
    return 0


REPORT = Command(
    "report",
    help="table of final metrics and bytes-to-target",
    description="One row per run and seed: status, final metrics, and the traffic (and "
    "steps, simulated time) needed to reach a target loss. --aggregate: one row per run, "
    "mean +- std over its seeds.",
    options=(
        Option("results", nargs="+", help="run or sweep directories"),
        Option("--target", type=float, help="target value of --metric (default: the configs' target_loss)"),
        Option(
            "--metric",
            default="loss",
            help="metric the target refers to (default: loss; accuracy metrics count as reached when >= target)",
        ),
        Option(
            "--aggregate",
            action="store_true",
            help="one row per run: mean +- sample std over seeds of the final metrics and of bytes/steps/time "
            "to target (over the seeds that reached it; 'reached' counts them); the CSV has <col>_mean, <col>_std",
        ),
        Option("--csv", metavar="FILE", help="also write the full table as CSV ('-' prints CSV only)"),
    ),
    handler=cmd_report,
)


# --------------------------------------------------------------------------- parser

COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (RUN, SWEEP, PLOT, REPORT, doctor.COMMAND, advise_cli.COMMAND, plan_measure.COMMAND, calibrate_cli.COMMAND)
}
"""Every ``cconv`` command, in the order of ``cconv --help``; each table lives beside its handler."""

DEBUG = Option("--debug", action="store_true", help="show tracebacks instead of one-line errors")
# --debug works before or after the command; the commands' copy has no default, so that it does not
# overwrite a --debug given before the command.
COMMON = (DEBUG._replace(default=argparse.SUPPRESS),)


def build_parser() -> argparse.ArgumentParser:
    """``cconv`` and its commands, from their tables (``cconv.cli_schema``)."""
    return cli_schema.parser(
        "cconv",
        tuple(COMMANDS.values()),
        description="Gradient compression for data-parallel training in JAX: "
        "runs, sweeps, figures, reports, a GPU/TPU readiness check, an advisor and a planner.",
        epilog="`cconv COMMAND --help` describes each command.",
        options=(DEBUG,),
        common=COMMON,
    )


def _one_line_warnings() -> None:
    """Show cconv's recovery warnings (a damaged metrics line or checkpoint) and warnings whose
    category sets ``one_line = True`` (e.g. ``ErrorFeedbackWarning``) as one line each."""
    import warnings

    from cconv.experiments.io import RecoveryWarning

    show = warnings.showwarning
    if getattr(show, "_cconv", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, RecoveryWarning) or getattr(category, "one_line", False):
            print(f"cconv: warning: {message}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    showwarning._cconv = True
    warnings.showwarning = showwarning


class _QuietStderr:
    """``sys.stderr`` without one known piece of library noise: after a failed checkpoint write,
    orbax's tensorstore callbacks print "RuntimeError: Event loop is closed" tracebacks from C
    (not through ``sys.excepthook``).  Traceback blocks are held per thread until their last line
    and dropped only when it is exactly that error; everything else passes through unchanged."""

    NOISE = "RuntimeError: Event loop is closed"

    def __init__(self, stream):
        self._stream, self._local = stream, threading.local()

    def write(self, text: str) -> int:
        held = getattr(self._local, "held", None)
        if held is None and not text.startswith("Traceback (most recent call last):"):
            return self._stream.write(text)
        held = (held or "") + text
        lines = held.split("\n")
        last = [ln for ln in lines[1:] if ln and not ln.startswith(" ")]
        if not last or not held.endswith("\n"):
            self._local.held = held
            return len(text)
        self._local.held = None
        if last[-1].strip() != self.NOISE:
            self._stream.write(held)
        return len(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _quiet_library_logs() -> None:
    """Without --debug, errors reach the user as cconv's one line: drop the libraries' own error
    logs (orbax logs every failed write thread with its traceback through absl; asyncio logs each of
    orbax's failed write tasks as "Task exception was never retrieved" when it is collected)."""
    import logging

    loggers = [logging.getLogger("asyncio")]
    try:
        from absl import logging as absl_logging

        loggers.append(absl_logging.get_absl_logger())
    except ImportError:
        pass
    for logger in loggers:
        if not any(getattr(f, "_cconv", False) for f in logger.filters):
            quiet = lambda record: record.levelno >= logging.CRITICAL  # noqa: E731
            quiet._cconv = True
            logger.addFilter(quiet)


def _interruption(e: KeyboardInterrupt) -> str:
    """What a stop by a signal did (``signals.Interrupted`` carries the signal and the step)."""
    if not hasattr(e, "signum"):
        return "interrupted"
    return f"{e.name}: " + (f"checkpoint saved at step {e.step}" if e.step is not None else "stopped")


def main(argv: list[str] | None = None) -> int:
    """The ``cconv`` command: its exit status.  Called as the process's command (``argv`` None:
    ``cconv ...`` or ``python -m cconv ...``), the process ends here (``_end_process``)."""
    code = _command(argv)
    if argv is None:
        _end_process(code)
    return code


def _end_process(code: int) -> None:
    """End the process with ``code`` once what it owes is done: every ``atexit`` handler run
    (logging's flush, JAX's clean-up, wandb's, file locks released), stdout and stderr flushed;
    then ``os._exit``, without the interpreter's teardown, which frees jax's, XLA's and the
    libraries' objects one by one: about 0.35 s of a 1.8 s ``cconv plan`` and of a 2.8 s short
    ``cconv run`` on this project's machine (``studies/benchmarks/cli_exit.py``,
    docs/performance.md).  cconv's files are complete by then (each written atomically, or
    flushed and synced line by line).  Left to Python's own exit: a process with a thread Python
    would wait for (not a daemon), which it joins, or with MPI initialised, which mpi4py finalises
    from C at the interpreter's end (``Py_AtExit``, not an ``atexit`` handler)."""
    import atexit

    me = threading.current_thread()
    if any(t.is_alive() and not t.daemon and t is not me for t in threading.enumerate()):
        return
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return
    atexit._run_exitfuncs()  # the handlers Python's exit would run, in its order
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream: nothing to owe
            pass
    os._exit(code)


def _command(argv: list[str] | None) -> int:
    _one_line_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    debug = bool(getattr(args, "debug", False))
    if not debug:
        _quiet_library_logs()
        if argv is None and not isinstance(sys.stderr, _QuietStderr):  # the process is the command
            sys.stderr = _QuietStderr(sys.stderr)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:  # Ctrl-C, or cconv.experiments.signals.Interrupted (SIGTERM/SIGINT
        # during training: checkpointed, the summary says interrupted)
        print(f"cconv: {_interruption(e)}; run the same command again to resume", file=sys.stderr)
        return getattr(e, "exit_code", 130)  # 128 + signal: 143 (SIGTERM), 130 (SIGINT)
    except BrokenPipeError:  # the reader went away (`cconv plan ... | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE, as a shell reports it
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as e:
        if debug:
            raise
        print(f"cconv: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - the point of the CLI is one readable line
        if debug:
            raise
        print(f"cconv: error: {type(e).__name__}: {_one_line(e)} (--debug shows the traceback)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
