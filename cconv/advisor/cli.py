"""``cconv advise CONFIG --cluster NODESxGPUS [...]``: the command line of ``cconv.advisor.advise``."""

from __future__ import annotations

import argparse
import math
import sys

from cconv.advisor import report as R
from cconv.cli_schema import Command, Option
from cconv.theory import cluster as CL

DESCRIPTION = """\
Which method reaches the target soonest on this cluster?  Trains every candidate of the config's
`advise:` block (default: the registries' compressors at their knob's extreme values, with and
without error feedback, under BSP; the dense baseline under BSP and local SGD) for a fraction of the config's
steps (--probe), several seeds as one program; extrapolates each learning curve to the target with
an interval; times a step on the cluster with the systems simulator (FLOPs / device, the step's own
collectives on the two-level network, compression measured here and scaled by memory bandwidth,
the schedule's overlap); ranks by predicted time to target.  Candidates whose probes cannot
support a prediction (diverged, stalled, target not approached, too noisy) are listed with the
reason, not ranked.  Writes <out>/probes/ (resumable runs), advice.json and advice.png.
"""


def _header(adv) -> str:
    return (
        f"{adv.config}: {adv.target} on {adv.cluster} ({adv.workers} workers); probes of {adv.probe_steps} of "
        f"{adv.budget} steps x {adv.seeds} seeds, {len({r.candidate for r in adv.rows})} candidates "
        f"({adv.probe_wall_s:.0f} s of probing, {adv.wall_s:.0f} s in all)"
    )


def _verify_table(rows) -> str:
    lines = ["verify: predicted vs actual steps to target (full runs, seed mean)"]
    for v in rows:
        act = f"{v.actual:.0f}" if math.isfinite(v.actual) else "not reached"
        ok = "inside" if v.inside else "OUTSIDE"
        lines.append(f"  {v.candidate:<36} predicted {v.predicted:.0f} [{v.lo:.0f}, {v.hi:.0f}]  actual {act}  {ok}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from cconv._startup import quiet_libraries

    if args.verify < 0:
        raise ValueError(f"--verify must be >= 0, got {args.verify}")
    cluster = CL.from_args(args)
    quiet_libraries()
    from cconv.advisor.api import advise

    adv = advise(
        args.config,
        cluster,
        target=args.target,
        probe=args.probe,
        seeds=args.seeds,
        verify_top=args.verify,
        out=args.out,
        overrides=args.set,
    )
    if args.json:
        sys.stdout.write(R.dumps(adv) + "\n")
        return 0
    print(_header(adv))
    multi = len({r.schedule for r in adv.rows}) > 1
    print(R.table(adv.rows, multi))
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
    help="which method reaches my target soonest on my cluster (probes + simulator)",
    description=DESCRIPTION,
    options=(
        Option("config", help="run config or sweep file (its base); an `advise:` block sets the candidates"),
        *CL.options(),
        Option("--target", help="METRIC=VALUE, e.g. test_accuracy=0.9 (default: advise.target, else loss=target_loss)"),
        Option("--probe", type=float, help="probe length as a fraction of the config's steps (default 0.1)"),
        Option("--seeds", type=int, help="seeds per candidate, run as one program (default 3)"),
        Option("--verify", type=int, default=0, metavar="N", help="train the top N to the full budget and compare"),
        Option("--json", action="store_true", help="print the advice as JSON instead of the table"),
        Option("--out", help="output directory (default results/advise/<config name>)"),
        Option("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key; repeatable"),
    ),
    handler=run,
    raw=True,
)
