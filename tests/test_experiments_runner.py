"""The run loop on real (tiny) training: results files, exact resume after an interruption,
vmapped seeds, divergence, simulated time, refusal to overwrite another run."""

import hashlib
import json
import math
import os
import time

import numpy as np
import pytest

from cconv.experiments import build, io
from cconv.experiments.config import ConfigError, from_dict
from cconv.experiments.runner import execute

# full training runs: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

TINY = {
    "model": {"name": "mlp", "hidden": [16]},
    "data": "digits",
    "workers": 4,
    "batch_size": 32,
    "steps": 30,
    "lr": 0.1,
    "compressor": {"name": "topk", "ratio": 0.1},
    "memory": "ef",
    "log_every": 5,
    "checkpoint_every": 10,
    "network": ["10GbE", "100GbIB"],
}


def lines(run_dir):
    return io.read_jsonl(os.path.join(run_dir, io.METRICS))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ref") / "run")
    res = execute(from_dict(TINY), d)
    return d, res


def test_run_directory_contents(reference):
    d, res = reference
    assert res.status == "completed"
    assert sorted(os.listdir(d)) == ["checkpoints", "config.yaml", "metrics.jsonl", "summary.json"]
    ls = lines(d)
    assert [l["step"] for l in ls] == [5, 10, 15, 20, 25, 30]
    for key in (
        "loss",
        "accuracy",
        "test_loss",
        "test_accuracy",
        "bytes_sent",
        "bytes_received",
        "cum_bytes",
        "sim_time",
        "sim_time@10GbE",
        "sim_time@100GbIB",
        "sim_step_time",
        "wall_time",
        "seed",
    ):
        assert key in ls[-1], key
    # cumulative traffic is the sum of the per-step traffic (one phase: constant per step)
    per_step = ls[0]["bytes_sent"] + ls[0]["bytes_received"]
    assert per_step > 0
    for l in ls:
        assert l["cum_bytes"] == pytest.approx(l["step"] * per_step)
        assert l["sim_time"] == pytest.approx(l["step"] * l["sim_step_time"])
        assert l["sim_time@10GbE"] > l["sim_time@100GbIB"] > 0
    assert ls[-1]["loss"] < ls[0]["loss"]
    s = io.read_summary(d)
    assert s["status"] == "completed" and s["error"] is None and s["step"] == 30
    assert s["final"]["step"] == 30 and s["calibration"]["compute_time"] > 0
    # the simulated step = measured compute + measured exchange + modelled communication
    cal = s["calibration"]
    local = cal["compute_time"] + sum(cal["exchange_time"].values())
    assert ls[-1]["sim_step_time@100GbIB"] > local


def test_interrupted_run_resumes_exactly(reference, tmp_path):
    ref_dir, _ = reference
    d = str(tmp_path / "run")
    cfg = from_dict(TINY)
    res = execute(cfg, d, stop_after=17)  # as if killed after step 17 (checkpoint: 10)
    assert res.status == "running"
    assert [l["step"] for l in lines(d)] == [5, 10, 15]
    with open(os.path.join(d, io.METRICS), "a") as fh:
        fh.write('{"step": 20, "loss": 0.')  # a torn line, as a kill mid-write leaves
    res = execute(cfg, d)
    assert res.status == "completed"
    got, want = lines(d), lines(ref_dir)
    assert [l["step"] for l in got] == [l["step"] for l in want]  # nothing lost, nothing twice
    for a, b in zip(got, want):
        for k in ("loss", "test_loss", "test_accuracy", "cum_bytes"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (a["step"], k)
        assert a["sim_time"] == pytest.approx(a["step"] * a["sim_step_time"])
    walls = [l["wall_time"] for l in got]
    assert walls == sorted(walls)
    # running the finished run again does nothing
    before = open(os.path.join(d, io.METRICS)).read()
    assert execute(cfg, d).status == "completed"
    assert open(os.path.join(d, io.METRICS)).read() == before


def test_vmapped_seeds_equal_separate_runs(tmp_path):
    base = {**TINY, "steps": 10, "network": None, "checkpoint_every": 100}
    multi = execute(from_dict({**base, "seed": [0, 1]}), str(tmp_path / "multi"))
    single = execute(from_dict({**base, "seed": 1}), str(tmp_path / "single"))
    assert multi.status == single.status == "completed"
    m = [l for l in lines(str(tmp_path / "multi")) if l["seed"] == 1]
    s = lines(str(tmp_path / "single"))
    assert [l["step"] for l in m] == [l["step"] for l in s] == [5, 10]
    for a, b in zip(m, s):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-6)
    m0 = [l["loss"] for l in lines(str(tmp_path / "multi")) if l["seed"] == 0]
    assert m0 != [l["loss"] for l in m]  # the seeds really differ
    assert set(multi.summary["per_seed"]) == {"0", "1"}


def test_divergence_is_a_result(tmp_path):
    cfg = from_dict({**TINY, "lr": 1e30, "compressor": "none", "memory": "none", "network": None, "steps": 40})
    res = execute(cfg, str(tmp_path / "run"))
    assert res.status == "diverged"
    s = io.read_summary(str(tmp_path / "run"))
    assert s["status"] == "diverged" and s["error"].startswith("seed 0: ")
    why = s["per_seed"]["0"]["diverged_why"]
    assert "non-finite loss" in why or "x the first step's" in why
    ls = lines(str(tmp_path / "run"))
    assert ls and ls[-1]["step"] < 40
    last = ls[-1]["loss"]
    assert last is None or last in ("inf", "-inf") or not math.isfinite(last) or last > 10 * ls[0]["loss"]


def test_a_finite_explosion_is_diverged(tmp_path):
    """A loss that grows geometrically but stays finite (gradient descent past 2/L on least squares)
    is ``diverged`` at the step it passes 10x the first step's, with the numbers in the summary."""
    from cconv.experiments.divergence import FACTOR

    raw = {**TINY, "data": "least_squares", "model": {"name": "linear"}, "lr": 3.0, "compressor": "none"}
    cfg = from_dict({**raw, "memory": "none", "network": None, "steps": 60, "log_every": 1})
    res = execute(cfg, str(tmp_path / "run"))
    ls = lines(str(tmp_path / "run"))
    losses = [ln["loss"] for ln in ls]
    assert all(math.isfinite(x) for x in losses)  # never overflowed: the old rule said 'completed'
    assert res.status == "diverged"
    s = io.read_summary(str(tmp_path / "run"))
    why = s["per_seed"]["0"]["diverged_why"]
    assert f"x the first step's {losses[0]:.4g}" in why
    assert losses[-1] > FACTOR * losses[0] >= max(losses[:-1])
    assert ls[-1]["step"] < 60
    json.dumps(s)


def test_other_config_in_run_dir_is_refused_untouched(reference):
    d, _ = reference
    digest = {
        f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
        for f in ("config.yaml", "metrics.jsonl", "summary.json")
    }
    other = from_dict({**TINY, "lr": 0.2})
    with pytest.raises(ConfigError, match="different config .*lr"):
        execute(other, d, problem=build.problem(other))
    assert digest == {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in digest}


def test_failure_is_recorded(tmp_path, monkeypatch):
    cfg = from_dict({**TINY, "network": None, "steps": 5})
    problem = build.problem(cfg)

    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(problem.trainer, "step", broken)
    with pytest.raises(RuntimeError):
        execute(cfg, str(tmp_path / "run"), problem=problem)
    s = io.read_summary(str(tmp_path / "run"))
    assert s["status"] == "failed" and s["error"] == "RuntimeError: disk on fire"
    assert not io.is_finished(str(tmp_path / "run"))
    np.testing.assert_equal(lines(str(tmp_path / "run")), [])


def wandb_records(path):
    """Payloads of a .wandb file: wandb's LevelDB-log framing (7-byte file header ':W&B' + magic +
    version; 32 KiB blocks of records with a 7-byte header crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    import struct
    import zlib

    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B"
    pos, block, out, parts = 7, 32768, [], []
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        data = raw[pos + 7 : pos + 7 + length]
        assert zlib.crc32(bytes([kind]) + data) & 0xFFFFFFFF == crc
        pos += 7 + length
        parts.append(data)
        if kind in (1, 4):  # FULL or LAST
            out.append(b"".join(parts))
            parts = []
    return out


def test_wandb_offline_with_bytes_axis(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[wandb]')")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline must be the default
    monkeypatch.setenv("WANDB_SILENT", "true")
    d = str(tmp_path / "run")
    cfg = from_dict({**TINY, "steps": 10, "network": None, "wandb": {"project": "cconv-test"}})
    assert execute(cfg, d).status == "completed"
    runs = [x for x in os.listdir(os.path.join(d, "wandb")) if x.startswith("offline-run-")]
    assert len(runs) == 1, os.listdir(os.path.join(d, "wandb"))
    # the run's records: a metric definition charting everything against cum_bytes
    from wandb.proto import wandb_internal_pb2

    path = [
        os.path.join(d, "wandb", runs[0], f)
        for f in os.listdir(os.path.join(d, "wandb", runs[0]))
        if f.endswith(".wandb")
    ][0]

    def records():
        out = []
        for data in wandb_records(path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            out.append(rec)
        return out

    # wandb's service process may still be writing the file when finish() returns on a loaded
    # machine: read until the run's exit record is there (bounded)
    deadline = time.monotonic() + 60
    recs = records()
    while not any(r.WhichOneof("record_type") == "exit" for r in recs) and time.monotonic() < deadline:
        time.sleep(0.5)
        recs = records()
    metrics, history, config = [], [], {}
    for rec in recs:
        kind = rec.WhichOneof("record_type")
        if kind == "metric":
            metrics.append((rec.metric.name, rec.metric.glob_name, rec.metric.step_metric))
        elif kind == "history":
            history.append(
                {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            )
        elif kind in ("config", "run"):
            items = rec.config.update if kind == "config" else rec.run.config.update
            config.update({item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in items})
    assert ("", "*", "cum_bytes") in metrics, metrics
    assert config["compressor"] == {"name": "topk", "ratio": 0.1} and config["batch_size"] == 32
    ours = lines(d)
    assert [h.get("step") for h in history] == [l["step"] for l in ours]
    assert [h["cum_bytes"] for h in history] == pytest.approx([l["cum_bytes"] for l in ours])
    assert [h["loss"] for h in history] == pytest.approx([l["loss"] for l in ours])


def test_engine_options_reach_the_engine(tmp_path):
    """gTop-k + DGC memory + density warm-up + clipping; then PS + local SGD: the config fields
    map onto the engine (bytes, density and simulated time follow the phases)."""
    base = {**TINY, "steps": 6, "log_every": 1, "checkpoint_every": 100, "network": None}
    cfg = from_dict(
        {
            **base,
            "architecture": "gtopk",
            "memory": "dgc",
            "clip": 1.0,
            "compressor": {"name": "topk", "ratio": 0.05},
            "warmup": {"densities": [0.5], "steps_per_stage": 3},
        }
    )
    assert execute(cfg, str(tmp_path / "gtopk")).status == "completed"
    ls = lines(str(tmp_path / "gtopk"))
    dens = [l["density"] for l in ls]
    assert dens[0] == dens[2] > dens[3] == dens[5]  # warm-up at 0.5, then the compressor's 0.05
    assert ls[0]["bytes_sent"] > ls[3]["bytes_sent"] > 0
    cfg = from_dict(
        {**base, "architecture": "ps", "memory": "none", "local_steps": 3, "compressor": "none", "network": "10GbE"}
    )
    assert execute(cfg, str(tmp_path / "ps")).status == "completed"
    ls = lines(str(tmp_path / "ps"))
    sent = [l["bytes_sent"] + l["bytes_received"] for l in ls]
    assert sent[0] == sent[1] == 0 and sent[2] > 0  # local steps communicate nothing
    assert ls[0]["sim_step_time"] < ls[2]["sim_step_time"]


def test_sweep_goes_on_after_divergence_and_failure(tmp_path, monkeypatch):
    from cconv.experiments import sweep

    spec = tmp_path / "s.yaml"
    spec.write_text(
        "base: {model: {name: mlp, hidden: [16]}, workers: 2, batch_size: 16, steps: 12, log_every: 4}\n"
        "grid: {lr: [1.0e+30, 0.5, 0.1]}\n"
    )
    real = build.problem

    def broken_at_lr_half(cfg):  # the lr=0.5 run breaks at its first step
        problem = real(cfg)
        if cfg.lr == 0.5:

            def broken(*a, **k):
                raise RuntimeError("broken step")

            problem.trainer.step = broken
        return problem

    monkeypatch.setattr(build, "problem", broken_at_lr_half)
    res = sweep.run_sweep(str(spec), str(tmp_path / "out"), figure=False, log=lambda *a, **k: None)
    assert (res["completed"], res["diverged"], res["failed"]) == (1, 1, 1)
    status = {
        n: io.read_summary(str(tmp_path / "out" / n))["status"]
        for n in os.listdir(tmp_path / "out")
        if n.startswith("lr=")
    }
    assert status == {"lr=1e+30": "diverged", "lr=0.5": "failed", "lr=0.1": "completed"}
    assert "RuntimeError: broken step" in res["errors"][0]
    # run again: finished runs are skipped, the failed one is retried (and now works)
    monkeypatch.setattr(build, "problem", real)
    res = sweep.run_sweep(str(spec), str(tmp_path / "out"), figure=False, log=lambda *a, **k: None)
    assert (res["completed"], res["skipped"], res["failed"]) == (1, 2, 0)


def test_a_sweep_builds_the_next_run_while_one_trains(tmp_path, monkeypatch):
    """``sweep.Ahead``: run i + 1's Problem is built (and its programs compiled) while run i trains,
    each run trains on the Problem built for its own config, and a build that fails ahead is left
    to the run (which builds again and reports it as usual)."""
    import threading

    from cconv.experiments import runner, sweep

    spec = tmp_path / "s.yaml"
    spec.write_text(
        "base: {model: {name: mlp, hidden: [16]}, workers: 2, batch_size: 16, steps: 8, log_every: 4}\n"
        "grid: {lr: [0.3, 0.2, 0.1]}\n"
    )
    built, started = {}, {lr: threading.Event() for lr in (0.3, 0.2, 0.1)}
    real_prepare, real_execute = sweep._prepare, runner.execute

    def prepare(cfg):
        started[cfg.lr].set()
        if cfg.lr == 0.1:
            raise RuntimeError("no build ahead")
        built[cfg.lr] = real_prepare(cfg)
        return built[cfg.lr]

    seen = {}

    def execute(cfg, run_dir, problem=None, **kw):
        nxt = {0.3: 0.2, 0.2: 0.1}.get(cfg.lr)
        seen[cfg.lr] = (problem, nxt is None or started[nxt].wait(60))  # the next build began first
        return real_execute(cfg, run_dir, problem=problem, **kw)

    monkeypatch.setattr(sweep, "_prepare", prepare)
    monkeypatch.setattr(runner, "execute", execute)
    res = sweep.run_sweep(str(spec), str(tmp_path / "out"), figure=False, log=lambda *a, **k: None)
    assert res["completed"] == 3
    assert seen[0.3][0] is built[0.3] and seen[0.2][0] is built[0.2] and seen[0.1][0] is None
    assert all(overlapped for _, overlapped in seen.values())
    assert seen[0.3][0].cfg.lr == 0.3 and seen[0.2][0].cfg.lr == 0.2


def test_a_metric_line_carries_the_window_mean_and_for_max_metrics_the_window_maximum():
    """``staleness_max`` of a line is the largest over its logged steps, not their mean."""
    from cconv.experiments import counters as CT

    counters = CT.Counters([0.0], [0.0], None, 0.0, [None], None, [{}], [0.0], [0.0])
    steps = [{"loss": v, "staleness_max": m} for v, m in ((1.0, 3.0), (2.0, 7.0), (3.0, 1.0), (4.0, 2.0))]
    ((i, done, acc),) = CT.accumulate(counters, None, list(enumerate(steps)), log_every=4, steps=4)
    line = CT.metric_line(counters, None, 0, i, done, acc, None, 0.0)
    assert line["loss"] == 2.5 and line["staleness_max"] == 7.0


def test_pause_and_resume_equal_one_uninterrupted_run(tmp_path):
    """``execute(pause_at=s)`` checkpoints at s and returns ``paused``; resumed (with the same
    problem object, as the advisor's race does) the run's metric lines equal an uninterrupted
    run's, and nothing before the pause is trained again."""
    from cconv.experiments import build

    cfg = from_dict({**TINY, "network": None, "steps": 24, "log_every": 4})
    whole = execute(cfg, str(tmp_path / "whole"))
    problem = build.problem(cfg)
    for s in (6, 13):
        res = execute(cfg, str(tmp_path / "paused"), problem=problem, pause_at=s)
        assert res.status == "paused" and res.summary["step"] == s
        assert io.read_summary(str(tmp_path / "paused"))["status"] == "paused"
    end = execute(cfg, str(tmp_path / "paused"), problem=problem)
    assert end.status == whole.status == "completed"
    a, b = lines(str(tmp_path / "whole")), lines(str(tmp_path / "paused"))
    assert [ln["step"] for ln in a] == [ln["step"] for ln in b]
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6) and x["test_accuracy"] == y["test_accuracy"]
