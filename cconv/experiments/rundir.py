"""A run directory's life: which run it holds, the checks before anything is written, the lock,
the claim (``config.yaml``), ``summary.json`` at each status and the paths of its other files.

Reading which run a directory holds writes nothing (``stored_run``): a finished run is a no-op,
also on a read-only file system.  A run about to train is checked once before its lock is taken
(``RunDir.check_creatable``: the parent and the directory writable, no files cconv did not
create), then claimed under the lock (``RunDir.claimed``): only what another process may have
changed between the look and the lock is read again (it may have created the run meanwhile, or
finished it).  Every file goes through ``cconv.experiments.io`` (no links, no foreign types).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator

from cconv.experiments import io
from cconv.experiments.checkpoint import Checkpointer
from cconv.experiments.config import ConfigError, RunConfig, read_stored, to_yaml

# --------------------------------------------------------------------------- what a directory holds


def stored_config_diff(run_dir: str, cfg: RunConfig) -> list[str] | None:
    """How the config stored in ``run_dir`` differs from ``cfg`` (``diff``'s dotted ``key: old ->
    new`` entries; [] when equal), or None when the directory holds no config.  Keys that only
    steer the advisor or the report (``config.STEERING_FIELDS``) are left out.  Reads only."""
    import yaml

    from cconv.experiments.config import diff, identity

    cpath = os.path.join(run_dir, io.CONFIG)
    if not io.check_entry(cpath):
        return None
    old = identity(read_stored(cpath))  # fields added since filled in; damaged: one-line ConfigError
    if old == identity(yaml.safe_load(to_yaml(cfg))):
        return []
    return diff(old, identity(cfg.to_dict())) or ["(the stored config.yaml is written differently)"]


def different_config(run_dir: str, d: list[str]) -> ConfigError:
    """The one-line refusal of a run directory that holds another config."""
    return ConfigError(
        f"{run_dir} already holds a run with a different config ({'; '.join(d[:3])}"
        f"{'; ...' if len(d) > 3 else ''}); choose another --out"
    )


def stored_run(run_dir: str, cfg: RunConfig) -> str | None:
    """'finished' or 'resume' for a run directory that holds ``cfg``, None for one that holds no
    config.  Refuses (one line) a different config and entries cconv did not create
    (``io.check_run_dir``).  Reads only: deciding that a finished run has nothing to do writes
    nothing, also on a read-only file system."""
    io.check_run_dir(run_dir)
    d = stored_config_diff(run_dir, cfg)
    if d:
        raise different_config(run_dir, d)
    if d is None:
        return None
    return "finished" if io.is_finished(run_dir) else "resume"


def refuse_foreign(run_dir: str) -> None:
    """A ConfigError for an existing, non-empty directory that holds no cconv run.  The lock, the
    temporary file of a ``config.yaml`` another process is writing (``io.atomic_write_text``:
    ``.config.yaml.<random>.tmp``, renamed into place) and another process's write probe
    (``io.check_writable``: ``.cconv-write-probe-<random>``, removed at once) are a run being
    created, not foreign files: this check runs before the lock is taken, so a concurrent sweep
    can see them."""
    if (
        os.path.isdir(run_dir)
        and not os.path.exists(os.path.join(run_dir, io.CONFIG))
        and [f for f in os.listdir(run_dir) if not _being_created(f)]
    ):
        raise ConfigError(f"{run_dir} is not empty and holds no cconv run; choose another --out")


def _being_created(name: str) -> bool:
    """``name`` is the lock, the temporary file of a ``config.yaml`` being written or a write probe."""
    return (
        name == io.LOCK
        or (name.startswith(f".{io.CONFIG}.") and name.endswith(".tmp"))
        or name.startswith(io.WRITE_PROBE)
    )


# --------------------------------------------------------------------------- failures


def error_line(e: BaseException) -> str:
    """``Type: first line of the message``, as recorded in summary.json's ``error``."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()


def failure_recorded(run_dir: str, e: BaseException) -> bool:
    """Does ``run_dir/summary.json`` record this failure (``RunDir.record_failure`` writes it when
    it can)?"""
    s = io.read_summary(run_dir) or {}
    return s.get("status") == "failed" and s.get("error") == error_line(e)


# --------------------------------------------------------------------------- the directory


class RunDir:
    """The run directory ``path`` of the run of ``cfg``, shown under ``desc`` (default: the
    directory's name)."""

    def __init__(self, path: str, cfg: RunConfig, desc: str | None = None):
        self.path, self.cfg = path, cfg
        self.desc = desc or os.path.basename(os.path.abspath(path))

    def file(self, name: str) -> str:
        """The path of one of the run's entries (``io.CONFIG``, ``io.METRICS``, ...)."""
        return os.path.join(self.path, name)

    def stored(self) -> str | None:
        """``stored_run``: 'finished', 'resume' or None (no config yet).  Reads only."""
        return stored_run(self.path, self.cfg)

    def check_creatable(self) -> None:
        """Before the lock file is put there: the parent and the directory can be written, and
        the directory holds nothing cconv did not create.  One-line ValueErrors."""
        io.check_writable(os.path.dirname(os.path.abspath(self.path)) or ".")
        refuse_foreign(self.path)
        io.check_writable(self.path)

    @contextlib.contextmanager
    def claimed(self, seen: str | None) -> Iterator[str]:
        """Hold the run's lock (``io.run_lock``; ``io.RunLocked`` at once when another process
        holds it) and claim the directory for the config: yields 'finished', 'resume' or 'new' (the
        config written).  ``seen``: what ``stored`` said before the lock; only what another
        process may have changed since is read again."""
        with io.run_lock(self.path):
            if seen is None:
                seen = self.stored()  # another process may have created the run meanwhile
            if seen is None:
                io.atomic_write_text(self.file(io.CONFIG), to_yaml(self.cfg))
                yield "new"
            else:
                yield "finished" if io.is_finished(self.path) else "resume"

    def checkpointer(self, keep: int) -> Checkpointer:
        """The run's checkpoints (``checkpoints/``), the ``keep`` latest kept; this process's own (a
        run of the runner is one process's, ``Checkpointer(local=True)``)."""
        return Checkpointer(self.file(io.CHECKPOINTS), keep=keep, local=True)

    def cut_metrics(self, step: int) -> None:
        """Cut metrics.jsonl back to the lines of steps ``<= step`` (-1: empty it)."""
        io.repair_jsonl(self.file(io.METRICS), step)

    def read_summary(self) -> dict | None:
        return io.read_summary(self.path)

    def write_summary(self, summary: dict) -> None:
        """Replace summary.json atomically."""
        io.write_json(self.file(io.SUMMARY), summary)

    def record_failure(self, e: BaseException) -> None:
        """Mark the run ``failed`` with ``e`` (inside its ``except``: the traceback is kept), best
        effort: the disk may be full (``failure_recorded`` tells the caller what was written)."""
        prev = self.read_summary() or {}
        try:
            self.write_summary(
                {**prev, "status": "failed", "error": error_line(e), "traceback": traceback.format_exc()}
            )
        except OSError:
            pass
