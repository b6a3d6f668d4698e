"""``cconv.experiments.warm``: a run's programs built ahead (in another thread) are the ones the
run then calls: it traces none of them again, and trains exactly as an unwarmed run."""

import json
import os
import threading

import pytest

from cconv.experiments import build as B
from cconv.experiments import runner
from cconv.experiments.compiletime import CompileMeter
from cconv.experiments.config import from_dict
from cconv.experiments.warm import warm

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


def test_a_warmed_run_traces_no_step_or_evaluator_and_trains_the_same(tmp_path):
    cfg = from_dict(RAW, source="test")
    cold = str(tmp_path / "cold")
    runner.execute(cfg, cold, problem=B.problem(cfg), nested=True)  # eager helpers built once
    problem = B.problem(cfg)
    with CompileMeter() as ahead:
        th = threading.Thread(target=lambda: warm(problem, cfg.steps))
        th.start()
        th.join()
    assert ahead.traced.count("run") == 2  # local SGD: a local and a sync phase
    assert "ev" in ahead.traced
    warmed = str(tmp_path / "warmed")
    with CompileMeter() as after:
        runner.execute(cfg, warmed, problem=problem, nested=True)
    assert "run" not in after.traced and "ev" not in after.traced, after.traced
    assert _lines(warmed) == _lines(cold)
