"""Validation gaps of issue 15 (item 5): wrong types in ``EngineConfig``/``Warmup``, negative
shapes in ``wire_bytes``, non-integer model sizes, and more workers than one process can hold.
Each is one ValueError line (exit 2 from the CLI), never a traceback, a truncation or a hang."""

import os
import subprocess
import sys

import jax
import pytest
import registry_cases as R

from cconv import compressors as C
from cconv import models
from cconv.engine.config import EngineConfig, Warmup
from cconv.theory import constants as T

TINY_YAML = (
    "model: {name: mlp, hidden: [8]}\ndata: digits\nworkers: 2\nbatch_size: 16\nsteps: 2\nlr: 0.1\n"
    "compressor: {name: topk, ratio: 0.1}\nlog_every: 1\ncheckpoint_every: 2\n"
)

BAD_ENGINE = {
    "momentum": ["0.9", None, 1.0, -0.1, float("nan"), True],
    "masking": [1, "yes", None],
    "compress_delta": [0, "false"],
    "compress_vectors": [1.0, None],
    "vote": ["true", 0],
    "clip": ["1", 0.0, float("inf"), True],
    "memory": [["ef"], 1],
    "workers": [2.0, "2", True],
    "axis_name": [3, ""],
}


@pytest.mark.parametrize(
    "field,value", [(f, v) for f, vs in BAD_ENGINE.items() for v in vs], ids=lambda x: repr(x)[:20]
)
def test_engine_config_wrong_type_is_one_line(field, value):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}") as info:
        EngineConfig(**{field: value})
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize(
    "args,kw",
    [((("x",),), {}), (("0.5",), {}), (((0.5,),), {"steps_per_stage": 1.5}), (((0.5,),), {"dense_steps": [1]})],
)
def test_warmup_wrong_type_is_one_line(args, kw):
    with pytest.raises(ValueError, match="Warmup: "):
        Warmup(*args, **kw)


@pytest.mark.parametrize("name", C.names())
@pytest.mark.parametrize("shape", [(-3,), (4, -3), (2.5,), ("a",)])
def test_wire_bytes_of_a_bad_shape_is_refused(name, shape):
    c = C.get(name, **R.first_case(name))  # the entry's first declared case
    with pytest.raises(ValueError, match="shape"):
        c.wire_bytes(shape)
    theory = C.entry(name).theory
    if shape[0] == -3 and theory is not None and theory.wire_bytes is not None:  # the closed form, where claimed
        with pytest.raises(ValueError, match="shape"):
            T.wire_bytes(c, shape)


@pytest.mark.parametrize(
    "name,shape,hp,fragment",
    [
        ("mlp", (64,), {"hidden": [8.5]}, "mlp hidden"),
        ("mlp", (64,), {"hidden": "8"}, "mlp hidden"),
        ("mlp", (64,), {"dropout": "a"}, "mlp dropout"),
        ("cnn", (8, 8, 1), {"hidden": 2.5}, "cnn hidden"),
        ("cnn", (8, 8, 1), {"channels": [4, True]}, "cnn channels"),
        ("resnet", (8, 8, 1), {"width": 1.5}, "resnet width"),
        ("resnet", (8, 8, 1), {"bn_momentum": None}, "resnet bn_momentum"),
        ("transformer", (16,), {"heads": 2.0}, "transformer heads"),
    ],
)
def test_model_sizes_must_be_integers(name, shape, hp, fragment):
    with pytest.raises(ValueError, match=fragment):
        models.build(name, shape, 10, 0, **hp)


def test_cli_model_width_not_an_integer_exit_2(tmp_path, capsys):
    from cconv import cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_YAML)
    rc = cli.main(["run", str(cfg), "--set", "model.hidden=[8.5]", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "hidden" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.slow
def test_more_workers_than_one_process_holds_exit_2_fast(command, tmp_path):
    """Before: workers=65536 spent minutes (silently) creating simulated CPU devices."""
    cfg = tmp_path / "c.yaml"
    if command == "run":
        cfg.write_text(TINY_YAML)
        extra = ["--set", "workers=65536", "--set", "batch_size=65536"]
    else:
        base = "".join(f"  {line}\n" for line in TINY_YAML.splitlines())
        cfg.write_text(f"base:\n{base}grid:\n  workers: [2, 4096]\n  batch_size: [4096]\n")
        extra = []
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-m", "cconv", command, str(cfg), "--out", str(tmp_path / "out"), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "at most 1024 workers" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_sweep_with_too_few_devices_creates_nothing(tmp_path, capsys):
    """The device check runs before the sweep directory is created.  In-process (``cli.main``):
    the test session has 8 simulated devices, as the real process here had (its XLA_FLAGS asked
    for 8); the refusal's own process is ``test_more_workers_than_one_process_holds_exit_2_fast``."""
    from cconv import cli

    assert len(jax.devices()) == 8
    base = "".join(f"  {line}\n" for line in TINY_YAML.splitlines())
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base:\n{base}grid:\n  workers: [2, 16]\n")
    rc = cli.main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "--no-figure"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "workers=16 but only 8" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
