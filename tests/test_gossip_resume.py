"""A CHOCO-SGD run SIGKILLed right after a checkpoint resumes bit-identically: the public copies
x_hat, s and the compressor states are engine state (``WorkerState.sync``), checkpointed with the
rest."""

import os

import pytest
from runs_helpers import run_cconv

from cconv.experiments import io

pytestmark = pytest.mark.slow  # subprocesses and a real SIGKILL

CHOCO_YAML = (
    "model: {name: mlp, hidden: [8]}\ndata: digits\nworkers: 4\nbatch_size: 32\nsteps: 16\nlr: 0.1\n"
    "log_every: 4\ncheckpoint_every: 4\nsync: gossip\ngossip: choco\ngossip_gamma: 0.5\n"
    "topology: ring\ncompressor: {name: topk, ratio: 0.1}\n"
)
# cconv's main with the checkpoint of step 8 followed by SIGKILL
KILL_AFTER_CHECKPOINT_8 = """
import os, signal, sys
from cconv.experiments import checkpoint
save = checkpoint.Checkpointer.save
def dying(self, step, *a, **k):
    save(self, step, *a, **k)
    if step == 8:
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint.Checkpointer.save = dying
from cconv import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _cconv(*args, code=None):
    """``cconv ARGS`` built as a user's (XLA's defaults): the claim is about a user's bits."""
    return run_cconv(*args, code=code, users_build=True)


def _lines(d):
    return [{k: v for k, v in ln.items() if k != "wall_time"} for ln in io.read_jsonl(os.path.join(d, io.METRICS))]


def test_choco_sigkill_resume_is_bit_identical(tmp_path):
    cfg = tmp_path / "choco.yaml"
    cfg.write_text(CHOCO_YAML)
    ref, killed = str(tmp_path / "ref"), str(tmp_path / "killed")
    r = _cconv("run", str(cfg), "--out", ref)  # the uninterrupted reference, built as the others
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr
    r = _cconv("run", str(cfg), "--out", killed, code=KILL_AFTER_CHECKPOINT_8)
    assert r.returncode == -9, r.stderr
    assert [ln["step"] for ln in _lines(killed)] == [4, 8]
    r = _cconv("run", str(cfg), "--out", killed)
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr
    want, got = _lines(ref), _lines(killed)
    assert [ln["step"] for ln in got] == [4, 8, 12, 16]
    assert got == want  # loss, consensus_distance, test metrics, bytes: equal floats
    assert all(ln["consensus_distance"] > 0 for ln in got)
