"""Reports and figures from result directories (metric files written here by hand)."""

import math
import os

import pytest

from cconv.experiments import io, plotting, report
from cconv.experiments.config import from_dict, to_yaml


def make_run(root, name, cfg, losses, per_step_bytes, status="completed", seeds=(0,)):
    d = os.path.join(root, name)
    os.makedirs(d)
    io.atomic_write_text(os.path.join(d, io.CONFIG), to_yaml(from_dict(cfg)))
    with io.JsonlWriter(os.path.join(d, io.METRICS)) as w:
        for seed in seeds:
            for i, loss in enumerate(losses):
                step = 10 * (i + 1)
                w.write(
                    {
                        "step": step,
                        "seed": seed,
                        "loss": loss + 0.01 * seed,
                        "test_accuracy": 1 - loss / 3,
                        "cum_bytes": step * per_step_bytes,
                        "sim_time@10GbE": step * 1e-3,
                        "sim_time": step * 1e-3,
                        "wall_time": step * 0.01,
                    }
                )
    io.write_json(os.path.join(d, io.SUMMARY), {"status": status, "error": None})
    return d


@pytest.fixture
def sweep(tmp_path):
    root = str(tmp_path / "sweep")
    base = {"workers": 2, "batch_size": 8, "target_loss": 0.5}
    make_run(root, "dense", {**base}, [2.0, 1.0, 0.4, 0.3], 1000.0)
    for r in (0.01, 0.1):
        for mem in ("none", "ef"):
            slow = 0.2 if mem == "none" else 0.0
            make_run(
                root,
                f"topk{r}{mem}",
                {**base, "compressor": {"name": "topk", "ratio": r}, "memory": mem},
                [2.0, 1.2, 0.6 + slow, 0.45 + slow],
                1000.0 * 2 * r,
                seeds=(0, 1),
            )
    make_run(
        root,
        "sign",
        {**base, "compressor": "signsgd", "memory": "ef"},
        [2.0, 1.5, 1.2, 1.0],
        1000 / 32.0,
        status="diverged",
    )
    return root


def test_load_runs_bytes_to_target(sweep):
    df = report.load_runs([sweep])
    assert len(df) == 1 + 4 * 2 + 1  # one row per (run, seed)
    dense = df[df["run"] == "dense"].iloc[0]
    assert dense["bytes_to_target"] == 30 * 1000.0 and dense["steps_to_target"] == 30
    assert dense["time_to_target"] == pytest.approx(0.03)
    ef = df[(df["run"] == "topk0.1ef") & (df["seed"] == 0)].iloc[0]
    assert ef["bytes_to_target"] == pytest.approx(40 * 200.0) and ef["compressor"] == "topk" and ef["ratio"] == 0.1
    assert math.isnan(df[df["run"] == "topk0.1none"].iloc[0]["bytes_to_target"])  # never reached
    assert df[df["run"] == "sign"].iloc[0]["status"] == "diverged"
    # an explicit target and an accuracy metric (reached when >= target)
    acc = report.load_runs([sweep], target=0.8, metric="test_accuracy")
    assert acc[acc["run"] == "dense"].iloc[0]["steps_to_target"] == 30
    text = report.format_table(df)
    assert "bytes_to_target" in text and "dense" in text


def test_load_metrics_has_config_columns(sweep):
    df = report.load_metrics([os.path.join(sweep, "dense"), os.path.join(sweep, "sign")])
    assert set(df["run"]) == {"dense", "sign"} and len(df) == 8
    assert {"compressor", "memory", "ratio", "cfg.workers", "cfg.compressor.name"} <= set(df.columns)
    with pytest.raises(ValueError, match="no such results directory"):
        report.find_runs([sweep + "_missing"])
    os.makedirs(sweep + "_empty")
    with pytest.raises(ValueError, match="no cconv runs"):
        report.find_runs([sweep + "_empty"])


def test_figures_are_written(sweep, tmp_path):
    df = report.load_metrics([sweep])
    outs = plotting.family_grid(df, x="bytes", y="loss", out=str(tmp_path / "grid.png"))
    assert outs == [str(tmp_path / "grid.png"), str(tmp_path / "grid.pdf")]
    outs += plotting.curves(df, x="time", y="test_accuracy", network="10GbE", out=str(tmp_path / "c.png"))
    outs += plotting.ratio_summary(report.load_runs([sweep]), out=str(tmp_path / "ratio.png"))
    for o in outs:
        assert os.path.getsize(o) > 1000
    with pytest.raises(ValueError, match="available: 10GbE"):
        plotting.curves(df, x="time", network="100GbIB", out=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="valid: bytes, bytes_encoded, steps, time"):
        plotting.curves(df, x="epochs", out=str(tmp_path / "x.png"))
