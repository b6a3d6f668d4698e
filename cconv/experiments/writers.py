"""Metric writers: where a run's metric lines go, behind one small interface.

Modelled on CommonLoopUtils' ``metric_writers`` (``MetricWriter.write_scalars(step, scalars)``,
``flush``, ``close``; a ``MultiWriter`` fans out to several)::

    writer.write_scalars(step, {"seed": 0, "loss": 0.31, "cum_bytes": 1.2e6, ...})
    writer.flush()    # everything written so far is on disk (metrics.jsonl: fsync'ed)
    writer.close()    # flush, then release the backend (``close(failed=True)``: the run failed)

``write_summary(mapping)`` records end-of-run values where a backend has such a place (wandb's
run summary).  A run always writes ``JsonlWriter`` (``metrics.jsonl``, the source of truth that
reports, plots and resumes read) and, on request, ``TensorBoardWriter`` (``tensorboard: true``)
and ``WandbWriter`` (``wandb: true`` or a mapping; offline by default).

Backends are optional extras; ``check_available(tensorboard=..., wandb=...)`` raises a one-line
``ValueError`` when a requested one is not installed, so that a run is refused before its
directory exists (``cconv.experiments.build.check_names`` calls it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from cconv.experiments import io

Scalar = int | float


class MetricWriter(Protocol):
    """What a run writes its metric lines to (CLU's ``MetricWriter``, scalars only)."""

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None: ...

    def write_summary(self, summary: Mapping[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self, failed: bool = False) -> None: ...


def _numbers(scalars: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of ``scalars`` (bools and strings left out)."""
    return {k: v for k, v in scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# --------------------------------------------------------------------------- availability

# backend -> (module its writer imports, how to install it)
BACKENDS: dict[str, tuple[str, str]] = {
    "wandb": ("wandb", "pip install 'cconv[wandb]'"),
    "tensorboard": ("tensorboardX", "pip install 'cconv[tensorboard]'"),
}


def check_available(**requested: bool) -> None:
    """One-line ValueError when a requested backend (``wandb=True``, ``tensorboard=True``) is not
    installed; nothing is imported (``importlib.util.find_spec``)."""
    for name, wanted in requested.items():
        if name not in BACKENDS:
            raise ValueError(f"unknown metric writer {name!r}; valid: {', '.join(BACKENDS)}")
        module, how = BACKENDS[name]
        if wanted and importlib.util.find_spec(module) is None:
            raise ValueError(f"{name} logging is enabled but {module} is not installed ({how}, or set {name}: false)")


# --------------------------------------------------------------------------- JSONL


class JsonlWriter:
    """``metrics.jsonl``: one JSON object per ``write_scalars`` call, ``{"step": step, **scalars}``.

    Lines are buffered until ``flush``, which appends all of them in one ``write`` followed by
    flush and fsync (``io.LineLog.write_many``): the runner flushes every batch of metric
    lines before it checkpoints, so the lines of steps <= s are on disk before checkpoint s.
    """

    def __init__(self, path: str):
        self.path = path
        self._out = io.LineLog(path)
        self._pending: list[dict] = []

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        self._pending.append({"step": step, **scalars})

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        del summary  # the run's summary.json is written by the runner (atomically)

    def flush(self) -> None:
        lines, self._pending = self._pending, []
        self._out.write_many(lines)

    def close(self, failed: bool = False) -> None:
        try:
            if not failed:
                self.flush()
        finally:
            self._out.close()


# --------------------------------------------------------------------------- TensorBoard


class TensorBoardWriter:
    """TensorBoard event files (``tensorboardX.SummaryWriter``), readable by
    ``tensorboard --logdir <run or sweep directory>``.

    One event directory per value of ``split`` (default ``"seed"``: ``<logdir>/seed_<s>/``), so
    that the seeds of a multi-seed run are separate TensorBoard runs; every other numeric scalar
    is one tag, at global step ``step``.  ``start``: the step the run starts or resumes at
    (its checkpoint); events at steps > ``start`` left by an interrupted process are purged
    (TensorBoard's ``purge_step``: a session start at that step hides them), as metrics.jsonl
    is cut back to the lines with step <= ``start``.
    """

    def __init__(self, logdir: str, split: str = "seed", start: int = 0):
        from tensorboardX import SummaryWriter

        self._cls = SummaryWriter
        self.logdir = io.ensure_dir(logdir)  # a real directory of the run, never a link
        self.split = split
        self.start = start
        self._writers: dict[Any, Any] = {}

    def _writer(self, group: Any) -> Any:
        if group not in self._writers:
            sub = os.path.join(self.logdir, f"{self.split}_{group}") if group is not None else self.logdir
            # event files are named by the second they were opened; the suffix keeps a resumed
            # process (even within the same second) from overwriting them and orders it after them
            suffix = f".from_step_{self.start:012d}"
            self._writers[group] = self._cls(sub, purge_step=self.start + 1, flush_secs=30, filename_suffix=suffix)
        return self._writers[group]

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        group = scalars.get(self.split)
        w = self._writer(group)
        for tag, value in _numbers(scalars).items():
            if tag != self.split:
                w.add_scalar(tag, float(value), global_step=int(step))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        del summary  # the final values are the last scalars

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self, failed: bool = False) -> None:
        del failed
        for w in self._writers.values():
            w.close()
        self._writers = {}


# --------------------------------------------------------------------------- Weights & Biases


class WandbWriter:
    """Mirror metric lines to a wandb run (one wandb run per cconv run; resumes with the same id).

    Offline by default: unless ``options`` sets ``mode: online`` or the environment sets
    ``WANDB_MODE``, the run is written under ``<run_dir>/wandb/`` (``wandb sync`` pushes it
    later).  Every metric is charted against ``cum_bytes`` (``define_metric("*",
    step_metric="cum_bytes")``); ``step`` and ``sim_time*`` are logged too for the other axes.
    """

    def __init__(self, options: Any, config: dict, run_dir: str, run_name: str, run_id: str):
        opts = dict(options) if isinstance(options, dict) else {}
        mode = opts.pop("mode", None) or os.environ.get("WANDB_MODE") or "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        check_available(wandb=True)
        import wandb

        io.ensure_dir(os.path.join(run_dir, "wandb"))  # where wandb writes: a real directory, never a link
        self._wandb = wandb
        self.run = wandb.init(
            project=opts.pop("project", "cconv"),
            entity=opts.pop("entity", None),
            group=opts.pop("group", None),
            tags=opts.pop("tags", None),
            name=run_name,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=run_dir,
            config=config,
            reinit="finish_previous",
        )
        self.run.define_metric("cum_bytes")
        self.run.define_metric("*", step_metric="cum_bytes")

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        self.run.log(_numbers({"step": step, **scalars}))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        for k, v in summary.items():
            if isinstance(v, (int, float, str)):
                self.run.summary[k] = v

    def flush(self) -> None:
        """Nothing to force: wandb has no public flush (0.31); its service process writes the
        run asynchronously and ``close`` (``run.finish``) waits for it.  The run's durable
        record is ``metrics.jsonl`` (``JsonlWriter.flush``), not the wandb mirror."""

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else None)

    # the pre-``MetricWriter`` API (``cconv.experiments.loggers.WandbLogger``)
    def log(self, record: Mapping[str, Any]) -> None:
        self.run.log(_numbers(record))

    def finish(self, summary: Mapping[str, Any] | None = None, exit_code: int | None = None) -> None:
        if summary:
            self.write_summary(summary)
        self.run.finish(exit_code=exit_code)


# --------------------------------------------------------------------------- fan-out


class MultiWriter:
    """Every call goes to each writer in order; ``close`` closes all of them even when one fails
    (the first error is raised after the others are closed)."""

    def __init__(self, writers: Iterable[MetricWriter]):
        self.writers = list(writers)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        for w in self.writers:
            w.write_scalars(step, scalars)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        for w in self.writers:
            w.write_summary(summary)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    def close(self, failed: bool = False) -> None:
        error = None
        for w in self.writers:
            try:
                w.close(failed=failed)
            except Exception as e:  # noqa: BLE001 - close the rest, then report the first
                error = error or e
        if error is not None:
            raise error


def write_lines(writer: MetricWriter, lines: Iterable[Mapping[str, Any]]) -> None:
    """Write metric lines (``{"step": s, **scalars}``) and flush them (the runner's unit)."""
    for line in lines:
        scalars = {k: v for k, v in line.items() if k != "step"}
        writer.write_scalars(int(line["step"]), scalars)
    writer.flush()
