"""``cconv.experiments.warm``: a run's programs built ahead (in another thread) are the ones the
run then calls: it traces none of them again, and trains exactly as an unwarmed run."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

RAW = dict(
    model={"name": "mlp", "hidden": [16]},
    data="digits",
    workers=4,
    batch_size=32,
    steps=6,
    lr=0.1,
    seed=[0, 1],
    log_every=2,
    launcher="vmap",
    compressor={"name": "topk", "ratio": 0.1},
    memory="ef",
    local_steps=2,
    checkpoint_every=100,
)


def _lines(d):
    with open(os.path.join(d, "metrics.jsonl")) as fh:
        rows = [json.loads(x) for x in fh]
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


SCRIPT = """
import json, os, sys, threading
from cconv.experiments import build as B, runner
from cconv.experiments.compiletime import CompileMeter
from cconv.experiments.config import from_dict
from cconv.experiments.warm import warm

cfg = from_dict(json.loads(sys.argv[2]), source="test")
out = sys.argv[1]
runner.execute(cfg, os.path.join(out, "cold"), problem=B.problem(cfg), nested=True)  # eager helpers built once
problem = B.problem(cfg)
with CompileMeter() as ahead:
    th = threading.Thread(target=lambda: warm(problem, cfg.steps))
    th.start()
    th.join()
with CompileMeter() as after:
    runner.execute(cfg, os.path.join(out, "warmed"), problem=problem, nested=True)
print(json.dumps({"ahead": ahead.traced, "after": after.traced}))
"""


def test_a_warmed_run_traces_no_step_or_evaluator_and_trains_the_same(tmp_path):
    # a fresh interpreter: JAX's configuration contexts are per thread, and one left open in the
    # test process's main thread by another test would make the main thread's programs differ
    # from the build thread's (warming is then wasted, never wrong)
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(RAW)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    traced = json.loads(res.stdout.strip().splitlines()[-1])
    assert traced["ahead"].count("run") == 2  # local SGD: a local and a sync phase
    assert "ev" in traced["ahead"]
    assert "run" not in traced["after"] and "ev" not in traced["after"], traced["after"]
    assert _lines(str(tmp_path / "warmed")) == _lines(str(tmp_path / "cold"))
