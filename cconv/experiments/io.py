"""Result files that survive anything: append-only JSONL with fsync, atomic replace for the rest.

A run directory holds::

    config.yaml      the resolved config (written once, atomically)
    metrics.jsonl    one JSON object per logged step; each line is written with one write(),
                     flushed and fsync'ed, so a kill leaves at most one partial *last* line
    summary.json     status (running | completed | diverged | failed), final metrics, error
    checkpoints/     orbax checkpoints (resume points)
    .lock            while a process trains the run: its pid, under an exclusive ``flock``

``repair_jsonl`` is the resume half of the protocol: it drops a partial last line and every line
whose step is beyond the last checkpoint, so lines are neither lost nor duplicated.  A damaged
line elsewhere is never a reason to drop data: it is reported (file and line) and skipped by
``read_jsonl``, the reader behind ``cconv report``, the figures and summary recovery.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"
FINISHED = ("completed", "diverged")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.generic,)):
        x = x.item()
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # numpy / jax arrays
        a = np.asarray(x)
        return a.item() if a.ndim == 0 else _jsonable(a.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def dumps(obj: Any) -> str:
    """JSON without NaN/Infinity tokens (strict parsers reject them): NaN -> null, inf -> "inf"."""
    return json.dumps(_jsonable(obj), allow_nan=False, separators=(",", ":"))


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """Write a file so that readers see either the old or the new content, never a mix."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


def write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


def read_json(path: str) -> Any:
    with open(path) as fh:
        return json.load(fh)


class JsonlWriter:
    """Append JSON lines; every line is one ``write`` followed by flush and fsync."""

    def __init__(self, path: str):
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._fh.write(dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def write_many(self, records: Iterable[dict]) -> None:
        blob = "".join(dumps(r) + "\n" for r in records)
        if blob:
            self._fh.write(blob)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RecoveryWarning(UserWarning):
    """Damage found in a run directory and worked around (the CLI prints it as one line)."""


class MetricsWarning(RecoveryWarning):
    """A damaged line in a metrics file (skipped by readers, kept on disk)."""


def _parse_line(raw: bytes) -> dict | None:
    """The record of one complete line; None when it is damaged (not a JSON object)."""
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def _warn_damaged(path: str, numbers: list[int], what: str) -> None:
    if numbers:
        import warnings

        where = f"line {numbers[0]}" if len(numbers) == 1 else f"lines {', '.join(map(str, numbers))}"
        warnings.warn(f"{path}: {where} damaged (not a JSON object); {what}", MetricsWarning, stacklevel=3)


def read_jsonl(path: str) -> list[dict]:
    """Complete lines of a JSONL file.  A partial last line (a kill in the middle of a write) is
    ignored; a damaged complete line (not a JSON object) is skipped with a ``MetricsWarning``
    naming the file and line, and reading goes on."""
    if not os.path.exists(path):
        return []
    out, bad = [], []
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.endswith(b"\n"):
                break
            if not raw.strip():
                continue
            rec = _parse_line(raw)
            if rec is None:
                bad.append(n)
            else:
                out.append(rec)
    _warn_damaged(path, bad, "skipped")
    return out


def repair_jsonl(path: str, max_step: int | None) -> int:
    """Cut the torn tail off a metrics file before a resume: everything after the last complete
    record with ``step <= max_step`` (all complete records when None; everything when
    max_step < 0), i.e. the lines of steps after the checkpoint and a partial last line.  Damaged
    lines before that point are not the tail: they stay (readers skip them) and are reported with
    a ``MetricsWarning`` naming file and line.  Returns the number of records kept."""
    if not os.path.exists(path):
        return 0
    keep_bytes = pos = kept = 0
    records, bad = 0, []
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.endswith(b"\n"):
                break
            pos += len(raw)
            if not raw.strip():
                continue
            rec = _parse_line(raw)
            if rec is None:
                bad.append((n, pos))
                continue
            records += 1
            step = rec.get("step", 0)
            if max_step is None or (max_step >= 0 and isinstance(step, (int, float)) and step <= max_step):
                keep_bytes, kept = pos, records
    _warn_damaged(path, [n for n, end in bad if end <= keep_bytes], "kept in place, skipped by readers")
    if os.path.getsize(path) != keep_bytes:
        with open(path, "r+b") as fh:
            fh.truncate(keep_bytes)
            fh.flush()
            os.fsync(fh.fileno())
    return kept


class OutputError(ValueError):
    """An output path that cannot be used (not a directory, not writable)."""


def check_creatable(path: str) -> None:
    """Would ``check_writable(path)`` succeed?  Checked without creating anything: ``path`` is a
    directory, or its nearest existing ancestor is a directory this process may write into."""
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise OutputError(f"output directory {path} is not writable: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"output directory {path} is not writable: {p}: permission denied")


def check_writable(directory: str) -> None:
    """Create ``directory`` (and parents) and prove a file can be written there; a clear
    ValueError (``OutputError``) otherwise.  Nothing existing is modified."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".cconv-write-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise OutputError(f"output directory {directory} is not writable: {reason}") from None


def read_summary(run_dir: str) -> dict | None:
    p = os.path.join(run_dir, SUMMARY)
    if not os.path.exists(p):
        return None
    try:
        return read_json(p)
    except (OSError, json.JSONDecodeError):
        return None


def is_finished(run_dir: str) -> bool:
    s = read_summary(run_dir)
    return bool(s) and s.get("status") in FINISHED


class RunLocked(ValueError):
    """The run directory is held by another process (``run_lock``)."""


def _lock_holder(path: str) -> str:
    try:
        with open(path) as fh:
            pid = fh.read().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


@contextlib.contextmanager
def run_lock(run_dir: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``run_dir`` (``flock`` on ``run_dir/.lock``, which holds
    the owner's pid) for the body; raises ``RunLocked`` at once when another process holds it.

    The lock file is removed on release, so a finished run directory holds no trace of it; a
    killed process leaves a stale, unlocked file that the next one takes over.  Acquiring checks
    that the locked file is still the one at the path (a releasing process may have unlinked it in
    between), so two processes never both hold the lock.  Advisory: only cconv processes (and
    tools that use ``flock`` on the same file) respect it; on network file systems it is as good
    as their ``flock`` support.
    """
    path = os.path.join(run_dir, LOCK)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(
                f"{run_dir} is in use by another cconv process{_lock_holder(path)}; "
                f"wait for it to finish or choose another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # unlinked by its previous holder after we opened it: take the new file
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)
