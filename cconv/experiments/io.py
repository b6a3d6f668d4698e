"""Result files that survive anything: append-only JSONL with fsync, atomic replace for the rest.

A run directory holds::

    config.yaml      the resolved config (written once, atomically)
    metrics.jsonl    one JSON object per logged step; each line is written with one write(),
                     flushed and fsync'ed, so a kill leaves at most one partial *last* line
    summary.json     status (running | completed | diverged | failed | interrupted), final metrics, error
    checkpoints/     orbax checkpoints (resume points)
    .lock            while a process trains the run: its pid, under an exclusive ``flock``

cconv touches only what it created (``RUN_ENTRIES``): every file of a run or sweep directory is
opened through ``open_file`` (``O_NOFOLLOW``, then ``fstat``: a regular file), every directory
through ``ensure_dir``, every atomic replace checks its target first; a symbolic link or a file of
another type (a directory, a FIFO, a device) where cconv expects its own file is refused with a
one-line ``ForeignFileError`` (a ValueError: exit 2 from the CLI) and is left untouched.

``repair_jsonl`` is the resume half of the protocol: it drops a partial last line and every line
whose step is beyond the last checkpoint, so lines are neither lost nor duplicated.  A damaged
line elsewhere is never a reason to drop data: it is reported (file and line) and skipped by
``read_jsonl``, the reader behind ``cconv report``, the figures and summary recovery.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import secrets
import stat
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"
TENSORBOARD = "tensorboard"  # event files of a run with tensorboard: true (one directory per seed)
SWEEP_INDEX = "sweep.json"  # marks a sweep directory: its grid points, configs and sweep file
FINISHED = ("completed", "diverged")
# interrupted: SIGTERM/SIGINT (signals.py); paused: runner.execute(pause_at=...), the advisor's races
STATUSES = ("running", "completed", "diverged", "failed", "interrupted", "paused")
# what cconv creates in a run directory: name -> is a directory
RUN_ENTRIES = {
    CONFIG: False,
    METRICS: False,
    SUMMARY: False,
    LOCK: False,
    CHECKPOINTS: True,
    CHECKPOINTS + ".damaged": True,
    TENSORBOARD: True,
    "wandb": True,
}


# --------------------------------------------------------------------------- only our own files


class ForeignFileError(ValueError):
    """A path where cconv expects a file or directory of its own holds something it did not
    create: a symbolic link, or another type of file.  cconv refuses it and leaves it as it is."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a file of an unknown type"


def _foreign(path: str, mode: int, want_dir: bool = False) -> ForeignFileError:
    want = "a directory" if want_dir else "a regular file"
    return ForeignFileError(
        f"{path} is {_kind(mode)}, not {want} cconv created; cconv does not follow or replace it "
        f"(remove it, or choose another output directory)"
    )


def check_entry(path: str, want_dir: bool = False) -> bool:
    """Is ``path`` absent (False) or cconv's kind of entry (True: a real directory / regular file,
    no link)?  Anything else raises ``ForeignFileError``.  Reads nothing, follows nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode):
        return True
    raise _foreign(path, st.st_mode, want_dir)


def check_run_dir(run_dir: str) -> None:
    """Refuse (``ForeignFileError``) a run directory whose cconv entries (``RUN_ENTRIES``) are
    links or of the wrong type, before anything is written; a run directory that is itself a
    symbolic link is allowed only where the user named it (the callers decide)."""
    if not os.path.isdir(run_dir):
        return
    for name, is_dir in RUN_ENTRIES.items():
        check_entry(os.path.join(run_dir, name), is_dir)


def open_file(path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """``os.open`` of a file of cconv's own: never follows a symbolic link at ``path``
    (``O_NOFOLLOW``), never blocks on a FIFO, and returns only a descriptor of a regular file;
    anything else raises ``ForeignFileError`` without having read or written it."""
    check_entry(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # replaced by a link/dir/FIFO since
            raise _foreign(path, os.lstat(path).st_mode) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _foreign(path, st.st_mode)
    os.set_blocking(fd, True)
    return fd


def ensure_dir(path: str) -> str:
    """Create the directory ``path`` of a run (parents included) or accept the real directory
    that is there; a link or a file there raises ``ForeignFileError``."""
    if not check_entry(path, want_dir=True):
        try:
            os.makedirs(path)
        except FileExistsError:  # created meanwhile: it must still be a directory
            check_entry(path, want_dir=True)
    return path


def read_bytes(path: str) -> bytes:
    """The content of a file of cconv's own (``open_file``'s checks)."""
    with os.fdopen(open_file(path), "rb") as fh:
        return fh.read()


def read_text(path: str) -> str:
    """The UTF-8 text of a file of cconv's own; undecodable bytes raise a one-line ValueError
    naming the file."""
    try:
        return read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is damaged: not UTF-8 text (byte {e.start})") from None


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


TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")  # ``_new_temp``'s names for ``atomic_write_bytes``


def _new_temp(directory: str, prefix: str) -> tuple[int, str]:
    """(descriptor, path) of a new empty file ``<prefix><random>.tmp`` in ``directory``, created
    with ``O_EXCL | O_NOFOLLOW`` and mode 0666 less the umask, as ``open`` creates files
    (``tempfile.mkstemp`` makes them 0600: results unreadable to colleagues under umask 022)."""
    for _ in range(100):
        tmp = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", os.path.join(directory, prefix))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write a file so that readers see either the old or the new content, never a mix.  The file
    replaced must be a regular file (no link: ``check_entry``); the temporary file is created with
    ``O_EXCL`` next to it, with the mode ``open`` gives a new file (0666 less the umask)."""
    check_entry(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = _new_temp(d, "." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
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


def atomic_write_text(path: str, text: str) -> None:
    """``atomic_write_bytes`` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_if_changed(path: str, data: bytes) -> bool:
    """``atomic_write_bytes`` unless the file already holds exactly ``data`` (then nothing is
    written: a finished sweep run again writes nothing).  Returns whether it wrote."""
    if check_entry(path) and read_bytes(path) == data:
        return False
    atomic_write_bytes(path, data)
    return True


def write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


def read_json(path: str) -> Any:
    """The JSON content of a file of cconv's own (``read_text``'s checks)."""
    return json.loads(read_text(path))


class LineLog:
    """An append-only file of JSON lines (cconv's own, opened by ``open_file``); every ``write``
    is one ``write`` call followed by flush and fsync.  ``writers.JsonlWriter``, the metric
    backend, appends ``metrics.jsonl`` through it."""

    def __init__(self, path: str):
        self.path = path
        fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._fh = os.fdopen(fd, "a", encoding="utf-8")

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

    def __enter__(self) -> LineLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RecoveryWarning(UserWarning):
    """Damage found in a run directory and worked around (the CLI prints it as one line)."""


class MetricsWarning(RecoveryWarning):
    """A damaged line in a metrics file (skipped by readers, kept on disk)."""


class DamagedRunWarning(MetricsWarning):
    """One run's damage (metric lines that are not records, an unreadable summary or config),
    summarized in one warning naming the run by ``cconv report`` / ``cconv plot``, which skip the
    damaged records and show the rest."""


SHOWN_LINES = 5  # a warning about damaged lines names this many of them, then counts the rest
NUMBER_WORDS = ("inf", "-inf", "nan")  # how ``dumps`` writes non-finite numbers (NaN: null)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def valid_record(rec: Any) -> bool:
    """Is ``rec`` a metric line as cconv writes it: a JSON object with an integer ``step`` >= 0,
    an integer ``seed`` (when present), and numbers (``null``, ``"inf"``, ``"-inf"`` for
    non-finite ones) everywhere else?  Anything else is damage, never data."""
    if not isinstance(rec, dict) or not _is_int(rec.get("step")) or rec["step"] < 0:
        return False
    if "seed" in rec and not _is_int(rec["seed"]):
        return False
    return all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in NUMBER_WORDS
        for k, v in rec.items()
        if k not in ("step", "seed")
    )


def _parse_line(raw: bytes) -> dict | None:
    """The record of one complete line; None when it is damaged (not UTF-8 JSON, or not a metric
    line: ``valid_record``)."""
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return rec if valid_record(rec) else None


def describe_lines(numbers: list[int]) -> str:
    """``line 7`` / ``3 lines (2, 5, 9)`` / ``120 lines (2, 5, 9, 11, 12, ...)``: a summary that
    stays one short line however many lines are damaged."""
    if len(numbers) == 1:
        return f"line {numbers[0]}"
    shown = ", ".join(map(str, numbers[:SHOWN_LINES])) + (", ..." if len(numbers) > SHOWN_LINES else "")
    return f"{len(numbers)} lines ({shown})"


def _warn_damaged(path: str, numbers: list[int], what: str) -> None:
    if numbers:
        warnings.warn(
            f"{path}: {describe_lines(numbers)} damaged (not a metric record); {what}", MetricsWarning, stacklevel=3
        )


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of the complete lines of a file of cconv's own (``open_file``); a partial
    last line (a kill in the middle of a write) is not one."""
    with os.fdopen(open_file(path), "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.endswith(b"\n"):
                return
            yield n, raw


def read_jsonl(path: str, damaged: list[int] | None = None) -> list[dict]:
    """Complete metric records of a JSONL file.  A partial last line (a kill in the middle of a
    write) is ignored; a damaged complete line (``valid_record`` fails) is skipped and reading goes
    on: its number is appended to ``damaged`` when given, else one ``MetricsWarning`` names the
    file and summarizes the lines (``describe_lines``)."""
    if not os.path.lexists(path):
        return []
    out, bad = [], []
    for n, raw in _lines(path):
        if not raw.strip():
            continue
        rec = _parse_line(raw)
        if rec is None:
            bad.append(n)
        else:
            out.append(rec)
    if damaged is not None:
        damaged.extend(bad)
    else:
        _warn_damaged(path, bad, "skipped")
    return out


def repair_jsonl(path: str, max_step: int | None) -> int:
    """Cut the torn tail off a metrics file before a resume: everything after the last complete
    record with ``step <= max_step`` (all complete records when None; everything when
    max_step < 0), i.e. the lines of steps after the checkpoint and a partial last line.  Damaged
    lines before that point are not the tail: they stay (readers skip them) and are reported with
    a ``MetricsWarning`` naming file and lines.  Returns the number of records kept."""
    if not os.path.lexists(path):
        return 0
    keep_bytes = pos = kept = 0
    records, bad = 0, []
    for n, raw in _lines(path):
        pos += len(raw)
        if not raw.strip():
            continue
        rec = _parse_line(raw)
        if rec is None:
            bad.append((n, pos))
            continue
        records += 1
        if max_step is None or (max_step >= 0 and rec["step"] <= max_step):
            keep_bytes, kept = pos, records
    _warn_damaged(path, [n for n, end in bad if end <= keep_bytes], "kept in place, skipped by readers")
    fd = open_file(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != keep_bytes:
            os.ftruncate(fd, keep_bytes)
            os.fsync(fd)
    finally:
        os.close(fd)
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


# names cconv keeps in run and sweep directories: no other command's output may take them
RESERVED = frozenset(RUN_ENTRIES) | {SWEEP_INDEX}


def holds_results(directory: str) -> bool:
    """Is ``directory`` a run (it holds ``config.yaml``) or a sweep (``sweep.json``) directory?"""
    return any(os.path.lexists(os.path.join(directory, n)) for n in (CONFIG, SWEEP_INDEX))


def check_output(path: str, what: str, *, in_results: bool = True) -> str:
    """Refuse, before any work, an output file a command (``report --csv``, ``plot --out``,
    ``doctor --json``) may not write: a name cconv keeps in run and sweep directories
    (``RESERVED``: ``config.yaml``, ``metrics.jsonl``, ...), a file inside a run's own
    sub-directories (``checkpoints/``, ...), one inside a run or sweep directory when the command's
    output is not a result of that kind (``in_results=False``), a link or anything but a regular
    file (``check_entry``), or a directory that cannot be created.  Returns ``path``; a one-line
    ``OutputError`` / ``ForeignFileError`` (ValueErrors: exit 2) otherwise."""
    name, parent = os.path.basename(path), os.path.dirname(os.path.abspath(path))
    if not name or name in RESERVED:
        raise OutputError(
            f"{what} {path}: {name or 'a directory'} is not a file name {what} may write (cconv keeps "
            f"{', '.join(sorted(RESERVED))} in run and sweep directories); choose another name"
        )
    inside = os.path.basename(parent) in RUN_ENTRIES and holds_results(os.path.dirname(parent))
    if inside or (not in_results and holds_results(parent)):
        where = f"{os.path.dirname(parent) if inside else parent} is a cconv run or sweep directory"
        raise OutputError(f"{what} {path}: {where}, which holds only its own files; choose another place")
    check_entry(path)
    check_creatable(parent)
    return path


WRITE_PROBE = ".cconv-write-probe-"  # the prefix of ``check_writable``'s probe file (removed at once)


def is_transient(name: str) -> bool:
    """Is ``name`` a file cconv creates and removes within one call: ``check_writable``'s probe, or
    an atomic write's temporary file (``_new_temp``: ``.<name>.<12 hex digits>.tmp``)?  Another
    process may see one for an instant (a sweep starting in the same directory)."""
    return name.startswith(WRITE_PROBE) or TEMP_NAME.fullmatch(name) is not None


def check_writable(directory: str) -> None:
    """Create ``directory`` (and parents) and prove a file can be written there; a clear
    ValueError (``OutputError``) otherwise.  Nothing existing is modified."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=WRITE_PROBE, dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise OutputError(f"output directory {directory} is not writable: {reason}") from None


def read_summary(run_dir: str) -> dict | None:
    """A run's summary.json; None when it is absent or damaged (not a JSON object whose
    ``status`` is one of ``STATUSES``: e.g. garbled, not UTF-8, a link)."""
    p = os.path.join(run_dir, SUMMARY)
    if not os.path.lexists(p):
        return None
    try:
        s = read_json(p)
    except (OSError, ValueError, RecursionError):
        return None
    return s if isinstance(s, dict) and s.get("status") in STATUSES else None


def is_finished(run_dir: str) -> bool:
    s = read_summary(run_dir)
    return bool(s) and s.get("status") in FINISHED


class RunLocked(ValueError):  # noqa: N818 (a state of the run directory, caught by name in the CLI and sweeps)
    """The run directory is held by another process (``run_lock``)."""


def _lock_holder(path: str) -> str:
    try:
        pid = read_text(path).strip()
    except (OSError, ValueError):
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
        fd = open_file(path, os.O_RDWR | os.O_CREAT)
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
        if _same_file(fd, path):
            break
        os.close(fd)  # unlinked by its previous holder after we opened it: take the new file
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        try:
            if _same_file(fd, path):  # only the file we locked, never what replaced it
                os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Is ``path`` (not followed) the file open as ``fd``?"""
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
