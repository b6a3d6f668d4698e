"""The engine's section of the run config: the keys of ``RunConfig`` that are ``EngineConfig``
fields (declared ``engine_key``, ``config.ENGINE_KEYS``) take their defaults from the engine's
dataclass, so an engine default is written once; ``build.make_engine_config`` passes the section
on (no hand-written field list).  What users wrote before keeps meaning the same run: every
``studies/*.yaml`` loads to the configs (digest and ``config.yaml`` text) it loaded to before,
and a run directory whose ``config.yaml`` was written before (``tests/stored_configs/``, written by
main at e238e22 from ``STORED`` below) still resumes."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from cconv.engine import EngineConfig
from cconv.experiments import build, io, rundir, sweep
from cconv.experiments import config as C

ROOT = Path(__file__).resolve().parent.parent
ENGINE = {f.name: f for f in dataclasses.fields(EngineConfig)}
RUN_DEFAULTS = {"workers": 8}  # a run simulates 8 devices; the engine's API default is 1
SPELT_OTHERWISE = {  # RunConfig keys named like an engine field whose config value is another type
    "compressor": "a {name, **hparams} mapping; the engine takes the built Compressor",
    "ef_scale": "null or auto in a config; the engine takes the resolved number",
}
# keys the build translates before the engine sees them (aliases, built objects, the devices' launcher)
TRANSLATED = ("architecture", "collective", "warmup", "ps_downlink", "launcher")


def test_every_engine_default_is_written_once_in_the_engine():
    """A RunConfig key named like an EngineConfig field is an ``engine_key`` (its default read
    from the dataclass) unless listed above; only ``workers`` has a run default of its own.
    Writing ``momentum: float = key(0.9, ...)`` (a second default) fails here."""
    same_name = {k for k in C.FIELDS if k in ENGINE}
    assert same_name - set(C.ENGINE_KEYS) == set(SPELT_OTHERWISE)
    assert set(C.ENGINE_KEYS) <= set(ENGINE)
    own = {k for k in C.ENGINE_KEYS if C.FIELDS[k].metadata.get("run_default")}
    assert own == set(RUN_DEFAULTS)
    for k in C.ENGINE_KEYS:
        assert C.default_of(k) == RUN_DEFAULTS.get(k, ENGINE[k].default), k
    assert set(C.GOSSIP_FIELDS) <= set(C.ENGINE_KEYS) and set(C.ADDED_FIELDS) <= set(C.FIELDS)
    assert all(isinstance(k, str) for k in C.ADDED_FIELDS)  # names: their defaults are the schema's


def test_an_engine_key_reads_its_default_from_the_engine():
    @dataclasses.dataclass(frozen=True)
    @C._engine_defaults
    class Section:
        adapt_every: int = C.engine_key("AdaComm's period", C.integer(1))
        workers: int = C.engine_key("workers", C.integer(1), run_default=3)

    assert Section() == Section(adapt_every=ENGINE["adapt_every"].default, workers=3)
    with pytest.raises(TypeError, match="EngineConfig has no field 'steps'"):
        C._engine_defaults(type("Bad", (), {"steps": C.engine_key("steps", C.integer(1))}))


# engine keys a config spells otherwise than the engine: their rules are the run config's
OWN_RULES = ("warmup", "stragglers", "architecture", "ps_downlink", "launcher", "torus", "mixing")
SHARED = [k for k in C.ENGINE_KEYS if k not in OWN_RULES]


def test_every_other_engine_key_is_checked_by_the_engines_rule():
    """One rule per key: the run config runs the engine field's rule object itself."""
    for k in C.ENGINE_KEYS:
        shared = C.FIELDS[k].metadata["rule"] is ENGINE[k].metadata.get("rule")
        assert shared == (k not in OWN_RULES), k


@pytest.mark.parametrize("key", SHARED)
def test_the_engine_and_the_loader_refuse_a_bad_value_with_one_message(key):
    """The same sentence, named ``EngineConfig.<key>`` by the engine and ``<key>`` (the YAML
    key) by the loader, one line."""
    values = {"workers": 4, key: {"bad": 1}}  # no rule takes a mapping
    with pytest.raises(ValueError) as engine:
        EngineConfig(**values)
    with pytest.raises(C.ConfigError) as loader:
        C.from_dict(values)
    assert str(engine.value) == f"EngineConfig.{loader.value}"
    assert str(loader.value).startswith(f"{key} must be ") and "\n" not in str(loader.value)


# raw configs of tests/stored_configs/<name>.yaml (what a user wrote), their digests then
STORED = {
    "gossip": (
        {
            "model": {"name": "mlp", "hidden": [8]},
            "workers": 4,
            "batch_size": 64,
            "steps": 20,
            "sync": "gossip",
            "gossip": "choco",
            "topology": "torus",
            "torus": [2, 2],
            "gossip_gamma": 0.5,
            "compressor": {"name": "topk", "ratio": 0.1},
            "jitter": 0.1,
            "compress_vectors": True,  # the default when it was written (OLD_DEFAULTS)
        },
        "f0cf37eec03e",
    ),
    "ssp": (
        {
            "model": {"name": "mlp", "hidden": [8]},
            "workers": 4,
            "batch_size": 64,
            "steps": 20,
            "sync": "ssp",
            "staleness": 2,
            "stragglers": {"fraction": 0.25, "slowdown": 4},
            "worker_speeds": [1, 1, 2, 1],
            "memory": "dgc",
            "momentum": 0,
            "masking": False,
            "clip": 1,
            "compressor": {"name": "topk", "ratio": 0.1},
            "optimizer": "sgd",
            "warmup": {"densities": [0.5], "steps_per_stage": 2},
            "granularity": "fused",
            "min_compress_size": 10,
            "compress_vectors": False,
            "architecture": "ps",
            "ps_downlink": {"name": "topk", "ratio": 0.5},
        },
        "7e808e5f90fd",
    ),
    "adacomm": (
        {
            "model": {"name": "mlp", "hidden": [8]},
            "workers": 4,
            "batch_size": 64,
            "steps": 20,
            "local_steps": "adaptive",
            "local_steps_init": 2,
            "adapt_every": 5,
            "compress_delta": True,
            "compressor": "signsgd",
            "memory": "ef",
            "ef_scale": 0.5,
            "compress_vectors": True,  # the default when it was written (OLD_DEFAULTS)
        },
        "94f81ddbaa88",
    ),
}


# engine defaults changed since the stored configs were written: (key, then, now); a stored
# config.yaml records every key, so it keeps meaning what it meant
OLD_DEFAULTS = [("compress_vectors", True, False)]  # 1-D tensors dense by default (issue 35)


@pytest.mark.parametrize("name", STORED)
def test_a_run_directory_written_before_resumes(tmp_path, name):
    raw, digest = STORED[name]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(ROOT / "tests" / "stored_configs" / f"{name}.yaml", run / io.CONFIG)
    cfg = C.from_dict(raw)
    assert cfg.digest() == digest
    assert C.to_yaml(cfg) == (run / io.CONFIG).read_text()  # written byte for byte as before
    assert rundir.stored_config_diff(str(run), cfg) == []
    assert rundir.stored_run(str(run), cfg) == "resume"
    assert C.from_dict(C.read_stored(str(run / io.CONFIG))) == cfg


@pytest.mark.parametrize("name", ["gossip", "adacomm"])
def test_a_run_written_under_an_old_default_keeps_it_and_is_not_mixed_with_todays(tmp_path, name):
    """The stored ``config.yaml`` says ``compress_vectors: true`` and means it; the same file
    without the key now means today's default, a different run: refused in one line naming the key,
    not resumed into the old directory."""
    raw = dict(STORED[name][0])
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(ROOT / "tests" / "stored_configs" / f"{name}.yaml", run / io.CONFIG)
    stored = C.from_dict(C.read_stored(str(run / io.CONFIG)))
    for key, then, now in OLD_DEFAULTS:
        assert raw.pop(key) == then == getattr(stored, key) != now == C.default_of(key) == getattr(EngineConfig, key)
        assert getattr(build.make_engine_config(stored), key) is then
    today = C.from_dict(raw)
    assert rundir.stored_config_diff(str(run), today) == [f"{k}: {a} -> {b}" for k, a, b in OLD_DEFAULTS]
    with pytest.raises(C.ConfigError, match="different config .*compress_vectors"):
        rundir.stored_run(str(run), today)


def _tuple(v):
    """A config value as the engine keeps it (mappings and lists become tuples)."""
    if isinstance(v, dict):
        return tuple(_tuple(x) for x in v.values())
    return tuple(_tuple(x) for x in v) if isinstance(v, list) else v


@pytest.mark.parametrize("name", STORED)
def test_the_engine_gets_its_section_as_configured(name):
    cfg = C.from_dict(STORED[name][0])
    ecfg = build.make_engine_config(cfg)
    for k in C.ENGINE_KEYS:
        if k not in TRANSLATED:
            assert _tuple(getattr(ecfg, k)) == _tuple(getattr(cfg, k)), k


# studies/*.yaml: (configs, sha256 of [name, digest, to_yaml] per config), from main at e238e22
EXPERIMENTS = {
    "studies/frontier_digits.yaml": (12, "266f6136db0b2425"),  # + 1-bit and 0/1 Adam (issue 37)
    "studies/onebit_adam_digits.yaml": (1, "d2f15b6397cfc2b8"),
    "studies/paper_digits.yaml": (31, "36f7cd115f617c00"),
    # the quickstart shows the defaults: 6537a7aa5e84fa02 until 1-D tensors became dense by default (issue 35)
    "studies/quickstart.yaml": (29, "67ac1b4402391def"),
    "studies/seeds_bench.yaml": (1, "a256bfc11b40dc3a"),
    "studies/sync.yaml": (20, "9e34969bac845ced"),
    "studies/wire_formats.yaml": (11, "ef9550c61468fbb2"),
}

# files that gained points since: their first points still load to what they loaded to at e238e22
BEFORE_ADDITIONS = {"studies/frontier_digits.yaml": (10, "7b99085cb6635a1c")}


def test_every_experiment_file_is_pinned():
    found = glob.glob("studies/*.yaml", root_dir=ROOT)
    assert sorted(found) == sorted(EXPERIMENTS)


@pytest.mark.parametrize("path", EXPERIMENTS)
def test_the_experiment_files_load_to_the_configs_they_loaded_to_before(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # sweep files name their paths relative to the repository
    raw = C.load_yaml(path)
    if "grid" in raw:
        configs = [(r.name, r.config) for r in sweep.load_sweep(path)[1]]
    else:
        configs = [("run", C.load_run(path))]
    pinned = lambda cs: hashlib.sha256(json.dumps([[n, c.digest(), C.to_yaml(c)] for n, c in cs]).encode()).hexdigest()
    assert (len(configs), pinned(configs)[:16]) == EXPERIMENTS[path]
    if path in BEFORE_ADDITIONS:
        n, before = BEFORE_ADDITIONS[path]
        assert pinned(configs[:n])[:16] == before
