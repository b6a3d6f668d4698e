"""Metric writers (cconv.experiments.writers): metrics.jsonl through the MetricWriter interface,
TensorBoard event files written and read back (tensorboard's EventAccumulator), fan-out, and a
run with ``tensorboard: true`` whose event files hold the metric lines of metrics.jsonl."""

import json
import os

import pytest

from cconv.experiments import io, writers


def _accumulator(path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return acc


def _scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_jsonl_writer_lines_are_step_then_scalars_and_written_on_flush(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    w = writers.JsonlWriter(path)
    w.write_scalars(5, {"seed": 0, "loss": 1.5, "cum_bytes": 100.0})
    w.write_scalars(5, {"seed": 1, "loss": float("nan")})
    assert os.path.getsize(path) == 0  # buffered until flush: one write (and fsync) per batch
    w.flush()
    w.write_scalars(10, {"seed": 0, "loss": 1.0})
    w.close()  # close flushes
    lines = open(path).read().splitlines()
    assert lines[0] == io.dumps({"step": 5, "seed": 0, "loss": 1.5, "cum_bytes": 100.0})
    assert json.loads(lines[1]) == {"step": 5, "seed": 1, "loss": None}  # NaN -> null, as before
    assert json.loads(lines[2]) == {"step": 10, "seed": 0, "loss": 1.0}


def test_write_lines_is_the_runner_unit(tmp_path):
    path = str(tmp_path / "m.jsonl")
    w = writers.JsonlWriter(path)
    lines = [{"step": 3, "seed": 0, "loss": 2.0}, {"step": 3, "seed": 7, "loss": 3.0}]
    writers.write_lines(w, lines)
    assert io.read_jsonl(path) == lines  # on disk once write_lines returns
    w.close()


def test_tensorboard_files_are_read_back(tmp_path):
    pytest.importorskip("tensorboardX")
    logdir = str(tmp_path / "tb")
    w = writers.TensorBoardWriter(logdir)
    for step in (5, 10, 15):
        for seed in (0, 3):
            w.write_scalars(step, {"seed": seed, "loss": step + seed / 10, "cum_bytes": 1000.0 * step, "note": "x"})
    w.close()
    assert sorted(os.listdir(logdir)) == ["seed_0", "seed_3"]  # one TensorBoard run per seed
    acc = _accumulator(os.path.join(logdir, "seed_3"))
    assert sorted(acc.Tags()["scalars"]) == ["cum_bytes", "loss"]  # numbers only; the seed is the run
    assert _scalars(acc, "loss") == [(5, pytest.approx(5.3)), (10, pytest.approx(10.3)), (15, pytest.approx(15.3))]
    assert _scalars(acc, "cum_bytes") == [(5, 5000.0), (10, 10000.0), (15, 15000.0)]


def test_tensorboard_resume_purges_the_lost_steps(tmp_path):
    """A resumed run restarts at its checkpoint: events the killed process wrote past it are hidden
    (purge_step), as metrics.jsonl is cut back."""
    pytest.importorskip("tensorboardX")
    logdir = str(tmp_path / "tb")
    w = writers.TensorBoardWriter(logdir)
    for step in (5, 10, 15, 20):
        w.write_scalars(step, {"seed": 0, "loss": 1.0})
    w.close()
    w = writers.TensorBoardWriter(logdir, start=10)
    for step in (15, 20):
        w.write_scalars(step, {"seed": 0, "loss": 2.0})
    w.close()
    assert _scalars(_accumulator(os.path.join(logdir, "seed_0")), "loss") == [
        (5, 1.0),
        (10, 1.0),
        (15, 2.0),
        (20, 2.0),
    ]


class _Recorder:
    def __init__(self, fail_close=False):
        self.calls, self.fail_close = [], fail_close

    def write_scalars(self, step, scalars):
        self.calls.append(("scalars", step, dict(scalars)))

    def write_summary(self, summary):
        self.calls.append(("summary", dict(summary)))

    def flush(self):
        self.calls.append(("flush",))

    def close(self, failed=False):
        self.calls.append(("close", failed))
        if self.fail_close:
            raise OSError("disk full")


def test_multiwriter_fans_out_and_closes_every_writer():
    a, b = _Recorder(fail_close=True), _Recorder()
    m = writers.MultiWriter([a, b])
    writers.write_lines(m, [{"step": 1, "seed": 0, "loss": 0.5}])
    m.write_summary({"status": "completed"})
    with pytest.raises(OSError, match="disk full"):
        m.close(failed=True)
    expected = [("scalars", 1, {"seed": 0, "loss": 0.5}), ("flush",), ("summary", {"status": "completed"})]
    assert a.calls == expected + [("close", True)] and b.calls == a.calls  # b closed although a failed


def test_unavailable_backend_is_one_line(monkeypatch):
    monkeypatch.setitem(writers.BACKENDS, "tensorboard", ("cconv_no_such_module", "pip install 'cconv[tensorboard]'"))
    writers.check_available(tensorboard=False, wandb=False)  # not requested: not checked
    with pytest.raises(ValueError) as e:
        writers.check_available(tensorboard=True)
    msg = str(e.value)
    assert "\n" not in msg and "cconv_no_such_module is not installed" in msg and "tensorboard: false" in msg
    with pytest.raises(ValueError, match="unknown metric writer 'csv'"):
        writers.check_available(csv=True)


@pytest.mark.slow
def test_run_with_tensorboard_mirrors_metrics_jsonl(tmp_path):
    """A run with ``tensorboard: true`` (two seeds, one program), stopped after step 5 and resumed
    from its checkpoint at step 3: each seed's event files hold exactly its metric lines (same
    steps, no duplicates of the recomputed steps 4-5, same values to float32); metrics.jsonl is
    what the same run without TensorBoard writes."""
    pytest.importorskip("tensorboardX")
    from cconv.experiments.config import from_dict
    from cconv.experiments.runner import execute

    raw = {
        "model": {"name": "mlp", "hidden": [8]},
        "workers": 2,
        "batch_size": 16,
        "steps": 6,
        "compressor": {"name": "topk", "ratio": 0.1},
        "memory": "ef",
        "log_every": 1,
        "checkpoint_every": 3,
        "seed": [0, 1],
    }
    d = str(tmp_path / "run")
    assert execute(from_dict({**raw, "tensorboard": True}), d, stop_after=5).status == "running"
    assert execute(from_dict({**raw, "tensorboard": True}), d).status == "completed"
    lines = io.read_jsonl(os.path.join(d, io.METRICS))
    assert sorted(os.listdir(os.path.join(d, "tensorboard"))) == ["seed_0", "seed_1"]
    for seed in (0, 1):
        acc = _accumulator(os.path.join(d, "tensorboard", f"seed_{seed}"))
        mine = [x for x in lines if x["seed"] == seed]
        assert [x["step"] for x in mine] == [1, 2, 3, 4, 5, 6]
        for tag in ("loss", "test_loss", "cum_bytes", "bytes_sent", "wall_time"):
            assert _scalars(acc, tag) == [(x["step"], pytest.approx(x[tag], rel=1e-6)) for x in mine], tag
    plain = str(tmp_path / "plain")  # the same run without TensorBoard writes the same metric lines
    assert execute(from_dict(raw), plain).status == "completed"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]
    assert strip(io.read_jsonl(os.path.join(plain, io.METRICS))) == strip(lines)
    assert not os.path.exists(os.path.join(plain, "tensorboard"))
