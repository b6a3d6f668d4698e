"""The run-config schema (``cconv.experiments.config``): one ``key(default, help, rule)`` per
config key in ``RunConfig``'s body, from which come the fields and defaults, ``from_dict`` (each
key's rule, then ``CROSS_RULES``) and ``field_help``; a validated ``RunConfig`` is frozen.

The pins below were computed on the code before the schema (commit eb0dbfa, field-by-field
``from_dict``): a resumed run compares its stored ``config.yaml`` and digest with today's, so
neither may change for an existing config.  Adding a key changes every ``to_yaml`` (one more
line): then name the key in ``ADDED_FIELDS`` (``read_stored`` fills its default into older files), check
that the digests below still hold, and update the YAML hashes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import pytest

from cconv.experiments import config as C
from cconv.experiments.config import CROSS_RULES, FIELDS, ConfigError, RunConfig, from_dict

# 1-D tensors were compressed by default then: the pins name it (compress_vectors: true), and a
# config that does not now means dense vectors, another config with another digest
OLD = {"compress_vectors": True}
PINNED = {  # name: (raw config, digest(), sha256(to_yaml())[:16]), both from the code before the schema
    "defaults": ({}, "05e836182166", "147bb075816d8c71"),
    "compressed": (
        {
            "model": {"name": "mlp", "hidden": [64]},
            "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
            "workers": 4,
            "batch_size": 64,
            "lr": 1,
            "lr_schedule": {"name": "cosine_decay_schedule", "alpha": 0.1},
            "optimizer": {"name": "sgd", "momentum": 0.9},
            "seed": [0, 1],
            "compressor": {"name": "topk", "ratio": 0.01},
            "memory": "ef",
            "ef_scale": "auto",
            "clip": 1,
            "warmup": {"densities": [0.25, 0.0625], "steps_per_stage": 2},
            "network": ["10GbE", {"name": "slow", "alpha": 1e-4, "beta": 1e-9}],
            "schedule": "wfbp",
            "stragglers": {"fraction": 0.25, "slowdown": 2},
            "jitter": 0.1,
            "worker_speeds": [1, 1, 2, 1],
            "wandb": {"project": "p", "mode": "offline"},
            "target_loss": 1,
        },
        "a2d4f9d712f1",  # issue 34: target_loss (1 here) no longer enters the digest (was 6538a201dc1b)
        "f3e10bc4b418173f",
    ),
    "gossip": (
        {
            "sync": "gossip",
            "gossip": "choco",
            "topology": "torus",
            "torus": [2, 4],
            "gossip_gamma": 1,
            "compressor": "signsgd",
            "momentum": 0,
            "tensorboard": True,
        },
        "338ce0e6f1b3",
        "9194e87afa63bc49",
    ),
    "local": (
        {
            "local_steps": "adaptive",
            "sync": "ssp",
            "staleness": 3,
            "data": {"name": "digits", "root": "/tmp/d"},
            "architecture": "ps",
            "ps_downlink": "topk",
            "memory": None,
            "name": "run-a",
            "log_every": 5,
        },
        "0b86150f58ee",
        "7714c21ad36a7b6d",
    ),
}


@pytest.mark.parametrize("name", PINNED)
def test_digest_and_yaml_are_those_of_the_code_before_the_schema(name):
    raw, digest, yaml_hash = PINNED[name]
    cfg = from_dict({**OLD, **raw})
    assert cfg.digest() == digest
    assert hashlib.sha256(C.to_yaml(cfg).encode()).hexdigest()[:16] == yaml_hash


def test_values_are_normalized_as_before():
    """Numbers become floats where the old code made them floats, names become mappings, a null
    memory is none (the pins above hold the same through the YAML)."""
    raw, _, _ = PINNED["compressed"]
    cfg = from_dict({**raw, "ps_downlink": "topk"})
    assert type(cfg.lr) is float and type(cfg.clip) is float and type(cfg.target_loss) is float
    assert cfg.stragglers == {"fraction": 0.25, "slowdown": 2.0} and type(cfg.stragglers["slowdown"]) is float
    assert [type(x) for x in cfg.worker_speeds] == [float] * 4
    assert type(cfg.workers) is int and cfg.seed == [0, 1]
    assert cfg.ps_downlink == {"name": "topk"} and from_dict({"model": "cnn"}).model == {"name": "cnn"}
    g = from_dict(PINNED["gossip"][0])
    assert type(g.gossip_gamma) is float and type(g.momentum) is float
    assert from_dict({"memory": None}).memory == "none"
    assert from_dict({"memory": "ef", "ef_scale": 1}).ef_scale == 1.0
    assert from_dict({"memory": "ef", "ef_scale": "auto"}).ef_scale == "auto"


def test_run_config_is_frozen():
    cfg = from_dict({"workers": 4, "batch_size": 64})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.workers = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model = {"name": "cnn"}
    changed = dataclasses.replace(cfg, steps=10)
    assert (changed.steps, cfg.steps) == (10, 300) and changed.workers == 4


def test_a_config_shares_no_container_with_its_input_or_another_config():
    raw = {"model": {"name": "mlp", "hidden": [64]}, "seed": [0, 1], "network": ["10GbE"]}
    cfg = from_dict(raw)
    raw["model"]["hidden"].append(1)
    raw["seed"].append(2)
    raw["network"][0] = "100GbE"
    assert cfg.model == {"name": "mlp", "hidden": [64]} and cfg.seed == [0, 1] and cfg.network == ["10GbE"]
    a, b = RunConfig(), RunConfig()
    assert a.model is not b.model and a.model == b.model


def test_every_key_is_declared_once_with_a_default_help_and_rule():
    """The defaults pass their own rules unchanged, so ``from_dict({})`` is ``RunConfig()``."""
    default = RunConfig()
    for name, f in FIELDS.items():
        assert isinstance(f.metadata["help"], str) and f.metadata["help"], name
        assert f.metadata["rule"](name, C.default_of(name), {}) == getattr(default, name), name
    assert from_dict({}) == default
    assert set(C.ADDED_FIELDS) <= set(FIELDS) and set(C.GOSSIP_FIELDS) <= set(C.ENGINE_KEYS)


def test_field_help_is_one_line_per_key_in_table_order():
    lines = C.field_help().splitlines()
    assert [line.split()[0] for line in lines] == list(FIELDS)
    for line, (name, f) in zip(lines, FIELDS.items()):
        default = json.dumps(C.default_of(name), default=str)
        assert re.fullmatch(rf"  {re.escape(f'{name:<18} {default:<26}')} {re.escape(f.metadata['help'])}", line)


# each rule kind, with the message the code before the schema gave (full text)
RULE_MESSAGES = [
    ({"workers": 0}, "workers must be an integer >= 1, got 0"),
    ({"workers": True}, "workers must be an integer >= 1, got True"),
    ({"lr": 0}, "lr must be > 0.0, got 0"),
    ({"lr": "fast"}, "lr must be a number, got 'fast'"),
    ({"jitter": -1}, "jitter must be >= 0.0, got -1"),
    ({"momentum": 1}, "momentum must be in [0, 1), got 1.0"),
    ({"momentum": -0.5}, "momentum must be >= 0.0, got -0.5"),
    ({"clip": 0}, "clip must be > 0.0, got 0"),
    ({"target_loss": "low"}, "target_loss must be a number, got 'low'"),
    ({"memory": "residual"}, "memory must be one of none, ef, dgc, ef21, ef21_sgdm; got 'residual'"),
    ({"masking": "yes"}, "masking must be true or false, got 'yes'"),
    ({"name": 3}, "name must be a string, got 3"),
    ({"gossip": 1}, "gossip must be one of dpsgd, choco; got 1"),  # the engine's rule (was: "must be a string")
    ({"model": {"hidden": [8]}}, "model: a mapping needs a 'name' string, got {'hidden': [8]}"),
    ({"model": 3}, "model: expected a name or a mapping with 'name', got 3"),
    ({"data": {"name": "digits", "root": 5}}, "data.root is a path: it must be a string, got 5"),
    ({"lr_schedule": 3}, "lr_schedule: expected a name or a mapping with 'name', got 3"),
    ({"ef_scale": 2, "memory": "ef"}, "ef_scale must be null, auto or a number in (0, 1], got 2"),
    ({"ef_scale": "half", "memory": "ef"}, "ef_scale must be null, auto or a number in (0, 1], got 'half'"),
    (
        {"gossip_gamma": 0, "sync": "gossip"},
        "gossip_gamma must be null (the compressor's safe value) or in (0, 1], got 0",
    ),
    ({"warmup": [0.5]}, "warmup must be null or a mapping {densities, steps_per_stage, dense_steps}, got [0.5]"),
    (
        {"warmup": {"densities": "dgc", "stages": 3}},
        "warmup: unknown key(s) stages; valid: densities, steps_per_stage, dense_steps",
    ),
    (
        {"warmup": {"densities": [0, 0.5]}},
        "warmup.densities must be 'dgc' or a list of numbers in (0, 1], got [0, 0.5]",
    ),
    (
        {"stragglers": {"fraction": 0.5, "slow": 2}},
        "stragglers must be null or a mapping {fraction, slowdown}, got {'fraction': 0.5, 'slow': 2}",
    ),
    ({"stragglers": {"fraction": "half"}}, "stragglers.fraction must be a number, got 'half'"),
    ({"wandb": None}, "wandb must be true, false or a mapping {project, mode, entity, group}, got None"),
    ({"wandb": {"projekt": "p"}}, "wandb: unknown key(s) projekt; valid: project, mode, entity, group, tags"),
    ({"advise": [1]}, "advise must be a mapping (cconv.advisor.space), got [1]"),
    ({"worker_speeds": 2}, "worker_speeds must be null or a list of 8 numbers, got 2"),
    ({"worker_speeds": [1, 0]}, "worker_speeds[] must be > 0.0, got 0"),
    ({"torus": "2x4", "sync": "gossip"}, "torus must be a list [rows, cols] or null, got '2x4'"),
    ({"mixing": [1, 2], "sync": "gossip"}, "mixing must be a list of rows (a P x P matrix) or null"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"seed": 2**63}, "seed must be an integer in [0, 2**63 - 1], got 9223372036854775808"),
    ({"seed": []}, "seed must be an integer in [0, 2**63 - 1] or a non-empty list of them, got []"),
    ({"seed": [1, 1]}, "seed list has duplicates: [1, 1]"),
    ({"seed": list(range(1001))}, "seed: 1001 seeds (more than 1000, limit MAX_SEEDS); split the run"),
    ({"network": [3]}, "network entries must be a preset name or a mapping {name, alpha, beta}, got 3"),
    ({"local_steps": "often"}, "local_steps must be an integer >= 1, got 'often'"),
    ({"max_staleness": 0}, "max_staleness must be an integer >= 1, got 0"),
    ({"servers": 0, "schedule": "bsp", "network": "10GbE"}, "servers must be an integer >= 1, got 0"),
    ({"architecture": "ring"}, "architecture must be one of all-to-all, parameter-server, ps, gtopk; got 'ring'"),
    ({"sync": "bulk"}, "sync must be one of bsp, ssp, asp, gossip, zero_one; got 'bulk'"),  # zero_one: 0/1 Adam's mode
]


@pytest.mark.parametrize("raw, message", RULE_MESSAGES)
def test_each_rule_gives_the_message_it_gave_before(raw, message):
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "raw, prefix",
    [
        ({"optimizer": "sgdd"}, "optimizer 'sgdd' is not an optax optimizer (a function of optax taking"),
        ({"lr_schedule": "cosinus"}, "lr_schedule 'cosinus' is not an optax schedule; valid: constant, cosine,"),
        ({"schedule": "eager"}, "schedule must be one of bsp, wfbp"),
        ({"launcher": "mpi"}, "launcher must be one of shard_map"),
    ],
)
def test_registry_names_are_looked_up_when_checked(raw, prefix):
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert str(e.value).startswith(prefix)


CROSS_MESSAGES = {  # CROSS_RULES' names: (a config that breaks only that rule, its message)
    "_batch_split": (
        {"batch_size": 100, "workers": 8},
        "batch_size 100 is not divisible by workers 8 (the global batch is split evenly)",
    ),
    "_ef_scale_needs_ef": ({"ef_scale": 0.5}, "ef_scale scales error feedback: it needs memory: ef, got memory: none"),
    "_check_bounds": ({"staleness": 400}, "staleness 400 is more than steps 300 (a bound past the run is moot)"),
    "_schedule_needs_network": ({"schedule": "wfbp"}, "schedule: wfbp sets the simulated time; it needs a network"),
    "_servers_need_schedule": ({"servers": 2}, "servers: the parameter servers of the simulated time need a schedule"),
    "_check_gossip": ({"topology": "torus"}, "topology: gossip keys, but sync is bsp (they need sync: gossip)"),
}


def test_every_cross_rule_has_its_case():
    assert [r.__name__ for r in CROSS_RULES] == list(CROSS_MESSAGES)


@pytest.mark.parametrize("rule", CROSS_RULES, ids=lambda r: r.__name__)
def test_cross_rules_run_after_the_keys_and_keep_their_messages(rule):
    raw, message = CROSS_MESSAGES[rule.__name__]
    unchecked = dataclasses.replace(RunConfig(), **raw)  # every key passes its own rule
    with pytest.raises(ConfigError) as direct:
        rule(unchecked)
    with pytest.raises(ConfigError) as loaded:
        from_dict(raw)
    assert str(direct.value) == str(loaded.value) == message
    for other in CROSS_RULES:
        if other is not rule:
            other(unchecked)  # the case breaks this rule only


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"max_staleness": 10_000}, "max_staleness 10000 is more than steps x workers = 2400"),
        ({"sync": "gossip", "workers": 1, "batch_size": 1}, "sync: gossip needs at least 2 workers, got workers: 1"),
    ],
)
def test_the_other_halves_of_the_cross_rules(raw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_dict(raw)


def test_a_key_is_checked_before_any_cross_rule():
    """A config with a bad key and a broken cross rule is refused for the key: cross rules see
    only values that passed their own rules (documented order of ``from_dict``)."""
    with pytest.raises(ConfigError, match=r"^lr must be > 0.0"):
        from_dict({"batch_size": 100, "workers": 8, "lr": -1})


def test_dotted_keys_reach_into_the_keys_the_schema_declares_dotted():
    dotted = [k for k, f in FIELDS.items() if f.metadata["dotted"]]
    assert dotted == ["model", "data", "optimizer", "lr_schedule", "compressor", "ps_downlink", "network", "wandb"]
    raw = C.apply_overrides({}, ["compressor.ratio=0.01", "lr_schedule.alpha=0.1", "wandb.project=p"])
    assert raw == {
        "compressor": {"name": "none", "ratio": 0.01},
        "lr_schedule": {"name": "constant", "alpha": 0.1},
        "wandb": {"project": "p"},
    }
    assert C.apply_overrides({"wandb": True}, ["wandb.project=p"]) == {"wandb": {"project": "p"}}
    with pytest.raises(ConfigError, match=r"^cannot set 'warmup.dense_steps': 'warmup' is not a mapping$"):
        C.apply_overrides({}, ["warmup.dense_steps=3"])


def test_a_dotted_key_into_a_number_is_refused_in_one_line():
    """Was a TypeError ('int' object is not iterable) from ``dict(3)``."""
    with pytest.raises(ConfigError, match=r"^cannot set 'model.hidden': model is 3, not a name or a mapping$"):
        C.apply_overrides({"model": 3}, ["model.hidden=[8]"])
