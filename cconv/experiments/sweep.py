"""Sweeps: expand a grid, validate every run, then run what is not finished.

A sweep file has ``base`` (a run config, inline or ``base: path.yaml`` relative to the sweep file)
and ``grid``: a mapping from a field (dotted for nested ones) to a list of values.  The runs are the
Cartesian product of the grid's lists.  A value that is a mapping may itself contain lists, which
expand inside it; this is how compressors with different hyper-parameters share one axis::

    grid:
      memory: [none, ef]
      compressor:
        - {name: topk, ratio: [0.001, 0.01, 0.1]}
        - {name: signsgd}

gives 2 x (3 + 1) = 8 runs.  Optional:

``include``: extra points outside the product, each a mapping of (dotted) fields, e.g. the dense
baseline ``include: [{compressor: none, memory: none}]``;
``rules``: conditional settings, applied in order to every point they match::

    rules:
      - when: {compressor.name: signsgd}     # all listed (dotted) fields equal
        set: {lr: 0.01}

A rule's ``set`` does not change the run's directory name (which lists the grid values only).

``run_sweep(path, out)``:

1. loads and validates every grid point (names, hyper-parameters, ranges) and loads each distinct
   dataset once, so bad input fails before anything is written;
2. checks the output directory, reading only (``check_out``): a non-empty directory must be a
   sweep directory (it holds ``sweep.json``, which every sweep writes before its first run); a
   run directory already there must hold exactly the config this sweep gives it, else the sweep
   is refused in one line naming the run, the differing key and the sweep file the run came from
   (a sweep never mixes configs in one results directory, so ``report.csv`` cannot); a link or a
   foreign file where cconv keeps its own is refused (``io.check_run_dir``);
3. for each run directory ``<out>/<grid point name>``: ``completed`` or ``diverged`` -> skipped;
   a checkpoint -> resumed; otherwise started.  A run that raises is recorded ``failed`` (with
   its error) and the sweep goes on; ``failed`` runs are retried the next time the sweep runs;
   ``interrupted`` runs (SIGTERM/SIGINT, ``cconv.experiments.signals``) are resumed; such a signal
   stops the sweep after the run it interrupts (the CLI exits 143 / 130);
   a run directory locked by another process (another sweep or ``cconv run`` on it, see
   ``io.run_lock``) is skipped and counted ``busy``: it is that process's to finish;
4. writes ``<out>/sweep.json`` (the grid points; per run its config digest and the sweep file
   and that file's SHA-256), ``<out>/report.csv`` and, with matplotlib, the convergence-vs-traffic
   figure ``<out>/convergence_vs_traffic.png`` (+ .pdf).  Each is written only when its content
   changed: a finished sweep run again writes nothing (also on a read-only file system).

Running the same command again after a kill at any moment loses nothing and duplicates nothing
(the per-run protocol is in ``cconv.experiments.runner``).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cconv._text import shown, shown_names
from cconv.experiments import io, signals
from cconv.experiments.config import (
    FIELDS,
    ConfigError,
    RunConfig,
    check_size,
    default_of,
    from_dict,
    load_yaml,
    set_path,
)

SWEEP_KEYS = ("name", "base", "grid", "include", "rules")
MAX_RUNS = 100_000  # points of one grid


@dataclass
class SweepRun:
    """One point of a sweep: its directory name, grid values and validated config."""

    name: str  # directory name inside the sweep directory
    point: dict  # the grid values of this run (dotted key -> value)
    config: RunConfig


def _expand_value(v: Any) -> list:
    """Alternatives of one grid entry: a mapping with list-valued entries expands into their
    product; anything else is one alternative."""
    if isinstance(v, dict):
        keys = list(v)
        axes = [x if isinstance(x, list) else [x] for x in (v[k] for k in keys)]
        return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]
    return [v]


def expand_grid(grid: dict) -> list[dict]:
    """All points of a grid: a list of {dotted key: value}."""
    if not isinstance(grid, dict) or not grid:
        raise ConfigError("sweep: 'grid' must be a non-empty mapping from a field to a list of values")
    keys = list(grid)
    axes = []
    check_size(grid, "sweep grid")
    for k in keys:
        vals = grid[k]
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"sweep grid: {shown(k)} must map to a non-empty list of values, got {shown(vals)}")
        alts = [a for v in vals for a in _expand_value(v)]
        axes.append(alts)
    n = math.prod(len(a) for a in axes)
    if n > MAX_RUNS:
        raise ConfigError(f"sweep grid: {n} runs (more than {MAX_RUNS}); split the sweep")
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        name = v.get("name")
        rest = [f"{k}{_fmt(x)}" for k, x in v.items() if k != "name"]
        return "-".join(([str(name)] if name is not None else []) + rest)
    if isinstance(v, float):  # short where exact (0.01); else every digit (0.1000001 != 0.1000002)
        return f"{v:g}" if float(f"{v:g}") == v else repr(v)
    if isinstance(v, list):
        return "+".join(_fmt(x) for x in v)
    return str(v)


def point_name(point: dict) -> str:
    """A readable, filesystem-safe directory name for a grid point, e.g.
    ``compressor=topk-ratio0.01,memory=ef,seed=0``."""
    parts = [f"{k}={_fmt(v)}" for k, v in point.items()]
    name = ",".join(parts)
    name = re.sub(r"[^A-Za-z0-9_.,=+\-]", "_", name)
    if len(name) > 150:
        name = name[:130] + "," + hashlib.sha256(name.encode()).hexdigest()[:12]
    return name


def load_sweep(path: str) -> tuple[str, list[SweepRun]]:
    """(sweep name, runs) of a sweep file; every run config is validated."""
    raw = load_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with 'base' and 'grid'")
    if "grid" not in raw:
        raise ConfigError(f"{path}: a sweep file needs 'grid' (use `cconv run` for a single config)")
    unknown = [k for k in raw if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(
            f"{path}: unknown sweep key(s) {shown_names(unknown)}; valid keys: "
            f"{', '.join(SWEEP_KEYS)} (run fields go under 'base')"
        )
    base = raw.get("base") or {}
    if isinstance(base, str):
        base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(os.path.abspath(path)), base)
        base = load_yaml(base_path) or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: 'base' must be a mapping of run config keys or a path to one")
    name = raw.get("name") or os.path.splitext(os.path.basename(path))[0]
    points = expand_grid(raw["grid"])
    include = raw.get("include") or []
    if not isinstance(include, list) or not all(isinstance(p, dict) and p for p in include):
        raise ConfigError(f"{path}: 'include' must be a list of mappings from a field to a value")
    for extra in include:
        points += expand_grid({k: (v if isinstance(v, list) else [v]) for k, v in extra.items()})
    rules = raw.get("rules") or []
    if not isinstance(rules, list) or not all(
        isinstance(r, dict) and set(r) == {"when", "set"} and isinstance(r["when"], dict) and isinstance(r["set"], dict)
        for r in rules
    ):
        raise ConfigError(f"{path}: 'rules' must be a list of {{when: {{field: value}}, set: {{field: value}}}}")
    return str(name), _runs(path, base, points, rules)


def _runs(path: str, base: dict, points: list[dict], rules: list[dict]) -> list[SweepRun]:
    """One validated run per distinct config: a point repeated (an ``include:`` naming a grid point,
    its keys in any order) is that run once; two distinct configs never share a name."""
    runs, names, configs = [], {}, set()
    for point in points:
        merged = copy.deepcopy(base)
        for k, v in point.items():
            set_path(merged, k, copy.deepcopy(v))
        apply_rules(merged, rules)
        rname = point_name(point)
        cfg = from_dict(merged, source=f"{path} [{shown(rname)}]")
        key = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
        if key in configs:
            continue
        configs.add(key)
        if rname in names:
            raise ConfigError(
                f"{path}: the grid points {shown(names[rname])} and {shown(point)} are different configs "
                f"with one run name {shown(rname)}; give them values that name them apart"
            )
        names[rname] = point
        runs.append(SweepRun(rname, point, cfg))
    return runs


def apply_rules(raw: dict, rules: list) -> None:
    """Apply a sweep's ``rules`` (in order; each ``when`` read after the rules before it) to a raw
    run config, in place.  ``cconv advise`` applies a sweep file's rules to its candidates too."""
    for rule in rules:
        if all(_get_path(raw, k) == v for k, v in rule["when"].items()):
            for k, v in rule["set"].items():
                set_path(raw, k, copy.deepcopy(v))


def _get_path(d: dict, dotted: str) -> Any:
    """Value of a dotted key in a raw config (names given as strings count as {name: ...})."""
    parts = dotted.split(".")
    if parts[0] not in FIELDS:
        raise ConfigError(f"unknown config key {shown(parts[0])} in a rule; valid keys: {', '.join(FIELDS)}")
    node = d[parts[0]] if parts[0] in d else default_of(parts[0])
    for p in parts[1:]:
        if isinstance(node, str) and p == "name":
            return node
        if not isinstance(node, dict):
            return None
        node = node.get(p)
    return node


def validate(runs: list[SweepRun]) -> None:
    """Every run's names, ranges and engine options; every distinct dataset loaded once (missing
    files fail here) and every distinct model initialised abstractly on it (``jax.eval_shape``)
    with one abstract step of its optimizer, so that bad input anywhere in the grid fails before
    anything is written."""
    import jax

    from cconv import models
    from cconv.experiments.build import check_names, load_dataset, make_optimizer  # not at import: loads the engine

    datasets: dict = {}
    checked = set()
    for r in runs:
        try:
            check_names(r.config)
            dkey = json.dumps(r.config.data, sort_keys=True, default=str)
            if dkey not in datasets:
                datasets[dkey] = load_dataset(r.config)
            ds = datasets[dkey]
            mkey = (
                dkey,
                json.dumps(r.config.model, sort_keys=True, default=str),
                json.dumps(r.config.optimizer, sort_keys=True, default=str),
            )
            if mkey not in checked:
                checked.add(mkey)
                hp = {k: v for k, v in r.config.model.items() if k != "name"}
                init = models.initializer(r.config.model["name"], ds.input_shape, ds.num_classes, **hp)
                params, _ = jax.eval_shape(init, jax.random.key(0))
                make_optimizer(r.config, params)  # one abstract step
        except (ValueError, TypeError) as e:
            raise ConfigError(f"run {r.name}: {str(e).splitlines()[0]}") from None


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def read_index(out: str) -> dict | None:
    """``<out>/sweep.json`` (None when ``out`` is absent or empty: a new sweep directory).  A
    non-empty directory without one is not a sweep's: refused (one line), as is a damaged one.
    Empty counts what another sweep starting there holds for an instant (its write probe, the
    temporary file of its sweep.json: ``io.is_transient``), so two sweeps started at once both go
    on (each run is then trained by one of them, ``io.run_lock``)."""
    if not os.path.isdir(out) or all(io.is_transient(n) for n in os.listdir(out)):
        return None
    path = os.path.join(out, io.SWEEP_INDEX)
    if not io.check_entry(path):
        raise ConfigError(
            f"{out} is not empty and is not a cconv sweep directory (no {io.SWEEP_INDEX}); choose another --out"
        )
    try:
        index = io.read_json(path)
    except (OSError, ValueError, RecursionError) as e:
        raise ConfigError(f"{path} is damaged ({str(e).splitlines()[0][:200]}); choose another --out") from None
    if not isinstance(index, dict) or not isinstance(index.get("runs"), dict):
        raise ConfigError(f"{path} is damaged (not a sweep index); choose another --out")
    return index


def check_out(out: str, source: str, runs: list[SweepRun]) -> dict | None:
    """Refuse, reading only, a sweep into ``out`` that would mix configs or touch what cconv did not
    create (module docstring, step 2); returns the existing index (``read_index``)."""
    from cconv.experiments import rundir  # imports jax: only after the CLI set the device count

    index = read_index(out)
    if index is None:  # a new (absent or empty) directory, or not one at all (check_writable says so)
        return None
    made = index.get("configs") or {}
    for r in runs:
        rd = os.path.join(out, r.name)
        if not io.check_entry(rd, want_dir=True):
            continue
        io.check_run_dir(rd)
        d = rundir.stored_config_diff(rd, r.config)
        if d:
            rec = made.get(r.name) if isinstance(made.get(r.name), dict) else {}
            src = rec.get("source") or "an earlier sweep"
            changed = " (changed since)" if rec.get("sha256") not in (None, _sha256(source)) else ""
            raise ConfigError(
                f"sweep: run {r.name} in {out} was made by {src}{changed} with a different config "
                f"({d[0]}{'; ...' if len(d) > 1 else ''}); refusing to mix configs in one results "
                f"directory: choose another --out or remove that run"
            )
    return index


def index_bytes(index: dict | None, name: str, source: str, runs: list[SweepRun]) -> bytes:
    """The content of ``<out>/sweep.json`` with this sweep's points merged in (earlier points are
    kept): per run its grid point and ``{digest, source, sha256}`` of its config's sweep file."""
    index = index or {}
    points, made = dict(index.get("runs") or {}), dict(index.get("configs") or {})
    src, sha = os.path.abspath(source), _sha256(source)
    for r in runs:
        points[r.name] = r.point
        made[r.name] = {"digest": r.config.digest(), "source": src, "sha256": sha}
    doc = {"name": name, "source": src, "runs": points, "configs": made}
    return (json.dumps(io._jsonable(doc), indent=2, allow_nan=False) + "\n").encode()


def _log(msg: str, file: Any = None) -> None:
    from tqdm.auto import tqdm

    tqdm.write(msg, file=file or sys.stdout)


@signals.deferring  # SIGTERM/SIGINT: the run it interrupts is checkpointed, then the sweep stops
def run_sweep(path: str, out: str | None = None, figure: bool = True, log: Callable[..., None] = _log) -> dict:
    """Run a sweep file; returns counts {completed, diverged, failed, skipped, busy} and the outputs."""
    from cconv.experiments import build, runner
    from cconv.experiments.compiletime import shared_programs
    from cconv.experiments.loggers import progress

    name, runs = load_sweep(path)
    out = out or os.path.join("results", name)
    validate(runs)
    for launcher in {r.config.launcher for r in runs}:  # before anything is created
        build.check_devices(max(r.config.workers for r in runs if r.config.launcher == launcher), launcher)
    index = check_out(out, path, runs)  # reads only: refusals come before anything is written
    new_index = index_bytes(index, name, path, runs)
    todo = [r for r in runs if not io.is_finished(os.path.join(out, r.name))]
    if todo or index is None or not _holds(os.path.join(out, io.SWEEP_INDEX), new_index):
        io.check_writable(out)
        io.write_if_changed(os.path.join(out, io.SWEEP_INDEX), new_index)
    counts = {"completed": 0, "diverged": 0, "failed": 0, "skipped": 0, "busy": 0}
    errors = []
    bar = progress(len(runs), f"sweep {name}", leave=True, position=0)
    bar.unit = "run"
    with shared_programs(), Ahead(todo) as ahead:  # runs that trace to one program build it once
        for i, r in enumerate(runs):
            signals.check()  # a signal between two runs: stop before the next
            rd = os.path.join(out, r.name)
            if io.is_finished(rd):
                counts["skipped"] += 1
                bar.update(1)
                continue
            try:
                res = runner.execute(r.config, rd, problem=ahead.problem(r), desc=r.name, nested=True)
                if res.trained:
                    counts[res.status] = counts.get(res.status, 0) + 1
                    log(f"[{i + 1}/{len(runs)}] {r.name}: {res.status}")
                else:  # another process finished it meanwhile
                    counts["skipped"] += 1
            except signals.Interrupted as e:  # checkpointed and marked interrupted: resumed by the next sweep
                log(f"[{i + 1}/{len(runs)}] {r.name}: interrupted ({e.name}) at step {e.step}", file=sys.stderr)
                bar.close()
                raise
            except io.RunLocked:
                counts["busy"] += 1
                log(f"[{i + 1}/{len(runs)}] {r.name}: skipped, in use by another cconv process")
            except Exception as e:  # recorded in the run's summary.json by runner.execute
                counts["failed"] += 1
                errors.append(f"{r.name}: {type(e).__name__}: {e}")
                first = str(e).splitlines()[0] if str(e) else ""
                log(f"[{i + 1}/{len(runs)}] {r.name}: failed ({type(e).__name__}: {first})", file=sys.stderr)
            bar.update(1)
    bar.close()
    outputs = finish(out, runs, figure=figure)
    return {**counts, "errors": errors, "out": out, "outputs": outputs}


class Ahead:
    """The next run's Problem and programs built while the current one trains.

    A sweep's runs are independent and each starts by building its Problem (data, model, trainer)
    and compiling its programs (``cconv.experiments.warm``); XLA compiles without Python's
    interpreter lock, and a small model's run spends its steps waiting on its devices, so one
    build thread prepares run i + 1 while run i trains.  The runs compute exactly what they would
    have: the same Problem and the same programs, built earlier (in the run's own thread a program
    is then found built).  The build thread executes no collective (``warm`` only compiles the
    step programs; the initial state it makes has none), so it never interleaves with a run's
    collective programs on the simulated devices.  A build that fails is left to the run, which
    builds again, fails there, and records it as usual."""

    def __init__(self, runs: list[SweepRun]):
        from concurrent.futures import ThreadPoolExecutor

        import jax

        # a run across processes (jax.distributed) builds in step with its other processes: never ahead
        self._runs = list(runs) if jax.process_count() == 1 else []
        self._pool, self._next = ThreadPoolExecutor(1, "cconv-ahead"), {}

    def __enter__(self) -> Ahead:
        self._submit(0)
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, j: int) -> None:
        if j < len(self._runs) and j not in self._next:
            self._next[j] = self._pool.submit(_prepare, self._runs[j].config)

    def problem(self, r: SweepRun):
        """Run ``r``'s Problem when it was built ahead (None: the run builds it); the build of the
        run after it starts now."""
        j = next((k for k, x in enumerate(self._runs) if x is r), None)
        if j is None:
            return None
        fut = self._next.pop(j, None)
        self._submit(j + 1)
        if fut is None or fut.exception() is not None:
            return None
        return fut.result()


def _prepare(cfg):
    """A run's Problem with its programs compiled (``Ahead``)."""
    from cconv.experiments import build
    from cconv.experiments.warm import warm

    problem = build.problem(cfg)
    warm(problem, cfg.steps)
    return problem


def _holds(path: str, data: bytes) -> bool:
    """Does the file ``path`` hold exactly ``data``?"""
    return io.check_entry(path) and io.read_bytes(path) == data


def finish(out: str, runs: list[SweepRun], figure: bool = True) -> list[str]:
    """report.csv and the convergence-vs-traffic figure of a sweep directory; returns the files
    written (none when the report is unchanged and the figure exists: nothing to redo)."""
    from cconv.experiments import report

    outputs = []
    dirs = [os.path.join(out, r.name) for r in runs if os.path.exists(os.path.join(out, r.name, io.CONFIG))]
    if not dirs:
        return outputs
    table = report.load_runs(dirs)
    csv = os.path.join(out, "report.csv")
    fig_path = os.path.join(out, "convergence_vs_traffic.png")
    if io.write_if_changed(csv, table.to_csv(index=False).encode()):
        outputs.append(csv)
    elif io.check_entry(fig_path) or not figure:
        return outputs
    if not figure:
        return outputs
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return outputs
    from cconv.experiments import plotting

    df = report.load_metrics(dirs)
    if not df.empty:
        outputs += plotting.family_grid(
            df,
            x="bytes",
            y="loss",
            out=fig_path,
            title=f"{os.path.basename(os.path.normpath(out))}: training loss vs traffic",
            order=[r.name for r in runs],
        )
    return outputs
