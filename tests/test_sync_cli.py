"""Synchronization modes from the command line: SIGKILL right after a checkpoint, then the same
command, gives the uninterrupted run's metrics bit for bit (SSP and ASP replay the timing
schedule, AdaComm's period is in the checkpoint); bad input is one line, exit 2, nothing written."""

import pytest
from runs_helpers import run_cconv

from cconv.experiments import io

BASE = (
    "model: {name: mlp, hidden: [8]}\ndata: digits\nworkers: 4\nbatch_size: 32\nsteps: 12\nlr: 0.05\n"
    "compressor: {name: topk, ratio: 0.1}\nmemory: ef\nlog_every: 4\ncheckpoint_every: 4\n"
    "stragglers: {fraction: 0.25, slowdown: 4}\njitter: 0.3\n"
)
MODES = {
    "ssp": "sync: ssp\nstaleness: 2\n",
    "asp": "sync: asp\narchitecture: parameter-server\n",
    "adacomm": "local_steps: adaptive\nlocal_steps_init: 3\nadapt_every: 3\n",
}
# cconv's main, SIGKILLed right after the checkpoint of step 8 is saved
KILL_AFTER_CHECKPOINT_8 = """
import os, signal, sys
from cconv.experiments import runstate
save = runstate.save
def dying(problem, ckpt, step, state, counters):
    save(problem, ckpt, step, state, counters)
    if step == 8:
        os.kill(os.getpid(), signal.SIGKILL)
runstate.save = dying
from cconv import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def cconv(*args, code=None):
    """``cconv ARGS`` built as a user's (XLA's defaults): the resume's bit-identity is a claim about a user's build."""
    return run_cconv(*args, code=code, timeout=600, users_build=True)


@pytest.mark.parametrize(
    "mode",  # CI: asp (CHOCO's resume: tests/test_gossip_resume.py); ssp and adacomm are extended
    [pytest.param(m, marks=[pytest.mark.extended] if m in ("adacomm", "ssp") else []) for m in MODES],
)
@pytest.mark.slow  # real subprocesses
def test_sigkill_and_resume_is_bit_identical(mode, tmp_path):
    spec = tmp_path / "run.yaml"
    spec.write_text(BASE + MODES[mode])
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    r = cconv("run", str(spec), "--out", str(ref))
    assert r.returncode == 0, r.stderr
    k = cconv("run", str(spec), "--out", str(killed), code=KILL_AFTER_CHECKPOINT_8)
    assert k.returncode == -9, k.stderr
    assert [line["step"] for line in io.read_jsonl(str(killed / io.METRICS))] == [4, 8]
    again = cconv("run", str(spec), "--out", str(killed))
    assert again.returncode == 0, again.stderr
    want, got = io.read_jsonl(str(ref / io.METRICS)), io.read_jsonl(str(killed / io.METRICS))
    assert [line["step"] for line in got] == [4, 8, 12]
    keep = lambda line: {k: v for k, v in line.items() if k != "wall_time" and not k.startswith("sim_")}
    for a, b in zip(want, got):  # simulated times rest on each process's own measured compute time
        assert keep(a) == keep(b)
    if mode != "adacomm":
        assert want[-1]["staleness_max"] > 0


BAD = [
    ("sync: ssp\nstaleness: -1\n", "staleness"),
    ("sync: ssp\nstaleness: 2\nlocal_steps: 4\n", "local SGD"),
    ("sync: asp\n", "parameter-server"),
    ("stragglers: {fraction: 1.0, slowdown: 4}\n", "fraction"),
    ("stragglers: {fraction: 0.25, slowdown: 0.5}\n", "slowdown"),
    ("stragglers: [0.25, 4]\n", "stragglers"),
    ("jitter: -1\n", "jitter"),
    ("worker_speeds: [1, 2]\n", "worker_speeds"),
    ("sync: gossipy\n", "sync"),
    ("local_steps: sometimes\n", "local_steps"),
    ("local_steps: adaptive\npost_local_switch: 3\n", "post_local_switch"),
]


def with_keys(extra: str) -> str:
    """BASE with the top-level keys of ``extra`` replaced (a config may not repeat a key)."""
    keys = {line.split(":")[0] for line in extra.splitlines() if line and not line.startswith(" ")}
    kept = [line for line in BASE.splitlines() if line.split(":")[0] not in keys]
    return "\n".join(kept) + "\n" + extra


@pytest.mark.parametrize("extra, match", BAD)
def test_bad_sync_input_is_one_line_exit_2_nothing_written(extra, match, tmp_path):
    """In-process (``cli.main``), as tests/test_config_mutations.py; one real subprocess below."""
    import contextlib
    import io as sio

    from cconv import cli

    spec = tmp_path / "run.yaml"
    spec.write_text(with_keys(extra))
    out, err = tmp_path / "out", sio.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["run", str(spec), "--out", str(out)])
    line = err.getvalue().strip()
    assert rc == 2 and line.startswith("cconv: error:") and match in line and "\n" not in line, line
    assert not out.exists()


@pytest.mark.extended  # CI: the 11 refusals in-process above, and a real process's refusal before jax
# starts in tests/test_cli.py::test_bad_input_in_a_real_process (the same cli.main path)
def test_bad_sync_input_from_the_shell(tmp_path):
    spec = tmp_path / "run.yaml"
    spec.write_text(BASE + BAD[0][0])
    r = cconv("run", str(spec), "--out", str(tmp_path / "out"))
    assert (
        r.returncode == 2 and r.stderr.strip().startswith("cconv: error:") and len(r.stderr.strip().splitlines()) == 1
    )
    assert not (tmp_path / "out").exists()
