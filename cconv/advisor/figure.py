"""The advice figure: predicted time to target (with its interval) against the metric the fitted
curve reaches at the full step budget, one point per ranked row, the Pareto front (no other row
is both faster and better at the end) joined and marked."""

from __future__ import annotations

import math

from cconv.advisor.report import Row


def pareto(rows: list[Row], higher: bool) -> list[Row]:
    """Rows no other row beats on both time (lower) and final metric (higher or lower is better)."""
    pts = [r for r in rows if math.isfinite(r.time_s) and math.isfinite(r.final_metric)]
    sign = 1.0 if higher else -1.0
    front = []
    for r in pts:
        beaten = any(
            o.time_s <= r.time_s
            and sign * o.final_metric >= sign * r.final_metric
            and (o.time_s < r.time_s or sign * o.final_metric > sign * r.final_metric)
            for o in pts
        )
        if not beaten:
            front.append(r)
    return sorted(front, key=lambda r: r.time_s)


def plot(rows: list[Row], metric: str, higher: bool, title: str, out: str) -> str:
    """Write the figure to ``out`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = [r for r in rows if r.rank and math.isfinite(r.final_metric)]
    front = pareto(ranked, higher)
    fig, ax = plt.subplots(figsize=(8, 5.5), constrained_layout=True)
    for r in ranked:
        on = r in front
        dense = r.speedup == 1.0 and r.overrides.get("compressor", {}).get("name") == "none"
        ax.errorbar(
            r.time_s,
            r.final_metric,
            xerr=[[r.time_s - r.time_lo], [r.time_hi - r.time_s]],
            fmt="s" if dense else "o",
            color="C3" if on else ("k" if dense else "C0"),
            alpha=1.0 if on or dense else 0.55,
            ms=6,
            capsize=2,
        )
        if on or dense or r.rank <= 3:
            ax.annotate(
                f"{r.rank}. {r.candidate}",
                (r.time_s, r.final_metric),
                fontsize=7,
                xytext=(4, 3),
                textcoords="offset points",
            )
    if front:
        ax.plot(
            [r.time_s for r in front],
            [r.final_metric for r in front],
            "-",
            color="C3",
            lw=1.2,
            label="Pareto front (faster and better at the end)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("predicted time to target on the cluster (s, log); bars: interval")
    ax.set_ylabel(f"{metric} at the full step budget (fitted curve; up: better)")
    if not higher:
        ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if front:
        ax.legend(fontsize=8, loc="best")
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
