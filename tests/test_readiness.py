"""GPU and TPU readiness without a device (``cconv.doctor``, issue 25).

Every training step the engine accepts -- each compressor (its entry's example; its schema's
switches too with ``-m extended``) x memory x aggregation option x architecture x launcher of the doctor's
set -- is exported with ``jax.export`` for CUDA, ROCm and TPU (lowered, not compiled): it must
lower, call no CPU-only custom call, and its collectives must move the bytes cconv logs.  The
parser of lowered StableHLO that the byte check rests on is tested on programs built to trip it
(a collective in a loop, a function called twice), and the check itself on a ledger that lies.
"""

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from jax import lax

from cconv import _native, cli, doctor
from cconv.comm import hlo
from cconv.compressors import select

QUICK = doctor.combos()
FULL_ONLY = sorted(set(doctor.combos(full=True)) - set(QUICK))
NAMES = sorted({c.compressor for c in QUICK})


def _kind(name: str) -> tuple:
    """What decides how a compressor's step is built and lowered: its aggregation, extra
    collectives, vote, agreement, sparse and variable-length payloads, bias (read from its entry
    and the compressor it builds, never from its name)."""
    from cconv import compressors as C

    e = C.entry(name)
    c = C.get(name, **dict(e.example))
    return (
        c.aggregation,
        e.collectives,
        e.votes,
        c.agree is not None,
        c.sparse is not None,
        c.variable_length,
        c.unbiased,
    )


def _one_of_each_kind(names: list) -> list:
    """The first compressor of each ``_kind`` runs in CI; the others of the same kind (the same
    program structure with another codec) run with ``-m extended``."""
    first: dict = {}
    for n in names:
        first.setdefault(_kind(n), n)
    keep = set(first.values())
    return [n if n in keep else pytest.param(n, marks=pytest.mark.extended) for n in names]


def _check_all(combos):
    results = [r for c in combos for r in doctor.check(c)]
    fails = [f"{r.platform}: {r.combo.label}: {r.reason}" for r in results if r.status == "fails"]
    assert not fails, "\n".join(fails)
    assert all(r.reason for r in results if r.status != "lowers")  # nothing skipped silently
    assert {r.platform for r in results} == set(doctor.PLATFORMS)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", _one_of_each_kind(NAMES))
def test_every_step_lowers_for_cuda_rocm_tpu(name):
    results = _check_all([c for c in QUICK if c.compressor == name])
    lowered = [r for r in results if r.status == "lowers"]
    # the default configuration (no memory, all-to-all, shard_map) and the one-device launcher lower
    for launcher in (doctor.DEFAULT_LAUNCHER, doctor.ONE_DEVICE):
        got = {r.platform for r in lowered if r.combo.launcher == launcher and r.combo.memory == "none"}
        assert got == set(doctor.PLATFORMS), launcher
    # real traffic was found and matched on the mesh; none in the one-device program
    assert any(r.collectives > 0 and r.bytes_sent > 0 for r in lowered if r.combo.launcher == doctor.DEFAULT_LAUNCHER)
    assert all(r.collectives == 0 for r in lowered if r.combo.launcher == doctor.ONE_DEVICE)


def test_full_settings_flip_each_switch_of_the_schema_once():
    """``--full``'s settings come from the schema, not from test cases: the example, then each
    "str" choice / "bool" value other than the example's, one at a time, all of which build."""
    from cconv import compressors as C

    for e in C.entries():
        got = doctor.settings(e)
        assert got[0] == dict(e.example) and len(got) == len({tuple(sorted(h.items())) for h in got})
        for hp in got[1:]:
            (changed,) = [k for k in hp if hp[k] != e.schema.validate(e.name, e.example).get(k)]
            assert next(p for p in e.schema.params if p.name == changed).type in ("str", "bool")
            C.get(e.name, **hp)
    topk = doctor.settings(C.entry("topk"))
    assert {**dict(C.entry("topk").example), "positions": "golomb"} in topk


def test_quick_set_covers_every_compressor_memory_method_and_launcher():
    from cconv import compressors as C
    from cconv import memory as M
    from cconv.comm.aggregation import COLLECTIVES, TRANSPORTS
    from cconv.engine.launchers import LAUNCHERS

    assert set(NAMES) == set(C.names())
    assert {c.memory for c in QUICK} == set(M.MEMORIES)
    assert {c.architecture for c in QUICK} == set(TRANSPORTS)
    assert {c.collective for c in QUICK} == set(COLLECTIVES) and any(c.vote for c in QUICK)
    assert {c.launcher for c in QUICK} == set(LAUNCHERS)
    for name in NAMES:  # every memory with every compressor
        assert {c.memory for c in QUICK if c.compressor == name} == set(M.MEMORIES)


@pytest.mark.extended
@pytest.mark.parametrize("name", NAMES)
def test_every_combination_lowers_for_cuda_rocm_tpu(name):
    _check_all([c for c in FULL_ONLY if c.compressor == name])


def test_doctor_cli_prints_the_table(monkeypatch, tmp_path, capsys):
    topk = next(c for c in QUICK if c.compressor == "topk")
    powersgd = next(c for c in QUICK if c.compressor == "powersgd")
    picked = [topk, topk._replace(memory="dgc"), topk._replace(launcher="pmap"), topk._replace(collective="allgather")]
    picked.append(powersgd._replace(memory="dgc"))  # refused by the engine: a reason, not a failure
    monkeypatch.setattr(doctor, "combos", lambda full=False: picked)
    out = tmp_path / "new" / "doctor.json"  # its directory is made, as report --csv makes its own
    assert cli.main(["doctor", "--platform", "cuda", "--json", str(out)]) == 0
    assert [r["status"] for r in json.loads(out.read_text())][:1] == ["lowers"]
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("compressor (options)"))
    assert header.split() == ["compressor", "(options)", "cuda"]
    assert re.search(rf"^{topk.row} +lowers \(3\)$", text, re.M)  # pmap is not exported; the other three lower
    # the reasons sit in a column of a table, as sentences: no exception class, no raw dict at the end
    assert re.search(r"^1 +topk +Function to be exported must be the result of `jit`", text, re.M)
    assert re.search(r"^n +compressors +reason$", text, re.M)
    assert re.search(r"^1 +powersgd +powersgd supports memory='ef' or 'none'", text, re.M)
    assert "Error:" not in text and "{" not in text.splitlines()[-1]
    assert text.splitlines()[-1].startswith(
        "All 3 valid combinations lower for cuda, with the bytes cconv logs. Not checked, with their reasons "
        "above: 1 combination refused by the engine and 1 combination that jax.export cannot export. ("
    )
    rows = json.loads(out.read_text())
    assert [r["status"] for r in rows].count("lowers") == 3 and rows[0]["combo"]["hparams"] == dict(topk.hparams)
    assert [r["status"] for r in rows].count("refused") == 1 and "ValueError: " in rows[-1]["reason"]


def test_doctor_rejects_an_unknown_platform(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--platform", "metal"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the checks can fail

MESH = jax.make_mesh((4,), ("w",), devices=jax.devices()[:4], axis_types=(jax.sharding.AxisType.Auto,))
X = jax.ShapeDtypeStruct((8,), jnp.float32)


def _export(body, platform="cuda"):
    f = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=jax.P("w"), out_specs=jax.P("w"), check_vma=False))
    return jax.export.export(f, platforms=(platform,))(X)


def test_stablehlo_collective_in_a_loop_is_refused():
    text = _export(lambda x: lax.fori_loop(0, 3, lambda i, v: lax.psum(v, "w") * 0.5, x)).mlir_module()
    (c,) = hlo.stablehlo_collectives(text)
    assert c.op == "all-reduce" and c.shapes == (("f32", (2,)),) and not c.entry
    with pytest.raises(ValueError, match="data dependent"):
        hlo.traffic([c], 4)


def test_stablehlo_function_called_twice_counts_twice():
    inner = jax.jit(lambda v: lax.all_gather(v, "w", tiled=True)[:2])
    text = _export(lambda x: inner(inner(x) + 1.0)).mlir_module()
    found = hlo.stablehlo_collectives(text)
    assert [c.op for c in found] == ["all-gather", "all-gather"] and all(c.entry for c in found)
    sent, recv = hlo.traffic(found, 4)  # each gathers 4 x 2 float32: (n - 1) / n * 32 B per device
    np.testing.assert_allclose(sent, 2 * 24.0) and np.testing.assert_allclose(recv, 2 * 24.0)


def test_stablehlo_permute_pairs_and_bytes():
    text = _export(lambda x: lax.ppermute(x, "w", [(0, 1), (1, 2)])).mlir_module()
    (c,) = hlo.stablehlo_collectives(text)
    assert c.op == "collective-permute" and c.pairs == ((0, 1), (1, 2))
    sent, recv = hlo.traffic([c], 4)
    np.testing.assert_array_equal(sent, [8, 8, 0, 0]) and np.testing.assert_array_equal(recv, [0, 8, 8, 0])


class _LyingLedger:
    def __init__(self, sent):
        self.sent = np.asarray(sent, float)

    def traffic(self, step, control=False):
        return self.sent, self.sent


def test_verdict_fails_on_a_byte_mismatch_and_on_a_cpu_only_call():
    exported = _export(lambda x: lax.psum(x, "w"))  # 2 floats, ring: 2 (n - 1) / n * 8 = 12 B
    assert doctor._verdict(_LyingLedger([12.0] * 4), exported, one_device=False)[0] == "lowers"
    status, reason, *_ = doctor._verdict(_LyingLedger([0.0] * 4), exported, one_device=False)
    assert status == "fails" and "cconv logs" in reason
    assert doctor._verdict(_LyingLedger([12.0] * 4), exported, one_device=True)[0] == "fails"
    if _native.available():  # the native kernel lowered for the CPU is what must never reach a GPU step
        f = jax.jit(lambda v: select.topk_indices(v, 3))
        cpu = jax.export.export(
            f, platforms=("cpu",), disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(_native.TOPK_TARGET)]
        )(jax.ShapeDtypeStruct((100,), jnp.float32))
        assert doctor.cpu_only_calls(cpu.mlir_module()) == [_native.TOPK_TARGET]
        status, reason, *_ = doctor._verdict(_LyingLedger([0.0] * 4), cpu, one_device=True)
        assert status == "fails" and _native.TOPK_TARGET in reason


# ----------------------------------------------------------------------------- the GPU check script

GPU_CHECK = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"


def _gpu_check(*args, cwd):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(GPU_CHECK), *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_gpu_check_refuses_to_file_a_cpu_table_under_a_gpu_name(tmp_path):
    p = _gpu_check("--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "gpu_check: error: no GPU here (jax backend 'cpu'); --dry-run tests the script"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_table(tmp_path):
    # The one command of docs/gpu.md, at tiny sizes on the CPU (a real process: the claim is the script).
    out, runs = tmp_path / "out", tmp_path / "runs"
    p = _gpu_check("--dry-run", "--out", str(out), "--runs", str(runs), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    check = json.loads((out / "dry-cpu-check.json").read_text())
    assert check["backend"] == "cpu" and [s["returncode"] for s in check["steps"]] == [0] * 5
    profile = json.loads((out / "dry-cpu-profile.json").read_text())
    assert profile["device"]["flops"] > 0 and [r["d"] for r in profile["compressors"]["topk"]] == [1000]
    plan = (out / "dry-cpu-plan.md").read_text()
    assert plan.count("$ cconv plan --cluster 1x1 --measure gpu_measured.yaml") == 2
    assert "--device-profile dry-cpu-profile.json" in plan and "modelled on h100" in plan
    assert [line.split()[0] for line in plan.splitlines() if line.startswith(("none ", "topk "))] == [
        "none",
        "topk",
    ] * 2
    bench = json.loads((out / "dry-cpu.json").read_text())
    assert "topk" in {r["name"] for r in bench["a"]["rows"]} and bench["a"]["floors"][0]["read_floor_s"] > 0
    assert {r["config"] for r in bench["b"]["rows"]} == {"dense", "topk 1% + EF"}
    assert "## (a)" in (out / "dry-cpu.md").read_text()
    sweep = yaml.safe_load((runs / "dry-cpu-quickstart.yaml").read_text())
    assert sweep["base"]["launcher"] == "vmap" and sweep["base"]["workers"] == 8
    rows = list(csv.DictReader(open(out / "dry-cpu-quickstart.csv")))
    assert [r["compressor"] for r in rows] == ["topk"]


def test_gpu_check_names_and_full_sweep():
    spec = importlib.util.spec_from_file_location(
        "gpu_check", GPU_CHECK.parent.parent / "studies/benchmarks/gpu_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (
        mod.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
        and mod.slug("AMD Instinct MI300X") == "amd-instinct-mi300x"
    )
    full, quickstart = mod.sweep_config(dry=False), yaml.safe_load(mod.QUICKSTART.read_text())
    assert full["base"].pop("launcher") == "vmap" and full == quickstart  # the quickstart, only the launcher set
