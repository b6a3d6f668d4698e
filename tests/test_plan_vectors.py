"""The planner sizes messages tensor by tensor with the engine's rule for vectors (issue 33, issue 35's
leftover): a 1-D tensor (a bias, a norm scale) travels dense, 4 bytes an element, in an all-reduce,
unless ``compress_vectors``; the default is the engine's (``ENGINE_DEFAULTS``), a published
implementation states its own (``Implementation.compress_vectors``), ``cconv plan --compress-vectors``
overrides both.  Bytes are hand-computed for a workload of one 10 x 100 matrix and its 10-element
bias (1,010 parameters): top-k at ratio 0.1 keeps k = 100 of the matrix's 1,000 entries (4-byte
value + 4-byte index: 800 B) and sends the bias dense (40 B); compressing the bias too, the flat
1,010-vector keeps k = 101 (808 B).  PowerSGD rank 1 on the matrix: (10 + 100) x 4 = 440 B."""

from __future__ import annotations

import json

import pytest

from cconv import cli
from cconv import compressors as C
from cconv.engine.config import ENGINE_DEFAULTS
from cconv.theory import cluster as CL
from cconv.theory import implementation as IM
from cconv.theory import planner as PL
from cconv.theory import predict as PR
from cconv.theory import profiles as P
from cconv.theory import workloads as W
from cconv.theory.devices import Device
from cconv.theory.schedule import compress as CC

TINY = W.Workload("tiny", 1010, 1.0, 1, ((10, 100), (10,)))
DEV = Device("toy", 1e12, 1e9, 5e-6)
BENCH = {"topk": (CC.Ratio(1.0, 2.0, 1.0),), "powersgd": (CC.Ratio(1.0, 2.0, 1.0),)}


def _prof():
    return P.make("tiny", [("fc", 1e9, 2e9, 4 * 1010, ((10, 100), (10,)))], 8)


def test_planner_calls_by_hand_under_both_settings():
    m, c = PL.all_methods()["topk"], C.get("topk", ratio=0.1)
    assert ENGINE_DEFAULTS["compress_vectors"] is False  # the hand values below assume the engine's default
    assert PL.calls(m, c, TINY, "fused") == [("allgather", 800.0, 0), ("allreduce", 40.0, 0)]
    assert PL.calls(m, c, TINY, "fused", compress_vectors=True) == [("allgather", 808.0, 0)]
    assert PL.calls(m, c, TINY, "layerwise") == [("allgather", 800.0, 0), ("allreduce", 40.0, 1)]
    flat = W.custom(1010, 1.0, 1)  # known only by D: one flat vector standing for its tensors, compressed whole
    assert PL.calls(m, c, flat, "fused") == [("allgather", 808.0, 0)]


def test_layer_costs_by_hand_under_both_settings():
    """An all-gathered payload and the bias's all-reduce are two messages (the vectors' one without
    compute, ready with the layer); PowerSGD's factors are all-reduced with the dense bias in one."""
    dense = CC.layer_costs(_prof(), "topk", 4, DEV, hparams={"ratio": 0.1}, bench=BENCH)
    assert [(lc.name, lc.kind, lc.nbytes, lc.fwd_s, lc.bwd_s) for lc in dense] == [
        ("fc", "allgather", 800.0, 1e-3, 2e-3),
        ("fc:dense", "allreduce", 40.0, 0.0, 0.0),
    ]
    floor = 4 * 1000 / 1e9  # the compressed matrix's read floor: the bias costs no compression
    assert dense[0].compress_s == pytest.approx(2.0 * floor + 5e-6) and dense[1].compress_s == 0.0
    every = CC.layer_costs(_prof(), "topk", 4, DEV, hparams={"ratio": 0.1}, bench=BENCH, compress_vectors=True)
    assert [(lc.kind, lc.nbytes) for lc in every] == [("allgather", 808.0)]
    ps = CC.layer_costs(_prof(), "powersgd", 4, DEV, hparams={"rank": 1}, bench=BENCH)
    assert [(lc.kind, lc.nbytes) for lc in ps] == [("allreduce", 440.0 + 40.0)]


def test_implementation_records_state_their_rule_and_its_source():
    assert IM.get("fused").compress_vectors is None  # cconv's program: the plan's setting, else the engine's
    for name, rule in (("per-tensor", True), ("mpi", True), ("espresso", True), ("ddp-hook", False)):
        impl = IM.get(name)
        assert impl.compress_vectors is rule and ".py" in impl.vectors_source, name
    fused = IM.get("fused")
    assert IM.vectors_of(fused) is ENGINE_DEFAULTS["compress_vectors"]
    assert IM.vectors_of(fused, own=True) is True and IM.vectors_of(IM.get("ddp-hook"), own=True) is False
    assert IM.vectors_of(IM.get("ddp-hook"), given=True) is True  # the plan's explicit setting first


def _plan_json(capsys, *argv) -> list[dict]:
    assert cli.main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_flag_reaches_the_model(capsys):
    """``--compress-vectors`` reaches both models: the cluster rows equal ``predict``'s with the
    setting, and the planner's payload is the flat vector's, where by default the biases are dense."""
    argv = ["--workload", "resnet50", "--cluster", "2x1", "--network", "10GbE", "--methods", "topk", "--ratios", "0.01"]
    default, flag = _plan_json(capsys, *argv), _plan_json(capsys, *argv, "--compress-vectors")
    c = CL.parse("2x1", CL.DEFAULT_INTRA, "10GbE", CL.DEFAULT_DEVICE)
    for rows, setting in ((default, False), (flag, True)):
        (want,) = PR.predict(c, "resnet50", ["topk"], sweep={"ratio": [0.01]}, compress_vectors=setting)
        assert rows[0]["bytes"] == want.bytes and rows[0]["iteration_time_s"] == want.iteration_time_s
    assert default[0]["bytes"] != flag[0]["bytes"]
    argv = ["--workload", "resnet50", "--workers", "8", "--network", "10GbE", "--methods", "topk", "--ratios", "0.01"]
    default, flag = _plan_json(capsys, *argv), _plan_json(capsys, *argv, "--compress-vectors")
    shapes, topk = W.get("resnet50").shapes, C.get("topk", ratio=0.01)
    vec = sum(s[0] for s in shapes if len(s) == 1)
    assert default[0]["payload_bytes"] == topk.wire_bytes((W.get("resnet50").params - vec,), "float32") + 4 * vec
    assert flag[0]["payload_bytes"] == topk.wire_bytes((W.get("resnet50").params,), "float32")


def test_plan_measure_takes_the_configs_setting(capsys):
    rc = cli.main(["plan", "--cluster", "1x2", "--measure", "missing.yaml", "--compress-vectors"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "the config's compress_vectors" in err


@pytest.mark.slow  # builds two tiny runs (~2 s)
def test_a_runs_profile_carries_its_configs_setting():
    """``cconv plan --measure``: the run's profile carries its config's ``compress_vectors``, so the
    model sizes the bytes the measured step sends (the MLP's biases dense, or compressed with it)."""
    from runs_helpers import tiny

    from cconv.experiments import build, clock
    from cconv.experiments.config import from_dict

    c = CL.parse("1x2", "NVLink", "10GbE", "v100")
    out = {}
    for setting in (False, True):
        prof = clock.profile_of(build.problem(from_dict(tiny(compress_vectors=setting))))
        assert prof.compress_vectors is setting
        (row,) = PR.predict(c, prof, ["topk"], sweep={"ratio": [0.1]})
        (want,) = PR.predict(c, prof._replace(compress_vectors=None), ["topk"], sweep={"ratio": [0.1]},
                             compress_vectors=setting)  # fmt: skip
        out[setting] = row.bytes
        assert row.bytes == want.bytes
    bias = sum(s[0] for lay in prof.layers for s in lay.shapes if len(s) == 1)
    assert bias > 0 and out[False] > out[True]  # the biases' 4 bytes an element against their top-k share


def test_ddp_powersgd_hook_sends_a_matrix_not_worth_compressing_dense():
    """DDP's PowerSGD hook compresses a matrix only if (rows + cols) x rank x min_compression_rate
    < rows x cols (``_should_compress``, min_compression_rate 2): the 10 x 100 matrix, (100, 10) in
    PyTorch's layout, is factorised at rank 4 ((100 + 10) x 4 x 4 B = 1,760 B; 3,520 < 4,000) and
    all-reduced dense with its bias at rank 5 (4,400 > 4,000: 4,000 + 40 B, nothing to compress);
    cconv's fused program factorises it at any rank."""
    assert IM.IMPLEMENTATIONS["ddp-hook"].min_compression_rate == IM.DDP_MIN_COMPRESSION_RATE == 2.0
    assert "_should_compress" in IM.IMPLEMENTATIONS["ddp-hook"].vectors_source

    def bucket(rank, impl):
        (lc,) = CC.layer_costs(_prof(), "powersgd", 4, DEV, hparams={"rank": rank}, bench=BENCH, implementation=impl)
        return lc.kind, lc.nbytes, lc.compress_s > 0

    assert bucket(4, "ddp-hook") == ("allreduce", 1760.0 + 40.0, True)
    assert bucket(5, "ddp-hook") == ("allreduce", 4000.0 + 40.0, False)
    assert bucket(5, "fused") == ("allreduce", 2200.0 + 40.0, True)
    assert IM.worth_compressing(4000.0, 1999.0, IM.IMPLEMENTATIONS["ddp-hook"])
    assert not IM.worth_compressing(4000.0, 2000.0, IM.IMPLEMENTATIONS["ddp-hook"])  # strictly more than 2x
    assert IM.worth_compressing(4000.0, 4000.0, IM.IMPLEMENTATIONS["fused"])  # no such rule
