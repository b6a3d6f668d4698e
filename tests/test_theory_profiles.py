"""Layer profiles (cconv.theory.profiles): presets against the survey's workloads, and profiles
derived from cconv's own models against the FLOP count of the compiled model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from cconv import models
from cconv.theory import profiles as P
from cconv.theory import workloads as W


@pytest.mark.parametrize("name", P.names())
def test_presets_have_the_workloads_parameters(name):
    p, w = P.get(name), W.get(name)
    assert p.params == w.params
    assert p.batch == w.batch
    assert all(lay.fwd_flops >= 0 and lay.bwd_flops >= 0 and lay.grad_bytes > 0 for lay in p.layers)


def test_resnet50_is_4_09_gmacs_per_image_and_the_survey_counts_macs():
    p = P.get("resnet50")
    macs = p.fwd_flops / 2 / p.batch
    assert macs == pytest.approx(4.09e9, rel=0.005)  # the well-known figure (torchvision, fc included)
    # the survey's C = 470 D is 3 x MACs (a multiply-accumulate counted once) within 3 %
    assert 3 * macs == pytest.approx(W.get("resnet50").flops_per_sample, rel=0.03)
    assert [lay.name for lay in p.layers[:1]] == ["fc"] and p.layers[-1].name == "conv1"
    assert len(p.layers) == 54  # 53 convolutions (each with its BN) and fc


def test_bert_embeddings_hold_many_parameters_and_no_flops():
    p = P.get("bert-base")
    emb = p.layers[-1]
    assert emb.name == "embeddings" and emb.fwd_flops == 0 and emb.bwd_flops == 0
    assert emb.grad_bytes / 4 == W.embedding_params(W.get("bert-base")) + 2 * 768
    assert emb.grad_bytes / (4 * p.params) > 0.2
    # C per sample within 25 % of the survey's (Base) and 60 % (Large): see the module docstring
    assert p.flops_per_sample / W.get("bert-base").flops_per_sample == pytest.approx(1.21, abs=0.02)
    large = P.get("bert-large")
    assert large.flops_per_sample / W.get("bert-large").flops_per_sample == pytest.approx(1.57, abs=0.02)


def test_backward_is_twice_forward_except_the_first_layer():
    p = P.get("resnet50")
    assert p.layers[-1].bwd_flops == p.layers[-1].fwd_flops
    assert all(lay.bwd_flops == 2 * lay.fwd_flops for lay in p.layers[:-1])


def test_scaled_keeps_the_shape():
    p = P.get("bert-base")
    s = P.scaled(p, W.get("bert-base").flops_per_sample)
    assert s.flops_per_sample == pytest.approx(W.get("bert-base").flops_per_sample)
    assert [lay.grad_bytes for lay in s.layers] == [lay.grad_bytes for lay in p.layers]
    r = s.layers[3].fwd_flops / p.layers[3].fwd_flops
    assert s.layers[10].bwd_flops / p.layers[10].bwd_flops == pytest.approx(r)


@pytest.mark.parametrize(
    "bad, match",
    [
        ([("a", -1.0, 0.0, 4.0)], "fwd_flops"),
        ([("a", 1.0, 2.0, -4.0)], "grad_bytes"),
        ([{"name": "a", "fwd_flops": 1.0}], "lacks"),
        ([], "no layers"),
        ([("a", float("nan"), 0.0, 4.0)], "finite"),
    ],
)
def test_bad_layer_tables_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match) as e:
        P.make("t", bad, 8)
    assert "\n" not in str(e.value)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile 'gpt'"):
        P.get("gpt")


# --------------------------------------------------------------------------- cconv's own models

CASES = {
    "mlp": ((8, 8, 1), 10, {"hidden": (64, 64)}),
    "cnn": ((12, 12, 1), 10, {"channels": (4, 8), "hidden": 16}),
    "resnet8": ((8, 8, 3), 10, {"width": 4}),
    "transformer": ((16,), 32, {"d_model": 32, "layers": 2, "heads": 2}),
    "linear": ((8, 8, 1), 10, {}),
}


@pytest.fixture(scope="module")
def derived():
    out = {}
    for m, (shape, nc, hp) in CASES.items():
        spec = P.abstract_spec(m, shape, nc, **hp)  # shapes only: nothing is initialised
        x = jax.ShapeDtypeStruct((8, *shape), jnp.int32 if m == "transformer" else jnp.float32)
        out[m] = (spec, x, P.from_spec(m, spec, x))
    return out


@pytest.mark.parametrize("model", list(CASES))
def test_derived_profile_matches_the_compiled_model(derived, model):
    spec, x, p = derived[model]
    shape, nc, hp = CASES[model]
    real, _ = jax.eval_shape(models.initializer(model, shape, nc, **hp), jax.random.key(0))
    assert p.params == spec.num_params == sum(leaf.size for leaf in jax.tree.leaves(real))
    assert p.batch == 8

    state = jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), spec.model_state)

    def forward(params, xb):
        return spec.apply(params, state, xb, True, None)[0].astype(jnp.float32)

    fwd = jax.jit(forward).lower(spec.params, x).cost_analysis()["flops"]
    # products only (no elementwise ops); XLA skips padded convolution taps: within 10 %
    assert p.fwd_flops == pytest.approx(fwd, rel=0.10)
    if model != "linear":  # a linear model's weight gradient does not need its forward pass
        both = jax.jit(jax.grad(lambda q, xb: forward(q, xb).sum())).lower(spec.params, x).cost_analysis()["flops"]
        assert p.fwd_flops + p.bwd_flops == pytest.approx(both, rel=0.10)


def test_derived_layers_in_backprop_order(derived):
    names = [lay.name for lay in derived["mlp"][2].layers]
    assert names == ["head", "layer1", "layer0"]
    t = [lay.name for lay in derived["transformer"][2].layers]
    assert t[0] == "head" and t[-1] == "embed"
    assert derived["transformer"][2].layers[-1].fwd_flops == 0  # a lookup, no product


# --------------------------------------------------------------------------- compression in the schedule

from cconv import compressors  # noqa: E402
from cconv.theory import constants as K  # noqa: E402
from cconv.theory import network as N  # noqa: E402
from cconv.theory import planner as PL  # noqa: E402
from cconv.theory.schedule import arch as A  # noqa: E402
from cconv.theory.schedule import compress as CC  # noqa: E402
from cconv.theory.schedule import ratios as R  # noqa: E402

TOY = P.make("toy", [("c", 1e9, 2e9, 4e6), ("b", 3e10, 6e10, 4e5), ("a", 1e9, 1e9, 4e6)], 8)


def _sparsifier() -> str:
    """A registered contractive compressor with an allgather payload and a ratio knob (no names)."""
    for e in compressors.entries():
        if e.knob is None or e.knob.name != "ratio" or e.aggregation != "allgather":
            continue
        if K.constants(compressors.get(e.name, ratio=0.01), (1000,)).kind == "contractive":
            return e.name
    pytest.skip("no contractive ratio compressor registered")


def test_identity_adds_no_operation_and_sends_the_gradient():
    lcs = CC.layer_costs(TOY, PL.identity_name(), 8)
    assert [lc.nbytes for lc in lcs] == [lay.grad_bytes for lay in TOY.layers]
    assert all(lc.compress_s == 0 and lc.decompress_s == 0 for lc in lcs)
    assert lcs[1].bwd_s == pytest.approx(6e10 / CC.SURVEY_DEVICE.flops)


def test_compress_costs_scale_with_the_measured_ratio_and_the_read_floor():
    m = _sparsifier()
    bench = {PL.all_methods()[m].compressor: (CC.Ratio(1e5, 2.0, 1.0), CC.Ratio(1e7, 4.0, 3.0))}
    dev = CC.Device("d", 1e12, 1e11, 0.0)
    lcs = CC.layer_costs(TOY, m, 8, dev, hparams={"ratio": 0.01}, bench=bench)
    d = 1e6  # 4e6 bytes: halfway between 1e5 and 1e7 on a log scale
    assert lcs[0].compress_s == pytest.approx(3.0 * 4 * d / 1e11)
    assert lcs[0].decompress_s == pytest.approx(8 * 2.0 * 4 * d / 1e11)  # 8 gathered payloads
    assert lcs[0].kind == "allgather" and lcs[0].nbytes < 4e6 / 10
    assert CC.ratio_at(bench[PL.all_methods()[m].compressor], 1e3) == (2.0, 1.0)  # held outside


def test_benchmark_ratios_are_read_by_registry_name():
    bench = CC.load_bench()
    assert set(bench) <= set(compressors.names()) and _sparsifier() in bench
    # a compressor without a row (registered after the committed benchmark ran): an estimated
    # cost (its Bench.target_x, else the median of the measured ones) and a warning, never a failure
    m = _sparsifier()
    name = PL.all_methods()[m].compressor
    rest = {k: v for k, v in bench.items() if k != name}
    target = compressors.entry(name).bench.target_x
    with pytest.warns(CC.EstimatedCostWarning, match=f"no benchmark row for {name!r}"):
        lc = CC.layer_costs(TOY, m, 8, hparams={"ratio": 0.01}, bench=rest)[0]
    d = TOY.layers[0].grad_bytes / 4
    assert lc.compress_s == pytest.approx(target * CC.SURVEY_DEVICE.read_floor(d) + CC.SURVEY_DEVICE.launch_s)
    untargeted = next(e.name for e in compressors.entries() if e.bench is None or e.bench.target_x is None)
    with pytest.warns(CC.EstimatedCostWarning, match="median"):  # no target: the median of the measured ones
        medians = CC.estimated_rows(untargeted, rest)
    assert len(medians) >= 2 and all(r.compress_x > 0 for r in medians)


@pytest.mark.parametrize("schedule", ["wfbp", "bsp", "mg-wfbp", "bytescheduler"])
def test_per_layer_ratios_match_brute_force_and_beat_the_global_ratio(schedule):
    m = _sparsifier()
    arch = A.get("ring", N.get("10GbE"), 8)
    vals = [0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16]
    for v in (0.01, 0.05):  # ends with v = 0.05
        h = R.per_layer(TOY, m, schedule, arch, 8, v, values=vals)
        e = R.per_layer(TOY, m, schedule, arch, 8, v, values=vals, exhaustive=True)
        assert h.iter_s == pytest.approx(e.iter_s, rel=1e-9)
        assert h.iter_s <= h.best_global_iter_s * (1 + 1e-12) and h.best_global_iter_s <= h.global_iter_s
        assert h.error <= h.budget
    if schedule != "bsp":  # overlap leaves room: moving kept elements to the early layer pays
        assert h.global_iter_s / h.iter_s > 1.03


# --------------------------------------------------------------------------- runs use the schedule

from collections import namedtuple  # noqa: E402

from cconv.theory.schedule import runs as RU  # noqa: E402

Coll = namedtuple("Coll", "kind bytes count control", defaults=(1, False))


def test_bsp_on_a_flat_link_with_fused_collectives_is_todays_formula():
    net = N.get("10GbE")
    colls = [Coll("allgather", 3e5), Coll("allreduce", 8.0)]
    today = 0.01 + 0.002 + N.step_comm_time(colls, 4, net)
    assert RU.step_time(TOY, colls, 4, net, "bsp", 0.01, 0.002) == pytest.approx(today, rel=1e-12)
    # a parameter server: push what was pushed, pull what was pulled (a gathered payload's reply is
    # the dense sum, larger than the push)
    for push, pull in ((4e5, 4e5), (4e4, 4e5)):
        ps = [Coll("ps_push", push), Coll("ps_pull", pull)]
        today_ps = 0.01 + 0.002 + N.step_comm_time(ps, 4, net, servers=1)
        assert RU.step_time(TOY, ps, 4, net, "bsp", 0.01, 0.002, ps=True) == pytest.approx(today_ps, rel=1e-12)
    # overlap: wait-free backprop hides communication behind the backward pass
    assert RU.step_time(TOY, colls, 4, net, "wfbp", 0.01, 0.002) < today


def test_run_schedule_and_servers_are_checked():
    from cconv.experiments.config import ConfigError, from_dict

    base = {"model": "linear", "data": "digits", "network": "10GbE"}
    assert from_dict({**base, "schedule": "wfbp", "servers": 2}).servers == 2
    assert from_dict(base).schedule is None
    for bad, match in (
        ({"schedule": "eager"}, "schedule must be one of"),
        ({"schedule": "bsp", "servers": 0}, "servers must be an integer >= 1"),
        ({"servers": 2}, "need a schedule"),
        ({"schedule": "bsp", "network": None}, "needs a network"),
    ):
        with pytest.raises(ConfigError, match=match):
            from_dict({**base, **bad})


@pytest.mark.slow
def test_a_runs_sim_time_follows_its_schedule():
    from cconv.experiments import build
    from cconv.experiments.clock import Measured as Calibration
    from cconv.experiments.clock import SimClock
    from cconv.experiments.config import from_dict

    tiny = {
        "model": {"name": "mlp", "hidden": [16]},
        "data": "digits",
        "workers": 4,
        "batch_size": 32,
        "steps": 2,
        "compressor": {"name": "topk", "ratio": 0.1},
        "granularity": "fused",
        "network": ["10GbE"],
    }
    problem = build.problem(from_dict(tiny))
    calib = Calibration(problem)
    default = SimClock(problem.cfg, problem.trainer, calib).step_times(0)[0]
    bsp = SimClock(from_dict({**tiny, "schedule": "bsp"}), problem.trainer, calib).step_times(0)[0]
    wfbp = SimClock(from_dict({**tiny, "schedule": "wfbp"}), problem.trainer, calib).step_times(0)[0]
    assert bsp == pytest.approx(default, rel=1e-9)  # fused collectives on a flat link: today's numbers
    assert wfbp > 0 and wfbp != pytest.approx(bsp, rel=1e-6)  # per-layer messages: more latency, some overlap


# --------------------------------------------------------------------------- plan: methods all, per-layer ratios

from cconv.theory import plan_cli  # noqa: E402
from cconv.theory.schedule import compressed as CP  # noqa: E402
from cconv.theory.schedule import survey as SV  # noqa: E402


def test_schedule_x_compressor_rows_with_the_identity_are_the_survey_rows():
    net = N.get("survey-100GbIB")
    notes: list[str] = []
    rows = CP.rows(
        "resnet50",
        32,
        net,
        methods=["WFBP-A2A", "BSP-PS"],
        compressors=[PL.identity_name(), _sparsifier()],
        notes=notes,
    )
    survey = {r.method: r for r in SV.rows("resnet50", 32, net, methods=["WFBP-A2A", "BSP-PS"])}
    ident = [r for r in rows if r.compressor == PL.identity_name()]
    assert len(ident) == 2
    for r in ident:
        s = survey[r.method.split("+")[0]]
        assert r.iter_s == pytest.approx(s.iter_s, rel=1e-12) and r.speedup == pytest.approx(s.speedup, rel=1e-12)
        assert r.compress_s == 0 and r.decompress_s == 0
    sparse = {r.method.split("+")[0]: r for r in rows if r.compressor != PL.identity_name()}
    assert set(sparse) == {"WFBP-A2A", "BSP-PS"}  # gathered payloads on a PS: push them, pull the dense sum
    assert all(r.compress_s > 0 for r in sparse.values())
    assert sparse["WFBP-A2A"].decompress_s > 0  # every worker decodes the P gathered payloads ...
    assert sparse["BSP-PS"].decompress_s == 0  # ... but BytePS's servers decode and reply dense
    # a 1% sparsifier's push is tiny, its pull the dense sum: about half the dense PS's exposed time
    ps = sparse["BSP-PS"].comm_exposed_s / survey["BSP-PS"].comm_exposed_s
    assert 0.4 < ps < 0.7
    assert any("parameter-server" in n for n in notes)


def test_plan_cli_bad_per_layer_input_is_one_line(capsys):
    args = ["--workload", "resnet50", "--workers", "32", "--network", "survey-100GbIB"]
    for extra in (["--per-layer-ratios", "bogus=1"], ["--per-layer-ratios", f"{_sparsifier()}=x"]):
        assert plan_cli.main(args + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("cconv: error:") and err.count("\n") == 1
    assert plan_cli.main(["--workers", "4", "--network", "10GbE", "--per-layer-ratios", f"{_sparsifier()}=0.01"]) == 2
    assert "needs --workload" in capsys.readouterr().err


@pytest.mark.extended
def test_plan_cli_methods_all_and_per_layer_ratios(capsys):
    import json

    base = ["--workload", "resnet50", "--workers", "32", "--network", "survey-100GbIB"]
    assert plan_cli.main(base + ["--methods", "all", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"method", "speedup", "iter_s", "comm_exposed_s", "compress_s"} <= set(rows[0])
    assert {r["method"].split("+")[0] for r in rows} == set(SV.METHODS)
    assert plan_cli.main(base + ["--per-layer-ratios", f"{_sparsifier()}=0.01", "--json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert rec["iter_s"] <= rec["best_global_iter_s"] and len(rec["values"]) == len(rec["layers"]) == 54


def test_the_validation_sources_presets_have_their_published_sizes():
    """Presets added for published runs reproduce what their sources state: Espresso's Tables 4-5
    (GPT-2 475 MB in 148 tensors, the WikiText-2 LSTM 328 MB in 10; MB there are MiB) and the
    Global-QSGD log's Transformer-XL counts (n_all_param, n_nonemb_param)."""

    def mib_and_tensors(name):
        p = P.get(name)
        return round(p.params * 4 / 2**20), sum(len(lay.tensors) for lay in p.layers)

    assert mib_and_tensors("gpt2") == (475, 148)
    assert mib_and_tensors("lstm-wt2") == (328, 10)
    txl = P.get("transformer-xl")
    assert txl.params == 191_950_298
    assert sum(lay.grad_bytes for lay in txl.layers if lay.name.startswith("layers.")) / 4 == 54_599_680
