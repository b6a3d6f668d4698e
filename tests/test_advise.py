"""``cconv advise`` (cconv.advisor): the extrapolation on synthetic curves with known answers,
its interval coverage on noisy curves (fixed keys), targets, candidates from a config's
``advise:`` block, bad options (exit 2, nothing written), and one end-to-end run on digits."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from cconv.advisor import extrapolate as X
from cconv.advisor import space as SP
from cconv.advisor import target as T

ACC = T.parse("test_accuracy=0.9")
LOSS = T.parse("test_loss=0.05")


def power_curve(a: float, b: float, steps: np.ndarray, seeds: int = 3, sigma: float = 0.0, rng=None) -> X.Curve:
    """Loss curves gap = a t^-b, times exp(sigma eps) per seed and step."""
    g = a * steps ** (-b)
    noise = np.exp(sigma * rng.standard_normal((seeds, len(steps)))) if sigma else np.ones((seeds, len(steps)))
    return X.Curve(steps.astype(float), g[None] * noise)


def _noisy(f, steps, seeds=3, sigma=0.03, seed=0) -> X.Curve:
    rng = np.random.default_rng(seed)
    return X.Curve(steps.astype(float), np.stack([f(steps) * np.exp(sigma * rng.standard_normal(len(steps))) for _ in range(seeds)]))


# Each family recovered from noisy synthetic data (3 seeds, 3 % multiplicative noise, fixed keys):
# the held-out choice picks the true family and t* lands within 10 % of the known answer (20 % for
# the power law, whose target lies 8 curve lengths ahead).
FAMILY_CASES = {
    "power": (lambda t: 2.0 * t**-0.5, (2.0 / 0.05) ** 2),
    "exp": (lambda t: 1.0 * np.exp(-0.01 * t), math.log(1 / 0.05) / 0.01),
    "loglogistic": (lambda t: 1.0 / (1 + (t / 150.0) ** 2.0), 150 * math.sqrt(1 / 0.05 - 1)),
}


@pytest.mark.parametrize("family", list(FAMILY_CASES))
def test_each_curve_family_is_recovered(family):
    f, truth = FAMILY_CASES[family]
    p = X.predict(_noisy(f, np.arange(5, 205, 5)), LOSS)
    assert p.status == "predicted" and p.family == family
    assert p.steps == pytest.approx(truth, rel=0.20 if family == "power" else 0.10)
    assert p.lo <= truth <= p.hi


def test_a_power_law_alone_misreads_an_s_curve():
    """The failure the families fix: an S-shaped curve (plateau, then t^-2) seen up to its knee; a
    power law fitted to it predicts far too many steps, the log-logistic fit is close."""
    f, truth = FAMILY_CASES["loglogistic"]
    steps = np.arange(5, 205, 5)
    xs, le = steps.astype(float), np.log(f(steps))
    power = X.CV.fit_power(xs, le).steps_to(math.log(0.05))
    assert power > 2 * truth
    assert X.predict(_noisy(f, steps), LOSS).steps == pytest.approx(truth, rel=0.10)


def test_warp_borrows_the_shape_of_a_curve_that_ran_further():
    """A candidate that learns like a reference, twice as slowly: its target step is twice the
    reference's, which the reference reached (an interpolation, not an extrapolation)."""
    g = lambda t: np.exp(-((t / 50.0) ** 2))  # a shape none of the other families has
    ref_steps = np.arange(2, 301, 2, dtype=float)
    ref = X.reference(X.Curve(ref_steps, g(ref_steps)[None]), LOSS)
    cand = np.arange(4, 121, 4, dtype=float)
    p = X.predict(X.Curve(cand, np.tile(g(cand / 2.0), (3, 1))), LOSS, refs=(ref,))
    assert p.family == "warp"
    assert p.steps == pytest.approx(2 * 50.0 * math.sqrt(math.log(20.0)), rel=0.03)


def test_reached_within_the_curve_is_interpolated():
    steps = np.array([10.0, 20.0, 30.0, 40.0])
    vals = np.array([[0.5, 0.8, 0.95, 0.97]])  # 0.9 between steps 20 and 30: 20 + 10 * (0.2 - 0.1)/(0.2 - 0.05)
    p = X.predict(X.Curve(steps, vals), ACC)
    assert p.status == "reached" and p.ok and p.observed
    assert p.steps == pytest.approx(20 + 10 * 0.1 / 0.15)
    assert (p.lo, p.hi) == (20.0, 30.0)


def test_no_prediction_when_diverged_stalled_or_far():
    steps = np.arange(10, 101, 10, dtype=float)
    nan = power_curve(1.0, 0.5, steps).values.copy()
    nan[1, 4] = np.nan
    p = X.predict(X.Curve(steps, nan), LOSS)
    assert p.status == "diverged" and not p.ok and "seed 1" in p.reason and "step 50" in p.reason
    rising = X.Curve(steps, np.tile(0.7 + 0.001 * steps, (3, 1)))
    assert X.predict(rising, LOSS).status == "stalled"
    slow = power_curve(1.0, 0.1, steps)  # 0.05 at t = 20^10: far beyond 30 curve lengths
    p = X.predict(slow, LOSS)
    assert p.status == "not-approached" and "(limit 30x)" in p.reason
    assert X.predict(X.Curve(steps[:3], power_curve(1.0, 0.5, steps[:3]).values), LOSS).status == "too-short"


def test_noisy_seeds_are_refused_not_ranked():
    """Seeds whose own curves decay at different rates (t^-0.3, t^-0.6, t^-1.2: their own
    predictions of the target step spread 80x) are 'noisy', not ranked on their mean."""
    steps = np.arange(10, 101, 10, dtype=float)
    vals = np.stack([steps**-b for b in (0.3, 0.6, 1.2)])
    p = X.predict(X.Curve(steps, vals), T.Target("test_loss", 0.05, T.KINDS["loss"]))
    assert p.status == "noisy" and not p.ok


# Coverage on synthetic noisy curves of every family with a known answer, targets 1.2 to 3 curve
# lengths ahead.  With n >= 250 curves, if the true coverage were 0.7 the observed share would have
# sd sqrt(0.7 x 0.3 / 250) = 0.029: the bound 0.7 holds the calibrated interval to the goal the
# validation states (its measured share here is ~0.9, 7 sd above).
def test_interval_coverage_on_noisy_curves_of_every_family():
    rng = np.random.default_rng(1234)
    steps = np.arange(4, 81, 4, dtype=float)
    hits = n = 0
    for i in range(300):
        kind = ("power", "exp", "loglogistic")[i % 3]
        ahead = steps[-1] * rng.uniform(1.2, 3.0)
        if kind == "power":
            b = rng.uniform(0.3, 0.8)
            f, e = (lambda t, b=b: t**-b), ahead**-b
        elif kind == "exp":
            k = rng.uniform(0.005, 0.03)
            f, e = (lambda t, k=k: np.exp(-k * t)), math.exp(-k * ahead)
        else:
            tau, b = rng.uniform(20, 60), rng.uniform(1.0, 3.0)
            f, e = (lambda t, tau=tau, b=b: 1 / (1 + (t / tau) ** b)), 1 / (1 + (ahead / tau) ** b)
        p = X.predict(_noisy(f, steps, sigma=0.03, seed=i), T.Target("test_loss", e, T.KINDS["loss"]))
        if not p.ok:
            continue
        n += 1
        hits += p.lo <= ahead <= p.hi
    assert n >= 250
    assert hits / n >= 0.7


def test_metric_at_the_budget_follows_the_fit():
    steps = np.arange(10, 201, 10, dtype=float)
    f, _ = FAMILY_CASES["exp"]
    assert X.metric_at(_noisy(f, steps, sigma=0.0), LOSS, 400) == pytest.approx(math.exp(-4.0), rel=0.02)
    assert X.metric_at(_noisy(f, steps, sigma=0.0), LOSS, 100) == pytest.approx(math.exp(-1.0), rel=1e-6)


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    "text,match",
    [
        ("test_accuracy=1.5", "never reaches"),
        ("test_loss=0", "never reaches"),
        ("test_perplexity=0.5", "never reaches"),
        ("test_accuracy=0", "every run starts there"),
        ("test_accuracy=abc", "not a number"),
        ("test_accuracy", "METRIC=VALUE"),
        ("test_f1=0.5", "which way it improves"),
    ],
)
def test_bad_targets(text, match):
    with pytest.raises(ValueError, match=match) as e:
        T.parse(text)
    assert "\n" not in str(e.value)


def test_target_must_be_a_metric_the_task_logs():
    with pytest.raises(ValueError, match="unknown metric 'test_perplexity'; this task logs loss, test_loss"):
        T.parse("test_perplexity=3", ["loss", "test_loss", "test_accuracy"])
    assert T.parse("test_accuracy=0.9", ["test_accuracy"]).kind.higher


# --------------------------------------------------------------------------- candidates


def _cfg(**kw):
    from cconv.experiments.config import from_dict

    return from_dict({"data": "digits", **kw})


def test_candidates_from_an_advise_block():
    block = {
        "compressors": ["none", {"name": "topk", "ratio": [0.1, 0.01]}, "signsgd"],
        "memory": ["none", "ef"],
        "sync": ["bsp", {"local_steps": 4}],
        "include": [{"compressor": "qsgd", "sync": "ssp", "staleness": 1}],
    }
    cfg = _cfg(advise=block)
    cands = SP.candidates(SP.parse(cfg.advise, cfg))
    names = [c.name for c in cands]
    assert names[0] == "none" and cands[0].dense  # the dense baseline first
    # none: no memory; 3 real compressor points x 2 memories; x 2 sync modes; + none under local SGD
    assert len(cands) == 2 + 3 * 2 * 2 + 1
    assert "topk(ratio=0.01) ef local_steps=4" in names and "none ef" not in names
    inc = cands[-1]
    assert inc.overrides == {
        "compressor": {"name": "qsgd"},
        "memory": "none",
        "architecture": "all-to-all",
        "sync": "ssp",
        "staleness": 1,
    }


def test_default_candidates_come_from_the_registries():
    from cconv import compressors as C

    cfg = _cfg()
    cands = SP.candidates(SP.parse(None, cfg))
    knobbed = [n for n in C.names() if C.entry(n).knob is not None and C.entry(n).knob.values]
    for n in knobbed:
        k = C.entry(n).knob
        for v in (min(k.values), max(k.values)):
            for mem in ("", " ef"):
                assert f"{n}({k.name}={v}){mem}" in [c.name for c in cands]
    assert any(c.dense and c.overrides.get("local_steps") for c in cands)  # a non-BSP mode


@pytest.mark.parametrize(
    "block,match",
    [
        ([1], "expected a mapping"),
        ({"compresors": []}, "unknown key"),
        ({"compressors": [{"ratio": 0.1}]}, "mapping with 'name'"),
        ({"sync": ["nope"]}, "unknown mode 'nope'"),
        ({"schedules": ["bogus"]}, "unknown schedule"),
        ({"probe": 1.5}, r"fraction in \(0, 1\]"),
        ({"seeds": 0}, "integer >= 1"),
        ({"include": [{"bogus": 1}]}, "unknown config key"),
    ],
)
def test_bad_advise_blocks(block, match):
    cfg = _cfg()
    with pytest.raises(ValueError, match=match):
        SP.parse(block, cfg)


def test_config_loader_accepts_the_block_and_leaves_the_digest():
    from cconv.experiments.config import ConfigError, from_dict

    assert from_dict({"advise": {"seeds": 2}}).advise == {"seeds": 2}
    assert from_dict({}).digest() == from_dict({"advise": None}).digest()
    with pytest.raises(ConfigError, match="advise must be a mapping"):
        from_dict({"advise": [1]})


# --------------------------------------------------------------------------- the command


QUICK = os.path.join(os.path.dirname(__file__), "..", "experiments", "quickstart.yaml")


@pytest.mark.parametrize(
    "args,match",
    [
        (["--cluster", "0x8"], "must be >= 1"),
        (["--cluster", "2x4", "--device", "tpu9"], "tpu9"),
        (["--cluster", "2x4", "--target", "test_accuracy=1.5"], "never reaches"),
        (["--cluster", "2x4", "--target", "test_bleu=3"], "unknown metric 'test_bleu'; this task logs"),
        (["--cluster", "2x4", "--probe", "0.001"], "too short"),
        (["--cluster", "3x1"], "not divisible by the cluster's 3 workers"),
        ([], "--cluster NODESxGPUS is required"),
    ],
)
def test_bad_options_exit_2_before_writing(args, match, tmp_path, capsys):
    from cconv.cli import main

    out = tmp_path / "adv"
    assert main(["advise", QUICK, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cconv: error:") and match in err[0], err
    assert not out.exists()


@pytest.mark.slow
def test_advise_end_to_end_on_digits(tmp_path):
    """Three candidates, two seeds, a 24-step probe of a 120-step budget on a 1x4 cluster: ranked
    rows with intervals and times, the recommendation, JSON and figure written, and --verify's
    full run of the pick compared with its prediction."""
    import cconv

    base = {
        "model": {"name": "mlp", "hidden": [32]},
        "data": "digits",
        "batch_size": 64,
        "steps": 120,
        "lr": 0.2,
        "advise": {"compressors": ["none", {"name": "topk", "ratio": 0.1}], "memory": ["ef"], "sync": ["bsp"]},
    }
    adv = cconv.advise(
        base, "1x4", target="test_accuracy=0.85", probe=0.2, seeds=2, verify_top=1, out=str(tmp_path / "a")
    )
    assert adv.workers == 4 and adv.probe_steps == 24 and adv.seeds == 2
    assert [r.candidate for r in adv.rows if r.rank] or not adv.supported
    names = {r.candidate for r in adv.rows}
    assert names == {"none", "topk(ratio=0.1) ef"}
    for r in adv.rows:
        assert r.step.step_s > 0 and r.step.compute_s > 0 and r.bytes_per_step > 0
        if r.rank:
            assert r.time_lo <= r.time_s <= r.time_hi
    top = next(r for r in adv.rows if r.rank == 1)
    dense = next(r for r in adv.rows if r.candidate == "none")
    assert top.step.comm_s <= dense.step.comm_s  # top-k moves fewer bytes than dense or is dense
    assert adv.recommendation.startswith("Recommended: ")
    data = json.loads(open(adv.outputs["json"]).read())
    assert data["recommendation"] == adv.recommendation and len(data["rows"]) == 2
    assert os.path.getsize(adv.outputs["figure"]) > 10_000
    (v,) = adv.verify
    assert v.candidate == top.candidate and math.isfinite(v.actual)


def test_speedups_are_over_the_dense_bsp_baseline():
    """Two dense rows (BSP and local SGD): speedups are over the named baseline (BSP), not over
    whichever dense row came last (a bug this test caught)."""
    from cconv.advisor import report as R
    from cconv.advisor.timing import StepTime

    def row(name, over, steps, step_s):
        p = X.Prediction("predicted", steps, steps / 2, steps * 2, extrapolation=2.0)
        return R.Row(name, over, "mg-wfbp", p, StepTime("mg-wfbp", step_s, 0, 0, 0), 1.0, 0.9)

    rows = R.rank(
        [
            row("none", {"compressor": {"name": "none"}}, 100, 1.0),
            row("none local_steps=4", {"compressor": {"name": "none"}, "local_steps": 4}, 100, 0.25),
            row("topk", {"compressor": {"name": "topk"}}, 100, 0.5),
        ],
        budget=1000,
        baseline="none",
    )
    speed = {r.candidate: r.speedup for r in rows}
    assert speed == {"none local_steps=4": 4.0, "topk": 2.0, "none": 1.0}
    assert [r.rank for r in rows] == [1, 2, 3]
    ok, line = R.recommendation(rows, "test_accuracy>=0.9", "1x8", "none")
    assert ok and line.startswith("Recommended: none local_steps=4 (mg-wfbp)") and "4.00x dense" in line


def test_mnist1d_is_generated_offline_as_a_width_one_image():
    """MNIST-1D (the validation's second task): make_dataset's signals as (40, 1, 1) images,
    standardised with the training statistics, 10 classes; bad arguments are one-line errors."""
    pytest.importorskip("mnist1d")
    from cconv import data

    ds = data.load("mnist1d", num_samples=200)
    assert ds.input_shape == (40, 1, 1) and ds.num_classes == 10 and ds.task == "classification"
    assert len(ds.train["y"]) == 160 and len(ds.test["y"]) == 40
    assert abs(float(ds.train["x"].mean())) < 1e-5 and abs(float(ds.train["x"].std()) - 1) < 1e-4
    with pytest.raises(ValueError, match="num_samples must be an integer >= 20"):
        data.load("mnist1d", num_samples=5)
