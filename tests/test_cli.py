"""The command line as a user drives it: subprocesses, a SIGKILL in the middle of a sweep, bad input."""

import hashlib
import io as _io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from runs_helpers import subprocess_env

from cconv import cli
from cconv.experiments import io

pytestmark = pytest.mark.slow  # CLI end-to-end runs in subprocesses; not in the fast subset (-m 'not slow')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SWEEP = """
name: tiny
base:
  model: {name: mlp, hidden: [8]}
  data: digits
  workers: 2
  batch_size: 16
  steps: 240
  lr: 0.1
  log_every: 8
  checkpoint_every: 24
  network: 10GbE
grid:
  compressor: [{name: topk, ratio: 0.1}, signsgd]
  memory: [ef]
"""
RUN_NAMES = ["compressor=topk-ratio0.1,memory=ef", "compressor=signsgd,memory=ef"]


def cconv(*args, cwd=None, **kw):
    env = subprocess_env()  # the CLI sets the device count
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0")
    return subprocess.run(
        [sys.executable, "-m", "cconv", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        **kw,
    )


def in_process(capsys, *args):
    """``cli.main(ARGS)`` in this process (what ``python -m cconv`` calls): (exit code, stdout,
    stderr).  For the commands after a test's first real process of the same kind: the process
    start and the imports (~3-4 s of CPU each) are what a subprocess would add."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def popen(*args):
    env = subprocess_env()
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0")
    return subprocess.Popen(
        [sys.executable, "-m", "cconv", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def digest(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """A reference sweep, and the same sweep SIGKILLed mid-run and then run again."""
    tmp = tmp_path_factory.mktemp("cli")
    spec = tmp / "tiny.yaml"
    spec.write_text(SWEEP)
    ref = tmp / "ref"
    r = cconv("sweep", str(spec), "--out", str(ref))
    assert r.returncode == 0, r.stderr
    killed = tmp / "killed"
    p = popen("sweep", str(spec), "--out", str(killed))
    second = killed / RUN_NAMES[1] / io.METRICS
    deadline = time.time() + 200
    # kill while the second run is between checkpoints: the first is finished, the second has
    # written metric lines beyond a checkpoint
    while time.time() < deadline and p.poll() is None:
        if len(io.read_jsonl(str(second))) >= 4:
            break
        time.sleep(0.02)
    assert p.poll() is None, "the sweep finished before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    state_at_kill = {
        "lines": [l["step"] for l in io.read_jsonl(str(second))],
        "first_finished": io.is_finished(str(killed / RUN_NAMES[0])),
        "second_finished": io.is_finished(str(killed / RUN_NAMES[1])),
    }
    first_digest = digest(killed / RUN_NAMES[0])
    again = cconv("sweep", str(spec), "--out", str(killed))
    return {
        "spec": spec,
        "ref": ref,
        "killed": killed,
        "ref_out": r,
        "again": again,
        "at_kill": state_at_kill,
        "first_digest": first_digest,
    }


def test_sigkill_then_same_command_loses_and_duplicates_nothing(sweeps, capsys):
    at_kill = sweeps["at_kill"]
    assert at_kill["first_finished"] and not at_kill["second_finished"] and len(at_kill["lines"]) >= 4
    again = sweeps["again"]
    assert again.returncode == 0, again.stderr
    assert "1 completed, 0 diverged, 0 failed, 1 already done" in again.stdout
    # the finished run was skipped, not touched
    assert digest(sweeps["killed"] / RUN_NAMES[0]) == sweeps["first_digest"]
    for name in RUN_NAMES:
        got = io.read_jsonl(str(sweeps["killed"] / name / io.METRICS))
        want = io.read_jsonl(str(sweeps["ref"] / name / io.METRICS))
        assert [l["step"] for l in got] == [l["step"] for l in want] == list(range(8, 241, 8))
        for a, b in zip(got, want):
            for k in ("loss", "test_loss", "test_accuracy", "cum_bytes", "cum_bytes_sent"):
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (name, a["step"], k)
        assert io.read_summary(str(sweeps["killed"] / name))["status"] == "completed"
    # a third time (in-process): nothing left to do
    code, out, _ = in_process(capsys, "sweep", sweeps["spec"], "--out", sweeps["killed"])
    assert code == 0 and "0 completed, 0 diverged, 0 failed, 2 already done" in out


def test_sweep_outputs_report_and_plot(sweeps, tmp_path, capsys):
    """``report --csv -`` in a real process; the other report and plot commands in-process."""
    ref = sweeps["ref"]
    out = sweeps["ref_out"].stdout
    assert "2 completed" in out and "convergence_vs_traffic.png" in out
    for f in ("report.csv", "convergence_vs_traffic.png", "convergence_vs_traffic.pdf", "sweep.json"):
        assert os.path.getsize(ref / f) > 0, f
    r = cconv("report", str(ref), "--target", "1.5", "--csv", "-")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(_io.StringIO(r.stdout))
    assert sorted(df["run"]) == sorted(RUN_NAMES)
    assert set(df["status"]) == {"completed"} and (df["step"] == 240).all()
    for _, row in df.iterrows():
        metrics = io.read_jsonl(str(ref / row["run"] / io.METRICS))
        first = next(l for l in metrics if l["loss"] <= 1.5)
        assert row["bytes_to_target"] == pytest.approx(first["cum_bytes"])
        assert row["steps_to_target"] == first["step"]
        assert row["cum_bytes"] == pytest.approx(metrics[-1]["cum_bytes"])
    code, table, _ = in_process(capsys, "report", ref)
    assert code == 0 and "bytes_to_target" not in table and "--target" in table
    for x, panels in (("bytes", "single"), ("steps", "family"), ("time", "single")):
        target = tmp_path / f"p_{x}.png"
        code, _, err = in_process(
            capsys, "plot", ref, "--x", x, "--y", "test_accuracy", "--panels", panels, "--out", target
        )
        assert code == 0, err
        assert target.stat().st_size > 0 and (tmp_path / f"p_{x}.pdf").stat().st_size > 0
    code, _, err = in_process(capsys, "plot", ref, "--x", "time", "--network", "100GbIB", "--out", tmp_path / "x.png")
    assert code == 2 and "available: 10GbE" in err


def test_run_command_and_rerun(tmp_path, capsys):
    """The first run and the resume in real processes; the rerun and the refusals in-process."""
    cfg = tmp_path / "one.yaml"
    cfg.write_text(
        "model: {name: linear}\nworkers: 4\nbatch_size: 32\nsteps: 12\nlog_every: 4\n"
        "compressor: {name: qsgd, levels: 4}\n"
    )
    out = tmp_path / "run"
    r = cconv("run", str(cfg), "--out", str(out), "--set", "lr=0.05", "--set", "memory=ef")
    assert r.returncode == 0, r.stderr
    assert "completed" in r.stdout and "loss=" in r.stdout
    assert "lr: 0.05" in (out / "config.yaml").read_text() and "memory: ef" in (out / "config.yaml").read_text()
    before = digest(out)
    code, stdout, _ = in_process(capsys, "run", cfg, "--out", out, "--set", "lr=0.05", "--set", "memory=ef")
    assert code == 0 and "already completed" in stdout and digest(out) == before
    # a different config into the same directory: refused, nothing touched
    code, _, err = in_process(capsys, "run", cfg, "--out", out, "--set", "lr=0.5")
    assert code == 2 and "different config" in err and "Traceback" not in err
    assert digest(out) == before
    # an interrupted run: another config is refused untouched, the same one resumes and finishes
    from cconv.experiments.config import load_run
    from cconv.experiments.runner import execute

    part = tmp_path / "part"
    execute(load_run(str(cfg), ["checkpoint_every=4"]), str(part), stop_after=6)
    assert io.read_summary(str(part))["status"] == "running"
    before = digest(part)
    code, _, err = in_process(capsys, "run", cfg, "--out", part, "--set", "checkpoint_every=4", "--set", "lr=0.5")
    assert code == 2 and "different config" in err and digest(part) == before
    r = cconv("run", str(cfg), "--out", str(part), "--set", "checkpoint_every=4")
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr
    assert [l["step"] for l in io.read_jsonl(str(part / io.METRICS))] == [4, 8, 12]


BAD = {
    "malformed_yaml": ("model: mlp\ncompressor: {name: topk, ratio: [0.1\n", [], "malformed YAML"),
    "unknown_key": ("model: mlp\nlearnin_rate: 0.1\n", [], "unknown config key(s) learnin_rate; valid keys:"),
    "unknown_compressor": ("compressor: topkk\n", [], "unknown compressor 'topkk'; valid names:"),
    "ratio_out_of_range": ("compressor: {name: topk, ratio: 2.0}\n", [], "ratio must be in (0, 1]"),
    "workers_batch": ("workers: 3\nbatch_size: 64\n", [], "not divisible by workers 3"),
    "missing_data_dir": ("data: {name: mnist, root: /nonexistent/cconv-data}\n", [], "/nonexistent/cconv-data"),
    "unknown_override": ("model: mlp\n", ["--set", "compresor.ratio=0.1"], "unknown config key 'compresor'"),
}


def _refused(case, tmp_path, run) -> None:
    """``run(argv) -> (exit code, stderr)`` on the BAD config ``case``: exit 2, one line, no
    traceback, nothing written."""
    text, extra, fragment = BAD[case]
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    out = tmp_path / "out"
    code, err = run(["run", str(cfg), "--out", str(out), *extra])
    err = err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("cconv: error: "), err
    assert fragment in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_one_line_no_traceback_nothing_written(case, tmp_path, capsys):
    """In-process (``cli.main``, what ``python -m cconv`` calls): the refusal happens before jax
    runs anything.  The same path in a real process: ``test_unwritable_output_dir`` and
    ``test_bad_input_in_a_real_process``."""
    _refused(case, tmp_path, lambda argv: (cli.main(argv), capsys.readouterr().err))


def test_bad_input_in_a_real_process(tmp_path):
    def run(argv):
        r = cconv(*argv)
        return r.returncode, r.stderr

    _refused("unknown_override", tmp_path, run)


def test_unwritable_output_dir(tmp_path, capsys):
    """``run`` in a real process, ``sweep`` in-process."""
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("model: {name: linear}\nworkers: 2\nbatch_size: 8\nsteps: 2\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    r = cconv("run", str(cfg), "--out", str(blocker / "out"))
    assert r.returncode == 2 and "not writable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert blocker.read_text() == "not a directory"
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {model: {name: linear}, workers: 2, batch_size: 8, steps: 2}\ngrid: {lr: [0.1]}\n")
    code, _, err = in_process(capsys, "sweep", spec, "--out", blocker / "sweep")
    assert code == 2 and "not writable" in err


def test_debug_shows_traceback(tmp_path):
    """In-process: with --debug the error leaves ``cli.main`` as the exception itself (the
    interpreter then prints its traceback and exits 1), not as the one-line message."""
    from cconv.experiments.config import ConfigError

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError):
        cli.main(["run", str(cfg), "--debug"])


@pytest.mark.parametrize("command", ["run", "sweep", "plot", "report", "doctor", "advise", "plan"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: cconv {command}")
    if command == "run":
        assert "compressor" in text and "batch_size" in text and "network" in text


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    for c in ("run", "sweep", "plot", "report", "doctor", "advise", "plan"):
        assert c in text


def test_device_flag_is_set_before_jax_starts():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    code = textwrap.dedent("""
        import os
        from cconv import cli
        cli.configure_devices(6)
        import jax
        print(os.environ["XLA_FLAGS"], jax.device_count())
    """)
    r = subprocess.run(
        [sys.executable, "-c", code], env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["--xla_force_host_platform_device_count=6", "6"]


USER_MODULE = '''
"""User code named by import path in a config (not registered with cconv)."""
import numpy as np

import cconv.compressors as C
from cconv.data import Dataset
from cconv.models import MLP


def toy(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    return Dataset({"x": x[:64], "y": y[:64]}, {"x": x[64:], "y": y[64:]}, 2, (4,), "classification",
                   {"name": "toy"})


def tiny_mlp(input_shape, num_classes, *, rngs, width=8):
    return MLP(input_shape, num_classes, rngs=rngs, hidden=(width,))


def half_topk(fraction=0.5):
    return C.get("topk", ratio=fraction)
'''


def test_import_paths_for_compressor_model_and_data(tmp_path, monkeypatch, capsys):
    """In-process (the user's module on sys.path, as PYTHONPATH puts it there for a process):
    the run trains with the user's model, data and compressor; bad paths are refused."""
    (tmp_path / "cconv_user_ext.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cconv_user_ext", raising=False)
    cfg = tmp_path / "user.yaml"
    cfg.write_text(
        "model: {name: 'cconv_user_ext:tiny_mlp', width: 8}\n"
        "data: {name: 'cconv_user_ext:toy', n: 96}\n"
        "compressor: {name: 'cconv_user_ext:half_topk', fraction: 0.25}\n"
        "memory: ef\nworkers: 2\nbatch_size: 8\nsteps: 4\nlog_every: 2\n"
    )
    out = tmp_path / "out"
    code, stdout, err = in_process(capsys, "run", cfg, "--out", out)
    assert code == 0 and "completed" in stdout, err
    lines = io.read_jsonl(str(out / io.METRICS))
    assert [l["step"] for l in lines] == [2, 4]
    # top-k of a 4x8 + 8 + 8x2 + 2 MLP at ratio 0.25: fewer bytes than dense fp32 (58 floats)
    assert 0 < lines[0]["bytes_sent"] < 58 * 4
    # the bad paths: refused before jax runs
    for key, bad, fragment in (
        ("model", "cconv_user_ext:nope", "model 'cconv_user_ext:nope': cannot import"),
        ("data", "no_such_module_xyz:toy", "dataset 'no_such_module_xyz:toy': cannot import"),
        ("compressor", "cconv_user_ext:nope", "compressor 'cconv_user_ext:nope': cannot import"),
    ):
        bad_out = tmp_path / f"bad_{key}"
        code = cli.main(["run", str(cfg), "--out", str(bad_out), "--set", f"{key}.name={bad}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err
        assert not bad_out.exists()
