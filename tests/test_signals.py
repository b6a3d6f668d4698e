"""SIGTERM / SIGINT during training (issue 26, rule 8; docs/signals.md): the step is finished, a
checkpoint is saved at it, the summary says ``interrupted``, the CLI exits 128 + signal, and the
same command resumes with nothing lost or repeated (metric lines and final state equal to an
uninterrupted run's, bit for bit).

The claims are about real processes: ``python -m cconv`` subprocesses get the real signal once
the run has logged a few steps (``metrics.jsonl`` polled), as test_reliability.py's SIGKILL tests
do.  One in-process test covers the loop's logic fast (the signal sent by the step itself)."""

import os
import signal
import subprocess
import sys
import time
from subprocess import PIPE

import jax
import numpy as np
import pytest
from runs_helpers import ROOT, cli_env, run_cconv, tiny, tiny_yaml

from cconv.experiments import build, io, report, signals
from cconv.experiments.checkpoint import Checkpointer
from cconv.experiments.config import from_dict, load_run
from cconv.experiments.runner import execute, initial_state

RUN_YAML = tiny_yaml(steps=200, checkpoint_every=1000)  # the only resume point is the one the signal makes


def _signal_after(
    args: list, metrics: str, sig: int, lines: int = 2, users_build: bool = False
) -> tuple[subprocess.CompletedProcess, int]:
    """Start ``cconv ARGS``, send ``sig`` once ``metrics`` has ``lines`` lines; (result, lines then)."""
    env = cli_env(users_build)
    p = subprocess.Popen([sys.executable, "-m", "cconv", *args], cwd=ROOT, env=env, stdout=PIPE, stderr=PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None and len(io.read_jsonl(metrics)) < lines:
        time.sleep(0.02)
    assert p.poll() is None, f"the run ended before it could be signalled: {p.communicate()[1][-2000:]}"
    seen = len(io.read_jsonl(metrics))
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out.decode(), err.decode()), seen


def _lines(d):
    return [{k: v for k, v in ln.items() if k != "wall_time"} for ln in io.read_jsonl(os.path.join(d, io.METRICS))]


def _final_state(cfg, d) -> list:
    """Every leaf of the run's last checkpointed state (params, optimizer, error feedback, keys)."""
    template = initial_state(build.problem(cfg))
    ck = Checkpointer(os.path.join(d, io.CHECKPOINTS))
    step, state, _ = ck.restore(template)
    ck.close()
    data = lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return [step] + [np.asarray(data(x)) for x in jax.tree.leaves(state)]


def _assert_same_state(a: list, b: list) -> None:
    assert a[0] == b[0] and len(a) == len(b)
    for i, (x, y) in enumerate(zip(a[1:], b[1:])):
        assert x.dtype == y.dtype and np.array_equal(x, y), f"leaf {i} differs"


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_exits_143_and_resumes_bit_identically(tmp_path):
    """Before: exit -15 (killed by the signal), no checkpoint, summary left ``running``."""
    spec = tmp_path / "run.yaml"
    spec.write_text(RUN_YAML)
    cfg = load_run(str(spec))
    ref, d = str(tmp_path / "ref"), str(tmp_path / "run")
    # every process builds as a user's does (runs_helpers.subprocess_env): the claim is about their bits
    r = run_cconv("run", str(spec), "--out", ref, users_build=True)  # the uninterrupted reference
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr[-2000:]
    r, seen = _signal_after(
        ["run", str(spec), "--out", d], os.path.join(d, io.METRICS), signal.SIGTERM, users_build=True
    )
    assert r.returncode == 143, r.stderr[-2000:]
    assert "SIGTERM" in r.stderr and "resume" in r.stderr and "Traceback" not in r.stderr
    s = io.read_summary(d)
    assert s["status"] == "interrupted" and s["signal"] == "SIGTERM" and s["error"] is None
    at = s["step"]
    assert 4 * seen <= at < 200  # the step reached when the signal came, not an earlier resume point
    assert Checkpointer(os.path.join(d, io.CHECKPOINTS)).all_steps() == [at]  # saved at that step
    assert [ln["step"] for ln in _lines(d)] == list(range(4, at + 1, 4))
    r = run_cconv("run", str(spec), "--out", d, users_build=True)
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr[-2000:]
    got, want = _lines(d), _lines(ref)
    assert [ln["step"] for ln in got] == list(range(4, 201, 4))  # each step once
    assert got == want  # loss, test metrics, bytes: equal floats
    _assert_same_state(_final_state(cfg, d), _final_state(cfg, ref))


@pytest.mark.slow
def test_sigint_stops_a_sweep_after_the_run_and_the_sweep_resumes(tmp_path):
    """Before: exit 130 with nothing saved, the run left ``running``."""
    spec = tmp_path / "s.yaml"
    base = "".join(f"  {line}\n" for line in RUN_YAML.splitlines())
    # two seeds: one step program for both runs (a grid over lr would compile a second one)
    spec.write_text(f"base:\n{base}grid:\n  seed: [0, 1]\n")
    out = tmp_path / "sw"
    first, second = out / "seed=0", out / "seed=1"
    r, _ = _signal_after(["sweep", str(spec), "--out", str(out)], str(first / io.METRICS), signal.SIGINT)
    assert r.returncode == 130, r.stderr[-2000:]
    s = io.read_summary(str(first))
    assert s["status"] == "interrupted" and s["signal"] == "SIGINT"
    assert Checkpointer(str(first / io.CHECKPOINTS)).all_steps() == [s["step"]]
    assert not second.exists()  # the sweep stopped after the interrupted run
    assert list(report.load_runs([str(first)])["status"]) == ["interrupted"]
    r = run_cconv("sweep", str(spec), "--out", str(out))
    assert r.returncode == 0 and "2 completed, 0 diverged, 0 failed, 0 already done" in r.stdout, r.stderr[-2000:]
    for d in (first, second):
        assert [ln["step"] for ln in _lines(str(d))] == list(range(4, 201, 4))
        assert io.read_summary(str(d))["status"] == "completed"


TINY = tiny(checkpoint_every=100)


def _signal_at(monkeypatch, problem, steps: dict) -> None:
    """The trainer's step sends itself ``steps[n]`` when called for the n-th time (1-based)."""
    step, calls = problem.trainer.step, [0]

    def signalling(*a):
        calls[0] += 1
        if calls[0] in steps:
            os.kill(os.getpid(), steps[calls[0]])
        return step(*a)

    monkeypatch.setattr(problem.trainer, "step", signalling)


@pytest.mark.slow
def test_a_signal_mid_interval_checkpoints_that_step_and_the_resume_loses_nothing(tmp_path, monkeypatch):
    """In-process (fast): SIGTERM during step 6 (between metric lines 4 and 8) stops at step 6 with
    the half-summed interval checkpointed; the resumed run equals an uninterrupted one."""
    cfg = from_dict(TINY)
    ref, d = str(tmp_path / "ref"), str(tmp_path / "run")
    assert execute(cfg, ref).status == "completed"
    problem = build.problem(cfg)
    _signal_at(monkeypatch, problem, {6: signal.SIGTERM})
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(signals.Interrupted) as e:
        execute(cfg, d, problem=problem)
    assert (e.value.step, e.value.exit_code) == (6, 143)
    assert io.read_summary(d)["status"] == "interrupted" and [ln["step"] for ln in _lines(d)] == [4]
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is gone with the run
    assert execute(cfg, d).status == "completed"
    assert _lines(d) == _lines(ref)
    _assert_same_state(_final_state(cfg, d), _final_state(cfg, ref))


@pytest.mark.extended
def test_a_second_signal_stops_at_once_and_the_previous_checkpoint_resumes(tmp_path, monkeypatch):
    """A second SIGINT while the first is handled stops without the step's checkpoint: the run
    resumes from the previous one (step 4), as after a SIGKILL."""
    cfg = from_dict({**TINY, "checkpoint_every": 4})
    d = str(tmp_path / "run")
    problem = build.problem(cfg)
    _signal_at(monkeypatch, problem, {6: signal.SIGINT, 7: signal.SIGINT})

    monkeypatch.setattr(signals, "pending", lambda: None)  # the loop has not yet acted on the first
    with pytest.raises(signals.Interrupted) as e:
        execute(cfg, d, problem=problem)
    assert e.value.step is None and e.value.exit_code == 130
    s = io.read_summary(d)
    assert s["status"] == "interrupted" and s["step"] == 4
    assert execute(cfg, d).status == "completed"
    assert [ln["step"] for ln in _lines(d)] == [4, 8, 12]
