"""cconv plan of the run-config optimizers (1-bit Adam, 0/1 Adam): their phases, read from the
optimizer objects (``cconv.engine.stages``), each cost term against hand-computed values, the mean
over a run, and the CLI's refusals."""

import json
import math

import jax
import jax.numpy as jnp
import pytest
import registry_cases as R

from cconv import compressors as C
from cconv.engine import stages as ST
from cconv.engine.config import Warmup
from cconv.engine.onebit_adam import onebit_adam_engine
from cconv.engine.optimizers import MessageTransformation, register
from cconv.engine.zero_one_adam import sync_steps, variance_steps
from cconv.engine.zero_one_mode import zero_one_adam_engine
from cconv.theory import network as N
from cconv.theory import planner as PL
from cconv.theory import workloads as W

# D = 220 in two tensors (200 + 20); C = 1e6 FLOP/sample, M = 1, F = 1e12 -> t_comp = 1 us; P = 4;
# alpha = 0, beta = 1 ns/B: ring all-reduce 2 (P-1)/P n beta, ring all-gather (P-1) n beta.
TOY = W.Workload("toy", 220, 1e6, 1, ((10, 20), (20,)))
NET = N.Network("hand", 0.0, 1e-9)
P = 4
COMPUTE = 1e-6
DENSE_B = 4 * 220  # float32 all-reduce
ONE_BIT_B = (25 + 4) + (3 + 4)  # per tensor (the engine's layerwise packing): ceil(d/8) sign bytes + a float32 scale
ZERO_ONE = dict(var_freeze_step=2, var_update_scaler=1, local_step_scaler=2, local_step_clipper=2)


def _by_phase(rows):
    return {r.phase: r for r in rows}


def test_onebit_adam_stages_are_its_warmup_then_its_compressor():
    tx = onebit_adam_engine(0.1, warmup_steps=4)
    dense, comp = ST.of_optimizer(tx, 10, TOY.shapes)
    assert (dense.sends, dense.steps, dense.first, dense.compressor) == ("dense", 4, 0, None)
    assert (comp.sends, comp.steps, comp.first) == ("compressed", 6, 4)
    assert comp.compressor is tx.engine["compressor"] and comp.compressed == (True, True) and not comp.fused


def test_zero_one_adam_stages_follow_its_policies():
    """Hand count for var_freeze_step=2, kappa=1, scaler 2, H=2 over k = 1..12: the variance at k = 1,
    2 (dense), k = 3 the last unfrozen step (1 bit), then syncs at 4, 5, 6, 8, 10, 12 and local steps at
    7, 9, 11; the same counts from the drop-in's own policy functions."""
    tx = zero_one_adam_engine(0.1, **ZERO_ONE)
    got = {s.sends: s for s in ST.of_optimizer(tx, 12, TOY.shapes)}
    assert {k: s.steps for k, s in got.items()} == {"dense": 2, "compressed": 7, "nothing": 3}
    assert got["compressed"].kinds == ("one_bit", "first_sync", "sync") and got["nothing"].kinds == ("local",)
    v = variance_steps(ZERO_ONE["var_freeze_step"], ZERO_ONE["var_update_scaler"])
    s = sync_steps(ZERO_ONE["var_freeze_step"], ZERO_ONE["local_step_scaler"], ZERO_ONE["local_step_clipper"], 12)
    assert (v, s) == ([1, 2], [4, 5, 6, 8, 10, 12])
    assert got["dense"].steps == len(v) and got["nothing"].steps == 12 - (ZERO_ONE["var_freeze_step"] + 1) - len(s)


def test_stage_calls_each_cost_term():
    tx = onebit_adam_engine(0.1, warmup_steps=4)
    dense, comp = ST.of_optimizer(tx, 10, TOY.shapes)
    assert PL.stage_calls(dense, TOY, "fused") == [("allreduce", DENSE_B, 0)]
    assert PL.stage_calls(comp, TOY, "fused") == [("allgather", ONE_BIT_B, 0)]  # scaled_sign gathers
    assert PL.stage_calls(comp, TOY, "layerwise") == [("allgather", 29.0, 0), ("allgather", 7.0, 1)]
    assert PL.stage_calls(comp._replace(fused=True), TOY, "fused") == [("allgather", 28 + 4, 0)]  # one scale
    half = comp._replace(compressed=(True, False))  # the bias left dense (compress_vectors=False)
    assert PL.stage_calls(half, TOY, "layerwise") == [("allgather", 29.0, 0), ("allreduce", 80.0, 1)]
    assert PL.stage_calls(comp._replace(sends="nothing"), TOY, "fused") == []


def test_onebit_adam_rows_hand_computed():
    p = PL.plan(TOY, P, NET, 1e12, methods=["onebit_adam"], steps=10, fixed={"warmup_steps": 4})
    mean, rows = p.rows[0], _by_phase(p.rows[1:])
    assert p.compute_s == pytest.approx(COMPUTE)
    dense, comp = rows["dense"], rows["scaled_sign"]
    assert (dense.steps, comp.steps, mean.steps, mean.phase) == (4, 6, 10, PL.MEAN)
    assert dense.payload_bytes == DENSE_B and dense.sent_bytes == pytest.approx(2 * 3 / 4 * DENSE_B)
    assert dense.comm_s == pytest.approx(2 * 3 / 4 * DENSE_B * 1e-9) and dense.constant == "omega=0"
    assert comp.payload_bytes == ONE_BIT_B and comp.sent_bytes == 3 * ONE_BIT_B
    assert comp.comm_s == pytest.approx(3 * ONE_BIT_B * 1e-9) and comp.iter_s == pytest.approx(COMPUTE + comp.comm_s)
    assert comp.speedup == pytest.approx(P * COMPUTE / comp.iter_s)
    assert mean.payload_bytes == pytest.approx((4 * DENSE_B + 6 * ONE_BIT_B) / 10)
    assert mean.sent_bytes == pytest.approx((4 * 1.5 * DENSE_B + 6 * 3 * ONE_BIT_B) / 10)
    t = COMPUTE + (4 * 1.5 * DENSE_B + 6 * 3 * ONE_BIT_B) * 1e-9 / 10
    assert mean.iter_s == pytest.approx(t) and mean.speedup == pytest.approx(P * COMPUTE / t)
    assert mean.constant == comp.constant == f"delta={1 / 220:.3g}" and not mean.lossless  # scaled sign: 1/d
    assert mean.knobs == (("warmup_steps", 4),) and mean.setting == "warmup_steps=4"
    assert p.best() is mean and all(math.isfinite(x) for r in p.rows for x in r[2:7])


def test_zero_one_adam_rows_hand_computed():
    """2 dense, 7 one-bit (gradients and syncs of u: the same payload) and 3 silent steps of 12."""
    p = PL.plan(TOY, P, NET, 1e12, methods=["zero_one_adam"], steps=12, fixed=ZERO_ONE)
    mean, rows = p.rows[0], _by_phase(p.rows[1:])
    assert {k: r.steps for k, r in rows.items()} == {"dense": 2, "scaled_sign": 7, "nothing": 3}
    silent = rows["nothing"]
    assert (silent.payload_bytes, silent.sent_bytes, silent.comm_s, silent.iter_s) == (0, 0, 0, COMPUTE)
    assert silent.speedup == pytest.approx(P)
    comm = (2 * 1.5 * DENSE_B + 7 * 3 * ONE_BIT_B) * 1e-9 / 12
    assert mean.comm_s == pytest.approx(comm) and mean.payload_bytes == pytest.approx(
        (2 * DENSE_B + 7 * ONE_BIT_B) / 12
    )
    assert mean.speedup == pytest.approx(P * COMPUTE / (COMPUTE + comm))


@pytest.mark.parametrize("which", ["onebit_adam", "zero_one_adam"])
def test_planned_bytes_are_the_engines_traced_collectives(which):
    """Over 12 steps, the bytes the planner's stages move per collective kind are the bytes a built
    trainer hands to its collectives (``Trainer.collectives``: the engine's trace-time ledger, which
    the HLO tests check against the compiled program), step by step summed."""
    from cconv.engine import EngineConfig, build

    tx = onebit_adam_engine(0.1, warmup_steps=4) if which == "onebit_adam" else zero_one_adam_engine(0.1, **ZERO_ONE)
    params = {"w": jnp.zeros((10, 20)), "b": jnp.zeros((20,))}  # TOY's shapes, in the order jax flattens them
    toy = TOY._replace(shapes=tuple(x.shape for x in jax.tree.leaves(params)))
    loss = lambda p, ms, batch, key: (jnp.sum((batch @ p["w"] + p["b"]) ** 2), (ms, {}))
    trainer = build(loss, params, tx, EngineConfig(workers=P, launcher="vmap", **tx.engine))
    engine: dict[str, float] = {}
    for step in range(12):
        for c in trainer.collectives(step):
            engine[c.kind] = engine.get(c.kind, 0.0) + c.bytes * c.count
    planned: dict[str, float] = {}
    for st in ST.of_optimizer(tx, 12, toy.shapes, workers=P):
        for kind, nbytes, _ in PL.stage_calls(st, toy, "fused"):
            planned[kind] = planned.get(kind, 0.0) + nbytes * st.steps
    assert planned == engine and engine["allgather"] > 0 and engine["allreduce"] > 0


def test_the_planner_reads_the_object_not_the_name():
    """An optimizer registered from user code is planned by its registry name with what its object
    says: its compressor's payloads after its dense warm-up (no planner code names it)."""
    with R.registries_restored():
        comp = C.get("topk", ratio=0.1)

        def factory(learning_rate, warmup=2):
            noop = lambda *a: None
            return MessageTransformation(
                noop, noop, noop, {"compressor": comp, "warmup": Warmup((), dense_steps=warmup)}
            )

        register("my_opt", factory)
        p = PL.plan(TOY, P, NET, 1e12, methods=["my_opt"], steps=5)
    rows = _by_phase(p.rows[1:])
    assert (rows["dense"].steps, rows["topk"].steps) == (2, 3)
    assert rows["topk"].payload_bytes == comp.wire_bytes((10, 20)) + 4 * 20  # the bias dense (by default)


def test_every_new_method_is_planned_by_name():
    """Issue 37's methods in one plan: the compressors by their names, the optimizers over a run;
    every row finite.  (EF21's memories send their compressor's payloads: no method of their own.)"""
    names = ["drive", "eden", "thc", "onebit_adam", "zero_one_adam"]
    p = PL.plan(W.get("resnet50"), 16, N.get("10GbE"), methods=names, steps=300, fixed=ZERO_ONE)
    assert {r.method for r in p.rows} == set(names)
    assert all(math.isfinite(v) and v >= 0 for r in p.rows for v in (r.payload_bytes, r.comm_s, r.iter_s, r.speedup))


def test_steps_are_needed_by_and_only_by_optimizers():
    with pytest.raises(ValueError, match="onebit_adam is planned over a run: give its length"):
        PL.plan(TOY, P, NET, 1e12, methods=["onebit_adam"])
    with pytest.raises(ValueError, match="none is among the methods"):
        PL.plan(TOY, P, NET, 1e12, methods=["topk"], steps=10)
    with pytest.raises(ValueError, match="steps must be an integer in"):
        PL.plan(TOY, P, NET, 1e12, methods=["onebit_adam"], steps=0)
    every = PL.plan(TOY, P, NET, 1e12, steps=3)  # no methods: every compressor and every optimizer
    assert {"onebit_adam", "zero_one_adam", "topk"} <= {r.method for r in every.rows}


# --------------------------------------------------------------------------- the command line

BASE = ["plan", "--params", "220", "--flops-per-sample", "1e6", "--batch", "1", "--workers", "4"]
BASE += ["--network", "hand", "--alpha", "0", "--beta", "1e-9", "--device-flops", "1e12"]


def _main(argv, capsys):
    from cconv.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's usage errors (one line, exit 2)
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err.strip().splitlines()


def test_cli_prints_each_phase_and_the_mean(capsys):
    rc, out, _ = _main([*BASE, "--methods", "none,onebit_adam", "--steps", "10", "--hparam", "warmup_steps=4"], capsys)
    assert rc == 0
    assert "onebit_adam (warmup_steps=4) over 10 steps: one step of each phase" in out
    phase = next(line for line in out.splitlines() if line.startswith("  scaled_sign"))
    assert phase.split()[1:3] == ["6", "60.0%"] and "32 B" in phase  # --params: one tensor of 220, one scale
    rc, text, _ = _main(
        [*BASE, "--methods", "onebit_adam", "--steps", "10", "--hparam", "warmup_steps=4", "--json"], capsys
    )
    records = json.loads(text)
    assert rc == 0 and [r["phase"] for r in records] == ["mean", "dense", "scaled_sign"]
    assert [r["steps"] for r in records] == [10, 4, 6] and records[2]["kinds"] == ["bsp"]


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--methods", "onebit_adam"], "onebit_adam is planned over a run: give its length"),
        (["--methods", "topk", "--steps", "10"], "none is among the methods"),
        (["--methods", "zero_one_adam", "--steps", "0"], "expected a positive integer"),
        (["--methods", "onebit_adam", "--steps", "10", "--hparam", "warmup_steps=0"], "warmup_steps must be"),
        (["--methods", "onebit_adam", "--steps", "10", "--hparam", "warmup_steps=1.5"], "(expected int)"),
        (["--methods", "onebit_adam", "--steps", "10", "--hparam", "nosuch=1"], "no registered compressor"),
        (["--methods", "onebit_adam", "--steps", "10", "--per-layer-ratios", "topk=0.01"], "--per-layer-ratios"),
    ],
)
def test_cli_refusals_one_line_exit_2(extra, match, capsys):
    rc, out, err = _main([*BASE, *extra], capsys)
    assert rc == 2 and out == "" and len(err) == 1 and err[0].startswith("cconv: error:") and match in err[0], err


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--cluster", "2x4", "--methods", "onebit_adam", "--steps", "10"], "not with --cluster"),
        (["--cluster", "2x4", "--steps", "10"], "cannot be combined with --cluster"),
        (["--workers", "4", "--network", "10GbE", "--methods", "survey", "--steps", "10"], "method set survey"),
    ],
)
def test_cli_refuses_optimizers_outside_the_flat_model(argv, match, capsys):
    rc, out, err = _main(["plan", "--workload", "bert-base", *argv], capsys)
    assert rc == 2 and out == "" and len(err) == 1 and match in err[0], err


def test_docs_example_prints_as_shown(capsys):
    """docs/planner.md's optimizer example: the command's output is the page's text block."""
    import os
    import re

    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "planner.md"), encoding="utf-8").read()
    m = re.search(r"```bash\n(cconv plan [^\n]*--steps [^\n]*)\n```\n\n```text\n(.*?)\n```", page, re.S)
    assert m, "the optimizer example (a cconv plan --steps command and its output) is not in docs/planner.md"
    rc, out, _ = _main(m.group(1).split()[1:], capsys)
    assert rc == 0 and out.rstrip("\n") == m.group(2)
