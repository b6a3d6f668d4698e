"""Reliability regressions (issue 15): a finished run never gets stuck, one run directory is
never trained by two processes, a damaged metrics line never deletes data, messages tell the
truth.  In-process tests use tiny configs; the CLI tests use real subprocesses."""

import json
import os
import textwrap
import time

import pytest
from runs_helpers import ROOT, TINY, cli_env, tiny_yaml, write_tiny
from runs_helpers import run_cconv as cconv

from cconv import cli
from cconv.experiments import io
from cconv.experiments.config import from_dict
from cconv.experiments.runner import execute

# real subprocesses, SIGKILL and concurrent processes: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow


def _summary_path(d):
    return os.path.join(d, io.SUMMARY)


# What a kill between the final checkpoint and the final summary leaves behind, and what a lost
# or garbled summary looks like.
def _kill_before_summary(d, s):
    io.write_json(
        _summary_path(d),
        {k: s[k] for k in ("run", "config_digest", "seeds", "calibration")} | {"status": "running", "step": 0},
    )


def _lost(d, s):
    os.unlink(_summary_path(d))


def _garbled(d, s):
    with open(_summary_path(d), "w") as fh:
        fh.write('{"run": "x", "stat')


def _failed_by_old_bug(d, s):
    io.write_json(_summary_path(d), {**s, "status": "failed", "error": "StepAlreadyExistsError: ..."})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("fin") / "run")
    res = execute(from_dict(TINY), d)
    assert res.status == "completed"
    return d, res.summary, open(os.path.join(d, io.METRICS), "rb").read()


@pytest.mark.parametrize("damage", [_kill_before_summary, _lost, _garbled, _failed_by_old_bug])
def test_finished_run_without_completed_summary_recovers(finished, damage, tmp_path):
    """Before: orbax StepAlreadyExistsError on every re-run, summary rewritten to failed."""
    import shutil

    src, want, metrics = finished
    d = str(tmp_path / "run")
    shutil.copytree(src, d)
    damage(d, want)
    assert not io.is_finished(d)
    res = execute(from_dict(TINY), d)
    assert res.status == "completed"
    got = io.read_summary(d)
    assert got == json.loads(json.dumps(want))  # the same summary, final metrics included
    assert open(os.path.join(d, io.METRICS), "rb").read() == metrics  # nothing trained again
    assert execute(from_dict(TINY), d).status == "completed"


def test_all_seeds_diverged_then_killed_before_summary_recovers(tmp_path):
    cfg = from_dict({**TINY, "lr": 1e30, "steps": 40, "compressor": "none", "memory": "none", "seed": [0, 1]})
    d = str(tmp_path / "run")
    res = execute(cfg, d)
    assert res.status == "diverged"
    metrics, want = open(os.path.join(d, io.METRICS), "rb").read(), io.read_summary(d)
    _kill_before_summary(d, want)
    again = execute(cfg, d)
    assert again.status == "diverged" and io.read_summary(d) == want
    assert open(os.path.join(d, io.METRICS), "rb").read() == metrics


# --------------------------------------------------------------------------- CLI, real SIGKILL

# cconv's main with summary.json's final write replaced by SIGKILL: the process dies right
# after the final checkpoint, before the summary says the run ended.
KILL_BEFORE_FINAL_SUMMARY = """
import os, signal, sys
from cconv.experiments import io
write_json = io.write_json
def dying(path, obj):
    if path.endswith("summary.json") and obj.get("status") in ("completed", "diverged"):
        os.kill(os.getpid(), signal.SIGKILL)
    write_json(path, obj)
io.write_json = dying
from cconv import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _check_completed(d, steps=(4, 8, 12)):
    s = io.read_summary(d)
    lines = io.read_jsonl(os.path.join(d, io.METRICS))
    assert s["status"] == "completed" and s["error"] is None
    assert [l["step"] for l in lines] == list(steps)
    assert s["final"] == lines[-1]


@pytest.mark.slow
def test_cli_run_sigkilled_before_final_summary_then_run_again(tmp_path, capsys):
    """Before: exit 1 with orbax's StepAlreadyExistsError, summary rewritten to failed, forever.
    The third command (nothing to do) runs in-process."""
    cfg = write_tiny(tmp_path / "tiny.yaml")
    out = str(tmp_path / "run")
    r = cconv("run", str(cfg), "--out", out, code=KILL_BEFORE_FINAL_SUMMARY)
    assert r.returncode == -9, r.stderr
    assert io.read_summary(out)["status"] == "running"
    metrics = open(os.path.join(out, io.METRICS), "rb").read()
    r = cconv("run", str(cfg), "--out", out)
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr
    _check_completed(out)
    assert open(os.path.join(out, io.METRICS), "rb").read() == metrics
    assert cli.main(["run", str(cfg), "--out", out]) == 0 and "already completed" in capsys.readouterr().out


@pytest.mark.extended  # CI: the run variant below and test_cli.py's SIGKILL of a sweep
@pytest.mark.slow
def test_cli_sweep_sigkilled_before_final_summary_then_sweep_again(tmp_path):
    spec = tmp_path / "s.yaml"
    base = textwrap.indent(tiny_yaml(), "  ")
    spec.write_text(f"base:\n{base}grid:\n  lr: [0.1, 0.05]\n")
    out = tmp_path / "sw"
    r = cconv("sweep", str(spec), "--out", str(out), code=KILL_BEFORE_FINAL_SUMMARY)
    assert r.returncode == -9, r.stderr
    assert io.read_summary(str(out / "lr=0.1"))["status"] == "running"
    r = cconv("sweep", str(spec), "--out", str(out))
    assert r.returncode == 0 and "2 completed, 0 diverged, 0 failed, 0 already done" in r.stdout, r.stderr
    for name in ("lr=0.1", "lr=0.05"):
        _check_completed(str(out / name))
    # a lost and a garbled summary of finished runs: recovered, not failed
    os.unlink(out / "lr=0.1" / io.SUMMARY)
    (out / "lr=0.05" / io.SUMMARY).write_text('{"status": "compl')
    r = cconv("sweep", str(spec), "--out", str(out))
    assert r.returncode == 0 and "2 completed, 0 diverged, 0 failed, 0 already done" in r.stdout, r.stderr
    for name in ("lr=0.1", "lr=0.05"):
        _check_completed(str(out / name))


# --------------------------------------------------------------------------- one process per run directory


def test_run_lock_is_exclusive_and_leaves_no_trace(tmp_path):
    d = str(tmp_path)
    with io.run_lock(d):
        assert open(os.path.join(d, io.LOCK)).read() == f"{os.getpid()}\n"
        with pytest.raises(io.RunLocked, match=rf"in use by another cconv process \(pid {os.getpid()}\)"):
            with io.run_lock(d):
                pass
    assert os.listdir(d) == []
    open(os.path.join(d, io.LOCK), "w").write("12345\n")  # stale, from a killed process
    with io.run_lock(d):
        pass
    assert os.listdir(d) == []


def test_execute_refuses_a_locked_run_directory_untouched(tmp_path):
    d = str(tmp_path / "run")
    os.makedirs(d)
    with io.run_lock(d):
        with pytest.raises(io.RunLocked):
            execute(from_dict(TINY), d)
        assert os.listdir(d) == [io.LOCK]
    assert execute(from_dict(TINY), d).status == "completed"
    assert io.LOCK not in os.listdir(d)


def _popen(*args):
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "cconv", *args],
        cwd=ROOT,
        env=cli_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_cli_run_on_a_directory_another_process_trains_is_refused(tmp_path, capsys):
    """Before: both processes trained the run, every step logged twice in metrics.jsonl.  Once
    the lock is released, the same command (in-process) trains the run."""
    cfg = write_tiny(tmp_path / "tiny.yaml")
    out = tmp_path / "run"
    out.mkdir()
    with io.run_lock(str(out)):  # this test process is "the other process"
        r = cconv("run", str(cfg), "--out", str(out))
        assert r.returncode == 2, r.stderr
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and f"in use by another cconv process (pid {os.getpid()})" in err
        assert os.listdir(out) == [io.LOCK]
    assert cli.main(["run", str(cfg), "--out", str(out)]) == 0, capsys.readouterr().err
    _check_completed(str(out))


@pytest.mark.slow
def test_two_concurrent_sweeps_on_one_directory(tmp_path):
    """Before: both sweeps exit 0 with every step logged twice (or crash on the other's orbax
    temporary directories).  Now each run is trained by exactly one of them."""
    spec = tmp_path / "s.yaml"
    base = textwrap.indent(tiny_yaml(steps=40), "  ")
    # three seeds: one step program for the three runs (a grid over lr would compile three)
    spec.write_text(f"base:\n{base}grid:\n  seed: [0, 1, 2]\n")
    out = tmp_path / "sw"
    procs = [_popen("sweep", str(spec), "--out", str(out), "--no-figure") for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr
        assert "Traceback" not in stderr
    import re

    completed = sum(int(re.search(r"(\d+) completed", stdout).group(1)) for stdout, _ in results)
    assert completed == 3, results  # every run trained once, by one of the two
    for name in ("seed=0", "seed=1", "seed=2"):
        _check_completed(str(out / name), steps=range(4, 41, 4))
        assert io.LOCK not in os.listdir(out / name)


# --------------------------------------------------------------------------- damaged metrics lines


def _write_lines(p, steps, garbage_after=None):
    with open(p, "w") as fh:
        for s in steps:
            fh.write(json.dumps({"step": s, "seed": 0, "loss": 1.0 / s}) + "\n")
            if s == garbage_after:
                fh.write("\x00\x00garbage{\n")


def test_damaged_middle_line_is_kept_reported_and_skipped(tmp_path):
    """Before: read_jsonl stopped at the damaged line, repair_jsonl cut every line after it."""
    p = str(tmp_path / io.METRICS)
    _write_lines(p, [10, 20, 30, 40, 50], garbage_after=10)
    with open(p, "a") as fh:
        fh.write('{"step": 60, "lo')  # and a torn last line
    with pytest.warns(io.MetricsWarning, match=r"metrics.jsonl: line 2 damaged .*skipped"):
        assert [l["step"] for l in io.read_jsonl(p)] == [10, 20, 30, 40, 50]
    with pytest.warns(io.MetricsWarning, match=r"metrics.jsonl: line 2 damaged .*kept in place"):
        assert io.repair_jsonl(p, 30) == 3  # resume from the checkpoint of step 30
    with pytest.warns(io.MetricsWarning):
        assert [l["step"] for l in io.read_jsonl(p)] == [10, 20, 30]
    assert open(p).read().count("garbage") == 1 and open(p).read().endswith("\n")


def test_damaged_tail_after_checkpoint_is_cut_silently(tmp_path, recwarn):
    p = str(tmp_path / io.METRICS)
    _write_lines(p, [10, 20, 30, 40], garbage_after=30)
    assert io.repair_jsonl(p, 30) == 3
    assert [l["step"] for l in io.read_jsonl(p)] == [10, 20, 30]
    assert "garbage" not in open(p).read() and not [w for w in recwarn if w.category is io.MetricsWarning]


def test_resume_with_a_damaged_line_loses_nothing(finished, tmp_path):
    """Before: the resume cut metrics.jsonl at the damaged line (steps 4..8 lost) and exited 0."""
    src, want, metrics = finished
    cfg = from_dict({**TINY, "log_every": 2, "checkpoint_every": 8})
    d = str(tmp_path / "run")
    execute(cfg, d, stop_after=10)  # as if killed at step 10 (checkpoint: 8)
    mpath = os.path.join(d, io.METRICS)
    raw = open(mpath, "rb").read().split(b"\n")
    assert [json.loads(l)["step"] for l in raw[:-1]] == [2, 4, 6, 8, 10]
    raw.insert(1, b"{garbage")
    open(mpath, "wb").write(b"\n".join(raw))
    with pytest.warns(io.MetricsWarning, match="line 2 damaged"):
        res = execute(cfg, d)
    assert res.status == "completed"
    with pytest.warns(io.MetricsWarning):
        got = io.read_jsonl(mpath)
    assert [l["step"] for l in got] == [2, 4, 6, 8, 10, 12]  # nothing lost, nothing duplicated
    assert got[-1]["cum_bytes"] == json.loads(metrics.splitlines()[-1])["cum_bytes"]
    assert res.summary["final"]["step"] == 12


def test_report_of_a_finished_run_with_a_damaged_line_shows_the_final_step(finished, tmp_path):
    """Before: cconv report presented the step before the damaged line as the final result."""
    import shutil

    from cconv.experiments import report

    src, want, metrics = finished
    d = str(tmp_path / "run")
    shutil.copytree(src, d)
    lines = metrics.split(b"\n")
    lines.insert(1, b"not json")
    open(os.path.join(d, io.METRICS), "wb").write(b"\n".join(lines))
    with pytest.warns(io.MetricsWarning, match="line 2"):
        table = report.load_runs([d])
    assert table["step"].tolist() == [12] and table["loss"].tolist() == [pytest.approx(want["final"]["loss"])]
    with pytest.warns(io.MetricsWarning):
        assert report.load_metrics([d])["step"].tolist() == [4, 8, 12]


# --------------------------------------------------------------------------- honest messages


def _damage_checkpoint(path):
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if "state" in p and os.path.getsize(p) > 0:
                with open(p, "r+b") as fh:
                    fh.truncate(os.path.getsize(p) // 2)


def test_damaged_checkpoint_one_line_naming_it_and_the_way_out(tmp_path, monkeypatch):
    """Before: a JSONDecodeError (a ValueError: `cconv: error:`, exit 2, as if the input were bad).
    With only one checkpoint kept there is nothing to fall back to."""
    from cconv.experiments import runner
    from cconv.experiments.checkpoint import CheckpointError

    monkeypatch.setattr(runner, "KEEP_CHECKPOINTS", 1)
    d = str(tmp_path / "run")
    execute(from_dict(TINY), d, stop_after=10)  # checkpoint of step 8
    ck = os.path.join(d, io.CHECKPOINTS, "8")
    _damage_checkpoint(ck)
    with pytest.raises(CheckpointError) as info:
        execute(from_dict(TINY), d)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and f"checkpoint {ck} cannot be restored" in msg
    assert "remove that directory to restart the run from step 0" in msg
    assert io.read_summary(d)["status"] == "failed"
    import shutil

    shutil.rmtree(ck)  # the advice, followed
    assert execute(from_dict(TINY), d).status == "completed"
    _check_completed(d)


def test_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    """Two checkpoints are kept (``runner.KEEP_CHECKPOINTS``)."""
    cfg = from_dict({**TINY, "steps": 16})
    d = str(tmp_path / "run")
    execute(cfg, d, stop_after=10)  # checkpoints of steps 4 and 8
    assert sorted(os.listdir(os.path.join(d, io.CHECKPOINTS))) == ["4", "8"]
    _damage_checkpoint(os.path.join(d, io.CHECKPOINTS, "8"))
    with pytest.warns(io.RecoveryWarning, match=r"checkpoints/8 cannot be restored .* resuming from step 4"):
        assert execute(cfg, d).status == "completed"
    assert os.path.isdir(os.path.join(d, io.CHECKPOINTS + ".damaged", "8"))
    _check_completed(d, steps=(4, 8, 12, 16))


def test_failure_message_says_whether_summary_was_written(tmp_path, monkeypatch):
    """Before: `recorded in summary.json` even when writing it failed (disk full)."""
    from cconv.experiments import build, rundir

    cfg = from_dict({**TINY, "steps": 4})
    problem = build.problem(cfg)
    monkeypatch.setattr(problem.trainer, "step", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    d = str(tmp_path / "ok")
    with pytest.raises(RuntimeError) as info:
        execute(cfg, d, problem=problem)
    assert rundir.failure_recorded(d, info.value)
    write_json = io.write_json

    def full(path, obj):
        if obj.get("status") == "failed":
            raise OSError(28, "No space left on device")
        write_json(path, obj)

    monkeypatch.setattr(io, "write_json", full)
    d = str(tmp_path / "full")
    with pytest.raises(RuntimeError) as info:  # the run's own error, not the OSError
        execute(cfg, d, problem=problem)
    assert not rundir.failure_recorded(d, info.value)


# --------------------------------------------------------------------------- validation gaps (CLI, in-process)

BOMB = (
    "wandb: {project: p, tags: [&a [x, x, x, x, x, x, x, x, x, x], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
    "&c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c], "
    "&e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d], &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]]}\n"
)
INVALID = {  # before: exit 1 with a run directory marked failed, or an OverflowError
    "optimizer_arg_not_a_number": ([], ["--set", "optimizer={name: sgd, momentum: abc}"], "optimizer {'name': 'sgd'"),
    "optimizer_arg_a_list": ([], ["--set", "optimizer={name: adam, b1: [1]}"], "optimizer {'name': 'adam'"),
    "schedule_arg_not_a_number": (
        [],
        ["--set", "lr_schedule={name: cosine, alpha: abc}"],
        "lr_schedule {'name': 'cosine', 'alpha': 'abc'}: TypeError",
    ),
    "schedule_unknown": ([], ["--set", "lr_schedule=cosinus"], "lr_schedule 'cosinus' is not an optax schedule"),
    "optimizer_unknown": ([], ["--set", "optimizer=adamm"], "optimizer 'adamm' is not an optax optimizer"),
    "ef_scale_out_of_range": ([], ["--set", "ef_scale=2"], "ef_scale must be null, auto or a number in (0, 1]"),
    "model_hparam_not_a_number": ([], ["--set", "model.hidden=abc"], "model {'name': 'mlp'"),
    "seed_too_large": ([], ["--set", "seed=18446744073709551616"], "seed must be an integer in [0, 2**63 - 1]"),
    "seed_list_too_large": ([], ["--set", "seed=[0, 99999999999999999999999]"], "seed must be an integer in"),
    "alias_bomb": ([BOMB], [], "expands to more than 100000 values"),
    "alias_bomb_in_set": (
        [],
        [
            "--set",
            "wandb={project: p, tags: [&a [x, x, x, x, x, x, x, x, x, x, x], "
            "&b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
            "&c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b], "
            "&d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c, *c], "
            "&e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d]]}",
        ],
        "expands to more than 100000 values",
    ),
    "missing_data_dir_deep_out": (
        [],
        ["--set", "data={name: mnist, root: /nonexistent/cconv}", "--out", "{tmp}/a/b/run"],
        "/nonexistent/cconv",
    ),
    "out_is_a_file": ([], ["--out", "{cfg}"], "is not a directory"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_input_exit_2_one_line_nothing_written(case, tmp_path, capsys):
    from cconv import cli

    extra_yaml, args, fragment = INVALID[case]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(tiny_yaml(steps=2) + "".join(extra_yaml))
    before = sorted(os.listdir(tmp_path))
    args = [a.replace("{tmp}", str(tmp_path)).replace("{cfg}", str(cfg)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "run")]
    rc = cli.main(["run", str(cfg), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("cconv: error: ") and fragment in err, err
    assert sorted(os.listdir(tmp_path)) == before  # no run directory, no parents created
    assert cfg.read_text().startswith("model:")


def test_error_feedback_warning_is_one_line_in_the_cli(tmp_path):
    """EF around QSGD s=2 (omega >= 1): the run goes on, stderr carries one warning line naming
    omega and the fix."""
    cfg = tmp_path / "cfg.yaml"
    write_tiny(cfg, steps=2, compressor={"name": "qsgd", "levels": 2})
    r = cconv("run", str(cfg), "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "omega" in line]
    assert len(warned) == 1 and warned[0].startswith("cconv: warning: memory ef around unbiased qsgd (omega = "), (
        r.stderr
    )
    assert "ef_scale: auto" in warned[0] and "warn_error_feedback" not in r.stderr  # no source line


@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_unavailable_metric_writer_exit_2_before_the_run_directory(backend, tmp_path, capsys, monkeypatch):
    """Before: the run directory was created, the run marked failed (exit 1).  Now: one line, exit
    2, nothing written (the backend is looked up, not imported, in check_names)."""
    from cconv import cli
    from cconv.experiments import writers

    monkeypatch.setitem(writers.BACKENDS, backend, ("cconv_no_such_module", f"pip install 'cconv[{backend}]'"))
    cfg = tmp_path / "cfg.yaml"
    write_tiny(cfg, steps=2, **{backend: True})
    before = sorted(os.listdir(tmp_path))
    rc = cli.main(["run", str(cfg), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("cconv: error: ") and "is not installed" in err, err
    assert f"cconv[{backend}]" in err and f"{backend}: false" in err
    assert sorted(os.listdir(tmp_path)) == before
    spec = tmp_path / "s.yaml"  # a sweep: refused before its directory exists
    base = "".join(f"  {line}\n" for line in cfg.read_text().splitlines())
    spec.write_text(f"base:\n{base}grid:\n  seed: [0, 1]\n")
    from cconv.experiments import sweep
    from cconv.experiments.config import ConfigError

    with pytest.raises(ConfigError, match="is not installed"):
        sweep.run_sweep(str(spec), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_sweep_with_a_bad_optimizer_argument_is_refused_before_anything_is_written(tmp_path):
    from cconv.experiments import sweep
    from cconv.experiments.config import ConfigError

    spec = tmp_path / "s.yaml"
    base = textwrap.indent(tiny_yaml(), "  ")
    spec.write_text(f"base:\n{base}grid:\n  optimizer: [sgd, {{name: sgd, momentum: abc}}]\n")
    with pytest.raises(ConfigError, match="momentum"):
        sweep.run_sweep(str(spec), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_sweep_grid_size_is_bounded():
    from cconv.experiments import sweep
    from cconv.experiments.config import ConfigError

    with pytest.raises(ConfigError, match="100000000 runs"):
        sweep.expand_grid({f"k{i}": list(range(10)) for i in range(8)})


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs (needs root and mount; skipped where the sandbox forbids it)."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield str(mnt)
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_ends_with_one_line_and_an_honest_summary(small_disk, tmp_path):
    """Before: pages of orbax tracebacks (absl error logs, "Event loop is closed" from C threads)
    and a 400-character tensorstore message; the partial checkpoint filled the disk."""
    cfg = tmp_path / "big.yaml"  # a checkpoint of ~5 MB (two workers' replicas and residuals)
    write_tiny(cfg, model={"name": "mlp", "hidden": [512, 512]})
    d = os.path.join(small_disk, "run")
    r = cconv("run", str(cfg), "--out", d)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    want = f"cconv: run failed: CheckpointError: cannot write checkpoint {d}/checkpoints/4: no space left on device"
    assert len(lines) == 1 and lines[0].startswith(want), r.stderr[-3000:]
    s = io.read_summary(d)
    assert s["status"] == "failed" and s["error"] == want.split("run failed: ")[1]
    assert os.listdir(os.path.join(d, io.CHECKPOINTS)) == []  # the partial write is gone
    assert "recorded in" in lines[0]


def test_a_failed_write_is_removed_even_when_late_writes_recreate_it(tmp_path, monkeypatch):
    """A failed orbax save returns while tensorstore's writers still have writes of the other arrays
    in flight; they recreate the temporary directory after the first removal (seen in CI: the
    disk-full run left ``4.orbax-checkpoint-tmp``).  Here a thread plays the late writer."""
    import threading

    import jax.numpy as jnp

    from cconv.experiments.checkpoint import Checkpointer, CheckpointError

    ck = Checkpointer(str(tmp_path / "ck"))
    late = os.path.join(ck.directory, "4.orbax-checkpoint-tmp", "state", "d")
    writers = []

    def full(step, args, force):
        os.makedirs(late)

        def write_late():  # after the first removal, as tensorstore's manifest write does
            time.sleep(0.3)
            os.makedirs(late, exist_ok=True)
            open(os.path.join(late, "chunk"), "wb").close()

        writers.append(threading.Thread(target=write_late))
        writers[0].start()
        raise ValueError("RESOURCE_EXHAUSTED: [os_error_code='28']")

    monkeypatch.setattr(ck._mngr, "save", full)
    with pytest.raises(CheckpointError, match="no space left on device"):
        ck.save(4, {"a": jnp.ones(3)}, {})
    writers[0].join()
    assert os.listdir(ck.directory) == []


def test_a_failed_checkpoint_write_names_the_checkpoint_and_keeps_the_previous(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from cconv.experiments.checkpoint import Checkpointer, CheckpointError

    ck = Checkpointer(str(tmp_path / "ck"), keep=2)
    ck.save(1, {"a": jnp.ones(3)}, {"n": 1})
    real = ck._mngr.save

    def full(step, args, force):
        os.makedirs(os.path.join(ck.directory, f"{step}.orbax-checkpoint-tmp-123", "x"))
        raise ValueError("RESOURCE_EXHAUSTED: Error writing ...: No space left on device [os_error_code='28']")

    monkeypatch.setattr(ck._mngr, "save", full)
    with pytest.raises(CheckpointError, match=r"^cannot write checkpoint .*/ck/2: no space left on device$"):
        ck.save(2, {"a": jnp.zeros(3)}, {"n": 2})
    assert sorted(os.listdir(ck.directory)) == ["1"]
    monkeypatch.setattr(ck._mngr, "save", real)
    step, state, meta = ck.restore({"a": jnp.zeros(3)})
    assert step == 1 and meta == {"n": 1} and float(state["a"].sum()) == 3.0
