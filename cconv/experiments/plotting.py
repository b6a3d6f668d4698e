"""Figures from run/sweep results (matplotlib, Agg): convergence against traffic, steps or time.

* ``curves``: one panel, one line per run (seeds averaged, min-max band when several).
* ``family_grid``: one panel per compressor family; within a panel, colour = the family's swept
  hyper-parameter (ratio, levels, rank, ...), line style = memory (solid EF, dashed none, dotted
  DGC); the uncompressed baseline (the identity compressor) is drawn in black in every panel.
  Labels and knobs come from the compressor registry (``Entry.label``, ``Entry.knob``).
* ``ratio_summary``: bytes to reach a target loss against the compression ratio, with and without
  error feedback, one line per sparsifier family; methods without a ratio (signSGD, TernGrad, ...)
  and the dense baseline are horizontal reference lines.

x axes: ``bytes`` = ``cum_bytes`` (cumulative bytes sent + received per worker, log scale: what
the collectives moved), ``bytes_encoded`` = ``cum_bytes_encoded`` (the same for the encoded
messages: smaller for entropy-coded payloads, whose buffers have a fixed capacity), ``steps``,
``time`` = simulated time on a network (``sim_time@<net>``; ``sim_time`` for the run's
first network; wall-clock time when no network was simulated).  Loss axes are shared and capped at
1.5 x the median initial value: a diverging run leaves through the top edge, marked with an x.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import numpy as np

# x axes on a byte scale (log): name -> (column, what it counts)
BYTE_AXES = {"bytes": ("cum_bytes", "traffic"), "bytes_encoded": ("cum_bytes_encoded", "encoded traffic")}
X_AXES = (*BYTE_AXES, "steps", "time")
MEMORY_STYLE = {"ef": "-", "none": "--", "dgc": ":"}
MEMORY_LABEL = {"ef": "EF", "none": "no EF", "dgc": "DGC memory"}
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


def mean_curve(g, xcol: str, ycol: str):
    """Seeds averaged at equal steps: (x mean, y mean, y min, y max) arrays."""
    agg = (
        g.groupby("step")
        .agg(x=(xcol, "mean"), y=(ycol, "mean"), lo=(ycol, "min"), hi=(ycol, "max"), n=(ycol, "size"))
        .sort_index()
    )
    return (
        agg["x"].to_numpy(float),
        agg["y"].to_numpy(float),
        agg["lo"].to_numpy(float),
        agg["hi"].to_numpy(float),
        int(agg["n"].max()) if len(agg) else 0,
    )


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


def _scales(ax, ys: list, x: str, y: str, limits=None) -> None:
    if x in BYTE_AXES:
        ax.set_xscale("log")
    if limits is not None:
        lo, hi = limits
        if hi / lo > 20:
            ax.set_yscale("log")
        ax.set_ylim(lo, hi)
    ax.grid(True, which="major", alpha=0.3)


def _draw(ax, g, xcol, ycol, top=None, **kw):
    xv, yv, lo, hi, n = mean_curve(g, xcol, ycol)
    ok = np.isfinite(xv)
    if x_is_log(ax):
        ok &= xv > 0
    xv, yv, lo, hi = xv[ok], yv[ok], lo[ok], hi[ok]
    blew_up = (~np.isfinite(yv)).any() or (top is not None and (yv[np.isfinite(yv)] > top).any())
    if top is not None:  # a diverging run leaves through the top edge
        yv = np.where(np.isfinite(yv), np.minimum(yv, top), top)
        lo, hi = np.minimum(lo, top), np.minimum(hi, top)
        if blew_up:
            cut = int(np.argmax(yv >= top)) + 1
            xv, yv, lo, hi = xv[:cut], yv[:cut], lo[:cut], hi[:cut]
    fin = np.isfinite(yv)
    (line,) = ax.plot(xv[fin], yv[fin], **kw)
    if n > 1:
        ax.fill_between(xv[fin], lo[fin], hi[fin], color=line.get_color(), alpha=0.15, linewidth=0)
    if blew_up and fin.any():
        ax.plot(xv[fin][-1:], yv[fin][-1:], marker="x", color=line.get_color(), markersize=7, clip_on=False)
    return xv[fin], yv[fin]


def x_is_log(ax) -> bool:
    return ax.get_xscale() == "log"


def _varying(df, cols) -> list[str]:
    return [c for c in cols if c in df.columns and df[c].astype(str).nunique() > 1]


def run_label(row, varying: list[str]) -> str:
    parts = []
    for c in varying:
        v = row[c]
        key = c.split(".")[-1] if c.startswith("cfg.") else c
        if c == "compressor":
            parts.append(family_label(v))
        elif c == "memory":
            parts.append(MEMORY_LABEL.get(v, str(v)))
        else:
            parts.append(f"{key}={v:g}" if isinstance(v, float) else f"{key}={v}")
    return ", ".join(parts) if parts else str(row["run"])


def save(fig, out: str) -> list[str]:
    """Save a figure as ``out`` and, for .png, also the .pdf next to it (and vice versa)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    root, ext = os.path.splitext(out)
    outs = [out]
    if ext.lower() in (".png", ".pdf"):
        other = root + (".pdf" if ext.lower() == ".png" else ".png")
        outs.append(other)
    for o in outs:
        fig.savefig(o, dpi=150, bbox_inches="tight")
    _plt().close(fig)
    return outs


def curves(
    df, x: str = "bytes", y: str = "loss", network: str | None = None, title: str | None = None, out: str = "curves.png"
) -> list[str]:
    """All runs in one panel (``cconv plot``)."""
    plt = _plt()
    if df.empty:
        raise ValueError("no metric lines to plot (have the runs started?)")
    if y not in df.columns:
        raise ValueError(
            f"no metric {y!r} in these results; available: "
            f"{', '.join(c for c in df.columns if df[c].dtype.kind == 'f' and not c.startswith('cfg.'))}"
        )
    xcol, xlabel = x_column(df, x, network)
    skip = {"run", "run_dir", "label", "cfg.seed", "cfg.name"}
    cand = ["compressor", "ratio", "memory"] + [
        c
        for c in df.columns
        if c.startswith("cfg.")
        and c not in skip
        and c not in ("cfg.compressor.name", "cfg.compressor.ratio", "cfg.memory")
    ]
    varying = _varying(df, cand)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    if x in BYTE_AXES:
        ax.set_xscale("log")
    limits = y_range(df, y)
    top = limits[1] if limits else None
    ys = []
    for _run, g in df.groupby("run", sort=True):
        label = g["label"].iloc[0] if "label" in g and g["label"].iloc[0] else run_label(g.iloc[0], varying)
        if "seed" in g and g["seed"].nunique() > 1:
            label += f" (mean of {g['seed'].nunique()} seeds, min-max band)"
        _, yv = _draw(ax, g, xcol, y, top=top, label=label, linewidth=1.4)
        ys.append(yv)
    _scales(ax, ys, x, y, limits)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(y_label(y))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7, loc="best", ncol=2 if df["run"].nunique() > 12 else 1)
    return save(fig, out)


def _knob(g, family: str | None = None) -> str | None:
    for k in knobs(family):
        c = f"cfg.compressor.{k}"
        if c in g.columns and g[c].notna().any() and g[c].astype(str).nunique() >= 1 and g[c].notna().all():
            return c
    return None


def family_grid(
    df,
    x: str = "bytes",
    y: str = "loss",
    network: str | None = None,
    title: str | None = None,
    out: str = "convergence.png",
    families: list[str] | None = None,
    ncols: int = 3,
) -> list[str]:
    """One panel per compressor family across its swept hyper-parameter, memory as line style."""
    plt = _plt()
    from matplotlib.lines import Line2D

    if df.empty:
        raise ValueError("no metric lines to plot (have the runs started?)")
    xcol, xlabel = x_column(df, x, network)
    ident = identity_name()
    base = df[df["compressor"] == ident]
    limits = y_range(df, y)
    top = limits[1] if limits else None
    fams = families or family_order(f for f in dict.fromkeys(df["compressor"]) if f != ident)
    if not fams:
        fams = [ident]
    n = len(fams)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for idx, fam in enumerate(fams):
        ax = axes[idx // ncols][idx % ncols]
        if x in BYTE_AXES:
            ax.set_xscale("log")
        g = df[df["compressor"] == fam]
        knob = _knob(g, fam)
        levels = sorted(g[knob].dropna().unique(), key=float) if knob else [None]
        ys = []
        handles = []
        for li, lev in enumerate(levels):
            color = cmap(0.85 * li / max(len(levels) - 1, 1)) if len(levels) > 1 else cmap(0.35)
            sub = g if lev is None else g[g[knob] == lev]
            for mem, gm in sub.groupby("memory", sort=True):
                for _, gr in gm.groupby("run"):
                    _, yv = _draw(
                        ax, gr, xcol, y, top=top, color=color, linestyle=MEMORY_STYLE.get(mem, "-."), linewidth=1.4
                    )
                    ys.append(yv)
            if lev is not None:
                handles.append(Line2D([], [], color=color, label=f"{knob.split('.')[-1]} = {float(lev):g}"))
        if not base.empty and fam != ident:
            for _, gb in base.groupby("run"):
                _, yv = _draw(ax, gb, xcol, y, top=top, color="black", linewidth=1.0, alpha=0.8)
                ys.append(yv)
            handles.append(Line2D([], [], color="black", label="dense baseline"))
        for mem in [m for m in ("ef", "none", "dgc") if m in set(g["memory"])]:
            handles.append(Line2D([], [], color="grey", linestyle=MEMORY_STYLE[mem], label=MEMORY_LABEL[mem]))
        _scales(ax, ys, x, y, limits)
        ax.set_title(family_label(fam))
        ax.legend(handles=handles, fontsize=7, loc="best")
        if idx // ncols == nrows - 1 or idx + ncols >= n:
            ax.set_xlabel(xlabel)
        if idx % ncols == 0:
            ax.set_ylabel(y_label(y))
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save(fig, out)


def ratio_summary(runs, title: str | None = None, out: str = "ratio_summary.png") -> list[str]:
    """Bytes to reach the target loss against the compression ratio, EF vs none (see module doc).

    ``runs`` is ``report.load_runs(..., target=...)``; seeds are averaged (runs where some seed did
    not reach the target count as not reached)."""
    plt = _plt()
    from matplotlib.lines import Line2D

    if "bytes_to_target" not in runs.columns:
        raise ValueError("no target loss: pass target= (or set target_loss in the config)")
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.set_xscale("log")
    ax.set_yscale("log")
    colors = plt.get_cmap("tab10")
    handles = []
    ident = identity_name()
    ratio_fams = [
        f
        for f in dict.fromkeys(runs["compressor"])
        if f != ident and "ratio" in runs.columns and runs.loc[runs["compressor"] == f, "ratio"].notna().all()
    ]
    flat_fams = [f for f in dict.fromkeys(runs["compressor"]) if f != ident and f not in ratio_fams]
    ci = 0
    for fam in ratio_fams:
        color = colors(ci % 10)
        ci += 1
        g = runs[runs["compressor"] == fam]
        for mem, gm in g.groupby("memory", sort=True):
            agg = gm.groupby("ratio")["bytes_to_target"].agg(lambda v: v.mean() if v.notna().all() else np.nan)
            r = agg.index.to_numpy(float)
            b = agg.to_numpy(float)
            ax.plot(r, b, color=color, linestyle=MEMORY_STYLE.get(mem, "-."), marker="o", markersize=4)
        handles.append(Line2D([], [], color=color, marker="o", label=family_label(fam)))
    for fam in flat_fams:
        color = colors(ci % 10)
        ci += 1
        g = runs[runs["compressor"] == fam]
        for mem, gm in g.groupby("memory", sort=True):
            v = gm["bytes_to_target"]
            if v.notna().all():
                ax.axhline(v.mean(), color=color, linestyle=MEMORY_STYLE.get(mem, "-."), linewidth=1.2)
        handles.append(Line2D([], [], color=color, label=f"{family_label(fam)} (no ratio)"))
    base = runs[runs["compressor"] == ident]["bytes_to_target"]
    if len(base) and base.notna().all():
        ax.axhline(base.mean(), color="black", linewidth=1.0)
        handles.append(Line2D([], [], color="black", label="dense baseline"))
    for mem in [m for m in ("ef", "none", "dgc") if m in set(runs["memory"])]:
        handles.append(Line2D([], [], color="grey", linestyle=MEMORY_STYLE[mem], label=MEMORY_LABEL[mem]))
    tgt = runs["target"].dropna().iloc[0] if "target" in runs and runs["target"].notna().any() else None
    ax.set_xlabel("compression ratio k/d (fraction of gradient entries sent)")
    ax.set_ylabel("traffic per worker to reach target [bytes]")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(
        title
        or (
            f"bytes to reach training loss {tgt:g} (missing point: not reached)"
            if tgt is not None
            else "bytes to reach the target loss"
        )
    )
    ax.legend(handles=handles, fontsize=7, loc="best")
    return save(fig, out)
