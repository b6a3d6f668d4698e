"""The advice figure: time to target on the cluster, one line per candidate (its name on the axis,
so no label overlaps another), in the order of the table (rank 1 at the top; the recommendation,
``cconv.advisor.ranking.pick``, ringed).

Observed times (the race saw the candidate reach the target) are filled squares; predicted ones
are circles with their interval; the recommendation is ringed; the dense baseline is black;
candidates that cannot be ranked (diverged, missed the step budget, ...) are a grey cross at the
right edge.  Every marker kind is in the legend.  One row per candidate: under several schedules
the fastest schedule's row is drawn (the table has them all)."""

from __future__ import annotations

import io
import math

from cconv.advisor.ranking import Row, fmt_time


def _preference(r: Row) -> tuple:
    """Which of a candidate's rows (one per schedule) the figure draws: the recommended one, else
    its fastest ranked one, else the first."""
    return (r.recommended, bool(r.rank), -r.time_s if r.rank else 0.0)


def _one_per_candidate(rows: list[Row]) -> list[Row]:
    best: dict[str, Row] = {}
    for r in rows:
        if r.candidate not in best or _preference(r) > _preference(best[r.candidate]):
            best[r.candidate] = r
    ranked = sorted((r for r in best.values() if r.rank), key=lambda r: r.rank)
    return ranked + [r for r in best.values() if not r.rank]


def _label(r: Row) -> str:
    """A row's axis label: its rank and name, marked when the race pruned it (its rank is its
    curve's; the recommendation is the ringed row) or when it is not ranked."""
    if not r.rank:
        return f"{r.candidate} (not ranked)"
    return f"{r.rank}. {r.candidate}" + (" (pruned)" if "pruned" in r.flags else "")


def _legend(fig) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="s", ls="", color="C0", label="observed in the race"),
        Line2D([], [], marker="o", ls="-", color="C1", label="predicted from the curve [interval]"),
        Line2D([], [], marker="o", ls="", mfc="none", mec="C3", ms=12, mew=1.5, label="recommended"),
        Line2D([], [], marker="o", ls="", color="k", label="dense baseline (square when observed)"),
        Line2D([], [], marker="x", ls="", color="0.5", label="not ranked (reason in the table)"),
    ]
    # a figure legend the layout makes room for (one under the axes, centred on them, ran off the
    # figure's right edge when long candidate names pushed the axes right)
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=3, frameon=False)


def _time_axis(ax, lo: float, hi: float) -> None:
    """A log time axis from ``lo`` to ``hi`` seconds, labelled in the table's units ("2 ms",
    ``ranking``'s format) at 1, 2 and 5 per decade (at 1 only past three decades); the other
    ticks unlabelled, so no label runs into the next."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    subs = (1.0,) if hi / lo > 1e3 else (1.0, 2.0, 5.0)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_time(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def png(rows: list[Row], metric: str, higher: bool, title: str, baseline: str = "dense") -> bytes:
    """The figure as PNG bytes (the caller writes them: ``io.atomic_write_bytes``); ``baseline``:
    the dense candidate's name (``ranking.rank``'s), drawn black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = _one_per_candidate(rows)
    ranked = [r for r in rs if r.rank]
    xs = [x for r in ranked for x in (r.time_lo, r.time_s, r.time_hi) if math.isfinite(x) and x > 0]
    lo, hi = (min(xs) / 1.5, max(xs) * 3.0) if xs else (1e-3, 1.0)
    fig, ax = plt.subplots(figsize=(9, 2.0 + 0.42 * len(rs)), constrained_layout=True)
    for i, r in enumerate(rs):
        y = len(rs) - 1 - i
        dense = r.candidate == baseline
        if not r.rank:
            ax.plot([hi / 1.3], [y], "x", color="0.5")
            continue
        color = "k" if dense else ("C0" if r.prediction.observed else "C1")
        if not r.prediction.observed:
            ax.plot([r.time_lo, r.time_hi], [y, y], "-", color=color, lw=1.5)
        ax.plot([r.time_s], [y], "s" if r.prediction.observed else "o", color=color, ms=7)
        if r.recommended:
            ax.plot([r.time_s], [y], "o", mfc="none", mec="C3", ms=14, mew=1.5)
    labels = [_label(r) for r in reversed(rs)]
    ax.set_yticks(range(len(rs)), labels, fontsize=8)
    _time_axis(ax, lo, hi)
    ax.set_ylim(-0.7, len(rs) - 0.3)
    ax.set_xlabel(f"time to reach the target on the cluster (log scale): {metric}")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both", axis="x")
    _legend(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    plt.close(fig)
    return buf.getvalue()
