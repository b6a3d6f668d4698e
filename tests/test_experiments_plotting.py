"""Plot labels, knobs and the baseline family come from the compressor registry; legend labels name
the settings that vary between runs; seed bands."""

import math

import numpy as np
import pandas as pd
import pytest

from cconv import compressors as C
from cconv.experiments import plotting


def test_labels_and_knobs_from_entries():
    for name in C.names():
        assert plotting.family_label(name) == (C.entry(name).label or name)
    assert plotting.family_label("not_registered") == "not_registered"
    assert plotting.family_label("no_such_module:factory") == "no_such_module:factory"
    assert plotting.knobs("topk")[:2] == ["ratio", "k"]
    assert plotting.knobs("qsgd")[0] == "levels" and plotting.knobs("powersgd")[0] == "rank"
    every = {e.knob.name for e in C.entries() if e.knob is not None} | {"k"}
    assert set(plotting.knobs()) == every and set(plotting.knobs("signsgd")) == every
    assert plotting.identity_name() in C.names()
    assert plotting.family_order(["zzz", "topk", "dgc"]) == ["dgc", "topk", "zzz"]


def test_a_user_registered_compressor_gets_its_label():
    from cconv.compressors import registry

    name = "test_plot_half"
    C.register(
        name, C.Entry(lambda: C.get("fp16"), aggregation="allreduce", label="half precision", knob=C.Knob("bits", (8,)))
    )
    try:
        assert plotting.family_label(name) == "half precision"
        assert plotting.knobs(name)[0] == "bits"
    finally:
        registry._REGISTRY.pop(name)


# ------------------------------------------------------------------ labels, bands (synthetic frames)


def frame(runs: dict[str, dict]) -> pd.DataFrame:
    """One metric line per run, with the config columns ``report.config_columns`` makes."""
    from cconv.experiments import report

    rows = []
    for run, cfg in runs.items():
        rows.append({"run": run, "step": 1, "seed": 0, "loss": 1.0, **report.config_columns(cfg)})
    return pd.DataFrame(rows)


SWEEP = {
    "dense": {"compressor": {"name": "none"}, "memory": "none", "lr": 0.1},
    "q4": {"compressor": {"name": "qsgd", "levels": 4}, "memory": "ef", "lr": 0.1},
    "q16": {"compressor": {"name": "qsgd", "levels": 16}, "memory": "ef", "lr": 0.1},
    "t1g": {"compressor": {"name": "topk", "ratio": 0.01, "positions": "golomb"}, "memory": "ef", "lr": 0.1},
    "t1": {"compressor": {"name": "topk", "ratio": 0.01}, "memory": "ef", "lr": 0.1},  # positions: default int32
    "t10": {"compressor": {"name": "topk", "ratio": 0.1}, "memory": "none", "lr": 0.1},
}


def test_labels_name_what_varies_and_nothing_absent():
    labels = plotting.run_labels(frame(SWEEP))
    assert labels == {
        "dense": "dense (no compression), no EF",
        "q4": "QSGD (levels=4), EF",
        "q16": "QSGD (levels=16), EF",
        "t1g": "top-k (ratio=0.01, positions=golomb), EF",
        "t1": "top-k (ratio=0.01, positions=int32), EF",
        "t10": "top-k (ratio=0.1, positions=int32), no EF",
    }
    assert not any("nan" in v for v in labels.values())
    assert plotting.run_order(frame(SWEEP)) == ["dense", "q4", "q16", "t1g", "t1", "t10"]
    # a setting outside the compressor appears when it varies
    two = {"a": {**SWEEP["t1"], "lr": 0.1}, "b": {**SWEEP["t1"], "lr": 0.05}}
    assert plotting.run_labels(frame(two)) == {"a": "lr=0.1", "b": "lr=0.05"}
    # nothing varies: the compressor and memory
    assert plotting.run_labels(frame({"only": SWEEP["q4"]})) == {"only": "QSGD, EF"}


def test_labels_and_config_names():
    same = {r: {**cfg, "name": "exp"} for r, cfg in SWEEP.items()}  # one name for all: ignored
    assert plotting.run_labels(frame(same)) == plotting.run_labels(frame(SWEEP))
    distinct = {r: {**cfg, "name": f"method {r}"} for r, cfg in SWEEP.items()}  # tells all apart: used
    assert plotting.run_labels(frame(distinct))["q4"] == "method q4"
    some = {"a": {**SWEEP["t1"], "name": "x"}, "b": {**SWEEP["t10"], "name": "x"}, "c": {**SWEEP["q4"], "name": "y"}}
    assert plotting.run_labels(frame(some)) == {
        "a": "x, top-k (ratio=0.01), EF",
        "b": "x, top-k (ratio=0.1), no EF",
        "c": "y, QSGD, EF",  # one QSGD run: its levels do not vary
    }
    twins = {"r1": SWEEP["q4"], "r2": SWEEP["q4"]}  # the same config twice: the directory tells them apart
    assert plotting.run_labels(frame(twins)) == {"r1": "QSGD, EF [r1]", "r2": "QSGD, EF [r2]"}


@pytest.mark.slow
def test_t_quantiles(monkeypatch):
    stats = pytest.importorskip("scipy.stats")
    for dof in range(1, 30):
        assert plotting.T975[dof - 1] == pytest.approx(stats.t.ppf(0.975, dof), abs=1e-3)
    assert plotting.t975(2) == pytest.approx(4.3027, abs=1e-4)
    import builtins

    real = builtins.__import__

    def no_scipy(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    assert plotting.t975(2) == 4.303 and plotting.t975(29) == 2.045 and plotting.t975(30) == 1.96
    assert math.isnan(plotting.t975(0))


def test_bands():
    # 3 seeds with values 1, 2, 6 at one step: mean 3, sample std sqrt(7)
    g = pd.DataFrame({"step": [1, 1, 1], "x": [5.0, 5.0, 5.0], "y": [1.0, 2.0, 6.0]})
    sd = math.sqrt(7.0)
    want = {
        "minmax": (1.0, 6.0),
        "std": (3 - sd, 3 + sd),
        "sem": (3 - sd / math.sqrt(3), 3 + sd / math.sqrt(3)),
        "ci95": (3 - plotting.t975(2) * sd / math.sqrt(3), 3 + plotting.t975(2) * sd / math.sqrt(3)),
    }
    for band, (lo, hi) in want.items():
        x, y, blo, bhi, n = plotting.mean_curve(g, "x", "y", band)
        assert (x[0], y[0], n) == (5.0, 3.0, 3)
        assert (blo[0], bhi[0]) == pytest.approx((lo, hi)), band
    _, _, blo, bhi, _ = plotting.mean_curve(g, "x", "y", "none")
    assert np.isnan(blo).all() and np.isnan(bhi).all()
    _, _, blo, _, _ = plotting.mean_curve(g.iloc[:1], "x", "y", "std")  # one seed: no band
    assert np.isnan(blo).all()
    with pytest.raises(ValueError, match="unknown band 'iqr'; valid: minmax, std, sem, ci95, none"):
        plotting.mean_curve(g, "x", "y", "iqr")


# ------------------------------------------------------------------ optimizers that send their own messages

ONEBIT = {
    "compressor": {"name": "none"},
    "memory": "none",
    "lr": 0.003,
    "optimizer": {"name": "onebit_adam", "warmup_steps": 30, "eps": 0.001},
}


def test_a_one_bit_adam_run_is_its_own_method_not_the_dense_baseline():
    """1-bit Adam's config says compressor none; its workers send 1-bit momenta with error feedback
    (``MessageTransformation.engine``): the figure draws it as its own family, labelled by the
    optimizer's ``label``, with the memory its messages travel with, beside the dense baseline."""
    runs = {"dense": {**SWEEP["dense"], "optimizer": {"name": "sgd"}}, "onebit": ONEBIT, "q4": SWEEP["q4"]}
    df = frame(runs)
    row = df.set_index("run").loc["onebit"]
    assert (row["compressor"], row["memory"]) == ("1-bit Adam", "ef")
    assert row["cfg.compressor.name"] == "none" and row["cfg.memory"] == "none"  # the stored config as written
    assert plotting.families_in(df) == ["qsgd", "1-bit Adam"]
    assert plotting.panels_for(df) == "family"
    labels = plotting.run_labels(df)
    assert labels["onebit"].startswith("1-bit Adam, EF") and labels["dense"].startswith("dense (no compression)")
    alone = plotting.run_labels(frame({"dense": runs["dense"], "onebit": ONEBIT}))
    assert alone["onebit"].startswith("1-bit Adam") and "dense" not in alone["onebit"]


def test_the_method_comes_from_the_optimizer_object_not_its_name():
    """A user's run-config optimizer is labelled by its object's ``label`` (its config name when it has
    none); an optimizer that sends its gradient keeps the config's compressor."""
    from registry_cases import registries_restored

    from cconv.engine import optimizers
    from cconv.engine.onebit_adam import onebit_adam_engine

    def factory(label):
        return lambda learning_rate, **kw: onebit_adam_engine(learning_rate, **kw)._replace(label=label)

    with registries_restored():
        optimizers.register("my_adam", factory("my method"))
        optimizers.register("plain_adam", factory(""))
        runs = {n: {**ONEBIT, "optimizer": {"name": n}} for n in ("my_adam", "plain_adam")}
        got = frame(runs).set_index("run")["compressor"].to_dict()
    assert got == {"my_adam": "my method", "plain_adam": "plain_adam"}
    adam = frame({"a": {**SWEEP["q4"], "optimizer": {"name": "adam"}}}).iloc[0]
    assert (adam["compressor"], adam["memory"]) == ("qsgd", "ef")
