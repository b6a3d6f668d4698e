"""Load runs and sweeps into pandas tables; final metrics and bytes-to-target.

    >>> from cconv.experiments import report
    >>> runs = report.load_runs(["results/quickstart"])       # one row per (run, seed)
    >>> curves = report.load_metrics(["results/quickstart"])  # one row per metric line
    >>> table = report.table(["results/quickstart"], target=0.3)

Both frames carry the run's config flattened into columns (``compressor``, ``ratio``, ``memory``,
``workers``, ..., and every other field as ``cfg.<dotted key>``), so grouping by any swept field is
one ``groupby``.  ``bytes_to_target`` is the cumulative traffic per worker (``cum_bytes``; and
``encoded_bytes_to_target`` from ``cum_bytes_encoded``, the encoded messages) at the
first metric line whose ``loss`` (or the chosen metric) is at or below the target; ``NaN`` when
the run never reaches it.  ``steps_to_target`` and ``time_to_target`` (simulated, first network)
are read off the same line.

``aggregate`` folds the seeds of each run into one row (``cconv report --aggregate``): the mean
and sample standard deviation (ddof=1; NaN for one seed) of every final metric and of the
to-target columns, the latter over the seeds that reached the target (``reached`` counts them),
with the run's legend label (``plotting.run_labels``: the settings that vary between the runs).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import yaml

from cconv._text import shown, shown_names
from cconv.experiments import io

if TYPE_CHECKING:
    import pandas as pd

FINAL_COLUMNS = (
    "loss",
    "accuracy",
    "test_loss",
    "test_accuracy",
    "cum_bytes",
    "cum_bytes_encoded",
    "sim_time",
    "wall_time",
)


def find_runs(paths: Iterable[str]) -> list[str]:
    """Run directories (those holding config.yaml) at or below the given paths, sorted."""
    found = []
    for p in paths:
        if not os.path.exists(p):
            raise ValueError(f"no such results directory: {p}")
        if os.path.isfile(os.path.join(p, io.CONFIG)):
            found.append(p)
            continue
        for root, dirs, files in os.walk(p):
            if io.CONFIG in files:
                found.append(root)
                dirs[:] = []
            else:
                dirs[:] = sorted(d for d in dirs if d not in (io.CHECKPOINTS, "wandb") and not d.startswith("."))
    if not found:
        raise ValueError(f"no cconv runs (directories with {io.CONFIG}) under: {', '.join(paths)}")
    return sorted(dict.fromkeys(found))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if not isinstance(v, list) else str(v)
    return out


def sent_columns(cfg: dict) -> dict:
    """What a run's workers send when its optimizer sends its own messages (a
    ``cconv.engine.optimizers.MessageTransformation``, 1-bit Adam: ``optimizers.sent``):
    ``compressor`` = the method (the optimizer's ``label``, else its config name), ``ratio`` and
    ``memory`` those of the exchange its messages travel through; {} for every other run (its
    ``compressor`` and ``memory`` keys say what travels) or when the stored optimizer no longer builds."""
    spec = cfg.get("optimizer")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return {}
    from cconv.engine import optimizers

    factory = optimizers.OPTIMIZERS.get(spec["name"])
    if factory is None:
        return {}
    lr = cfg.get("lr")
    knobs = {k: v for k, v in spec.items() if k != "name"}
    try:
        tx = factory(learning_rate=float(lr if lr is not None else 0.0), **knobs)
    except Exception:  # noqa: BLE001 - it no longer accepts the stored knobs
        return {}
    sent = optimizers.sent(tx)
    if sent is None:
        return {}
    hp = dict(getattr(sent.compressor, "hparams", {}) or {})
    return {"compressor": sent.method or spec["name"], "ratio": hp.get("ratio", hp.get("k")), "memory": sent.memory}


def config_columns(cfg: dict) -> dict:
    """The columns a run contributes to every row: the usual axes by short name, the rest dotted.
    ``compressor``, ``ratio`` and ``memory`` say what the workers send: the config's keys, or, for an
    optimizer that sends its own messages, its method and its exchange's (``sent_columns``); the
    ``cfg.*`` columns are the stored config as written."""
    comp = cfg.get("compressor") or {}
    cols = {
        "compressor": comp.get("name"),
        "ratio": comp.get("ratio", comp.get("k")),
        "memory": cfg.get("memory"),
        **sent_columns(cfg),
        "architecture": cfg.get("architecture"),
        "workers": cfg.get("workers"),
        "model": (cfg.get("model") or {}).get("name"),
        "data": (cfg.get("data") or {}).get("name"),
        "lr": cfg.get("lr"),
        "label": cfg.get("name") or None,
    }
    for k, v in _flatten(cfg).items():
        cols[f"cfg.{k}"] = v
    return cols


def read_config(run_dir: str) -> dict:
    """A run's stored config; a one-line ValueError naming the file when it is damaged."""
    path = os.path.join(run_dir, io.CONFIG)
    try:
        cfg = yaml.safe_load(io.read_text(path))
    except (yaml.YAMLError, RecursionError) as e:
        raise ValueError(f"{path} is damaged: {str(e).splitlines()[0]}") from None
    if cfg is not None and not isinstance(cfg, dict):
        raise ValueError(f"{path} is damaged: not a mapping")
    return cfg or {}


class RunFiles(NamedTuple):
    """What report and plot read of one run: its config, summary ({} when absent or damaged),
    metric records (damaged ones skipped) and status."""

    run_dir: str
    config: dict
    summary: dict
    lines: list[dict]
    status: str


def _summary(run_dir: str, problems: list[str], has_lines: bool) -> tuple[dict, str]:
    """(summary, status) of a run; a missing or damaged summary is a problem when the run has
    metric lines (it started), and its status is then ``unknown``, never a guess."""
    s = io.read_summary(run_dir)
    if s is not None and isinstance(s.get("per_seed") or {}, dict):
        return s, s["status"]
    if os.path.lexists(os.path.join(run_dir, io.SUMMARY)):
        problems.append(f"{io.SUMMARY} damaged")
    elif has_lines:
        problems.append(f"no {io.SUMMARY}")
    else:
        return {}, "not started"
    return {}, "unknown"


def read_run(run_dir: str) -> RunFiles | None:
    """One run's files as report and plot use them.  Damage never becomes data: metric lines that
    are not records (``io.valid_record``: garbage, invalid JSON or UTF-8, a step ``"abc"``) are
    skipped, a damaged summary gives status ``unknown``, a damaged config skips the run (None);
    all of a run's damage is one ``DamagedRunWarning`` naming the run (lines summarized)."""
    problems: list[str] = []
    try:
        cfg = read_config(run_dir)
    except (OSError, ValueError) as e:
        cfg = None
        problems.append(f"{io.CONFIG} unreadable ({str(e).splitlines()[0]}); run left out")
    lines: list[dict] = []
    if cfg is not None:
        bad: list[int] = []
        try:
            lines = io.read_jsonl(os.path.join(run_dir, io.METRICS), damaged=bad)
        except (OSError, ValueError) as e:
            problems.append(f"{io.METRICS} unreadable ({str(e).splitlines()[0]})")
        if bad:
            problems.append(f"{io.METRICS} {io.describe_lines(bad)} not metric records, skipped")
        seed = cfg.get("seed")
        default = seed[0] if isinstance(seed, list) and seed else seed
        lines = [l if "seed" in l else {**l, "seed": default} for l in lines]
        summary, status = _summary(run_dir, problems, bool(lines))
    if problems:
        warnings.warn(f"run {run_dir}: {'; '.join(problems)}", io.DamagedRunWarning, stacklevel=3)
    if cfg is None:
        return None
    return RunFiles(run_dir, cfg, summary, lines, status)


def read_runs(paths: Iterable[str]) -> list[RunFiles]:
    """``read_run`` of every run under ``paths``; a ValueError when none can be read."""
    runs = [r for r in (read_run(rd) for rd in find_runs(paths)) if r is not None]
    if not runs:
        raise ValueError(f"no readable cconv runs under: {', '.join(paths)}")
    return runs


def _num(v):
    if v is None:
        return math.nan
    if isinstance(v, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(v, math.nan)
    return float(v)


def load_metrics(paths: Iterable[str]) -> pd.DataFrame:
    """All metric lines of all runs under ``paths`` as one long DataFrame; ``diverged_at_step`` is
    the step at which the line's seed diverged (its run's ``summary.json``, the rule of
    ``cconv.experiments.divergence``), NaN when it did not."""
    import pandas as pd

    rows = []
    for run in read_runs(paths):
        rd = run.run_dir
        cols = {"run": _run_name(rd), "run_dir": rd, **config_columns(run.config)}
        for line in run.lines:
            row = {**cols, **{k: (_num(v) if k not in ("step", "seed") else v) for k, v in line.items()}}
            rows.append({**row, "diverged_at_step": diverged_at(run.summary, line.get("seed"))})
    return pd.DataFrame(rows)


def diverged_at(summary: dict, seed) -> float:
    """The step at which ``seed`` diverged by its run's summary (``per_seed``; a one-seed run's
    ``diverged`` status without it: the summary's step), NaN when it did not or nobody knows."""
    rec = (summary.get("per_seed") or {}).get(str(seed))
    if isinstance(rec, dict):
        step = rec.get("diverged_at_step")
        return float(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else math.nan
    if summary.get("status") == "diverged" and isinstance(summary.get("step"), int):
        return float(summary["step"])
    return math.nan


def sweep_order(paths: Iterable[str]) -> list[str]:
    """Run names in their sweep file's order (the grid's expansion, then ``include``): the runs
    listed in the ``sweep.json`` of each of ``paths`` that is a sweep directory; [] for none (a
    damaged index orders nothing)."""
    names: list[str] = []
    for p in paths:
        try:
            index = io.read_json(os.path.join(p, io.SWEEP_INDEX))
        except (OSError, ValueError, RecursionError):  # none, a link (ForeignFileError), damaged
            continue
        runs = index.get("runs") if isinstance(index, dict) else None
        names += [str(n) for n in runs] if isinstance(runs, dict) else []
    return list(dict.fromkeys(names))


def _run_name(rd: str) -> str:
    return os.path.basename(os.path.normpath(rd))


def _seed_order(v) -> tuple:
    """Integer seeds in order, anything else (a config without a seed) after them."""
    return (not isinstance(v, int), v if isinstance(v, int) else 0)


def _first_reaching(lines: list[dict], metric: str, target: float, higher_is_better: bool):
    for line in lines:
        v = _num(line.get(metric))
        if math.isnan(v):
            continue
        if (v >= target) if higher_is_better else (v <= target):
            return line
    return None


def check_target(target: float | None, metric: str = "loss") -> None:
    """Refuse (one-line ValueError) a target no run could meaningfully reach: not finite (``inf``
    would be "reached" by every run, ``nan`` by none), negative (losses, accuracies, bytes and times
    are >= 0), or an accuracy above 1.  Checked before any run is read."""
    if target is None:
        return
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise ValueError(f"--target must be a finite number, got {shown(target)}")
    if target < 0:
        raise ValueError(f"--target {target:g}: {metric} is never negative (targets are >= 0)")
    if "accuracy" in metric and target > 1:
        raise ValueError(f"--target {target:g}: {metric} is a fraction in [0, 1]")


def check_metric(runs: list[RunFiles], metric: str) -> None:
    """Refuse a ``metric`` that no metric line of ``runs`` holds (a misspelt ``--metric`` would
    otherwise give every run an empty to-target column, silently); runs without lines prove nothing."""
    seen: set[str] = set()
    for run in runs:
        for line in run.lines:
            if metric in line:
                return
            seen.update(line)
    if seen:
        known = sorted(seen - {"step", "seed"})
        raise ValueError(f"--metric {shown(metric)}: no run logged it; the runs' metrics: {shown_names(known, 12)}")


def load_runs(paths: Iterable[str], target: float | None = None, metric: str = "loss") -> pd.DataFrame:
    """One row per (run, seed): status, final metrics and, when a target is known (argument, else
    the run config's ``target_loss``), bytes/steps/time to reach it.  A bad ``target``/``metric``
    is a one-line ValueError (``check_target``, ``check_metric``)."""
    import pandas as pd

    check_target(target, metric)
    higher = "accuracy" in metric
    rows = []
    runs = read_runs(paths)
    check_metric(runs, metric)
    for run in runs:
        rd, cfg, summary, lines, status = run
        seeds = sorted({l["seed"] for l in lines}, key=_seed_order) or (
            cfg.get("seed") if isinstance(cfg.get("seed"), list) else [cfg.get("seed")]
        )
        per_seed = summary.get("per_seed") or {}
        tgt = target if target is not None else cfg.get("target_loss")
        for s in seeds:
            sl = [l for l in lines if l.get("seed") == s]
            last = sl[-1] if sl else {}
            row = {
                "run": _run_name(rd),
                "seed": s,
                "status": ps.get("status", status) if isinstance(ps := per_seed.get(str(s)), dict) else status,
                "step": last.get("step", 0),
            }
            for k in FINAL_COLUMNS:
                if k in last:
                    row[k] = _num(last[k])
            if tgt is not None:
                hit = _first_reaching(sl, metric, float(tgt), higher)
                row["target"] = float(tgt)
                row["bytes_to_target"] = _num(hit["cum_bytes"]) if hit else math.nan
                row["encoded_bytes_to_target"] = _num(hit.get("cum_bytes_encoded")) if hit else math.nan
                row["steps_to_target"] = hit["step"] if hit else math.nan
                row["time_to_target"] = _num(hit.get("sim_time")) if hit else math.nan
            err = summary.get("error")
            row["error"] = err if err is None or isinstance(err, str) else str(err)
            row.update(config_columns(cfg))
            row["run_dir"] = rd
            rows.append(row)
    return pd.DataFrame(rows)


SHOW = (
    "run",
    "seed",
    "status",
    "step",
    "loss",
    "test_loss",
    "test_accuracy",
    "cum_bytes",
    "cum_bytes_encoded",
    "sim_time",
    "wall_time",
    "bytes_to_target",
    "encoded_bytes_to_target",
    "steps_to_target",
    "time_to_target",
)


def table(paths: Iterable[str], target: float | None = None, metric: str = "loss") -> pd.DataFrame:
    """The report table (the columns ``cconv report`` prints; the CSV has every column)."""
    return load_runs(paths, target=target, metric=metric)


def format_table(df: pd.DataFrame) -> str:
    cols = [c for c in SHOW if c in df.columns and (c.endswith("_to_target") or not df[c].isna().all())]
    for enc, moved in (("cum_bytes_encoded", "cum_bytes"), ("encoded_bytes_to_target", "bytes_to_target")):
        if enc in cols and (moved not in df.columns or df[enc].fillna(-1).equals(df[moved].fillna(-1))):
            cols.remove(enc)  # fixed-size formats only: the encoded bytes are the moved bytes
    view = df[cols].copy()
    fmt = {}
    for c in ("loss", "test_loss"):
        fmt[c] = lambda v: f"{v:.4f}"
    fmt["test_accuracy"] = lambda v: f"{v:.3f}"
    for c in ("cum_bytes", "cum_bytes_encoded", "bytes_to_target", "encoded_bytes_to_target"):
        fmt[c] = _human_bytes
    for c in ("sim_time", "wall_time", "time_to_target"):
        fmt[c] = lambda v: f"{v:.3g}s"
    for c, f in fmt.items():
        if c in view.columns:
            view[c] = [("-" if (isinstance(v, float) and math.isnan(v)) else f(v)) for v in view[c]]
    for c in ("steps_to_target",):
        if c in view.columns:
            view[c] = ["-" if (isinstance(v, float) and math.isnan(v)) else int(v) for v in view[c]]
    return view.to_string(index=False)


def _human_bytes(v: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1000 or unit == "TB":
            return f"{v:.3g}{unit}"
        v /= 1000.0
    return f"{v:.3g}TB"


# per-seed columns that aggregate folds into <col>_mean and <col>_std
AGG_COLUMNS = (
    *FINAL_COLUMNS,
    "bytes_to_target",
    "encoded_bytes_to_target",
    "steps_to_target",
    "time_to_target",
)


def _statuses(v: pd.Series) -> str:
    counts = v.astype(str).value_counts()
    return next(iter(counts.index)) if len(counts) == 1 else ", ".join(f"{n} {s}" for s, n in counts.items())


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run of ``load_runs``'s table: ``label``, ``seeds`` (how many), ``status`` (one
    word, or counts such as ``2 completed, 1 diverged``), ``<col>_mean`` and ``<col>_std`` over the
    seeds for the final metrics and the to-target columns (these over the seeds that reached the
    target; ``reached`` = how many did), then the run's config columns.  Rows in legend order."""
    import pandas as pd

    from cconv.experiments.plotting import run_labels, run_order

    if runs.empty:
        raise ValueError("no runs to aggregate")
    labels = run_labels(runs)
    stats = [c for c in AGG_COLUMNS if c in runs.columns]
    config = [c for c in runs.columns if c not in (*stats, "seed", "status", "step", "error", "target")]
    rows = []
    for run in run_order(runs):
        g = runs[runs["run"] == run]
        row = {
            "run": run,
            "label": labels[run],
            "seeds": len(g),
            "status": _statuses(g["status"]),
            "step": g["step"].max(),
        }
        if "target" in g.columns:
            row["target"] = g["target"].iloc[0]
            row["reached"] = int(g["bytes_to_target"].notna().sum())
        for c in stats:
            v = pd.to_numeric(g[c], errors="coerce").astype(float)
            v = v[v.notna()]
            row[f"{c}_mean"] = float(v.mean()) if len(v) else math.nan
            row[f"{c}_std"] = float(v.std(ddof=1)) if len(v) > 1 else math.nan
        errors = [e for e in g["error"] if isinstance(e, str) and e] if "error" in g.columns else []
        row["error"] = errors[0] if errors else None
        for c in config:
            if c not in row:
                row[c] = g[c].iloc[0]
        rows.append(row)
    return pd.DataFrame(rows)


def format_aggregate(df: pd.DataFrame) -> str:
    """``aggregate``'s table as ``cconv report --aggregate`` prints it: ``mean ± std`` per cell, the
    mean alone where the seeds agree (or there is one), ``-`` where no seed has a value."""
    shown = [c for c in SHOW if c in AGG_COLUMNS and f"{c}_mean" in df.columns]
    if "target" not in df.columns:
        shown = [c for c in shown if not c.endswith("_to_target")]
    for enc, moved in (("cum_bytes_encoded", "cum_bytes"), ("encoded_bytes_to_target", "bytes_to_target")):
        if enc in shown and df[f"{enc}_mean"].fillna(-1).equals(df[f"{moved}_mean"].fillna(-1)):
            shown.remove(enc)  # fixed-size formats only: the encoded bytes are the moved bytes
    shown = [c for c in shown if c.endswith("_to_target") or df[f"{c}_mean"].notna().any()]
    view = df[["label", "seeds", "status"]].rename(columns={"label": "run"}).copy()
    for c in shown:
        f = _FORMATS.get(c, lambda v: f"{v:.4g}")
        cells = []
        for m, s in zip(df[f"{c}_mean"], df[f"{c}_std"]):
            if math.isnan(m):
                cells.append("-")
            else:
                same = math.isnan(s) or s <= 1e-9 * abs(m)  # one seed, or equal over seeds
                cells.append(f(m) if same else f"{f(m)} ± {f(s)}")
        view[c] = cells
        if c == "bytes_to_target" and "reached" in df.columns:
            view["reached"] = [f"{r}/{n}" for r, n in zip(df["reached"], df["seeds"])]
    return view.to_string(index=False)


def _loss(v: float) -> str:
    return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.3g}"


_FORMATS = {
    "loss": _loss,
    "test_loss": _loss,
    "test_accuracy": lambda v: f"{v:.3f}",
    "accuracy": lambda v: f"{v:.3f}",
    "cum_bytes": lambda v: _human_bytes(v),
    "cum_bytes_encoded": lambda v: _human_bytes(v),
    "bytes_to_target": lambda v: _human_bytes(v),
    "encoded_bytes_to_target": lambda v: _human_bytes(v),
    "steps_to_target": lambda v: f"{v:.3g}",
    "sim_time": lambda v: f"{v:.3g}s",
    "wall_time": lambda v: f"{v:.3g}s",
    "time_to_target": lambda v: f"{v:.3g}s",
}
