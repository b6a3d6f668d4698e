"""Regenerate the paper figures from a sweep's results directory.

    .venv/bin/cconv sweep studies/paper_digits.yaml            # -> results/paper_digits/
    .venv/bin/python paper_figures/make_figures.py results/paper_digits --out paper_figures

Writes (PNG and PDF each), one panel per compressor family, colour = compression ratio, solid =
error feedback, dashed = none, dashed black = the uncompressed baseline, seeds averaged with a
min-max band; panels in the sweep file's order; a run that diverged is named in its panel's legend:

    loss_vs_bytes, accuracy_vs_bytes          against cumulative traffic per worker (log x)
    loss_vs_steps, accuracy_vs_steps          against training steps
    loss_vs_time_<net>, accuracy_vs_time_<net> against simulated time on 10GbE, 100GbE, 100GbIB
    ratio_summary                             traffic to reach the target loss against the ratio,
                                              with and without error feedback
"""

from __future__ import annotations

import argparse
import os
import sys

from cconv.experiments import plotting, report

NETWORKS = ("10GbE", "100GbE", "100GbIB")
Y = {"loss": "loss", "accuracy": "test_accuracy"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="sweep results directory (e.g. results/paper_digits)")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output directory")
    ap.add_argument(
        "--target", type=float, help="target training loss for the ratio summary (default: the configs' target_loss)"
    )
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    df = report.load_metrics([args.results])
    order = report.sweep_order([args.results])  # panels in the sweep file's order
    name = os.path.basename(os.path.normpath(args.results))
    task = f"{df['model'].iloc[0].upper()} on {df['data'].iloc[0]}, {int(df['workers'].iloc[0])} workers"
    written = []
    for short, y in Y.items():
        what = "training loss" if short == "loss" else "test accuracy"
        written += plotting.family_grid(
            df,
            x="bytes",
            y=y,
            order=order,
            out=os.path.join(args.out, f"{short}_vs_bytes.png"),
            title=f"{what} against traffic ({task})",
        )
        written += plotting.family_grid(
            df,
            x="steps",
            y=y,
            order=order,
            out=os.path.join(args.out, f"{short}_vs_steps.png"),
            title=f"{what} against steps ({task})",
        )
        for net in NETWORKS:
            written += plotting.family_grid(
                df,
                x="time",
                y=y,
                network=net,
                order=order,
                out=os.path.join(args.out, f"{short}_vs_time_{net}.png"),
                title=f"{what} against simulated time on {net} ({task})",
            )
    runs = report.load_runs([args.results], target=args.target)
    written += plotting.ratio_summary(runs, out=os.path.join(args.out, "ratio_summary.png"))
    for w in written:
        print(f"wrote {w}")
    print(f"from {len(df['run'].unique())} runs of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
