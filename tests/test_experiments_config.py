"""Run/sweep configs: loading, validation, overrides, grid expansion (no training here)."""

import textwrap

import pytest

from cconv.experiments import config as C
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
        ({"memory": "residual"}, "memory must be one of none, ef, dgc"),
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
        C.check_names(cfg)


def test_optimizer_arguments_checked_against_optax():
    C.check_names(C.from_dict({"optimizer": {"name": "sgd", "momentum": 0.9}}))
    with pytest.raises(ConfigError, match="unknown argument"):
        C.check_names(C.from_dict({"optimizer": {"name": "adam", "momentum": 0.9}}))
    with pytest.raises(ConfigError, match="dgc keeps the momentum"):
        C.check_names(C.from_dict({"memory": "dgc", "optimizer": {"name": "sgd", "momentum": 0.9}}))


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
    name, runs = C.load_sweep(p)
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
    _, runs = C.load_sweep(p)
    assert [r.config.compressor["ratio"] for r in runs] == [0.01, 0.5]
    bad = write(tmp_path, "b.yaml", "base: {}\ngrid: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match="non-empty list"):
        C.load_sweep(bad)
    bad2 = write(tmp_path, "c.yaml", "base: {}\ngrid: {lr: [0.1]}\nsteps: 3\n")
    with pytest.raises(ConfigError, match="unknown sweep key"):
        C.load_sweep(bad2)
    bad3 = write(tmp_path, "d.yaml", "base: {}\ngrid: {workers: [3]}\n")
    with pytest.raises(ConfigError, match="not divisible"):
        C.load_sweep(bad3)
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
    _, runs = C.load_sweep(p)
    assert len(runs) == 2 * 3 + 1
    lr = {(r.config.compressor["name"], r.config.compressor.get("ratio"), r.config.memory): r.config.lr for r in runs}
    assert lr[("signsgd", None, "none")] == 0.01 and lr[("signsgd", None, "ef")] == 0.001
    assert lr[("topk", 0.1, "ef")] == 0.1 and lr[("none", None, "none")] == 0.1
    assert runs[-1].name == "compressor=none,memory=none"
    bad = write(tmp_path, "b.yaml", "base: {}\ngrid: {lr: [0.1]}\nrules: [{when: {x: 1}}]\n")
    with pytest.raises(ConfigError, match="rules"):
        C.load_sweep(bad)


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
    ps = C.engine_config(C.from_dict({"architecture": "ps", "compressor": {"name": "topk", "ratio": 0.1}}))
    assert (ps.architecture, ps.collective) == ("parameter-server", "auto")
    # `architecture: gtopk` is all-to-all with the gTop-k collective (it wins over `collective`)
    g = C.engine_config(
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
    C.check_names(cfg)
    assert C.parse_value("1e-3") == 0.001 and C.parse_value("1.0e-3") == 0.001 and C.parse_value("10") == 10


def test_sweep_names_still_importable_from_config():
    from cconv.experiments import sweep

    assert C.load_sweep is sweep.load_sweep and C.expand_grid is sweep.expand_grid
    assert C.expand_grid({"memory": ["none", "ef"]}) == [{"memory": "none"}, {"memory": "ef"}]
