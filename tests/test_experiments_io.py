"""Result files and checkpoints: fsync'ed JSONL, repair after a kill, atomic writes, orbax pytrees."""

import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cconv.experiments import io
from cconv.experiments.checkpoint import Checkpointer, decode_host_state, encode_host_state


def test_jsonl_lines_and_nonfinite(tmp_path):
    p = str(tmp_path / "m.jsonl")
    with io.LineLog(p) as w:
        w.write({"step": 1, "loss": float("nan"), "x": np.float32(2.5)})
        w.write_many([{"step": 2, "loss": float("inf")}, {"step": 3, "loss": jnp.asarray(0.5)}])
    text = open(p).read()
    assert "NaN" not in text and "Infinity" not in text
    lines = io.read_jsonl(p)
    assert [l["step"] for l in lines] == [1, 2, 3]
    assert lines[0]["loss"] is None and lines[0]["x"] == 2.5 and lines[1]["loss"] == "inf"
    assert lines[2]["loss"] == 0.5


def test_partial_last_line_is_ignored_and_repaired(tmp_path):
    p = str(tmp_path / "m.jsonl")
    with io.LineLog(p) as w:
        for s in (10, 20, 30):
            w.write({"step": s, "loss": 1.0 / s})
    with open(p, "a") as fh:  # what a kill in the middle of a write leaves
        fh.write('{"step": 40, "lo')
    assert [l["step"] for l in io.read_jsonl(p)] == [10, 20, 30]
    # resume from the checkpoint of step 20: drop the partial line and step 30
    assert io.repair_jsonl(p, 20) == 2
    assert [l["step"] for l in io.read_jsonl(p)] == [10, 20]
    assert open(p).read().endswith("\n")
    # appending after repair continues cleanly
    with io.LineLog(p) as w:
        w.write({"step": 30, "loss": 0.1})
    assert [l["step"] for l in io.read_jsonl(p)] == [10, 20, 30]
    assert io.repair_jsonl(p, None) == 3
    assert io.repair_jsonl(p, -1) == 0 and os.path.getsize(p) == 0


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = str(tmp_path / "summary.json")
    io.write_json(p, {"status": "running"})
    io.write_json(p, {"status": "completed", "loss": float("nan")})
    assert io.read_json(p) == {"status": "completed", "loss": None}
    assert sorted(os.listdir(tmp_path)) == ["summary.json"]
    assert io.is_finished(str(tmp_path))


def test_check_writable(tmp_path):
    io.check_writable(str(tmp_path / "a" / "b"))
    assert os.path.isdir(tmp_path / "a" / "b") and os.listdir(tmp_path / "a" / "b") == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        io.check_writable(str(blocker / "out"))


class Inner(NamedTuple):
    residual: jax.Array


class Empty(NamedTuple):
    pass


def test_checkpoint_roundtrip_of_arbitrary_pytree(tmp_path):
    n = min(4, jax.device_count())
    mesh = jax.make_mesh((n,), ("w",))
    sharded = jax.device_put(jnp.arange(2.0 * n).reshape(n, 2), NamedSharding(mesh, P("w")))
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    opt = optax.sgd(0.1, momentum=0.9)
    grads = jax.tree.map(jnp.ones_like, params)
    ostate = opt.update(grads, opt.init(params), params)[1]
    state = {
        "params": params,
        "opt": ostate,
        "mem": Inner(sharded),
        "empty": Empty(),
        "key": jax.random.key(7),
        "step": jnp.int32(12),
    }
    ck = Checkpointer(str(tmp_path / "ck"))
    assert ck.latest_step() is None
    host = {"perm": np.arange(6, dtype=np.int64), "pos": 4, "nested": {"epoch": 2}}
    ck.save(12, state, {"batcher": encode_host_state(host), "cum": [1.5, 2.0]})

    def floating(x):
        return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)

    state2 = jax.tree.map(lambda x: x * 2 if floating(x) else x, state)
    ck.save(24, state2, {"cum": [3.0, 4.0], "batcher": encode_host_state(host)})
    ck.close()
    assert sorted(os.listdir(tmp_path / "ck")) == ["24"]  # keep=1

    template = jax.tree.map(
        lambda x: jnp.zeros_like(x) if floating(x) else x, {**state, "key": jax.random.key(0), "step": jnp.int32(0)}
    )
    template["mem"] = Inner(jax.device_put(jnp.zeros((n, 2)), NamedSharding(mesh, P("w"))))
    step, restored, meta = Checkpointer(str(tmp_path / "ck")).restore(template)
    assert step == 24 and meta["cum"] == [3.0, 4.0]
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    np.testing.assert_array_equal(restored["mem"].residual, 2 * np.arange(2.0 * n).reshape(n, 2))
    assert restored["mem"].residual.sharding.is_equivalent_to(sharded.sharding, 2)
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    np.testing.assert_array_equal(restored["opt"][0].trace["w"], 2 * ostate[0].trace["w"])
    assert int(restored["step"]) == 12
    back = decode_host_state(meta["batcher"])
    assert back["pos"] == 4 and back["nested"] == {"epoch": 2}
    assert back["perm"].dtype == np.int64 and back["perm"].tolist() == list(range(6))
    json.dumps(meta)


def test_a_directory_holding_only_another_sweeps_transient_files_is_new(tmp_path, monkeypatch):
    """Two sweeps started at once on one directory: the second may list it while the first holds
    its write probe or its sweep.json's temporary file; that is an empty (new) directory, not a
    foreign one (before: 'is not empty and is not a cconv sweep directory', one sweep refused)."""
    from cconv.experiments import sweep

    fd, name = io._new_temp(str(tmp_path), "." + io.SWEEP_INDEX + ".")
    os.close(fd)
    assert io.is_transient(os.path.basename(name))
    probe = tmp_path / (io.WRITE_PROBE + "k2x9_a")
    probe.write_text("")
    assert sweep.read_index(str(tmp_path)) is None
    for name in ("notes.tmp", ".x.json.zzzzzzzzzzzz.tmp", ".x.json.abc.tmp", "..0123456789ab.tmp", "sweep.tmp"):
        assert not io.is_transient(name), name
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and is not a cconv sweep directory"):
        sweep.read_index(str(tmp_path))
