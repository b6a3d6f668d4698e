"""Run/sweep configs: loading, validation, overrides, grid expansion (no training here)."""

import textwrap

import pytest

from cconv.experiments import build as B
from cconv.experiments import config as C
from cconv.experiments import optax_names
from cconv.experiments import sweep as S
from cconv.experiments.config import ConfigError


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_defaults_and_named_fields(tmp_path):
    p = write(
        tmp_path,
        "a.yaml",
        """
        model: mlp
        compressor: {name: topk, ratio: 0.01}
        memory: ef
        workers: 4
        batch_size: 64
        network: [10GbE, {name: mine, alpha: 1.0e-5, beta: 1.0e-9}]
    """,
    )
    cfg = C.load_run(p)
    assert cfg.model == {"name": "mlp"}
    assert cfg.data == {"name": "digits"}
    assert cfg.compressor == {"name": "topk", "ratio": 0.01}
    assert cfg.workers == 4 and cfg.batch_size == 64 and cfg.memory == "ef"
    assert cfg.seeds() == [0]
    assert len(cfg.networks()) == 2
    # the resolved config round-trips through YAML unchanged
    again = C.from_dict(__import__("yaml").safe_load(C.to_yaml(cfg)))
    assert again == cfg and again.digest() == cfg.digest()


def test_unknown_key_lists_valid_keys(tmp_path):
    p = write(tmp_path, "a.yaml", "model: mlp\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError) as e:
        C.load_run(p)
    msg = str(e.value)
    assert "learning_rate" in msg and "valid keys:" in msg and "lr" in msg and "\n" not in msg


def test_malformed_yaml_is_one_line_with_position(tmp_path):
    p = write(tmp_path, "bad.yaml", "model: mlp\ncompressor: {name: topk, ratio: [0.1\n")
    with pytest.raises(ConfigError) as e:
        C.load_run(p)
    assert "malformed YAML" in str(e.value) and "line" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"workers": 3, "batch_size": 64}, "not divisible by workers 3"),
        ({"workers": 0}, "workers must be an integer >= 1"),
        ({"lr": -1.0}, "lr must be > 0"),
        ({"memory": "residual"}, "memory must be one of none, ef, dgc, ef21, ef21_sgdm"),
        ({"architecture": "ring"}, "architecture must be one of"),
        ({"seed": [1, 1]}, "duplicates"),
        ({"steps": 2.5}, "steps must be an integer"),
        ({"optimizer": "sgdd"}, "valid: sgd"),
        ({"compressor": {"ratio": 0.1}}, "needs a 'name'"),
    ],
)
def test_structural_errors(raw, fragment):
    with pytest.raises(ConfigError, match=fragment):
        C.from_dict(raw)


@pytest.mark.parametrize(
    "comp, fragment",
    [
        ({"name": "topkk"}, "valid names:"),
        ({"name": "topk", "ratio": 1.5}, r"ratio must be in \(0, 1\]"),
        ({"name": "topk", "ratio": 0.0}, r"ratio must be in \(0, 1\]"),
        ({"name": "signsgd", "ratio": 0.1}, "unknown hyper-parameter"),
    ],
)
def test_library_name_errors(comp, fragment):
    cfg = C.from_dict({"compressor": comp})
    with pytest.raises(ConfigError, match=fragment):
        B.check_names(cfg)


def test_optimizer_arguments_checked_against_optax():
    B.check_names(C.from_dict({"optimizer": {"name": "sgd", "momentum": 0.9}}))
    with pytest.raises(ConfigError, match="unknown argument"):
        B.check_names(C.from_dict({"optimizer": {"name": "adam", "momentum": 0.9}}))
    with pytest.raises(ConfigError, match="dgc keeps the momentum"):
        B.check_names(C.from_dict({"memory": "dgc", "optimizer": {"name": "sgd", "momentum": 0.9}}))


def test_overrides_dotted_and_typed(tmp_path):
    p = write(tmp_path, "a.yaml", "compressor: {name: topk, ratio: 0.1}\nworkers: 4\nbatch_size: 64\n")
    cfg = C.load_run(
        p,
        [
            "compressor.ratio=0.001",
            "memory=ef",
            "clip=null",
            "seed=[0, 1]",
            "data.partition=dirichlet",
            "data.alpha=0.5",
        ],
    )
    assert cfg.compressor == {"name": "topk", "ratio": 0.001}
    assert cfg.memory == "ef" and cfg.clip is None and cfg.seed == [0, 1]
    assert cfg.data == {"name": "digits", "partition": "dirichlet", "alpha": 0.5}
    # a plain name replaces the whole mapping (hyper-parameters of the old compressor go)
    assert C.load_run(p, ["compressor=signsgd"]).compressor == {"name": "signsgd"}
    with pytest.raises(ConfigError, match="unknown config key 'lrr'"):
        C.load_run(p, ["lrr=0.1"])
    with pytest.raises(ConfigError, match="key=value"):
        C.load_run(p, ["lr"])
    with pytest.raises(ConfigError, match="not a mapping"):
        C.load_run(p, ["workers.x=1"])


def test_grid_expansion_with_nested_alternatives(tmp_path):
    write(tmp_path, "base.yaml", "workers: 4\nbatch_size: 64\nsteps: 5\n")
    p = write(
        tmp_path,
        "s.yaml",
        """
        name: demo
        base: base.yaml
        grid:
          memory: [none, ef]
          compressor:
            - {name: topk, ratio: [0.01, 0.1]}
            - {name: signsgd}
          seed: [0, 1]
    """,
    )
    name, runs = S.load_sweep(p)
    assert name == "demo"
    assert len(runs) == 2 * 3 * 2
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert "memory=ef,compressor=topk-ratio0.01,seed=1" in names
    r = next(r for r in runs if r.name == "memory=ef,compressor=topk-ratio0.01,seed=1")
    assert r.config.compressor == {"name": "topk", "ratio": 0.01} and r.config.memory == "ef"
    assert r.config.seed == 1 and r.config.workers == 4 and r.config.steps == 5
    assert {tuple(sorted(x.config.compressor.items())) for x in runs} == {
        (("name", "topk"), ("ratio", 0.01)),
        (("name", "topk"), ("ratio", 0.1)),
        (("name", "signsgd"),),
    }


def test_grid_dotted_key_and_errors(tmp_path):
    p = write(
        tmp_path,
        "s.yaml",
        """
        base: {compressor: {name: topk, ratio: 0.1}, workers: 2, batch_size: 8}
        grid: {compressor.ratio: [0.01, 0.5]}
    """,
    )
    _, runs = S.load_sweep(p)
    assert [r.config.compressor["ratio"] for r in runs] == [0.01, 0.5]
    bad = write(tmp_path, "b.yaml", "base: {}\ngrid: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match="non-empty list"):
        S.load_sweep(bad)
    bad2 = write(tmp_path, "c.yaml", "base: {}\ngrid: {lr: [0.1]}\nsteps: 3\n")
    with pytest.raises(ConfigError, match="unknown sweep key"):
        S.load_sweep(bad2)
    bad3 = write(tmp_path, "d.yaml", "base: {}\ngrid: {workers: [3]}\n")
    with pytest.raises(ConfigError, match="not divisible"):
        S.load_sweep(bad3)
    with pytest.raises(ConfigError, match="is a sweep file"):
        C.load_run(p)


def test_include_and_rules(tmp_path):
    p = write(
        tmp_path,
        "s.yaml",
        """
        base: {workers: 2, batch_size: 8, lr: 0.1}
        grid:
          memory: [none, ef]
          compressor: [{name: topk, ratio: [0.1, 0.5]}, signsgd]
        include:
          - {compressor: none, memory: none}
        rules:
          - when: {compressor.name: signsgd}
            set: {lr: 0.01}
          - when: {compressor.name: signsgd, memory: ef}
            set: {lr: 0.001}
    """,
    )
    _, runs = S.load_sweep(p)
    assert len(runs) == 2 * 3 + 1
    lr = {(r.config.compressor["name"], r.config.compressor.get("ratio"), r.config.memory): r.config.lr for r in runs}
    assert lr[("signsgd", None, "none")] == 0.01 and lr[("signsgd", None, "ef")] == 0.001
    assert lr[("topk", 0.1, "ef")] == 0.1 and lr[("none", None, "none")] == 0.1
    assert runs[-1].name == "compressor=none,memory=none"
    bad = write(tmp_path, "b.yaml", "base: {}\ngrid: {lr: [0.1]}\nrules: [{when: {x: 1}}]\n")
    with pytest.raises(ConfigError, match="rules"):
        S.load_sweep(bad)


def test_option_lists_are_the_engines_and_aliases_map_before_validation():
    from cconv.engine import config as E

    for arch in ("all-to-all", "parameter-server", "ps", "gtopk"):
        C.from_dict({"architecture": arch})
    for launcher, cls in E.LAUNCHERS.items():
        if cls.one_process_per_worker:  # mpirun launches: the engine API, not the one-process runner
            with pytest.raises(ConfigError, match="launcher must be one of"):
                C.from_dict({"launcher": launcher})
        else:
            assert C.from_dict({"launcher": launcher}).launcher == launcher
    ps = B.make_engine_config(C.from_dict({"architecture": "ps", "compressor": {"name": "topk", "ratio": 0.1}}))
    assert (ps.architecture, ps.collective) == ("parameter-server", "auto")
    # `architecture: gtopk` is all-to-all with the gTop-k collective (it wins over `collective`)
    g = B.make_engine_config(
        C.from_dict({"architecture": "gtopk", "collective": "allgather", "compressor": {"name": "topk", "ratio": 0.1}})
    )
    assert (g.architecture, g.collective) == ("all-to-all", "gtopk")
    # the resolved config keeps the spelling the user wrote (run directories stay comparable)
    assert C.from_dict({"architecture": "ps"}).architecture == "ps"
    with pytest.raises(ConfigError, match="launcher must be one of"):
        C.from_dict({"launcher": "threads"})
    with pytest.raises(ConfigError, match="collective must be one of"):
        C.from_dict({"collective": "ring"})
    with pytest.raises(ConfigError, match="granularity must be one of"):
        C.from_dict({"granularity": "bucketed"})


def test_exponent_floats_without_a_dot(tmp_path):
    p = write(tmp_path, "a.yaml", "lr: 1e-3\ncompressor: {name: threshold, tau: 2E-4}\nclip: +5e0\nname: 1e3x\n")
    cfg = C.load_run(p, ["momentum=5e-1"])
    assert cfg.lr == 0.001 and cfg.compressor["tau"] == 2e-4 and cfg.clip == 5.0 and cfg.momentum == 0.5
    assert cfg.name == "1e3x"
    B.check_names(cfg)
    assert C.parse_value("1e-3") == 0.001 and C.parse_value("1.0e-3") == 0.001 and C.parse_value("10") == 10


def test_sweep_names_live_in_sweep_only():
    """Grid expansion is cconv.experiments.sweep's; config no longer re-exports it (that re-export
    closed an import cycle config -> sweep -> runner -> config, tests/test_imports.py)."""
    assert not hasattr(C, "load_sweep") and not hasattr(C, "expand_grid")
    assert S.expand_grid({"memory": ["none", "ef"]}) == [{"memory": "none"}, {"memory": "ef"}]


# --------------------------------------------------------------------------- optax optimizers and schedules


def test_any_optax_optimizer_with_its_arguments():
    """Not a whitelist: every optax function taking learning_rate, checked by its signature."""
    import optax

    names = optax_names.optimizer_names()
    assert {"sgd", "adamw", "lion", "adan", "signum", "rprop"} <= set(names)
    assert all("learning_rate" in optax_names.parameters(getattr(optax, n)) for n in names)
    for spec in ({"name": "adan", "b1": 0.9}, {"name": "signum", "beta": 0.8}, {"name": "contrib.prodigy"}):
        cfg = C.from_dict({"optimizer": spec})
        B.check_names(cfg)
        assert isinstance(B.make_optimizer(cfg), optax.GradientTransformation)
    for spec, fragment in [
        ({"name": "adamww"}, "not an optax optimizer .* valid: adamw, "),  # closest names first
        ({"name": "clip_by_global_norm"}, "taking learning_rate"),  # an optax function, not an optimizer
        ({"name": "contrib._private"}, "not an optax optimizer"),
    ]:
        with pytest.raises(ConfigError, match=fragment) as e:
            C.from_dict({"optimizer": spec})
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="'adan': unknown argument.s. momentum; valid: b1, b2"):
        B.check_names(C.from_dict({"optimizer": {"name": "adan", "momentum": 0.9}}))


def test_schedule_strings_are_todays_schedules():
    """constant / cosine (with and without warm-up) are the schedules they always were."""
    import numpy as np
    import optax

    steps = np.arange(0, 301, 7)
    for warm in (0, 20):
        for name, old in (
            ("constant", optax.constant_schedule(0.1)),
            ("cosine", optax.cosine_decay_schedule(0.1, max(300 - warm, 1))),
        ):
            if warm:
                old = optax.join_schedules([optax.linear_schedule(0.0, 0.1, warm), old], [warm])
            new = B.make_schedule(C.from_dict({"lr_schedule": name, "lr_warmup": warm, "steps": 300}))
            np.testing.assert_array_equal(np.asarray([new(s) for s in steps]), np.asarray([old(s) for s in steps]))


def test_any_optax_schedule_with_run_defaults(tmp_path):
    import numpy as np
    import optax

    p = write(
        tmp_path,
        "a.yaml",
        "lr: 1e-2\nsteps: 200\nlr_schedule: {name: warmup_cosine_decay_schedule, init_value: 0.0, warmup_steps: 20}\n",
    )
    cfg = C.load_run(p)
    B.check_names(cfg)
    fn, kwargs = B.schedule_arguments(cfg)
    # what the mapping leaves out comes from the run: peak_value = lr, decay_steps = steps
    assert fn is optax.warmup_cosine_decay_schedule
    assert kwargs == {"init_value": 0.0, "warmup_steps": 20, "peak_value": 0.01, "decay_steps": 200}
    sched = B.make_schedule(cfg)
    assert float(sched(0)) == 0.0 and float(sched(20)) == pytest.approx(0.01) and float(sched(200)) < 1e-6
    # given arguments win; --set reaches into the mapping; a string becomes {name}
    cfg = C.load_run(p, ["lr_schedule.decay_steps=100", "lr_schedule.end_value=0.001"])
    assert B.schedule_arguments(cfg)[1]["decay_steps"] == 100
    assert float(B.make_schedule(cfg)(150)) == pytest.approx(0.001)
    cfg = C.load_run(None, ["lr_schedule.name=exponential_decay", "lr_schedule.decay_rate=0.5"])
    assert B.schedule_arguments(cfg)[1] == {"decay_rate": 0.5, "init_value": 0.1, "transition_steps": 300}
    assert C.from_dict({"lr_schedule": {"name": "cosine"}}).lr_schedule == {"name": "cosine"}
    assert np.isclose(float(B.make_schedule(C.from_dict({"lr_schedule": {"name": "cosine", "alpha": 0.5}}))(300)), 0.05)


@pytest.mark.parametrize(
    "schedule, fragment",
    [
        ("cosin", "lr_schedule 'cosin' is not an optax schedule; valid: constant, cosine, cosine_decay_schedule"),
        ({"name": "join_schedules"}, "not an optax schedule"),  # takes functions, not config values
        ({"init_value": 0.1}, "needs a 'name'"),
        ({"name": "cosine", "warmup": 3}, "'cosine': unknown argument.s. warmup; valid: init_value, decay_steps"),
        ({"name": "warmup_cosine_decay_schedule"}, "missing required argument.s. init_value, warmup_steps"),
        ({"name": "cosine", "alpha": "abc"}, r"lr_schedule \{'name': 'cosine', 'alpha': 'abc'\}: TypeError"),
        ({"name": "piecewise_constant_schedule", "boundaries_and_scales": [1]}, "lr_schedule"),
    ],
)
def test_schedule_errors_are_one_line(schedule, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        B.check_names(C.from_dict({"lr_schedule": schedule}))
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- error feedback: omega warning, ef_scale


def test_ef_scale_values_and_errors():
    assert C.from_dict({}).ef_scale is None and C.from_dict({"memory": "ef", "ef_scale": 1}).ef_scale == 1.0
    assert C.from_dict({"memory": "ef", "ef_scale": "auto"}).ef_scale == "auto"
    with pytest.raises(ConfigError, match="ef_scale scales error feedback: it needs memory: ef, got memory: none"):
        C.from_dict({"ef_scale": "auto"})  # issue 26: silently ignored before
    for bad in ("autoo", 0, 1.5, True, [0.5]):
        with pytest.raises(ConfigError, match="ef_scale must be null, auto or a number in"):
            C.from_dict({"memory": "ef", "ef_scale": bad})
    with pytest.raises(ConfigError, match="ef_scale scales error feedback: it needs memory: ef, got memory: dgc"):
        C.from_dict({"memory": "dgc", "ef_scale": 0.5})
    shapes = [(64, 16), (16,), (16, 10), (10,)]  # the quickstart-like MLP

    def scale(**raw):
        return B.make_compression(C.from_dict(raw), shapes).ef_scale

    # QSGD s=2: omega = min(d/s^2, sqrt(d)/s), largest for the 64x16 matrix: sqrt(1024)/2 = 16
    qsgd = {"memory": "ef", "compressor": {"name": "qsgd", "levels": 2}}
    assert scale(**qsgd, ef_scale="auto") == pytest.approx(1 / 17)
    assert scale(**qsgd, ef_scale="auto", compress_vectors=False, min_compress_size=200) == pytest.approx(1 / 17)
    fused = (1024 + 160) ** 0.5 / 2  # one flat buffer of the matrices (the biases travel dense by default)
    assert scale(**qsgd, ef_scale="auto", granularity="fused") == pytest.approx(1 / (1 + fused))
    fused = (1024 + 16 + 160 + 10) ** 0.5 / 2  # and of every tensor
    assert scale(**qsgd, ef_scale="auto", granularity="fused", compress_vectors=True) == pytest.approx(1 / (1 + fused))
    assert scale(**qsgd) == 1.0 and scale(**qsgd, ef_scale=0.25) == 0.25
    assert scale(memory="ef", compressor={"name": "topk", "ratio": 0.1}, ef_scale="auto") == 1.0  # contractive
    eng = B.make_engine_config(C.from_dict({**qsgd, "workers": 2, "batch_size": 8, "ef_scale": "auto"}), shapes=shapes)
    assert eng.ef_scale == pytest.approx(1 / 17) and eng.memory == "ef"


def test_error_feedback_warning_names_omega_once(recwarn):
    import warnings

    B._WARNED.clear()
    cfg = C.from_dict({"memory": "ef", "compressor": {"name": "qsgd", "levels": 2}})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        B.make_compression(cfg, [(64, 16), (16,)])
        B.make_compression(cfg, [(64, 16), (16,)])  # once per process
        B.make_compression(C.from_dict({"memory": "ef", "compressor": "qsgd"}), [(64, 16)])  # omega = 4 (s = 8): warns
        B.make_compression(C.from_dict({"memory": "ef", "compressor": "qsgd"}), [(4,)])  # omega = 1/16 < 1
        B.make_compression(C.from_dict({**cfg.to_dict(), "ef_scale": "auto"}), [(64, 16)])  # the fix: silent
        B.make_compression(C.from_dict({"memory": "ef", "compressor": {"name": "topk", "ratio": 0.1}}), [(64, 16)])
        B.make_compression(C.from_dict({"memory": "none", "compressor": "qsgd"}), [(64, 16)])  # no EF
    msgs = [str(x.message) for x in w if issubclass(x.category, B.ErrorFeedbackWarning)]
    assert len(msgs) == 2, msgs
    assert "\n" not in msgs[0] and "omega = 16 >= 1" in msgs[0] and "cconv.theory.constants.omega" in msgs[0]
    assert "ef_scale: auto" in msgs[0] and "omega = 4 >= 1" in msgs[1]


@pytest.mark.slow
def test_ef_scale_auto_converges_where_plain_error_feedback_diverges(tmp_path):
    """QSGD with s=2 levels (omega = 16 on the 64x16 layer) under error feedback: plain EF blows up
    in the tiny model (fixed seed), ef_scale: auto (input scaled by 1/17) trains, as QSGD without
    memory does."""
    import math
    import warnings

    from cconv.experiments.runner import execute

    raw = {
        "model": {"name": "mlp", "hidden": [16]},
        "workers": 4,
        "batch_size": 32,
        "steps": 60,
        "lr": 0.1,
        "compressor": {"name": "qsgd", "levels": 2},
        "memory": "ef",
        "log_every": 5,
        "checkpoint_every": 1000,
    }
    losses = {}
    for label, extra in (("ef", {}), ("auto", {"ef_scale": "auto"}), ("none", {"memory": "none"})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", B.ErrorFeedbackWarning)
            res = execute(C.from_dict({**raw, **extra}), str(tmp_path / label))
        losses[label] = res.summary["final"]["loss"] if res.status == "completed" else math.inf
    first = math.log(10)  # ten classes: the untrained loss
    assert not losses["ef"] < 1e3, losses  # diverged (non-finite) or exploded
    assert losses["auto"] < 0.8 * first and losses["none"] < 0.8 * first, losses
