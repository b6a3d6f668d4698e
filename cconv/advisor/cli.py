"""``cconv advise CONFIG --cluster NODESxGPUS [...]``: the command line of ``cconv.advisor.advise``."""

from __future__ import annotations

import argparse
import math
import sys

from cconv import distributed
from cconv.advisor import ranking
from cconv.advisor.steptime import TIMINGS
from cconv.cli_schema import Command, Option
from cconv.theory import cluster

DESCRIPTION = """\
Which method reaches the target soonest on this cluster?  Times a step of every candidate of the
config's `advise:` block on the cluster (default: the registries' compressors at their knob's
extreme values, error feedback around the biased ones, under BSP; the dense baseline under BSP
and local SGD), then races them at equal time on the cluster (successive halving: the best half
go on from their checkpoints, the finalists run to the target), several seeds as one program,
within --budget full dense runs of training steps.  Each candidate's time to target is observed
(it reached the target in the race) or predicted from its curve with an interval.  Candidates that
diverge, miss the step budget or cannot be predicted are listed with the reason, never
recommended.  Writes <out>/probes/ (resumable runs), advice.json and advice.png.
"""


def _header(adv) -> str:
    return (
        f"{adv.config}: {adv.target} on {adv.cluster} ({adv.workers} workers), step budget {adv.steps}; "
        f"{len({r.candidate for r in adv.rows})} candidates x {adv.seeds} seeds raced in {len(adv.rungs)} rungs, "
        f"spent {adv.spent:.2f} of --budget {adv.budget:g} dense runs of steps ({adv.wall_s:.0f} s in all, "
        f"{adv.build_wait_s:.0f} s of it building {adv.programs} programs ({adv.programs_reused} reused): "
        f"{adv.compile_s:.0f} s of compilation on {adv.build_threads} thread{'s' if adv.build_threads > 1 else ''})"
    )


def _verify_table(rows) -> str:
    lines = ["verify: predicted vs actual steps to target (full runs, seed mean)"]
    for v in rows:
        act = f"{v.actual:.0f}" if math.isfinite(v.actual) else "not reached"
        ok = "inside" if v.inside else "OUTSIDE"
        lines.append(f"  {v.candidate:<36} predicted {v.predicted:.0f} [{v.lo:.0f}, {v.hi:.0f}]  actual {act}  {ok}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from cconv._startup import quiet_libraries, stdout_to_stderr

    if not 0 <= args.verify <= 64:
        raise ValueError(f"--verify must be an integer in [0, 64], got {args.verify}")
    on = cluster.from_args(args)
    n = distributed.launched_processes()
    if n > 1 and args.timing != "measured":
        raise ValueError(
            f"started as {n} processes: cconv advise races in one process; only --timing measured uses several "
            f"(each candidate's step timed across them); start it once, or add --timing measured"
        )
    if args.timing == "measured":  # before jax starts: jax.distributed, or simulated CPU devices
        distributed.start_devices(on.workers)
    quiet_libraries()
    from cconv.advisor.api import advise

    with stdout_to_stderr(n > 1):  # gloo's C++ prints its connections on stdout
        adv = advise(
            args.config,
            on,
            target=args.target,
            budget=args.budget,
            seeds=args.seeds,
            verify_top=args.verify,
            out=args.out,
            overrides=args.set,
            timing=args.timing,
            repeats=args.measure_steps,
        )
    if adv is None:  # another process of a measured run across processes: its part was the timing
        return 0
    if args.json:
        sys.stdout.write(ranking.dumps(adv) + "\n")
        return 0
    print(_header(adv))
    multi = len({r.schedule for r in adv.rows}) > 1
    print(ranking.table(adv.rows, multi, adv.steps))
    for name, why in adv.skipped:
        print(f"skipped {name}: {why}")
    print(adv.recommendation)
    if adv.verify:
        print(_verify_table(adv.verify))
    for path in adv.outputs.values():
        print(f"wrote {path}")
    return 0


COMMAND = Command(
    "advise",
    help="which method reaches my target soonest on my cluster (a race at equal cluster time)",
    description=DESCRIPTION,
    options=(
        Option("config", help="run config or sweep file (its base); an `advise:` block sets the candidates"),
        *cluster.options(),
        Option("--target", help="METRIC=VALUE, e.g. test_accuracy=0.9 (default: advise.target, else loss=target_loss)"),
        Option(
            "--budget", type=float, help="training steps to spend, in full dense runs of the config's steps (default 1)"
        ),
        Option("--seeds", type=int, help="seeds per candidate, run as one program (default 3, at most 16)"),
        Option("--verify", type=int, default=0, metavar="N", help="continue the top N to the full budget and compare"),
        Option(
            "--timing",
            choices=TIMINGS,
            default="modelled",
            help="how a step is timed: modelled on the cluster (default), or measured: each candidate's real step "
            "on this machine (one device per worker; simulated CPU devices on CPU), the model beside it",
        ),
        Option(
            "--measure-steps",
            type=int,
            metavar="N",
            help="with --timing measured: timed steps per phase after compilation, median taken (default 10)",
        ),
        Option("--json", action="store_true", help="print the advice as JSON instead of the table"),
        Option("--out", help="output directory (default results/advise/<config name>)"),
        Option("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key; repeatable"),
    ),
    handler=run,
    raw=True,
)
