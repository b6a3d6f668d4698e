"""Figures from run/sweep results (matplotlib, Agg): convergence against traffic, steps or time.

* ``curves``: one panel, one line per run (seeds averaged, a band over the seeds when several),
  labelled by the settings that vary between the runs (``run_labels``).
* ``family_grid``: one panel per compressor family (in a sweep's file order, ``families_in``);
  within a panel, colour = the family's swept hyper-parameter (ratio, levels, rank, ...), line
  style = memory (solid EF, dashed none, dotted DGC), marker = any other setting that varies within
  the family (e.g. ``positions``); a family without levels to colour (signSGD, TernGrad, an
  optimizer that sends its own messages, 1-bit Adam: ``report.sent_columns``) is coloured by
  memory (``MEMORY_COLOR``), so that its EF and no-EF curves differ where they overlap and the
  legend names each line in its colour; the uncompressed baseline (the identity compressor) is a
  dashed black line in every panel (``BASELINE_STYLE``, also in ``curves`` and ``ratio_summary``).
  Labels and knobs come from the compressor registry (``Entry.label``, ``Entry.knob``).
* ``ratio_summary``: bytes to reach a target loss against the compression ratio, with and without
  error feedback, one line per sparsifier family; methods without a ratio (signSGD, TernGrad, ...)
  and the dense baseline are horizontal reference lines.

Seed bands (``band=``): the mean over seeds at each step with ``minmax`` (the default: with the
2-5 seeds of a typical sweep it shows every seed's range and assumes no distribution), ``std``
(mean +- sample standard deviation, ddof=1), ``sem`` (std / sqrt(n)), ``ci95`` (mean +-
t_{0.975, n-1} sem, Student's t with n - 1 degrees of freedom) or ``none``.

x axes: ``bytes`` = ``cum_bytes`` (cumulative bytes sent + received per worker, log scale: what
the collectives moved), ``bytes_encoded`` = ``cum_bytes_encoded`` (the same for the encoded
messages: smaller for entropy-coded payloads, whose buffers have a fixed capacity), ``steps``,
``time`` = simulated time on a network (``sim_time@<net>``; ``sim_time`` for the run's
first network; wall-clock time when no network was simulated).  Loss axes are shared and capped at
1.5 x the median initial value: a diverging run leaves through the top edge, marked with an x, and
the legend names it: ``diverged at step N`` when its ``summary.json`` says so (the rule of
``cconv.experiments.divergence``: a non-finite loss or 10x the first step's), else ``above the
axis from step N`` (``divergence_notes``, ``note_of``).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator
from io import BytesIO
from typing import NamedTuple

import numpy as np

from cconv.experiments import io

# x axes on a byte scale (log): name -> (column, what it counts)
BYTE_AXES = {"bytes": ("cum_bytes", "traffic"), "bytes_encoded": ("cum_bytes_encoded", "encoded traffic")}
X_AXES = (*BYTE_AXES, "steps", "time")
MEMORY_STYLE = {"ef": "-", "none": "--", "dgc": ":", "ef21": "-.", "ef21_sgdm": (0, (5, 1, 1, 1, 1, 1))}
MEMORY_LABEL = {"ef": "EF", "none": "no EF", "dgc": "DGC memory", "ef21": "EF21", "ef21_sgdm": "EF21-SGDM"}
Y_LABELS = {
    "loss": "training loss",
    "test_loss": "test loss",
    "test_accuracy": "test accuracy",
    "accuracy": "training accuracy",
}


def identity_name() -> str:
    """The registered name of the identity compressor: the dense baseline of every panel."""
    from cconv import compressors as C

    return C.IDENTITY


def family_label(name: str) -> str:
    """A compressor family's label: its registry entry's ``label`` (also for a compressor named by
    import path, ``pkg.mod:factory``), else its name."""
    from cconv import compressors as C

    if name in C.names() or (isinstance(name, str) and ":" in name):
        try:
            return C.entry(name).label or str(name)
        except ValueError:
            pass
    return str(name)


def knobs(family: str | None = None) -> list[str]:
    """Hyper-parameters that can colour a family's runs, in order of preference: the family's own
    ``Entry.knob``, then ``ratio`` and ``k`` (sparsifier runs that set k instead of ratio), then
    every other registered knob."""
    from cconv import compressors as C

    own = []
    if family in C.names():
        knob = C.entry(family).knob
        own = [knob.name] if knob is not None else []
    others = sorted({e.knob.name for e in C.entries() if e.knob is not None})
    return list(dict.fromkeys([*own, "ratio", "k", *others]))


def family_order(families: Iterable[str]) -> list[str]:
    """Registered families in name order, then the others by name."""
    from cconv import compressors as C

    registered = C.names()
    return sorted(families, key=lambda f: (registered.index(f) if f in registered else len(registered), str(f)))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def x_column(df, x: str, network: str | None = None) -> tuple[str, str]:
    """(column, axis label) for an x choice."""
    if x in BYTE_AXES:
        col, what = BYTE_AXES[x]
        if col not in df.columns:
            raise ValueError(f"no {col} in these results (written by cconv runs since encoded sizes are logged)")
        return col, f"cumulative {what} per worker, sent + received [bytes]"
    if x == "steps":
        return "step", "training step"
    if x == "time":
        if network:
            col = f"sim_time@{network}"
            if col not in df.columns:
                nets = sorted(c.split("@", 1)[1] for c in df.columns if c.startswith("sim_time@"))
                raise ValueError(
                    f"no simulated time for network {network!r} in these results; "
                    f"available: {', '.join(nets) or 'none (set network: in the config)'}"
                )
            return col, f"simulated time on {network} [s]"
        if "sim_time" in df.columns and df["sim_time"].notna().any():
            return "sim_time", "simulated time [s]"
        return "wall_time", "wall-clock time [s]"
    raise ValueError(f"unknown x axis {x!r}; valid: {', '.join(X_AXES)}")


def y_label(y: str) -> str:
    return Y_LABELS.get(y, y.replace("_", " "))


BANDS = ("minmax", "std", "sem", "ci95", "none")
BAND_LABEL = {
    "minmax": "band: min-max",
    "std": "band: +-1 std",
    "sem": "band: +-1 s.e.m.",
    "ci95": "band: 95% CI (t, n-1 dof)",
    "none": "no band",
}
# Student's t 0.975 quantiles for 1..29 degrees of freedom (n = 2..30 seeds); 1.96 beyond
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
)  # fmt: skip


def t975(dof: int) -> float:
    """t_{0.975, dof}, the two-sided 95% quantile of Student's t: from scipy when installed, else
    the table above (exact to 3 decimals for dof <= 29) and the normal 1.96 beyond."""
    if dof < 1:
        return math.nan
    try:
        from scipy import stats
    except ImportError:
        return T975[dof - 1] if dof <= len(T975) else 1.96
    return float(stats.t.ppf(0.975, dof))


def check_band(band: str) -> str:
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; valid: {', '.join(BANDS)}")
    return band


def spread(mean, std, n, lo, hi, band: str = "minmax"):
    """(lower, upper) of a seed band from per-point statistics (arrays): see the module doc.
    NaN where it is undefined (one seed, or ``band='none'``)."""
    check_band(band)
    mean, std, n = np.asarray(mean, float), np.asarray(std, float), np.asarray(n, float)
    if band == "minmax":
        ok = n > 1
        return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)
    if band == "none":
        return np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    half = std
    with np.errstate(invalid="ignore", divide="ignore"):
        if band in ("sem", "ci95"):
            half = std / np.sqrt(n)
        if band == "ci95":
            half = half * np.array([t975(int(k) - 1) if k > 1 else np.nan for k in n.ravel()]).reshape(n.shape)
    half = np.where(n > 1, half, np.nan)
    return mean - half, mean + half


def mean_curve(g, xcol: str, ycol: str, band: str = "minmax"):
    """Seeds averaged at equal steps: (x mean, y mean, band lower, band upper, number of seeds)."""
    agg = (
        g.groupby("step")
        .agg(
            x=(xcol, "mean"),
            y=(ycol, "mean"),
            sd=(ycol, "std"),
            lo=(ycol, "min"),
            hi=(ycol, "max"),
            n=(ycol, "count"),
        )
        .sort_index()
    )
    y = agg["y"].to_numpy(float)
    lo, hi = spread(y, agg["sd"].to_numpy(float), agg["n"].to_numpy(float), agg["lo"], agg["hi"], band)
    return agg["x"].to_numpy(float), y, lo, hi, int(agg["n"].max()) if len(agg) else 0


def y_range(df, ycol: str) -> tuple[float, float] | None:
    """Shared y limits for a loss-like metric: from 0.8 x the smallest value to 1.5 x the median
    over runs of their *first* logged value, so that a diverging run leaves through the top edge (marked with an
    x there) instead of stretching the axis over many decades.  None for accuracies."""
    if "accuracy" in ycol or ycol not in df.columns:
        return None
    vals = df[ycol].to_numpy(float)
    finite = vals[np.isfinite(vals) & (vals > 0)]
    if not finite.size:
        return None
    firsts = (
        df.sort_values("step")
        .groupby("run")[ycol]
        .apply(lambda v: v[np.isfinite(v.to_numpy(float))].iloc[0] if np.isfinite(v.to_numpy(float)).any() else np.nan)
    )
    top = 1.5 * float(np.nanmedian(firsts.to_numpy(float))) if firsts.notna().any() else float(finite.max())
    return 0.8 * float(finite.min()), max(top, 1.05 * float(finite.min()))


class Line(NamedTuple):
    """What the curves of one figure share: x and y columns, the cap of the loss axis (``top``,
    None for none: ``y_range``) and the seed band (``spread``)."""

    xcol: str
    ycol: str
    top: float | None
    band: str


def _scales(ax, x: str, limits=None) -> None:
    """Log x for a byte axis; the shared y limits (log y when they span more than a factor 20); grid."""
    if x in BYTE_AXES:
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        if 0 < lo < hi < 100 * lo:  # under two decades matplotlib labels 2, 3, 4, 6 x 10^n: they overlap
            from matplotlib.ticker import LogLocator, NullFormatter

            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))  # 10^n and 3 x 10^n labelled
            ax.xaxis.set_minor_formatter(NullFormatter())
    if limits is not None:
        lo, hi = limits
        if hi / lo > 20:
            ax.set_yscale("log")
        ax.set_ylim(lo, hi)
    ax.grid(True, which="major", alpha=0.3)


class Drawn(NamedTuple):
    """A drawn curve (``_draw``): its line, and the step at which it left through the top edge (None:
    it stayed on the axes)."""

    artist: object
    left: int | None


def _draw(ax, g, line: Line, **kw) -> Drawn:
    """One run's seed-mean curve (``ax.plot`` with ``kw``) and its band; a run that diverges (non-finite,
    or above ``line.top`` to its end) is cut where it leaves through the top edge for good and marked
    with an x there; an excursion above ``line.top`` that comes back runs along the top edge."""
    xv, yv, lo, hi, n = mean_curve(g, line.xcol, line.ycol, line.band)
    steps = np.sort(g["step"].dropna().unique())  # mean_curve's index
    ok = np.isfinite(xv)
    if x_is_log(ax):
        ok &= xv > 0
    xv, yv, lo, hi, steps = xv[ok], yv[ok], lo[ok], hi[ok], steps[ok]
    top, left = line.top, None
    blew_up = (~np.isfinite(yv)).any() or (top is not None and (yv[np.isfinite(yv)] > top).any())
    if top is not None:  # a diverging run leaves through the top edge (for good: cut there)
        yv = np.where(np.isfinite(yv), np.minimum(yv, top), top)
        lo, hi = np.minimum(lo, top), np.minimum(hi, top)
        below = np.flatnonzero(yv < top)
        if len(yv) and yv[-1] >= top:  # from its last point on the axes it never comes back
            cut = int(below[-1]) + 2 if len(below) else 1
            xv, yv, lo, hi, left = xv[:cut], yv[:cut], lo[:cut], hi[:cut], int(steps[cut - 1])
        blew_up = left is not None
    fin = np.isfinite(yv)
    (drawn,) = ax.plot(xv[fin], yv[fin], **kw)
    if n > 1 and np.isfinite(lo[fin]).any():
        ax.fill_between(xv[fin], lo[fin], hi[fin], color=drawn.get_color(), alpha=0.15, linewidth=0)
    if blew_up and fin.any():
        ax.plot(xv[fin][-1:], yv[fin][-1:], marker="x", color=drawn.get_color(), markersize=7, clip_on=False)
    return Drawn(drawn, left)


def divergence_notes(df) -> dict[str, str]:
    """What a legend says of each run with a diverged seed, from its ``summary.json``
    (``report.load_metrics``'s ``diverged_at_step``: the rule of ``cconv.experiments.divergence``):
    ``diverged at step N``; with several seeds ``k of n seeds diverged, the first at step N``."""
    if df.empty or "diverged_at_step" not in df.columns:
        return {}
    notes = {}
    for run, g in df.groupby("run", sort=False):
        per_seed = g.groupby("seed")["diverged_at_step"].first() if "seed" in g.columns else g["diverged_at_step"][:1]
        div = per_seed.dropna()
        if div.empty:
            continue
        first = int(div.min())
        many = len(per_seed) > 1
        notes[run] = f"{len(div)} of {len(per_seed)} seeds diverged, the first at step {first}" if many else ""
        notes[run] = notes[run] or f"diverged at step {first}"
    return notes


def note_of(run: str, notes: dict[str, str], drawn: Drawn) -> str | None:
    """A run's legend note: its divergence (``divergence_notes``), else where its curve left the axes."""
    if run in notes:
        return notes[run]
    return None if drawn.left is None else f"above the axis from step {drawn.left}"


def x_is_log(ax) -> bool:
    return ax.get_xscale() == "log"


# config keys that never tell runs apart in a legend: bookkeeping, not the experiment
NOT_SETTINGS = frozenset({"seed", "name", "checkpoint_every", "wandb", "tensorboard", "target_loss"})


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v in ("", "nan"))


def format_value(v) -> str:
    """A setting's value as a legend shows it: floats in ``%g`` (``4.0`` -> ``4``), else ``str``."""
    if isinstance(v, (float, np.floating)):
        return f"{float(v):g}"
    if isinstance(v, np.integer):
        return str(int(v))
    return str(v)


def run_settings(row) -> dict[str, str]:
    """A run's settings from its config columns, as ``{key: formatted value}`` in config order:
    ``compressor`` (the method: its name, or the label of an optimizer that sends its own messages,
    ``report.sent_columns``), ``compressor.<hparam>`` (the schema's defaults filled in for a
    registered compressor, so an omitted ``positions`` reads as ``int32``), ``memory`` (what its
    messages travel with) and every other ``cfg.*`` key but bookkeeping (``seed``, ``name``,
    ``checkpoint_every``, ...).  Absent and NaN values are left out (a dense run has no ``ratio``)."""
    from cconv import compressors as C

    comp = row.get("compressor", row.get("cfg.compressor.name"))
    if _missing(comp):
        comp = row.get("cfg.compressor.name")
    hparams: dict[str, str] = {}
    rest: dict[str, str] = {}
    for col, v in row.items():
        if not str(col).startswith("cfg.") or col == "cfg.compressor.name" or _missing(v):
            continue
        key = col[4:]
        if key.startswith("compressor."):
            hparams[key] = format_value(v)
        elif key.split(".")[0] not in NOT_SETTINGS and key != "compressor":
            rest[key] = format_value(v)
    if "memory" in rest and not _missing(row.get("memory")):
        rest["memory"] = format_value(row["memory"])
    if _missing(comp):
        return {**hparams, **rest}
    if comp in C.names():  # the given hyper-parameters, then the schema's defaults of the others
        for k, v in C.entry(comp).schema.defaults().items():
            if not _missing(v):
                hparams.setdefault(f"compressor.{k}", format_value(v))
    return {"compressor": str(comp), **hparams, **rest}


def settings_of(df) -> dict[str, dict[str, str]]:
    """``run_settings`` of every run of ``df`` (from its first row), keyed by run."""
    firsts = df.drop_duplicates("run")
    return {row["run"]: run_settings(row) for _, row in firsts.iterrows()}


def _short(key: str) -> str:
    """Legend name of a setting: ``compressor.ratio`` -> ``ratio``, ``optimizer.name`` -> ``optimizer``."""
    if key.startswith("compressor."):
        return key.split(".", 1)[1]
    return key[: -len(".name")] if key.endswith(".name") else key


def varying_keys(settings: dict[str, dict[str, str]]) -> list[str]:
    """Keys that take at least two different (present) values over the runs, in first-seen order."""
    values: dict[str, set] = {}
    for st in settings.values():
        for k, v in st.items():
            values.setdefault(k, set()).add(v)
    return [k for k, vs in values.items() if len(vs) > 1]


def _describe(st: dict[str, str], keys: list[str], family: bool = True) -> list[str]:
    """The label parts of one run for the given varying keys (compressor first, with its
    hyper-parameters in brackets, then memory, then the rest); a key the run lacks is left out.
    ``family=False``: the hyper-parameters without the compressor's name (a family's own panel)."""
    hp = [f"{_short(k)}={st[k]}" for k in keys if k.startswith("compressor.") and k in st]
    parts = []
    if family and "compressor" in st and ("compressor" in keys or hp):
        fam = family_label(st["compressor"])
        parts.append(f"{fam} ({', '.join(hp)})" if hp else fam)
    elif hp:
        parts.append(", ".join(hp))
    if "memory" in keys and "memory" in st:
        parts.append(MEMORY_LABEL.get(st["memory"], f"memory={st['memory']}"))
    parts += [
        f"{_short(k)}={st[k]}"
        for k in keys
        if k not in ("compressor", "memory") and not k.startswith("compressor.") and k in st
    ]
    return parts


def run_labels(df) -> dict[str, str]:
    """One unique, informative legend label per run of ``df`` (``load_metrics`` or ``load_runs``).

    Built from the settings that vary between the runs (``run_settings``; e.g. ``top-k (ratio=0.01,
    positions=golomb), EF`` or ``QSGD (levels=4)``), never from one they lack (no ``ratio=nan`` on
    the dense baseline).  Config ``name:`` values are used when they tell all runs apart, put in
    front when they differ only between some, and ignored when equal.  When nothing varies the label
    is the compressor and memory; runs that still share a label get their directory name appended."""
    if df.empty:
        return {}
    settings = settings_of(df)
    names = {}
    for _, row in df.drop_duplicates("run").iterrows():
        name = row.get("cfg.name", row.get("label"))
        names[row["run"]] = "" if _missing(name) else str(name)
    keys = varying_keys(settings)
    labels = {}
    distinct_names = all(names.values()) and len(set(names.values())) == len(names)
    for run, st in settings.items():
        if distinct_names and len(names) > 1:
            labels[run] = names[run]
            continue
        parts = _describe(st, keys)
        if not parts:
            parts = _describe(st, ["compressor", "memory"]) or [str(run)]
        if names[run] and len(set(names.values())) > 1:
            parts.insert(0, names[run])
        labels[run] = ", ".join(parts)
    counts: dict[str, int] = {}
    for lab in labels.values():
        counts[lab] = counts.get(lab, 0) + 1
    return {run: (f"{lab} [{run}]" if counts[lab] > 1 else lab) for run, lab in labels.items()}


def run_order(df) -> list[str]:
    """Runs in legend order: compressor family (registry order), then its settings (numbers by
    value), memory, then the run name."""
    if df.empty:
        return []
    settings = settings_of(df)
    keys = varying_keys(settings)
    fams = family_order({st.get("compressor", "") for st in settings.values()})

    def num(v: str):
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)

    def key(run):
        st = settings[run]
        return (
            fams.index(st.get("compressor", "")),
            [num(st.get(k, "")) for k in keys if k.startswith("compressor.")],
            list(MEMORY_LABEL).index(st["memory"]) if st.get("memory") in MEMORY_LABEL else len(MEMORY_LABEL),
            [num(st.get(k, "")) for k in keys if not k.startswith("compressor") and k != "memory"],
            str(run),
        )

    return sorted(settings, key=key)


def outputs(out: str) -> list[str]:
    """The files ``save`` writes for ``out``: the .png and the .pdf next to it (and vice versa)."""
    root, ext = os.path.splitext(out)
    if ext.lower() in (".png", ".pdf"):
        return [out, root + (".pdf" if ext.lower() == ".png" else ".png")]
    return [out]


def check_outputs(out: str) -> list[str]:
    """``io.check_output`` of every file ``save`` writes for ``out`` (before any work)."""
    return [io.check_output(o, "--out") for o in outputs(out)]


def save(fig, out: str) -> list[str]:
    """Save a figure as ``out`` and, for .png, also the .pdf next to it (and vice versa).  Each file
    is replaced atomically and only if it is a regular file (``io.atomic_write_bytes``: a link or
    another file type there is refused, never followed)."""
    outs = outputs(out)
    for o in outs:
        io.check_entry(o)  # all refusals before the first file is written
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # the directory may be a link you chose
    for o in outs:
        buf = BytesIO()
        fig.savefig(buf, format=os.path.splitext(o)[1][1:].lower() or None, dpi=150, bbox_inches="tight")
        io.atomic_write_bytes(o, buf.getvalue())
    _plt().close(fig)
    return outs


LEGEND = ("auto", "outside", "inside", "none")
LINESTYLES = ("-", "--", ":", "-.")


def check_legend(where: str) -> str:
    if where not in LEGEND:
        raise ValueError(f"unknown legend placement {where!r}; valid: {', '.join(LEGEND)}")
    return where


def _legend(ax, handles=None, title: str | None = None, where: str = "auto", entries: int = 0, **kw) -> None:
    """A legend inside (matplotlib's ``best`` spot, away from the curves where it can) or, for many
    entries (``auto``: more than 5) or ``outside``, to the right of the axes, where it covers none."""
    if check_legend(where) == "none":
        return
    kw = {"fontsize": 7, "title": title, "title_fontsize": 7, **kw}
    if handles is not None:
        kw["handles"] = handles
    if where == "outside" or (where == "auto" and entries > 5):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False, **kw)
    else:
        ax.legend(loc="best", **kw)


def _handle(**kw):
    """A legend entry that is not a curve of the axes (a ``Line2D`` without data)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], **kw)


# the uncompressed baseline (the identity compressor) in every figure: black, dashed (docs/getting_started.md)
BASELINE_STYLE = {"color": "black", "linestyle": "--"}
# colour of a memory where it tells a family's runs apart (a family without knob levels)
MEMORY_COLOR = {
    "ef": "tab:blue",
    "none": "tab:orange",
    "dgc": "tab:green",
    "ef21": "tab:red",
    "ef21_sgdm": "tab:purple",
}


def _baseline_handle():
    return _handle(label="dense baseline", **BASELINE_STYLE)


def _memory_handles(memories: Iterable[str], coloured: bool = False) -> list:
    """One legend entry per memory among ``memories`` (line style: ``MEMORY_STYLE``), in EF, none, DGC
    order; grey, or (``coloured``: a panel whose colour tells the memories apart) ``MEMORY_COLOR``."""
    present = set(memories)
    return [
        _handle(color=MEMORY_COLOR.get(m, "grey") if coloured else "grey", linestyle=style, label=MEMORY_LABEL[m])
        for m, style in MEMORY_STYLE.items()
        if m in present
    ]


def _label_axes(ax, xlabel: str | None = None, ylabel: str | None = None, title: str | None = None) -> None:
    """The axis labels and the title that are given."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)


def _one_panel(log_x: bool):
    """(figure, axes) of a one-panel figure (``curves``, ``ratio_summary``)."""
    fig, ax = _plt().subplots(figsize=(7.5, 4.8))
    if log_x:
        ax.set_xscale("log")
    return fig, ax


def _check_metrics(df, y: str | None = None) -> None:
    """Refuse an empty frame, and a metric ``y`` it does not have (naming the ones it has)."""
    if df.empty:
        raise ValueError("no metric lines to plot (have the runs started?)")
    if y is not None and y not in df.columns:
        raise ValueError(
            f"no metric {y!r} in these results; available: "
            f"{', '.join(c for c in df.columns if df[c].dtype.kind == 'f' and not c.startswith('cfg.'))}"
        )


def _seeds_note(df, band: str) -> str | None:
    """``mean of 3 seeds, band: ...`` when some run has several seeds (None otherwise)."""
    if "seed" not in df.columns:
        return None
    n = df.groupby("run")["seed"].nunique()
    if n.max() <= 1:
        return None
    many = f"{int(n.max())}" if n.min() == n.max() else f"{int(n.min())}-{int(n.max())}"
    return f"mean of {many} seeds, {BAND_LABEL[band]}"


def _with_seed_counts(df, labels: dict[str, str]) -> dict[str, str]:
    """``labels``, with `` (n seeds)`` after those of runs whose number of seeds is not the most common one."""
    if "seed" not in df.columns:
        return labels
    seeds = df.groupby("run")["seed"].nunique()
    common = int(seeds.mode().iloc[0]) if len(seeds) else 1
    return {
        run: label + (f" ({int(seeds[run])} seed{'s' if seeds[run] != 1 else ''})" if seeds[run] != common else "")
        for run, label in labels.items()
    }


def _variants(settings: dict[str, dict[str, str]], shown: Iterable[str]) -> dict[str, str]:
    """Each run's variant within a family: the settings that vary between the runs (``varying_keys``)
    but those ``shown`` otherwise (colour, line style), as ``_describe`` writes them; keyed by run."""
    other = [k for k in varying_keys(settings) if k not in tuple(shown)]
    return {run: ", ".join(_describe(st, other, family=False)) for run, st in settings.items()}


def curves(
    df,
    x: str = "bytes",
    y: str = "loss",
    network: str | None = None,
    title: str | None = None,
    out: str = "curves.png",
    band: str = "minmax",
    legend: str = "auto",
    target: float | None = None,
) -> list[str]:
    """All runs in one panel (``cconv plot --panels single``): one line per run, seeds averaged with
    a ``band`` (module doc), labelled by ``run_labels`` (and ``note_of``: a run that diverged or left
    the axes says so), in ``run_order``, the dense baseline dashed black; the legend goes outside
    the axes for more than five runs (``legend``).  ``target``: a dotted horizontal line at that value."""
    check_band(band)
    _check_metrics(df, y)
    xcol, xlabel = x_column(df, x, network)
    labels = _with_seed_counts(df, run_labels(df))
    order = run_order(df)
    fig, ax = _one_panel(log_x=x in BYTE_AXES)
    limits = y_range(df, y)
    line = Line(xcol, y, limits[1] if limits else None, band)
    colors, notes, ident = _plt().get_cmap("tab10"), divergence_notes(df), identity_name()
    for i, run in enumerate(order):
        g = df[df["run"] == run]
        kw = {"color": colors(i % 10), "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)]}
        if (g["compressor"] == ident).all():
            kw = BASELINE_STYLE
        drawn = _draw(ax, g, line, linewidth=1.4, **kw)
        note = note_of(run, notes, drawn)
        drawn.artist.set_label(labels[run] + (f": {note}" if note else ""))
    if target is not None:
        ax.axhline(target, color="grey", linestyle=":", linewidth=1.0, label=f"target {y_label(y)} {target:g}")
    _scales(ax, x, limits)
    _label_axes(ax, xlabel, y_label(y), title)
    _legend(ax, title=_seeds_note(df, band), where=legend, entries=len(order) + (target is not None))
    return save(fig, out)


def _knob(g, family: str | None = None) -> str | None:
    for k in knobs(family):
        c = f"cfg.compressor.{k}"
        if c in g.columns and g[c].notna().any() and g[c].astype(str).nunique() >= 1 and g[c].notna().all():
            return c
    return None


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _grid(n: int, ncols: int, legend: str):
    """(figure, axes[row][col], ncols, nrows) for ``n`` panels, shared y; the cells past ``n`` hidden."""
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    wide = 6.2 if legend == "outside" else 4.6
    fig, axes = _plt().subplots(nrows, ncols, figsize=(wide * ncols, 3.6 * nrows), sharey=True, squeeze=False)
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].set_visible(False)
    return fig, axes, ncols, nrows


def _markers(variant: dict[str, str]) -> dict[str, str | None]:
    """A marker per variant (``_variants``), none when all runs are one variant."""
    kinds = list(dict.fromkeys(variant.values()))
    return {kind: (MARKERS[i % len(MARKERS)] if len(kinds) > 1 else None) for i, kind in enumerate(kinds)}


class Curve(NamedTuple):
    """How one run of a family panel was drawn (``_level_curves``): its colour, line style, memory,
    knob level and ``Drawn``."""

    color: object
    style: object
    memory: str
    level: object
    drawn: Drawn


def _level_curves(ax, sub, line: Line, color_of, marker_of: dict[str, str | None], level=None) -> dict[str, Curve]:
    """The runs of one knob level, coloured ``color_of(memory)``: line style by memory, marker by variant."""
    curves = {}
    for mem, gm in sub.groupby("memory", sort=True):
        style = MEMORY_STYLE.get(mem, "-.")
        for run, gr in gm.groupby("run"):
            kw = {"marker": marker_of[run], "markersize": 3.5, "markevery": max(1, gr["step"].nunique() // 8)}
            drawn = _draw(ax, gr, line, color=color_of(mem), linestyle=style, linewidth=1.4, **kw)
            curves[run] = Curve(color_of(mem), style, mem, level, drawn)
    return curves


def _note_handles(curves: dict[str, Curve], notes: dict[str, str], knob: str | None, variant: dict[str, str]) -> list:
    """A legend entry (an x on the run's line) per run that diverged or left the axes, naming it."""
    handles = []
    for run, c in curves.items():
        note = note_of(run, notes, c.drawn)
        if note is None:
            continue
        parts = [f"{knob} = {float(c.level):g}"] if c.level is not None else []
        parts += [MEMORY_LABEL.get(c.memory, f"memory={c.memory}")] + ([variant[run]] if variant.get(run) else [])
        handles.append(_handle(color=c.color, linestyle=c.style, marker="x", label=f"{', '.join(parts)}: {note}"))
    return handles


def _family_curves(ax, g, family: str, line: Line, notes: dict[str, str]) -> tuple[list, list]:
    """One family's runs in its panel, coloured by its knob's level (``_knob``), or by memory when it
    has no levels to colour (``MEMORY_COLOR``: EF and no EF then differ in colour and line style);
    their legend entries (one naming each run that diverged) and those of the memories."""
    knob = _knob(g, family)
    levels = sorted(g[knob].dropna().unique(), key=float) if knob else [None]
    name = knob.split(".")[-1] if knob else None
    variant = _variants(settings_of(g), ("compressor", "memory", f"compressor.{name}" if knob else None))
    marker = _markers(variant)
    by_memory = knob is None or (len(levels) == 1 and g["memory"].nunique() > 1)  # the legend's colours name lines
    cmap = _plt().get_cmap("viridis")
    handles, curves = [], {}
    for li, lev in enumerate(levels):
        color = cmap(0.85 * li / max(len(levels) - 1, 1)) if len(levels) > 1 else cmap(0.35)
        sub = g if lev is None else g[g[knob] == lev]
        color_of = (lambda m: MEMORY_COLOR.get(m, "grey")) if by_memory else (lambda m, c=color: c)
        curves.update(_level_curves(ax, sub, line, color_of, {r: marker[variant[r]] for r in set(sub["run"])}, lev))
        if lev is not None and not by_memory:
            handles.append(_handle(color=color, label=f"{name} = {float(lev):g}"))
    handles += [_handle(color="grey", marker=m, linestyle="none", label=k) for k, m in marker.items() if m is not None]
    return handles + _note_handles(curves, notes, name, variant), _memory_handles(g["memory"], coloured=by_memory)


def _baseline_curves(ax, base, line: Line) -> None:
    """The dense baseline's runs: black, dashed (``BASELINE_STYLE``)."""
    for _, gb in base.groupby("run"):
        _draw(ax, gb, line, linewidth=1.2, alpha=0.8, **BASELINE_STYLE)


def families_in(df, order: Iterable[str] | None = None) -> list[str]:
    """The compressor families of ``df``'s runs but the dense baseline (itself when it is alone):
    in the order their first run has in ``order`` (run names: a sweep's file order,
    ``report.sweep_order``), then the others in ``family_order``."""
    ident = identity_name()
    fam_of = dict(zip(df["run"], df["compressor"]))
    first = [fam_of[r] for r in (order or ()) if r in fam_of]
    rest = family_order(f for f in dict.fromkeys(df["compressor"]) if f not in first)
    return [f for f in dict.fromkeys([*first, *rest]) if f != ident] or [ident]


PANELS = ("auto", "family", "single")


def panels_for(df, panels: str = "auto") -> str:
    """``family`` or ``single`` for a ``cconv plot --panels`` choice: ``auto`` is ``family`` when the
    runs hold two or more compressor families besides the dense baseline (a sweep: one panel each,
    instead of dozens of lines in one), else ``single``."""
    if panels not in PANELS:
        raise ValueError(f"unknown panels {panels!r}; valid: {', '.join(PANELS)}")
    if panels != "auto":
        return panels
    fams = set(df["compressor"].dropna()) - {identity_name()} if "compressor" in df.columns else set()
    return "family" if len(fams) >= 2 else "single"


def family_grid(
    df,
    x: str = "bytes",
    y: str = "loss",
    network: str | None = None,
    title: str | None = None,
    out: str = "convergence.png",
    families: list[str] | None = None,
    ncols: int = 3,
    band: str = "minmax",
    legend: str = "auto",
    order: list[str] | None = None,
) -> list[str]:
    """One panel per compressor family across its swept hyper-parameter (colour), memory as line
    style, any other setting that varies within the family as marker; seeds averaged with a
    ``band`` (module doc); the dense baseline dashed black on every panel; a run that diverged or
    left the axes named in its panel's legend.  Panels: ``families``, else ``families_in(df,
    order)`` (``order``: run names, a sweep's file order).  ``legend``: ``auto``/``inside`` (best
    spot in each panel), ``outside`` (right of each panel), ``none``."""
    check_band(band)
    check_legend(legend)
    _check_metrics(df)
    xcol, xlabel = x_column(df, x, network)
    ident = identity_name()
    base = df[df["compressor"] == ident]
    limits = y_range(df, y)
    line = Line(xcol, y, limits[1] if limits else None, band)
    fams = families or families_in(df, order)
    fig, axes, ncols, nrows = _grid(len(fams), ncols, legend)
    note, notes = _seeds_note(df, band), divergence_notes(df)
    for idx, fam in enumerate(fams):
        ax = axes[idx // ncols][idx % ncols]
        if x in BYTE_AXES:
            ax.set_xscale("log")
        g = df[df["compressor"] == fam]
        handles, memories = _family_curves(ax, g, fam, line, notes)
        if not base.empty and fam != ident:
            _baseline_curves(ax, base, line)
            handles.append(_baseline_handle())
        handles += memories
        _scales(ax, x, limits)
        where = "inside" if legend == "auto" else legend
        _legend(ax, handles, title=note if idx == 0 else None, where=where, entries=len(handles))
        bottom = idx // ncols == nrows - 1 or idx + ncols >= len(fams)  # no panel below this one
        _label_axes(ax, xlabel if bottom else None, y_label(y) if idx % ncols == 0 else None, family_label(fam))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save(fig, out)


# what a ratio summary counts until the target: x choice -> (load_runs column, axis label, log scale)
TO_TARGET = {
    "bytes": ("bytes_to_target", "traffic per worker to reach target [bytes]", True),
    "bytes_encoded": ("encoded_bytes_to_target", "encoded traffic per worker to reach target [bytes]", True),
    "steps": ("steps_to_target", "steps to reach target", False),
    "time": ("time_to_target", "simulated time to reach target [s]", True),
}
# what an x choice of a ratio summary needs in the runs: column, hint when it is missing
TO_TARGET_NEEDS = {
    "time": ("sim_time", "simulated time: set network: in the config"),
    "bytes_encoded": ("cum_bytes_encoded", ""),
}
RATIO_AXIS = "compression ratio k/d (fraction of gradient entries sent)"


def _to_target(runs, x: str) -> tuple[str, str, bool]:
    """``TO_TARGET[x]``, after refusing an x axis the runs cannot give."""
    if x not in TO_TARGET:
        raise ValueError(f"unknown x axis {x!r} for a ratio summary; valid: {', '.join(TO_TARGET)}")
    if "bytes_to_target" not in runs.columns:
        raise ValueError("no target loss: pass target= (or set target_loss in the config)")
    if x in TO_TARGET_NEEDS:
        need, hint = TO_TARGET_NEEDS[x]
        if need not in runs.columns or not runs[need].notna().any():
            raise ValueError(f"no {need} in these results{' (' + hint + ')' if hint else ''}")
    return TO_TARGET[x]


def _point(v, band: str):
    """Mean and band of one ratio point's seeds; NaN when some seed did not reach the target."""
    v = v.to_numpy(float)
    if not len(v) or not np.isfinite(v).all():
        return math.nan, math.nan, math.nan
    sd = float(np.std(v, ddof=1)) if len(v) > 1 else math.nan
    lo, hi = spread([v.mean()], [sd], [len(v)], [v.min()], [v.max()], band)
    return float(v.mean()), float(lo[0]), float(hi[0])


def _ratio_families(runs, ident: str) -> tuple[list[str], list[str]]:
    """(families whose every run has a ratio, the other compressed families), in ``family_order``."""
    fams = [f for f in family_order(dict.fromkeys(runs["compressor"])) if f != ident]
    with_ratio = [
        f for f in fams if "ratio" in runs.columns and runs.loc[runs["compressor"] == f, "ratio"].notna().all()
    ]
    return with_ratio, [f for f in fams if f not in with_ratio]


def _ratio_xlim(ax, runs, ratio_fams: list[str]) -> None:
    """One ratio (or none): a decade around it, not a singular axis."""
    ratios = sorted({float(r) for r in runs.loc[runs["compressor"].isin(ratio_fams), "ratio"]})
    if len(ratios) < 2:
        r = ratios[0] if ratios else 0.1
        ax.set_xlim(r / 3, r * 3)


def _ratio_line(ax, gm, col: str, band: str, color, style: str) -> bool:
    """Seed means against the ratio, with the band as error bars; True if some point reached the target."""
    pts = sorted((float(r), *_point(v, band)) for r, v in gm.groupby("ratio")[col])
    r, b, lo, hi = (np.array(c, float) for c in zip(*pts))
    ax.plot(r, b, color=color, linestyle=style, marker="o", markersize=4)
    ok = np.isfinite(lo) & np.isfinite(b)
    if ok.any():
        ax.errorbar(r[ok], b[ok], yerr=[b[ok] - lo[ok], hi[ok] - b[ok]], fmt="none", ecolor=color, elinewidth=1)
    return bool(np.isfinite(b).any())


def _flat_line(ax, gm, col: str, band: str, color, style: str) -> bool:
    """A method without a ratio: a horizontal line at its seed mean; True if it reached the target."""
    b, _, _ = _point(gm[col], band)
    if math.isfinite(b):
        ax.axhline(b, color=color, linestyle=style, linewidth=1.2)
    return math.isfinite(b)


def _ratio_family(ax, g, family: str, has_ratio: bool, col: str, band: str, palette: Iterator) -> list:
    """One family's lines (one colour per variant, the next of ``palette``; line style by memory); their
    legend entries."""
    variant = _variants(settings_of(g), ("compressor", "memory", "compressor.ratio", "compressor.k"))
    handles = []
    for kind in dict.fromkeys(variant[r] for r in run_order(g)):
        color = next(palette)
        drawn = False
        for mem, gm in g[g["run"].map(variant) == kind].groupby("memory", sort=True):
            draw = _ratio_line if has_ratio else _flat_line
            drawn |= draw(ax, gm, col, band, color, MEMORY_STYLE.get(mem, "-."))
        name = family_label(family) + (f" ({kind})" if kind else "")
        name += ", no ratio" if not has_ratio else ""
        name += "" if drawn else ", target not reached"
        handles.append(_handle(color=color, marker="o" if has_ratio else None, label=name))
    return handles


def _ratio_title(runs, ylabel: str) -> str:
    tgt = runs["target"].dropna().iloc[0] if "target" in runs and runs["target"].notna().any() else None
    what = ylabel.split(" to reach")[0]
    if tgt is None:
        return f"{what} to reach the target"
    return f"{what} to reach target {tgt:g} (missing point: not reached)"


def ratio_summary(
    runs,
    title: str | None = None,
    out: str = "ratio_summary.png",
    x: str = "bytes",
    band: str = "minmax",
    legend: str = "auto",
) -> list[str]:
    """Bytes (or encoded bytes, steps, simulated time: ``x``) to reach the target against the
    compression ratio, EF vs none (see module doc); ``cconv plot --kind ratio-summary``.

    ``runs`` is ``report.load_runs(..., target=...)``.  Seeds are averaged, with the ``band`` as
    error bars (a ratio where some seed did not reach the target counts as not reached).  Runs of
    one family that differ in another setting (e.g. ``positions``) are separate lines."""
    check_band(band)
    col, ylabel, ylog = _to_target(runs, x)
    fig, ax = _one_panel(log_x=True)
    if ylog:
        ax.set_yscale("log")
    palette = map(_plt().get_cmap("tab10"), itertools.cycle(range(10)))  # one colour per line, in legend order
    ident = identity_name()
    ratio_fams, flat_fams = _ratio_families(runs, ident)
    _ratio_xlim(ax, runs, ratio_fams)
    handles = []
    for fam in ratio_fams + flat_fams:
        handles += _ratio_family(ax, runs[runs["compressor"] == fam], fam, fam in ratio_fams, col, band, palette)
    base = runs[runs["compressor"] == ident][col]
    if len(base) and base.notna().all():
        ax.axhline(base.mean(), linewidth=1.0, **BASELINE_STYLE)
        handles.append(_baseline_handle())
    handles += _memory_handles(runs.loc[runs["compressor"] != ident, "memory"])
    ax.grid(True, which="major", alpha=0.3)
    _label_axes(ax, RATIO_AXIS, ylabel, title or _ratio_title(runs, ylabel))
    _legend(ax, handles, title=_seeds_note(runs, band), where=legend, entries=len(handles))
    return save(fig, out)
