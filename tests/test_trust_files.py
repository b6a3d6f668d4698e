"""Trust round 2 (issue 26), rules 1-4 and 7: a results directory never mixes configs, cconv
touches only files it created, a failed resume loses nothing, a finished run is a no-op that
writes nothing, and one damaged run never blocks the report or the figure of the others.

Runs are tiny (digits, an 8-unit MLP, 12 steps: ~3 s each) and shared between tests through
module fixtures that are copied; the CLI is called in-process (``cli.main``), except for the
read-only mount, whose claim is about a real process."""

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from io import StringIO

import pandas as pd
import pytest
from runs_helpers import subprocess_env, tiny, write_tiny

from cconv import cli
from cconv.experiments import io, plotting, report
from cconv.experiments.config import from_dict
from cconv.experiments.runner import execute

TINY = tiny(log_every=2)


def snapshot(root) -> dict:
    """Every entry under ``root`` (not followed): type, mode, size, mtime and file bytes."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            data = open(p, "rb").read() if stat.S_ISREG(st.st_mode) else os.readlink(p) if os.path.islink(p) else None
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_size, st.st_mtime_ns, data)
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A completed tiny run (copied by the tests that change it)."""
    d = str(tmp_path_factory.mktemp("fin") / "run")
    assert execute(from_dict(TINY), d).status == "completed"
    return d


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A tiny run stopped after step 10, as a kill would leave it (checkpoint at step 8, metric
    lines up to step 10)."""
    d = str(tmp_path_factory.mktemp("int") / "run")
    execute(from_dict(TINY), d, stop_after=10)
    steps = [l["step"] for l in io.read_jsonl(os.path.join(d, io.METRICS))]
    assert steps == [2, 4, 6, 8, 10] and io.read_summary(d)["status"] == "running"
    return d


def _copy(src, tmp_path, name="run"):
    d = str(tmp_path / name)
    shutil.copytree(src, d, symlinks=True)
    return d


def _config(tmp_path, **changes) -> str:
    return write_tiny(tmp_path / "tiny.yaml", **{"log_every": 2, **changes})


def _one_warning(err: str) -> str:
    """The one warning line the CLI printed (cconv prints recovery warnings as one line each)."""
    lines = [l for l in err.splitlines() if l.startswith("cconv: warning:")]
    assert len(lines) == 1, err
    return lines[0]


def _one_error_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.startswith("cconv: error:")]
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------- rule 1: no mixed configs


def _sweep_file(tmp_path, base_changes=None, lrs=(0.1,), name="s.yaml"):
    base = {**TINY, "steps": 4, "log_every": 2, "checkpoint_every": 2, **(base_changes or {})}
    spec = tmp_path / name
    spec.write_text(json.dumps({"base": base, "grid": {"lr": list(lrs)}}))
    return str(spec)


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_sweep_refuses_a_changed_config_before_writing_anything(tmp_path, capsys):
    """Before: the finished run was silently reused and report.csv mixed the old and new configs."""
    out = str(tmp_path / "sw")
    assert cli.main(["sweep", _sweep_file(tmp_path), "--out", out, "--no-figure"]) == 0
    before = snapshot(out)
    capsys.readouterr()
    changed = _sweep_file(tmp_path, {"batch_size": 32}, lrs=(0.1, 0.05))
    assert cli.main(["sweep", changed, "--out", out, "--no-figure"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "run lr=0.1" in line and "batch_size: 16 -> 32" in line and "s.yaml (changed since)" in line
    assert snapshot(out) == before  # nothing written, not even the new run lr=0.05


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_sweep_reuses_only_runs_whose_config_is_unchanged(tmp_path, capsys):
    """A grid point added to the sweep file: the finished run (same config) is kept, the new one
    runs, and report.csv holds both, each with its own config."""
    out = str(tmp_path / "sw")
    assert cli.main(["sweep", _sweep_file(tmp_path), "--out", out, "--no-figure"]) == 0
    metrics = open(os.path.join(out, "lr=0.1", io.METRICS), "rb").read()
    capsys.readouterr()
    assert cli.main(["sweep", _sweep_file(tmp_path, lrs=(0.1, 0.05)), "--out", out, "--no-figure"]) == 0
    assert "1 completed, 0 diverged, 0 failed, 1 already done" in capsys.readouterr().out
    assert open(os.path.join(out, "lr=0.1", io.METRICS), "rb").read() == metrics
    table = report.load_runs([out])
    assert sorted(zip(table["run"], table["lr"])) == [("lr=0.05", 0.05), ("lr=0.1", 0.1)]
    index = json.load(open(os.path.join(out, io.SWEEP_INDEX)))
    assert set(index["configs"]) == {"lr=0.1", "lr=0.05"}


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_sweep_out_refuses_a_nonempty_directory_that_is_not_a_sweep(tmp_path, capsys):
    """Before: the sweep wrote its runs, sweep.json and report.csv among the user's files."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    before = snapshot(out)
    assert cli.main(["sweep", _sweep_file(tmp_path), "--out", str(out)]) == 2
    assert "is not empty and is not a cconv sweep directory (no sweep.json)" in _one_error_line(capsys.readouterr().err)
    assert snapshot(out) == before


# --------------------------------------------------------------------------- rule 2: only our own files


def _link_to_outside(tmp_path, d, name):
    target = tmp_path / "outside.txt"
    target.write_text("precious\n")
    p = os.path.join(d, name)
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.unlink(p)
    os.symlink(target, p)
    return target


def _link_dir_to_outside(tmp_path, d, name):
    target = tmp_path / "outside_dir"
    target.mkdir()
    (target / "keep.txt").write_text("precious\n")
    p = os.path.join(d, name)
    shutil.rmtree(p, ignore_errors=True)
    os.symlink(target, p)
    return target


def _lock_dir(tmp_path, d, name):
    os.mkdir(os.path.join(d, io.LOCK))
    return None


def _fifo(tmp_path, d, name):
    p = os.path.join(d, name)
    os.unlink(p)
    os.mkfifo(p)
    return None


FOREIGN = {
    "lock-symlink": (_link_to_outside, io.LOCK, "is a symbolic link"),
    "metrics-symlink": (_link_to_outside, io.METRICS, "is a symbolic link"),
    "summary-symlink": (_link_to_outside, io.SUMMARY, "is a symbolic link"),
    "config-symlink": (_link_to_outside, io.CONFIG, "is a symbolic link"),
    "checkpoints-symlink": (_link_dir_to_outside, io.CHECKPOINTS, "is a symbolic link"),
    "lock-directory": (_lock_dir, io.LOCK, "is a directory"),
    "metrics-fifo": (_fifo, io.METRICS, "is a FIFO"),
}


@pytest.mark.slow  # trains tiny runs (a few seconds each)
@pytest.mark.timeout(120)  # before: a FIFO opened for writing blocked forever without a reader
@pytest.mark.parametrize("case", FOREIGN)
def test_a_link_or_foreign_file_in_a_run_directory_is_refused_untouched(case, interrupted, tmp_path, capsys):
    """Before: a .lock symlink's target was clobbered, a metrics.jsonl symlink's target truncated
    on resume, a .lock directory gave exit 1 and "could not be recorded", a FIFO hung the run."""
    make, name, what = FOREIGN[case]
    cfg = _config(tmp_path)
    d = _copy(interrupted, tmp_path)
    target = make(tmp_path, d, name)
    outside = snapshot(target.parent) if target is not None else None
    before = snapshot(d)
    assert cli.main(["run", cfg, "--out", d]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert os.path.join(d, name) in line and what in line
    assert snapshot(d) == before
    if target is not None:
        assert snapshot(target.parent) == outside


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_sweep_run_directory_that_is_a_link_is_refused(tmp_path, capsys):
    out = str(tmp_path / "sw")
    assert cli.main(["sweep", _sweep_file(tmp_path), "--out", out, "--no-figure"]) == 0
    elsewhere = tmp_path / "elsewhere"
    shutil.move(os.path.join(out, "lr=0.1"), elsewhere)
    os.symlink(elsewhere, os.path.join(out, "lr=0.1"))
    before, outside = snapshot(out), snapshot(elsewhere)
    capsys.readouterr()
    assert cli.main(["sweep", _sweep_file(tmp_path), "--out", out]) == 2
    assert "lr=0.1 is a symbolic link" in _one_error_line(capsys.readouterr().err)
    assert snapshot(out) == before and snapshot(elsewhere) == outside


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_report_and_figure_outputs_never_follow_a_link(finished, tmp_path, capsys):
    """``cconv report --csv`` and ``cconv plot --out`` replace only regular files of their own."""
    target = tmp_path / "outside.txt"
    target.write_text("precious\n")
    for link, argv in (
        ("t.csv", ["report", finished, "--csv", "t.csv"]),
        ("f.png", ["plot", finished, "--out", "f.png"]),
        ("g.pdf", ["plot", finished, "--out", "g.png"]),  # the .pdf written next to a .png
    ):
        link = tmp_path / link
        os.symlink(target, link)
        argv[-1] = str(tmp_path / argv[-1])
        assert cli.main(argv) == 2, link
        assert f"{link} is a symbolic link" in _one_error_line(capsys.readouterr().err)
        assert target.read_text() == "precious\n" and os.path.islink(link)
        assert sorted(os.listdir(tmp_path)) == sorted(["outside.txt", link.name]), "nothing else written"
        os.unlink(link)


def test_open_file_refuses_links_and_foreign_types_without_blocking(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    os.symlink(f, tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, what in (("link", "a symbolic link"), ("fifo", "a FIFO"), ("dir", "a directory")):
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, os.O_RDWR | os.O_CREAT):
            with pytest.raises(io.ForeignFileError, match=f"is {what}, not a regular file"):
                io.open_file(str(tmp_path / name), flags)
    with pytest.raises(io.ForeignFileError, match="is a regular file, not a directory"):
        io.ensure_dir(str(f))
    assert f.read_text() == "x"


# --------------------------------------------------------------------------- rule 3: a failed resume loses nothing


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_resume_whose_checkpoint_path_is_not_a_directory_loses_no_metric_line(interrupted, tmp_path, capsys):
    """Before: metrics.jsonl was emptied (no checkpoint found), then the first save failed (exit 1)."""
    d = _copy(interrupted, tmp_path)
    shutil.rmtree(os.path.join(d, io.CHECKPOINTS))
    open(os.path.join(d, io.CHECKPOINTS), "w").write("not a directory\n")
    before = snapshot(d)
    assert cli.main(["run", _config(tmp_path), "--out", d]) == 2
    assert "checkpoints is a regular file, not a directory" in _one_error_line(capsys.readouterr().err)
    assert snapshot(d) == before


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_resume_that_fails_to_start_cuts_nothing(interrupted, tmp_path, monkeypatch):
    """Any failure between the restore and the first new step (here: the metric writers cannot be
    opened) leaves metrics.jsonl as it was.  Before: it was cut back to the checkpoint's step 8."""
    from cconv.experiments import runner

    d = _copy(interrupted, tmp_path)
    metrics = open(os.path.join(d, io.METRICS), "rb").read()

    def broken(*a, **k):
        raise OSError("the disk went away")

    monkeypatch.setattr(runner, "open_writers", broken)
    with pytest.raises(OSError, match="the disk went away"):
        execute(from_dict(TINY), d)
    assert open(os.path.join(d, io.METRICS), "rb").read() == metrics
    monkeypatch.undo()
    assert execute(from_dict(TINY), d).status == "completed"  # and the resume then works
    assert [l["step"] for l in io.read_jsonl(os.path.join(d, io.METRICS))] == [2, 4, 6, 8, 10, 12]


# --------------------------------------------------------------------------- rule 4: a finished run is a no-op

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_MUTATING = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown"}
_MUTATING |= {"os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.move"}
_WATCH: dict = {"root": None, "seen": []}


def _audit(event, args):
    root = _WATCH["root"]
    if root is None:
        return
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITES)
        if writes and isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith(root):
            _WATCH["seen"].append((event, args))
    elif event in _MUTATING:
        paths = [os.fsdecode(a) for a in args if isinstance(a, (str, bytes, os.PathLike))]
        if event == "os.truncate" or any(p.startswith(root) for p in paths):
            _WATCH["seen"].append((event, args))


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one only records while a test watches


@contextlib.contextmanager
def writes_under(root):
    """Every write-like call Python makes (opens for writing, renames, removals, mkdir, truncate,
    chmod, ...) under ``tmp_path`` while the test body runs, via ``sys.addaudithook``.  Root
    ignores file permissions, so a chmod'ed directory proves nothing here; this catches the
    attempt itself, whoever runs the test (C libraries that write without Python are not seen:
    the read-only mount test below covers those)."""
    _WATCH["seen"] = []
    _WATCH["root"] = str(root)
    try:
        yield _WATCH["seen"]
    finally:
        _WATCH["root"] = None


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_finished_run_again_writes_nothing(finished, tmp_path, capsys):
    """Before: the CLI probed its parent directory with a temporary file and ``execute`` created
    and removed a .lock, so a finished run failed on a read-only file system."""
    d = _copy(finished, tmp_path)
    cfg = _config(tmp_path)
    before = snapshot(tmp_path)
    os.chmod(d, 0o555)  # read-only for everyone but root (the audit hook covers root)
    try:
        with writes_under(tmp_path) as seen:
            assert cli.main(["run", cfg, "--out", d]) == 0
            assert "already completed; nothing to do" in capsys.readouterr().out
            res = execute(from_dict(TINY), d)
        assert res.status == "completed" and not res.trained
        assert seen == []
    finally:
        os.chmod(d, 0o755)
    assert snapshot(tmp_path) == before


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_finished_sweep_again_writes_nothing(tmp_path, capsys):
    """Before: sweep.json and report.csv were rewritten (and the write probe created) every time."""
    out = str(tmp_path / "sw")
    spec = _sweep_file(tmp_path)
    assert cli.main(["sweep", spec, "--out", out]) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    with writes_under(tmp_path) as seen:
        assert cli.main(["sweep", spec, "--out", out]) == 0
    assert "0 completed, 0 diverged, 0 failed, 1 already done" in capsys.readouterr().out
    assert seen == []
    assert snapshot(tmp_path) == before


RO_MOUNT = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && ! touch "$0/.probe" 2>/dev/null'


def _unshare_ro_works(path) -> bool:
    """Can this user mount ``path`` read-only in a private mount namespace (``unshare -rm``)?"""
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "sh", "-c", RO_MOUNT, str(path)], capture_output=True).returncode == 0


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_finished_run_again_succeeds_on_a_read_only_file_system(finished, tmp_path):
    """A real process in a private mount namespace where the results tree is mounted read-only
    (EROFS applies to root too): ``cconv run`` of the finished run exits 0 and says nothing to do."""
    ro = str(tmp_path / "ro")  # the run directory and its parent (where a write probe would go)
    d = _copy(finished, tmp_path / "ro")
    cfg = _config(tmp_path)
    if not _unshare_ro_works(ro):
        pytest.skip("needs unshare -rm and a read-only bind mount (unprivileged user namespaces)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = subprocess_env()
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0", PYTHONPATH=root)
    script = RO_MOUNT + ' && exec "$@"'
    argv = ["unshare", "-rm", "sh", "-c", script, ro, sys.executable, "-m", "cconv", "run", cfg, "--out", d]
    r = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "already completed; nothing to do" in r.stdout


# --------------------------------------------------------------------------- rule 7: damage is never data


def _damage(d):
    """Garbage lines (more than a warning lists), a step "abc", invalid JSON, invalid UTF-8, a
    boolean loss; and no summary.json."""
    mpath = os.path.join(d, io.METRICS)
    lines = open(mpath, "rb").read().splitlines(keepends=True)
    good = [json.loads(l) for l in lines]
    bad = [b"garbage %d\n" % i for i in range(40)]
    bad += [json.dumps({**good[0], "step": "abc"}).encode() + b"\n", b'{"step": 3, "loss": \n']
    bad += [b'{"step": 5, "seed": 0, "loss": "\xff\xfe"}\n', json.dumps({**good[0], "loss": True}).encode() + b"\n"]
    open(mpath, "wb").write(lines[0] + b"".join(bad) + b"".join(lines[1:]))
    os.unlink(os.path.join(d, io.SUMMARY))
    return good


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_report_of_a_sweep_with_one_damaged_run(finished, tmp_path, capsys):
    """Before: the step "abc" was shown as the run's final step (or the report failed)."""
    sw = tmp_path / "sw"
    sw.mkdir()
    good_dir = _copy(finished, sw, "lr=0.1")
    bad_dir = _copy(finished, sw, "lr=0.2")
    want = _damage(bad_dir)
    assert cli.main(["report", str(sw), "--csv", "-"]) == 0
    out, err = capsys.readouterr()
    msg = _one_warning(err)  # one warning for the damaged run, whatever the number of lines
    assert bad_dir in msg and "44 lines (2, 3, 4, 5, 6, ...)" in msg and "no summary.json" in msg
    assert len(msg) < 400
    df = pd.read_csv(StringIO(out)).set_index("run")
    assert df.loc["lr=0.1", "status"] == "completed" and df.loc["lr=0.2", "status"] == "unknown"
    for run in ("lr=0.1", "lr=0.2"):  # every number shown is a number the run wrote
        assert df.loc[run, "step"] == 12
        assert df.loc[run, "loss"] == pytest.approx(want[-1]["loss"])
    assert good_dir


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_plot_of_a_sweep_with_one_damaged_run(finished, tmp_path, capsys):
    sw = tmp_path / "sw"
    sw.mkdir()
    _copy(finished, sw, "lr=0.1")
    bad_dir = _copy(finished, sw, "lr=0.2")
    _damage(bad_dir)
    png = tmp_path / "fig.png"
    assert cli.main(["plot", str(sw), "--x", "steps", "--out", str(png)]) == 0
    assert bad_dir in _one_warning(capsys.readouterr().err)
    assert png.stat().st_size > 0
    with pytest.warns(io.DamagedRunWarning):
        df = report.load_metrics([str(sw)])
    assert sorted(df[df["run"] == "lr=0.2"]["step"]) == [2, 4, 6, 8, 10, 12]
    assert all(isinstance(s, int) for s in df["step"])


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_run_with_a_damaged_config_is_left_out_with_one_warning(finished, tmp_path, capsys):
    sw = tmp_path / "sw"
    sw.mkdir()
    _copy(finished, sw, "a")
    bad = _copy(finished, sw, "b")
    open(os.path.join(bad, io.CONFIG), "wb").write(b"model: \xff\xfe\x00garbage\n")
    assert cli.main(["report", str(sw), "--csv", "-"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"b: config.yaml unreadable .*not UTF-8.*run left out", _one_warning(err))
    assert out.count("\n") == 2 and ",completed," in out  # the header and run a


@pytest.mark.slow  # trains tiny runs (a few seconds each)
def test_a_damaged_summary_is_status_unknown_not_data(finished, tmp_path):
    d = _copy(finished, tmp_path)
    for text in ('{"status": 5}', '{"status": "completed", "per_seed": [1]}', "\xff"):
        open(os.path.join(d, io.SUMMARY), "w", encoding="latin-1").write(text)
        with pytest.warns(io.DamagedRunWarning, match="summary.json damaged"):
            assert report.load_runs([d])["status"].tolist() == ["unknown"]


def test_a_warning_about_many_damaged_lines_stays_short(tmp_path):
    p = str(tmp_path / io.METRICS)
    with open(p, "w") as fh:
        for s in range(1, 10001):
            fh.write(json.dumps({"step": s, "seed": 0, "loss": 1.0}) + "\n" if s % 2 else "junk\n")
    with pytest.warns(io.MetricsWarning) as caught:
        assert len(io.read_jsonl(p)) == 5000
    assert len(caught) == 1 and "5000 lines (2, 4, 6, 8, 10, ...)" in str(caught[0].message)
    assert len(str(caught[0].message)) < 200


def test_the_figure_is_written_through_the_same_rule(tmp_path):
    """``plotting.save`` writes both files atomically, refusing before the first when either is
    not a regular file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.mkfifo(tmp_path / "f.pdf")
    with pytest.raises(io.ForeignFileError, match="f.pdf is a FIFO"):
        plotting.save(plt.figure(), str(tmp_path / "f.png"))
    assert not (tmp_path / "f.png").exists()


def test_a_run_being_created_by_another_process_is_not_foreign(tmp_path):
    """Two sweeps on one directory: the second checks a run directory before it takes the lock, and
    may see the first's lock and the temporary file of the config.yaml it is writing (renamed into
    place a moment later). That is a run being created, not a directory cconv did not create
    (this raised 'is not empty and holds no cconv run' under load); anything else still is."""
    from cconv.experiments import rundir

    run = tmp_path / "r"
    run.mkdir()
    (run / io.LOCK).write_text("")
    (run / f".{io.CONFIG}.k2j3x9.tmp").write_text("name: ''\n")
    (run / f"{io.WRITE_PROBE}q8x2k1").write_text("")  # the other's io.check_writable, a moment later gone
    rundir.refuse_foreign(str(run))
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no cconv run"):
        rundir.refuse_foreign(str(run))
