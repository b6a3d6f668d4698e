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
from cconv.advisor.curves import fit_power, fit_warp

ACC = T.parse("test_accuracy=0.9")
LOSS = T.parse("test_loss=0.05")


def power_curve(a: float, b: float, steps: np.ndarray, seeds: int = 3, sigma: float = 0.0, rng=None) -> X.Curve:
    """Loss curves gap = a t^-b, times exp(sigma eps) per seed and step."""
    g = a * steps ** (-b)
    noise = np.exp(sigma * rng.standard_normal((seeds, len(steps)))) if sigma else np.ones((seeds, len(steps)))
    return X.Curve(steps.astype(float), g[None] * noise)


def _noisy(f, steps, seeds=3, sigma=0.03, seed=0) -> X.Curve:
    rng = np.random.default_rng(seed)
    return X.Curve(
        steps.astype(float),
        np.stack([f(steps) * np.exp(sigma * rng.standard_normal(len(steps))) for _ in range(seeds)]),
    )


# Each family recovered from noisy synthetic data (3 seeds, 3 % multiplicative noise), in at least
# 5 of 6 draws (fixed keys): the held-out choice picks the true family, or the one that contains it
# (the stretched exponential is the exponential at beta = 1; the log-logistic is a power law past its
# knee), t* lands within 10 % of the known answer (20 % for the power law, whose target lies 8 curve
# lengths ahead), and the interval holds it.
FAMILY_CASES = {
    "power": (lambda t: 2.0 * t**-0.5, (2.0 / 0.05) ** 2),
    "exp": (lambda t: 1.0 * np.exp(-0.01 * t), math.log(1 / 0.05) / 0.01),
    "loglogistic": (lambda t: 1.0 / (1 + (t / 150.0) ** 2.0), 150 * math.sqrt(1 / 0.05 - 1)),
    "stretched": (lambda t: np.exp(-np.sqrt(t / 30.0)), 30.0 * math.log(1 / 0.05) ** 2),
}
CONTAINING = {"power": ("power", "loglogistic"), "exp": ("exp", "stretched")}


@pytest.mark.parametrize("family", list(FAMILY_CASES))
def test_each_curve_family_is_recovered(family):
    f, truth = FAMILY_CASES[family]
    recovered = []
    for seed in range(6):
        p = X.predict(_noisy(f, np.arange(5, 205, 5), seed=seed), LOSS)
        recovered.append(
            p.status == "predicted"
            and p.family in CONTAINING.get(family, (family,))
            and p.steps == pytest.approx(truth, rel=0.20 if family == "power" else 0.10)
            and p.lo <= truth <= p.hi
        )
    assert sum(recovered) >= 5, recovered


def test_a_power_law_alone_misreads_an_s_curve():
    """The failure the families fix: an S-shaped curve (plateau, then t^-2) seen up to its knee; a
    power law fitted to it predicts far too many steps, the log-logistic fit is close."""
    f, truth = FAMILY_CASES["loglogistic"]
    steps = np.arange(5, 205, 5)
    xs, le = steps.astype(float), np.log(f(steps))
    power = fit_power(xs, le).steps_to(math.log(0.05))
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


def test_warp_fits_a_candidate_slower_than_its_reference():
    """A short curve (8 steps, as a candidate pruned at the race's first rung) of a candidate that
    learns like the reference 1.8x slower: its first steps map before the reference's first logged
    step (read as flat there), and the stretch comes out above 1.  The fit used to bound the
    stretch at 1 (every point inside the reference's range), so the warp predicted the
    reference's own target step for every slower candidate (1.0x, here 44 % short)."""
    g = lambda t: 0.9 / (1 + (t / 20.0) ** 2)  # a plateau, then t^-2: the reference's S-curve
    ref_steps = np.arange(1, 121, dtype=float)
    ref = X.reference(X.Curve(ref_steps, g(ref_steps)[None]), LOSS)
    cand = np.arange(1, 9, dtype=float)
    fit = fit_warp(cand, np.log(g(cand / 1.8)), ref)
    truth = 1.8 * 20.0 * math.sqrt(0.9 / 0.05 - 1)
    assert fit.steps_to(math.log(0.05)) == pytest.approx(truth, rel=0.03)


def test_the_slow_side_widens_faster_with_the_extrapolation():
    """The interval's slow side grows by kappa_slow more per log(1 + t*/t_end) than its fast side
    (learning slows down as it goes: short curves err towards too few steps), so on one curve the
    slow side's excess over the fast side is kappa_slow * log(1 + t*/t_end) exactly."""
    f, truth = FAMILY_CASES["exp"]
    steps = np.arange(5, 105, 5)
    s = X.Settings(z=1.0, kappa=0.1, kappa_slow=0.3)
    p = X.predict(_noisy(f, steps), LOSS, s)
    assert p.status == "predicted" and p.lo > steps[-1]
    slow, fast = math.log(p.hi / p.steps), math.log(p.steps / p.lo)
    assert slow - fast == pytest.approx(0.3 * math.log1p(p.steps / steps[-1]), rel=1e-9)
    even = X.predict(_noisy(f, steps), LOSS, s._replace(kappa_slow=0.0))
    assert math.log(even.hi / even.steps) == pytest.approx(math.log(even.steps / even.lo), rel=1e-9)


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
    predictions of the target step spread 80x at z = 1) are 'noisy', not ranked on their mean."""
    steps = np.arange(10, 101, 10, dtype=float)
    vals = np.stack([steps**-b for b in (0.3, 0.6, 1.2)])
    p = X.predict(X.Curve(steps, vals), T.Target("test_loss", 0.05, T.KINDS["loss"]), X.Settings(z=1.0))
    assert p.status == "noisy" and not p.ok


# Coverage on synthetic noisy curves of every family with a known answer, targets 1.2 to 3 curve
# lengths ahead.  With n >= 250 curves, if the true coverage were 0.7 the observed share would have
# sd sqrt(0.7 x 0.3 / 250) = 0.029: the bound 0.7 holds the calibrated interval to the goal the
# validation states (its measured share here is ~0.97, 9 sd above).
@pytest.mark.slow
def test_interval_coverage_on_noisy_curves_of_every_family():
    rng = np.random.default_rng(1234)
    steps = np.arange(4, 81, 4, dtype=float)
    hits = n = 0
    for i in range(300):
        kind = ("power", "exp", "loglogistic", "stretched")[i % 4]
        ahead = steps[-1] * rng.uniform(1.2, 3.0)
        if kind == "power":
            b = rng.uniform(0.3, 0.8)
            f, e = (lambda t, b=b: t**-b), ahead**-b
        elif kind == "exp":
            k = rng.uniform(0.005, 0.03)
            f, e = (lambda t, k=k: np.exp(-k * t)), math.exp(-k * ahead)
        elif kind == "loglogistic":
            tau, b = rng.uniform(20, 60), rng.uniform(1.0, 3.0)
            f, e = (lambda t, tau=tau, b=b: 1 / (1 + (t / tau) ** b)), 1 / (1 + (ahead / tau) ** b)
        else:
            tau, b = rng.uniform(5, 40), rng.uniform(0.4, 0.9)
            f, e = (lambda t, tau=tau, b=b: np.exp(-((t / tau) ** b))), math.exp(-((ahead / tau) ** b))
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
        ("test_accuracy=1", "the metric's best value"),
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


def test_an_optimizer_that_sends_its_own_messages_names_the_uncompressed_candidates():
    """1-bit Adam sends 1-bit momenta with compressor none: its candidates are not "dense"."""
    block = {"compressors": ["none"], "sync": ["bsp", {"local_steps": 4}]}
    cfg = _cfg(advise=block, optimizer={"name": "onebit_adam", "warmup_steps": 10}, lr=0.003)
    names = [c.name for c in SP.candidates(SP.parse(cfg.advise, cfg))]
    assert names[0] == "1-bit Adam" and not any("dense" in n for n in names), names
    plain = SP.candidates(SP.parse(block, _cfg(advise=block)))
    assert plain[0].name == "dense"


@pytest.mark.slow
def test_zero_one_adam_config_is_advised_with_its_refused_candidates_skipped(tmp_path):
    """0/1 Adam decides its own local steps (sync ``zero_one``): the default search's dense local-SGD
    candidate is refused by its mode and skipped with that reason; the baseline is 0/1 Adam (before:
    any refused candidate without a compressor stopped the whole advice, as if it were the baseline)."""
    from cconv.advisor.api import prepare

    opt = {"name": "zero_one_adam", "var_freeze_step": 10, "var_update_scaler": 2, "local_step_scaler": 8}
    raw = {**TINY_ADVISE, "optimizer": {**opt, "local_step_clipper": 4, "eps": 1e-3}, "lr": 0.003, "steps": 60}
    raw["advise"] = {"compressors": ["none"]}
    plan = prepare(raw, "1x4", target="test_accuracy=0.5", seeds=1, out=str(tmp_path / "a"))
    assert [c.name for c in plan.candidates] == ["0/1 Adam"]
    assert [why for _, why in plan.skipped] == [
        "sync='zero_one' decides its own local steps: no local_steps or post_local_switch"
    ]
    assert not os.path.exists(tmp_path / "a")


def test_the_dense_model_under_each_sync_mode_with_the_default_memory():
    """memory left out (``paired``: none around the dense model): the dense model is a candidate
    under every listed sync mode (before: only under the first, the baseline, unless the block
    listed memory none)."""
    block = {"compressors": ["none"], "sync": ["bsp", {"local_steps": 4}]}
    names = [c.name for c in SP.candidates(SP.parse(block, _cfg(advise=block)))]
    assert names == ["dense", "dense, local SGD H=4"]


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
    assert names[0] == "dense" and cands[0].dense  # the dense baseline first
    # dense: no memory; 3 real compressor points x 2 memories; x 2 sync modes; + dense under local SGD
    assert len(cands) == 2 + 3 * 2 * 2 + 1
    assert "top-k 1 % + EF, local SGD H=4" in names and "dense + EF" not in names
    inc = cands[-1]
    assert inc.overrides == {
        "compressor": {"name": "qsgd"},
        "memory": "none",
        "architecture": "all-to-all",
        "sync": "ssp",
        "staleness": 1,
    }


def test_default_candidates_pair_error_feedback_by_the_bound():
    """The default search: every knobbed compressor at its extreme values, error feedback around
    the biased ones and none around the unbiased ones (read from the theory's bound), the dense
    baseline and dense local SGD."""
    from cconv import compressors as C
    from cconv.theory import constants

    cfg = _cfg()
    cands = SP.candidates(SP.parse(None, cfg))
    over = [c.overrides for c in cands]
    knobbed = [n for n in C.names() if C.entry(n).knob is not None and C.entry(n).knob.values]
    for n in knobbed:
        k = C.entry(n).knob
        for v in (min(k.values), max(k.values)):
            unbiased = constants.constants(C.get(n, **{k.name: v}), (64, 64)).kind == "unbiased"
            mine = [o for o in over if o["compressor"] == {"name": n, k.name: v}]
            assert [o["memory"] for o in mine] == ["none" if unbiased else "ef"], (n, v)
    assert any(c.dense and c.overrides.get("local_steps") for c in cands)  # a non-BSP mode
    assert len(cands) <= SP.MAX_CANDIDATES


@pytest.mark.parametrize(
    "block,match",
    [
        ([1], "expected a mapping"),
        ({"compresors": []}, "unknown key"),
        ({"compressors": [{"ratio": 0.1}]}, "mapping with 'name'"),
        ({"sync": ["nope"]}, "unknown mode 'nope'"),
        ({"sync": []}, "an empty list"),
        ({"schedules": ["bogus"]}, "unknown schedule"),
        ({"budget": 0}, r"advise.budget must be a number of full dense runs in \(0, 100\]"),
        ({"budget": float("nan")}, r"advise.budget must be a number of full dense runs in \(0, 100\]"),
        ({"seeds": 0}, r"integer in \[1, 16\]"),
        ({"seeds": 100000000}, r"integer in \[1, 16\]"),
        ({"include": [{"bogus": 1}]}, "unknown config key"),
        ({"include": [{"seed": 3}]}, "cannot vary between candidates"),
        ({"include": [{"steps": 10, "local_steps": 2}]}, "cannot vary between candidates"),
        ({"include": [{"schedule": "wfbp"}]}, "cannot vary between candidates"),
        ({"sync": [{"workers": 4}]}, "cannot vary between candidates"),
    ],
)
def test_bad_advise_blocks(block, match):
    cfg = _cfg()
    with pytest.raises(ValueError, match=match) as e:
        SP.parse(block, cfg)
    assert "\n" not in str(e.value)


def test_a_huge_block_is_counted_before_it_is_expanded():
    """Knob lists multiplying to 10^12 candidates: refused from the count, in well under a second
    and without building one candidate (before: expanded in memory, then MemoryError)."""
    import time

    block = {
        "compressors": [{"name": "topk", "ratio": [0.1] * 1000, "x": [1] * 1000, "y": [2] * 1000, "z": [3] * 1000}]
    }
    t = time.perf_counter()
    with pytest.raises(ValueError, match="over a million candidates; the limit is 64"):
        SP.parse(block, _cfg())
    assert time.perf_counter() - t < 1.0
    assert SP.count({"compressors": ["none", {"name": "topk", "ratio": [0.1, 0.01]}], "memory": ["none", "ef"]}) == 8


def test_config_loader_accepts_the_block_and_leaves_the_digest():
    from cconv.experiments.config import ConfigError, from_dict

    assert from_dict({"advise": {"seeds": 2}}).advise == {"seeds": 2}
    assert from_dict({}).digest() == from_dict({"advise": None}).digest()
    with pytest.raises(ConfigError, match="advise must be a mapping"):
        from_dict({"advise": [1]})


# --------------------------------------------------------------------------- the race


def _arms(step_s: dict) -> list:
    from cconv.advisor import race

    return [race.Arm(n, s) for n, s in step_s.items()]


def _synthetic_observer(curves: dict, every: int = 1):
    """observe() over known curves: name -> f(t) of test_loss, logged every ``every`` steps;
    records the steps asked of each arm."""
    from cconv.advisor import race

    asked: dict = {}

    def observe(name, upto):
        asked.setdefault(name, []).append(upto)
        t = np.arange(every, upto + 1, every, dtype=float)
        f = curves[name]
        v = np.stack([f(t) * (1 + 0.01 * k) for k in range(3)])
        if not np.all(np.isfinite(v)) or np.any(v > 10 * f(np.array([1.0]))[0]):
            return race.Observation(X.Curve(t, v), upto, "loss above 10x the first step's")
        return race.Observation(X.Curve(t, v), upto)

    return observe, asked


def test_the_race_keeps_the_best_and_observes_it():
    """Eight candidates whose losses fall at known rates, at equal step times: the fastest survives
    every rung and is seen to reach the target; the slowest is pruned first."""
    from cconv.advisor import race

    rates = {f"c{i}": 0.004 * (i + 1) for i in range(8)}  # c7 fastest
    curves = {n: (lambda t, k=k: np.exp(-k * t)) for n, k in rates.items()}
    observe, asked = _synthetic_observer(curves)
    tgt = T.Target("test_loss", math.exp(-0.032 * 60), T.KINDS["loss"])  # c7 reaches it at step 60
    res = race.race(_arms({n: 1e-3 for n in rates}), observe, tgt, max_steps=400, budget=400)
    st = {s.arm.name: s for s in res.standings}
    assert st["c7"].status == "reached" and st["c7"].reached_at == pytest.approx(60, abs=1)
    assert st["c0"].status == "pruned" and st["c0"].rung == 0
    assert res.spent <= res.budget
    assert max(asked["c7"]) >= 60 and max(asked["c0"]) == min(max(v) for v in asked.values())


def test_equal_time_gives_cheaper_steps_more_of_them():
    """Rungs are time on the cluster: an arm whose step costs half as much trains twice the steps."""
    from cconv.advisor import race

    curves = {"slow": lambda t: np.exp(-0.01 * t), "cheap": lambda t: np.exp(-0.01 * t)}
    observe, asked = _synthetic_observer(curves)
    tgt = T.Target("test_loss", 1e-6, T.KINDS["loss"])
    res = race.race(_arms({"slow": 2e-3, "cheap": 1e-3}), observe, tgt, max_steps=1000, budget=600)
    assert asked["cheap"][0] == 2 * asked["slow"][0]
    assert res.rungs[0].steps == {"slow": asked["slow"][0], "cheap": asked["cheap"][0]}


def test_every_rung_trains_someone_further():
    """Many arms on a small budget (the README's 18 candidates in one dense run): the first rung's
    minimum of steps exceeds the rung's time for every arm.  No rung may prune on what the
    previous one already showed -- each trains at least one survivor further (the old race cut 18
    arms to 2 in five rungs that trained nothing)."""
    from cconv.advisor import race

    rng = np.random.default_rng(0)
    names = [f"a{i}" for i in range(18)]
    curves = {n: (lambda t, k=k: np.exp(-k * t)) for n, k in zip(names, rng.uniform(0.01, 0.03, 18))}
    observe, asked = _synthetic_observer(curves)
    tgt = T.Target("test_loss", math.exp(-3.0), T.KINDS["loss"])
    step_s = {n: float(s) for n, s in zip(names, rng.uniform(2e-4, 7.5e-4, 18))}
    res = race.race(_arms(step_s), observe, tgt, max_steps=300, budget=300)
    for before, after in zip(res.rungs, res.rungs[1:]):
        assert any(after.steps[n] > before.steps[n] for n in after.steps), (before, after)
    assert res.spent <= res.budget


def test_a_rung_compares_at_equal_time_not_at_each_arms_last_point():
    """'fast' steps 4x cheaper and has trained 200 steps (0.2 s), 'slow' 40 steps (0.16 s).  At
    equal time on the cluster (0.16 s: fast's step 160) slow is ahead; read at its last point, fast
    would look ahead only because it was given more time.  The race compares at equal time."""
    from cconv.advisor import race

    curves = {"slow": lambda t: np.exp(-0.02 * t), "fast": lambda t: np.exp(-0.0045 * t)}
    t = np.arange(1, 201, dtype=float)
    st = [
        race.Standing(race.Arm("slow", 4e-3), 40, X.Curve(t[:40], curves["slow"](t[:40])[None]), "running"),
        race.Standing(race.Arm("fast", 1e-3), 200, X.Curve(t, curves["fast"](t)[None]), "running"),
    ]
    tgt = T.Target("test_loss", 1e-9, T.KINDS["loss"])
    assert race.common_time(st) == pytest.approx(0.16)
    assert [s.arm.name for s in race.order(st, tgt, race.equal_time_score(st, tgt))] == ["slow", "fast"]
    assert [s.arm.name for s in race.order(st, tgt)] == ["fast", "slow"]  # each at its last point


@pytest.mark.parametrize("seed", range(6))
def test_a_race_never_exceeds_its_budget(seed):
    """Random arm counts, step times, curves and budgets (fixed keys): the steps the race trains
    never exceed the budget, and each arm's steps never exceed max_steps."""
    from cconv.advisor import race

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    rates = rng.uniform(0.001, 0.05, n)
    curves = {f"a{i}": (lambda t, k=k: np.exp(-k * t)) for i, k in enumerate(rates)}
    observe, asked = _synthetic_observer(curves, every=int(rng.integers(1, 4)))
    max_steps = int(rng.integers(50, 400))
    budget = int(rng.integers(n * race.MIN_STEPS, 3 * max_steps))
    tgt = T.Target("test_loss", float(np.exp(-rng.uniform(0.5, 6))), T.KINDS["loss"])
    res = race.race(_arms({f"a{i}": float(rng.uniform(1e-4, 1e-2)) for i in range(n)}), observe, tgt, max_steps, budget)
    assert res.spent <= budget
    assert sum(max(v) for v in asked.values()) <= budget
    assert all(max(v) <= max_steps for v in asked.values())


def test_what_the_race_leaves_trains_the_arms_it_cannot_rank_yet():
    """``race.refine``: the first arm reaches the target at step 60 and every other is pruned
    early, leaving budget.  Refining two of them trains exactly those two, to an equal time (the
    one whose step costs half trains twice the steps), within what was left; a refined arm that
    reaches the target is seen there; one not named, or not pruned, does not train."""
    from cconv.advisor import race

    rates = {"win": 0.032, "a": 0.004, "b": 0.012, "c": 0.006}
    curves = {n: (lambda t, k=k: np.exp(-k * t)) for n, k in rates.items()}
    observe, asked = _synthetic_observer(curves)
    tgt = T.Target("test_loss", math.exp(-0.032 * 60), T.KINDS["loss"])
    step_s = {"win": 1e-3, "a": 2e-3, "b": 1e-3, "c": 1e-3}
    res = race.race(_arms(step_s), observe, tgt, max_steps=400, budget=400)
    st = {s.arm.name: s for s in res.standings}
    assert st["win"].status == "reached" and {st[n].status for n in "abc"} == {"pruned"}
    left, before = res.budget - res.spent, {n: st[n].steps for n in st}
    assert left > 0
    out = race.refine(res, ["a", "b", "win"], observe, tgt, max_steps=400)
    now = {s.arm.name: s for s in out.standings}
    trained = {n: now[n].steps - before[n] for n in now}
    assert trained["c"] == 0 and trained["win"] == 0 and trained["a"] > 0 and trained["b"] > 0
    assert 0 < out.spent - res.spent == trained["a"] + trained["b"] <= left
    assert abs(now["a"].steps * 2e-3 - now["b"].steps * 1e-3) <= 2e-3  # equal time, to a step
    assert out.rungs[-1].kept == () and set(out.rungs[-1].steps) == {"a", "b"}
    assert now["b"].status == "reached" and now["b"].reached_at == pytest.approx(160, abs=4)
    assert now["a"].status == "pruned"
    assert race.refine(out._replace(spent=out.budget), ["a"], observe, tgt, 400) == out._replace(spent=out.budget)


def test_unranked_names_the_pruned_arms_without_a_time_to_target_inside_the_steps():
    """``api.unranked``: a pruned arm whose clean exponential curve predicts the target at ~100 of
    400 steps is ranked; a pruned arm whose curve has stalled, and one predicted past the step
    budget, are not (the refinement's arms); a reached arm is not a candidate."""
    from cconv.advisor import api, race

    t = np.arange(1.0, 41.0)
    tgt = T.Target("test_loss", math.exp(-0.03 * 100), T.KINDS["loss"])

    def standing(name, values, status="pruned"):
        seeds = np.stack([values * f for f in (0.99, 1.0, 1.01)])
        return race.Standing(race.Arm(name, 1e-3), 40, X.Curve(t, seeds), status)

    res = race.Race(
        [
            standing("clean", np.exp(-0.03 * t)),
            standing("flat", np.full_like(t, 0.9)),
            standing("late", np.exp(-0.003 * t)),
            standing("seen", np.exp(-0.2 * t), "reached"),
        ],
        [],
        160,
        400,
    )
    assert api.unranked(res, tgt, 400) == ["flat", "late"]


def test_the_budget_left_goes_to_the_unranked_arms_first_then_to_every_pruned_one():
    """``api.spend_left``: "win" reaches the target at step 60 and the race ends with budget left.
    "flat" (no time to target within the step budget) trains first, to the step budget; what is
    still left trains the pruned arms the table could already rank -- "rises" (a start that turns
    up after step 12, ranked from its first 20 steps) is then seen to stall, the steady ones to
    reach the target; never past the budget.  With only enough left for the first pass, the
    ranked arms do not train."""
    from cconv.advisor import api, race

    def rises(t):
        return np.where(t <= 12, np.exp(-0.03 * t), np.exp(-0.36) * (1 + 0.05 * (t - 12)))

    curves = {"win": lambda t: np.exp(-0.04 * t), "rises": rises, "flat": lambda t: 0.9 + 0.0 * t}
    curves.update({f"s{i}": (lambda t, k=k: np.exp(-k * t)) for i, k in enumerate((0.036, 0.034, 0.032))})
    observe, asked = _synthetic_observer(curves)
    tgt = T.Target("test_loss", math.exp(-0.04 * 60), T.KINDS["loss"])
    res = race.race(_arms({n: 1e-3 for n in curves}), observe, tgt, max_steps=200, budget=600)
    before = {s.arm.name: s for s in res.standings}
    assert before["win"].status == "reached" and before["rises"].status == race.PRUNED
    assert api.predictions(res, tgt)["rises"].ok and api.unranked(res, tgt, 200) == ["flat"]
    out = api.spend_left(res, observe, tgt, 200)
    now = {s.arm.name: s for s in out.standings}
    assert now["flat"].steps == 200 and now["flat"].status == "missed"  # the first pass
    assert now["rises"].steps > before["rises"].steps and api.predictions(out, tgt)["rises"].status == "stalled"
    assert now["s2"].status == "reached" and now["s2"].reached_at == pytest.approx(75, abs=1)
    assert out.spent <= out.budget == 600 and len(out.rungs) == len(res.rungs) + 2
    short = api.spend_left(res._replace(budget=res.spent + 200 - before["flat"].steps), observe, tgt, 200)
    assert all(s.steps == before[s.arm.name].steps for s in short.standings if s.arm.name != "flat")
    assert short.spent == short.budget


def _summary(res) -> tuple:
    return (
        [(s.arm.name, s.steps, s.status, s.reached_at, s.rung) for s in res.standings],
        [(r.steps, r.kept) for r in res.rungs],
        res.spent,
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_rung_trained_side_by_side_is_the_race_trained_one_by_one(seed):
    """The advisor trains a rung's candidates at once in threads (``api.side_by_side``): the race
    is the same standing for standing and rung for rung, within its budget, and the threads did
    overlap (two observations in flight at once)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from cconv.advisor import api, race

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 10))
    curves = {f"a{i}": (lambda t, k=k: np.exp(-k * t)) for i, k in enumerate(rng.uniform(0.002, 0.05, n))}
    arms = _arms({f"a{i}": float(rng.uniform(1e-4, 1e-2)) for i in range(n)})
    tgt = T.Target("test_loss", float(np.exp(-rng.uniform(0.5, 4))), T.KINDS["loss"])
    budget = int(rng.integers(n * race.MIN_STEPS, 600))
    plain, _ = _synthetic_observer(curves)
    one = race.race(arms, plain, tgt, 300, budget)

    observe, asked = _synthetic_observer(curves)
    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    def slow(name, upto):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.01)
        try:
            return observe(name, upto)
        finally:
            with lock:
                state["now"] -= 1

    with ThreadPoolExecutor(max_workers=2) as pool:
        two = race.race(arms, slow, tgt, 300, budget, train=api.side_by_side(pool))
    assert _summary(two) == _summary(one)
    assert two.spent <= budget and sum(max(v) for v in asked.values()) <= budget
    assert state["most"] == 2


def test_an_exploding_candidate_is_diverged_and_dropped():
    from cconv.advisor import race

    curves = {"ok": lambda t: np.exp(-0.01 * t), "boom": lambda t: 2.5 * np.exp(0.8 * t)}
    observe, asked = _synthetic_observer(curves)
    tgt = T.Target("test_loss", 0.5, T.KINDS["loss"])
    res = race.race(_arms({"ok": 1e-3, "boom": 1e-3}), observe, tgt, max_steps=300, budget=600)
    st = {s.arm.name: s for s in res.standings}
    assert st["boom"].status == "diverged" and "10x" in st["boom"].diverged
    assert len(asked["boom"]) == 1  # not trained again


def _row(name, over, steps, step_s, status="predicted", lo=None, hi=None):
    from cconv.advisor import ranking as R
    from cconv.advisor.steptime import StepTime

    p = X.Prediction(status, steps, steps / 2 if lo is None else lo, steps * 2 if hi is None else hi, extrapolation=2.0)
    return R.Row(name, over, "mg-wfbp", p, StepTime("mg-wfbp", step_s, step_s / 2, step_s / 4, step_s / 4), 1.0, 0.9)


def _validation():
    """``studies/advise/validate.py`` as a module (the study is a script beside the package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "studies", "advise", "validate.py")
    spec = importlib.util.spec_from_file_location("advise_validate", path)
    V = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(V)
    return V


def test_the_validation_scores_every_interval_the_advice_prints():
    """``validate.scored_interval`` (coverage and width): a ranked row, and a row predicted past the
    step budget of 200 (``misses the budget``, not ranked: ``predicted`` NaN) whose full run reaches
    the target all the same, are scored; a run that never reaches the target is a miss where the
    interval ends inside the budget and censored where it runs past it; a row without a prediction
    (stalled, flagged) has no interval to score."""
    V = _validation()
    nan, inf = math.nan, math.inf

    def row(predicted, point, lo, hi, actual):
        return dict(predicted=predicted, point=point, lo=lo, hi=hi, actual=actual)

    assert V.scored_interval(row(90.0, 90.0, 70.0, 150.0, 100.0), 200)
    assert V.scored_interval(row(nan, 216.0, 203.0, 484.0, 128.0), 200)  # predicted past the budget, reached
    assert V.scored_interval(row(90.0, 90.0, 70.0, 150.0, inf), 200)  # a miss: never reached by 200
    assert not V.scored_interval(row(90.0, 90.0, 70.0, 250.0, inf), 200)  # censored
    assert not V.scored_interval(row(nan, 216.0, 203.0, 484.0, inf), 200)  # censored
    assert not V.scored_interval(row(nan, nan, nan, nan, 128.0), 200)  # no prediction


def test_the_validation_scores_the_speedup_the_table_prints():
    """``studies/advise/validate.py``'s ``speedups`` is the speedup over dense and its interval that
    ``ranking.rank`` prints (dense's time over the row's; dense's fast end over the row's slow end,
    and the other way), beside the actual one from the full runs; a row beside an observed dense row
    is checked, two observed rows are not (no interval), and a run that never reaches the target
    gives no actual speedup."""
    from cconv.advisor import ranking as R

    V = _validation()
    dense = _row("dense", {"compressor": {"name": "none"}}, 90, 2e-3, lo=80, hi=150)
    topk = _row("top-k", {"compressor": {"name": "topk"}}, 120, 1e-3, lo=100, hi=300)
    local = _row("local", {"local_steps": 4}, 60, 5e-4, status="reached", lo=59, hi=60)
    rows = {r.candidate: r for r in R.rank([dense, topk, local], budget=400, baseline="dense")}

    def scored(r, actual):
        p = r.prediction
        return dict(candidate=r.candidate, predicted=p.steps, lo=p.lo, hi=p.hi, observed=p.observed,
                    step_s=r.step.step_s, actual=actual)  # fmt: skip

    got = V.speedups([scored(rows["dense"], 100.0), scored(rows["top-k"], 150.0), scored(rows["local"], math.inf)])
    assert [x["candidate"] for x in got] == ["top-k", "local"]
    for x in got:
        r = rows[x["candidate"]]
        assert (x["predicted"], x["lo"], x["hi"]) == pytest.approx((r.speedup, r.speedup_lo, r.speedup_hi))
    assert got[0]["actual"] == pytest.approx(100 * 2e-3 / (150 * 1e-3)) and math.isnan(got[1]["actual"])
    seen = dict(scored(rows["dense"], 90.0), observed=True)
    assert V.speedups([seen, dict(scored(rows["local"], 60.0), observed=True)]) == []


def test_the_learning_rate_schedule_is_evaluated_once_per_schedule(monkeypatch):
    """``api.lr_factor`` evaluates a schedule over every step once and reads every candidate's
    window from it: candidates that share the run's schedule (every candidate of one advice, whose
    keys never touch it) build it once; another schedule is built anew, and each gives its own rates."""
    from cconv.advisor import api
    from cconv.experiments import build
    from cconv.experiments.config import from_dict

    built, real = [], build.make_schedule
    monkeypatch.setattr(build, "make_schedule", lambda cfg: built.append(cfg.lr_schedule) or real(cfg))
    monkeypatch.setattr(api, "_RATES", {})
    decay = {"name": "exponential_decay", "transition_steps": 30, "decay_rate": 0.5, "staircase": True}
    a = from_dict(dict(steps=90, lr=0.1, lr_schedule=decay, compressor={"name": "topk", "ratio": 0.1}, memory="ef"))
    b = from_dict(dict(steps=90, lr=0.1, lr_schedule=decay, local_steps=4))
    assert api.lr_factor(a, 10, 70) == pytest.approx(4.0) and api.lr_factor(b, 40, 70) == pytest.approx(2.0)
    assert api.lr_factor(a, 10, 20) == 1.0 and len(built) == 1
    assert api.lr_factor(from_dict(dict(steps=90, lr=0.1, lr_schedule="cosine")), 10, 80) > 2 and len(built) == 2


def test_a_prediction_past_a_learning_rate_change_is_flagged():
    """``api.lr_factor``: the learning rate's largest move between a curve's end and its
    prediction's slow end -- x0.1 at step 60 (staircase): a curve of 31 steps predicted to 223 of
    a 160-step budget sees 100x ahead (both decays), to 59 nothing, to 61 the first; a constant
    schedule 1x; a warm-up ahead counts too.  ``ranking.rank`` flags ``lr-change`` from 2x, never
    on an observed row."""
    from cconv.advisor import api
    from cconv.advisor import ranking as R
    from cconv.experiments.config import from_dict

    decay = {"name": "exponential_decay", "transition_steps": 60, "decay_rate": 0.1, "staircase": True}
    step = from_dict(dict(steps=160, lr=0.3, lr_schedule=decay))
    assert api.lr_factor(step, 31, 223) == pytest.approx(100, rel=1e-4)
    assert api.lr_factor(step, 31, 59) == api.lr_factor(step, 31, 60) == 1.0
    assert api.lr_factor(step, 31, 61) == pytest.approx(10, rel=1e-4) and api.lr_factor(step, 61, 100) == 1.0
    assert api.lr_factor(from_dict(dict(steps=200, lr=0.2)), 8, 150) == 1.0
    warm = from_dict(dict(steps=200, lr=0.2, lr_warmup=40))
    assert api.lr_factor(warm, 8, 30) == pytest.approx(29 / 7)  # the rates of updates 7 and 29
    # schedules written for one step (over an array of steps they mis-broadcast or fail): vmapped
    ramp = {"name": "piecewise_interpolate_schedule", "interpolate_type": "linear", "boundaries_and_scales": {50: 0.1}}
    assert api.lr_factor(from_dict(dict(steps=100, lr=0.1, lr_schedule=ramp)), 10, 90) == pytest.approx(8.38)
    cycle = {"name": "linear_onecycle_schedule", "transition_steps": 100, "peak_value": 0.1}
    assert api.lr_factor(from_dict(dict(steps=100, lr=0.1, lr_schedule=cycle)), 10, 90) > 2
    rows = [
        _row("dense", {"compressor": {"name": "none"}}, 100, 1.0)._replace(lr_factor=10.0),
        _row("top-k", {"compressor": {"name": "topk"}}, 100, 0.5)._replace(lr_factor=1.5),
        _row("local", {"local_steps": 4}, 40, 0.5, status="reached", lo=39, hi=40)._replace(lr_factor=10.0),
    ]
    flags = {r.candidate: r.flags for r in R.rank(rows, budget=1000, baseline="dense")}
    assert "lr-change" in flags["dense"] and "lr-change" not in flags["top-k"] + flags["local"]


def test_speedups_are_over_the_dense_bsp_baseline():
    """Two dense rows (BSP and local SGD): speedups are over the named baseline (BSP), not over
    whichever dense row came last (a bug this test caught)."""
    from cconv.advisor import ranking as R

    rows = R.rank(
        [
            _row("dense", {"compressor": {"name": "none"}}, 100, 1.0),
            _row("dense, local SGD H=4", {"compressor": {"name": "none"}, "local_steps": 4}, 100, 0.25),
            _row("top-k", {"compressor": {"name": "topk"}}, 100, 0.5),
        ],
        budget=1000,
        baseline="dense",
    )
    speed = {r.candidate: r.speedup for r in rows}
    assert speed == {"dense, local SGD H=4": 4.0, "top-k": 2.0, "dense": 1.0}
    assert [r.rank for r in rows] == [1, 2, 3]
    ok, line = R.recommendation(rows, "test_accuracy>=0.9", "1x8", 1000)
    assert ok and line.startswith("Recommended: dense, local SGD H=4 (mg-wfbp)") and "4.00x dense" in line
    assert "compute-bound (50 %)" in line
    # both predicted: the speedup's interval, dense's fast end over the row's slow end and back
    assert "4.00x dense [1.00x, 16x]" in line
    local = next(r for r in rows if r.rank == 1)
    assert (local.speedup_lo, local.speedup_hi) == (1.0, 16.0)
    base = next(r for r in rows if r.candidate == "dense")  # dense over itself: 1.00x, no interval
    assert base.speedup == 1.0 and math.isnan(base.speedup_lo) and math.isnan(base.speedup_hi)


def test_an_observed_speedup_has_no_interval_and_a_predicted_one_does():
    """Observed on both sides the speedup is one number; a predicted recommendation (the README's:
    a short curve's fit) prints the interval its times vouch for beside its point speedup."""
    from cconv.advisor import ranking as R

    dense = _row("dense", {"compressor": {"name": "none"}}, 100, 1.0, status="reached", lo=99, hi=100)
    seen = _row("top-k", {"compressor": {"name": "topk"}}, 100, 0.5, status="reached", lo=99, hi=100)
    rows = R.rank([dense, seen], budget=1000, baseline="dense")
    ok, line = R.recommendation(rows, "test_loss<=0.1", "1x8", 1000)
    assert ok and line.endswith("2.00x dense; compute-bound (50 %).") and "[" not in line.split("observed")[1]
    guess = _row("top-k", {"compressor": {"name": "topk"}}, 20, 0.5, lo=10, hi=150)  # 10 ms [5, 75]
    rows = R.rank([dense, guess], budget=1000, baseline="dense")
    ok, line = R.recommendation(rows, "test_loss<=0.1", "1x8", 1000)
    assert ok and "10.00x dense [1.32x, 20x]" in line  # 99 / 75 and 100 / 5


def test_a_candidate_predicted_past_the_budget_is_never_recommended():
    """The fastest predicted time belongs to a candidate that needs more steps than the budget:
    it is listed, unranked, never recommended; when nothing fits, the line says what budget would."""
    from cconv.advisor import ranking as R

    fast_but_long = _row("top-k", {"compressor": {"name": "topk"}}, 900, 1e-3, lo=700, hi=1200)
    slow = _row("dense", {"compressor": {"name": "none"}}, 400, 1.0)
    rows = R.rank([fast_but_long, slow], budget=500, baseline="dense")
    assert [r.candidate for r in rows if r.rank] == ["dense"]
    ok, line = R.recommendation(rows, "test_loss<=0.1", "1x8", 500)
    assert ok and line.startswith("Recommended: dense")
    rows = R.rank([fast_but_long], budget=500, baseline="dense")
    ok, line = R.recommendation(rows, "test_loss<=0.1", "1x8", 500)
    assert not ok and "no candidate reaches test_loss<=0.1 within 500 steps" in line
    assert "a step budget of 1200 would reach it" in line


def test_a_target_met_at_the_first_logged_step_is_no_recommendation():
    """Every candidate meets the target at its first line: the order would be step time alone
    (before: ranked on it), so the advice says the target is too easy."""
    from cconv.advisor import ranking as R

    first = _row("dense", {"compressor": {"name": "none"}}, 4, 1.0, status="reached", lo=0.0, hi=4.0)
    other = _row("top-k", {"compressor": {"name": "topk"}}, 4, 0.5, status="reached", lo=0.0, hi=4.0)
    rows = R.rank([first, other], budget=100, baseline="dense")
    ok, line = R.recommendation(rows, "test_accuracy>=0.1", "1x8", 100)
    assert not ok and "at its first logged step" in line and "choose a harder target" in line


# --------------------------------------------------------------------------- the command


QUICK = os.path.join(os.path.dirname(__file__), "..", "studies", "quickstart.yaml")


@pytest.mark.parametrize(
    "args,match",
    [
        (["--cluster", "0x8"], "must be >= 1"),
        (["--cluster", "2x4", "--device", "tpu9"], "tpu9"),
        (["--cluster", "2x4", "--target", "test_accuracy=1.5"], "never reaches"),
        (["--cluster", "2x4", "--target", "test_bleu=3"], "unknown metric 'test_bleu'; this task logs"),
        (["--cluster", "2x4", "--budget", "0.01"], "raise --budget to"),
        (["--cluster", "2x4", "--budget", "nan"], "--budget must be"),
        (["--cluster", "2x4", "--seeds", "100000000"], "--seeds must be an integer in [1, 16]"),
        (["--cluster", "2x4", "--verify", "-1"], "--verify must be"),
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


def test_out_must_be_an_advice_directory(tmp_path, capsys):
    """A sweep's or a run's directory (anything but an earlier advice's files) is refused as --out,
    and so is a link, before anything is written (before: its probes joined the sweep's report)."""
    from cconv.cli import main

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "report.csv").write_text("run,loss\n")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    for out, what in ((sweep, "not an advice directory"), (tmp_path / "link", "symbolic link")):
        assert main(["advise", QUICK, "--cluster", "1x8", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and what in err[0], err
    assert sorted(os.listdir(sweep)) == ["report.csv"] and os.listdir(tmp_path / "elsewhere") == []


TINY_ADVISE = {
    "model": {"name": "mlp", "hidden": [32]},
    "data": "digits",
    "batch_size": 64,
    "steps": 120,
    "lr": 0.2,
    "advise": {"compressors": ["none", {"name": "topk", "ratio": 0.1}], "memory": ["ef"], "sync": ["bsp"]},
}


def test_advise_end_to_end_on_digits(tmp_path):
    """Two candidates, two seeds, a 120-step budget on a 1x4 cluster: raced within the budget, rows
    with times and reasons, the recommendation (observed or predicted within the budget), JSON and
    figure written."""
    import cconv

    adv = cconv.advise(TINY_ADVISE, "1x4", target="test_accuracy=0.85", seeds=2, out=str(tmp_path / "a"))
    assert adv.workers == 4 and adv.seeds == 2 and adv.steps == 120
    assert 0 < adv.spent <= adv.budget == 1.0
    assert {r.candidate for r in adv.rows} == {"dense", "top-k 10 % + EF"}
    for r in adv.rows:
        assert r.step.step_s > 0 and r.step.compute_s > 0 and r.bytes_per_step > 0 and r.why
        if r.rank:
            assert r.time_lo <= r.time_s <= r.time_hi and r.prediction.steps <= 120
    assert adv.supported and adv.recommendation.startswith("Recommended: ")
    data = json.loads(open(adv.outputs["json"]).read())
    assert data["recommendation"] == adv.recommendation and len(data["rows"]) == 2
    assert os.path.getsize(adv.outputs["figure"]) > 10_000


@pytest.mark.slow
def test_advise_again_retrains_nothing_and_verifies(tmp_path):
    """A second advise on the same --out reuses every probe (no metrics file changes) and --verify
    continues only the pick, to the full budget, and compares it with its prediction."""
    import cconv
    from cconv.advisor.probes import slug

    out = str(tmp_path / "a")
    adv = cconv.advise(TINY_ADVISE, "1x4", target="test_accuracy=0.85", seeds=2, out=out)
    probes_dir = os.path.join(out, "probes")
    mtimes = {d: os.path.getmtime(os.path.join(probes_dir, d, "metrics.jsonl")) for d in os.listdir(probes_dir)}
    again = cconv.advise(TINY_ADVISE, "1x4", target="test_accuracy=0.85", seeds=2, out=out, verify_top=1)
    pick = lambda a: next(r.candidate for r in a.rows if r.rank == 1)  # noqa: E731
    assert pick(again) == pick(adv)  # times differ by the host's timing noise (exchange measured here)
    (v,) = again.verify
    assert v.candidate == pick(again) and math.isfinite(v.actual)
    others = {d: t for d, t in mtimes.items() if d != slug(pick(again))}
    assert others and all(
        os.path.getmtime(os.path.join(probes_dir, d, "metrics.jsonl")) == t for d, t in others.items()
    )


def test_advise_writes_nothing_through_links(tmp_path):
    """advice.png, probes/ and probes/<candidate> that are symbolic links are refused with one
    line, and the files they point to are untouched (before: advice.png was written through)."""
    import cconv
    from cconv.experiments.io import ForeignFileError

    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep")
    for name, target in (("advice.png", victim), ("probes", tmp_path)):
        out = tmp_path / f"a-{name}"
        out.mkdir()
        os.symlink(target, out / name)
        with pytest.raises(ForeignFileError, match="symbolic link"):
            cconv.advise(TINY_ADVISE, "1x4", target="test_accuracy=0.85", seeds=2, out=str(out))
    assert victim.read_bytes() == b"keep"


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


def test_an_advice_that_ranks_nothing_removes_the_old_figure(tmp_path):
    """advice.json and advice.png always belong to the same advice: when nothing is ranked the
    previous run's figure is removed (before: left beside the new JSON)."""
    from types import SimpleNamespace

    from cconv.advisor import api

    (tmp_path / "advice.png").write_bytes(b"old")
    unranked = _row("signSGD", {"compressor": {"name": "signsgd"}}, math.nan, 1.0, status="diverged")
    plan = SimpleNamespace(out=str(tmp_path), source="x.yaml", target=ACC, cluster=None, budget=1.0)
    outputs: dict = {}
    api._figure(plan, [unranked], outputs)
    assert not (tmp_path / "advice.png").exists() and "figure" not in outputs


@pytest.mark.slow
def test_a_probe_builds_every_program_unoptimised_on_cpu(tmp_path, monkeypatch):
    """On CPU each program of a probe's trainer (initial state, step) goes to XLA with the
    advisor's fast-build options (``probes.FAST_BUILD``), and its evaluator, which runs at every
    metric line, with XLA's defaults; an option this XLA does not know is left out rather than
    failing the advice (tests/test_vmap_launcher.py: options reach XLA)."""
    from cconv.advisor import probes
    from cconv.engine.launchers import Launcher
    from cconv.experiments.warm import warm

    built, real = [], Launcher.jit

    def spy(self, fn, **kw):
        built.append((fn.__name__, kw.get("compiler_options", self.compiler_options)))
        return real(self, fn, **kw)

    monkeypatch.setattr(Launcher, "jit", spy)
    block = {"compressors": [{"name": "topk", "ratio": 0.1}], "memory": ["ef"]}
    base = _cfg(model={"name": "mlp", "hidden": [16]}, data="digits", batch_size=32, steps=20, advise=block)
    cand = next(c for c in SP.candidates(SP.parse(block, base)) if not c.dense)
    cfg = probes.probe_config(base, cand, seeds=2, workers=4, log_every=1)
    assert probes.compiler_options() == probes.FAST_BUILD  # the tests run on CPU
    warm(probes.build(cfg, cand, str(tmp_path / "p")).problem, 2)
    assert [o for name, o in built if name == "ev"] == [None]  # the evaluator: XLA's defaults
    trainer = [o for name, o in built if name != "ev"]
    assert len(trainer) >= 2 and all(o == probes.FAST_BUILD for o in trainer)  # init, step
    monkeypatch.setattr(probes, "FAST_BUILD", {"xla_no_such_option": 1, "xla_backend_optimization_level": 0})
    assert probes.compiler_options() == {"xla_backend_optimization_level": 0}  # another XLA's: left out


@pytest.mark.parametrize(
    "schedule",
    ["cosine", {"name": "exponential_decay", "decay_rate": 0.1, "staircase": True, "transition_steps": 12}],
)
def test_a_probes_learning_rate_is_the_full_runs_at_every_step(schedule):
    """A probe is the first steps of the run the user would start: its config keeps the full run's
    steps, so its learning-rate schedule (warm-up, then a schedule whose length cconv fills in from
    the run, or one the config sets) is the full run's at every step, for every candidate."""
    from cconv.advisor import probes
    from cconv.experiments.build import make_schedule

    block = {"compressors": [{"name": "topk", "ratio": 0.1}], "memory": ["ef"], "include": [{"local_steps": 4}]}
    base = _cfg(data="digits", steps=40, lr=0.2, lr_warmup=5, lr_schedule=schedule, advise=block)
    steps = np.arange(base.steps + 1)
    want = np.asarray([make_schedule(base)(int(t)) for t in steps])
    assert want[0] == 0.0 and want.max() == pytest.approx(0.2) and want[-1] < 0.1  # a warm-up, then a decay
    for cand in SP.candidates(SP.parse(block, base)):
        cfg = probes.probe_config(base, cand, seeds=3, workers=8, log_every=2)
        assert cfg.steps == base.steps
        np.testing.assert_allclose([make_schedule(cfg)(int(t)) for t in steps], want, rtol=1e-6)


@pytest.mark.parametrize("lo, hi", [(1.5e-3, 6e-2), (2e-5, 3e-4), (0.5, 4000.0), (1e-4, 10.0)])
def test_the_figures_time_axis_reads_in_units_and_no_label_overlaps_another(lo, hi):
    """``figure._time_axis``: the labelled ticks read in the table's units ("5 ms"), the minor
    ticks carry no label, and no two labels' boxes overlap (the 2 x 10^-3 / 3 x 10^-3 labels of
    matplotlib's default log axis ran into each other)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cconv.advisor import figure

    fig, ax = plt.subplots(figsize=(9, 4))
    figure._time_axis(ax, lo, hi)
    fig.canvas.draw()
    shown = [t for t in ax.get_xticklabels(which="both") if t.get_text() and lo <= t.get_position()[0] <= hi]
    assert 2 <= len(shown) and all(t.get_text().split()[-1] in ("us", "ms", "s", "min", "h") for t in shown)
    boxes = sorted((t.get_window_extent() for t in shown), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in shown]
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    plt.close(fig)


def test_the_figure_draws_the_named_baseline_black_and_labels_unranked_rows(monkeypatch):
    """The dense baseline is the candidate ``ranking.rank`` measured speedups against (here 0/1
    Adam's), not any row without a compressor; an unranked row says so on its label."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    from cconv.advisor import figure
    from cconv.advisor.ranking import Row
    from cconv.advisor.steptime import StepTime

    drawn, axes, real = [], [], Axes.plot

    def spy(self, *args, **kw):
        axes.append(self)
        drawn.append((args[1][0] if len(args) > 1 else None, kw.get("color")))
        return real(self, *args, **kw)

    monkeypatch.setattr(Axes, "plot", spy)
    st = StepTime("mg-wfbp", 1e-3, 5e-4, 4e-4, 1e-4)
    seen = X.Prediction("reached", 50.0, 49.0, 50.0)
    guess = X.Prediction("predicted", 80.0, 60.0, 120.0, family="power")
    none = {"compressor": {"name": "none"}}

    def row(name, pred, rank, over=none):
        return Row(name, over, "mg-wfbp", pred, st, 1e3, 0.9, time_s=pred.steps * 1e-3, time_lo=pred.lo * 1e-3,
                   time_hi=pred.hi * 1e-3, rank=rank)  # fmt: skip

    rows = [row("0/1 Adam", seen, 1), row("dense", guess, 2), row("top-k 1 %", guess, None, {"compressor": {}})]
    assert figure.png(rows, "loss", False, "t", baseline="0/1 Adam")[:8] == b"\x89PNG\r\n\x1a\n"
    colors = {y: {c for yy, c in drawn if yy == y} for y, _ in drawn}
    assert "k" in colors[2] and "k" not in colors[1]  # rows top-down: y = 2 the baseline, y = 1 dense
    labels = [t.get_text() for t in axes[0].get_yticklabels()]
    assert labels == ["top-k 1 % (not ranked)", "2. dense", "1. 0/1 Adam"]


def test_a_candidate_the_race_pruned_is_ranked_from_its_curve_but_not_recommended(monkeypatch):
    """The fresh held-out task's failure (docs/advise_validation.md): QSGD, pruned at the first rung, was
    extrapolated from 8 steps to a slow end faster than the finalists' and recommended, and never
    reached the target.  The race's verdict now decides: a pruned row keeps its rank and is
    flagged, the recommendation is the first row the race did not prune (the line names the ones
    above it), and the figure rings that row; when every ranked row was pruned, the first is."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    from cconv.advisor import figure
    from cconv.advisor import ranking as R

    def raced(row, status):
        return row._replace(race=status)

    qsgd = raced(_row("QSGD", {"compressor": {"name": "qsgd"}}, 50, 1e-3, lo=40, hi=100), "pruned")
    dense = raced(_row("dense", {"compressor": {"name": "none"}}, 95, 1e-3, lo=86, hi=165), "finalist")
    topk = raced(_row("top-k", {"compressor": {"name": "topk"}}, 150, 1e-3, lo=100, hi=400), "finalist")
    rows = R.rank([dense, topk, qsgd], budget=200, baseline="dense")
    assert [(r.candidate, r.rank, r.recommended) for r in rows] == [
        ("QSGD", 1, False),
        ("dense", 2, True),
        ("top-k", 3, False),
    ]
    assert "pruned" in rows[0].flags and "pruned" not in rows[1].flags
    ok, line = R.recommendation(rows, "test_accuracy>=0.42", "1x8", 200)
    assert ok and line.startswith("Recommended: dense (mg-wfbp)")
    assert line.endswith(
        "ranked above it from their curves, pruned by the race: QSGD "
        "(--verify 2 trains them and it to the step budget)."
    )
    rings, real = [], Axes.plot

    def spy(self, *args, **kw):
        if kw.get("mfc") == "none" and len(args) > 1:
            rings.append(args[1][0])
        return real(self, *args, **kw)

    monkeypatch.setattr(Axes, "plot", spy)
    from matplotlib.figure import Figure

    seen, save = {}, Figure.savefig

    def check(fig, *args, **kw):  # the labels, and the legend inside the figure, as drawn
        fig.canvas.draw()
        seen["labels"] = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        box, legend = fig.bbox, fig.legends[0].get_window_extent()
        seen["inside"] = box.x0 <= legend.x0 and legend.x1 <= box.x1 and box.y0 <= legend.y0
        return save(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", check)
    long = raced(_row("random-k 10 %, scaled=False + EF (a long name)", {"compressor": {}}, 50, 1e-3), "pruned")
    stalled = long._replace(prediction=X.Prediction("stalled", math.nan, math.nan, math.nan))
    figure.png([*rows, stalled], "acc", True, "t")
    assert rings == [2]  # rows top-down: y = 3 QSGD, y = 2 dense, y = 1 top-k, y = 0 the unranked one
    assert seen["labels"][::-1][:3] == ["1. QSGD (pruned)", "2. dense", "3. top-k"] and seen["inside"]
    only = R.rank([qsgd, raced(_row("signSGD", {"compressor": {"name": "signsgd"}}, 70, 1e-3), "pruned")], 200)
    ok, line = R.recommendation(only, "test_accuracy>=0.42", "1x8", 200)
    assert ok and line.startswith("Recommended: QSGD") and "pruned by the race" not in line


def test_a_pruned_candidate_whose_step_time_alone_wins_is_revived_not_recommended():
    """The README's case: local SGD, pruned at the first rung, is predicted at 29 [8, 175] steps
    of 203 us; the fastest survivor was observed at 57 steps of 710 us (40.5 ms).  Even needing
    175 steps local SGD would take 35.5 ms: its cheaper step carries the advantage.  That is the
    test by which the race runs it on beside the survivors (``leapfrog``), not a recommendation:
    from its 8 steps the table ranks it first, flagged pruned, and the survivor is recommended
    (on the Adam task's communication-bound clusters this test chose QSGD from 8 steps, which
    never reaches the target).  A pruned row whose advantage rests on needing fewer steps than a
    survivor (the same step time) passes no test; the steps it is granted are those of the
    survivor that needs the most."""
    from cconv.advisor import ranking as R

    local = _row("dense, local SGD H=4", {"compressor": {"name": "none"}, "local_steps": 4}, 29, 203e-6, lo=8, hi=175)
    thc = _row("THC", {"compressor": {"name": "thc"}}, 57, 710e-6, status="reached", lo=56, hi=57)
    rows = R.rank([thc._replace(race="reached"), local._replace(race="pruned")], budget=300, baseline="THC")
    assert [(r.candidate, r.recommended) for r in rows] == [("dense, local SGD H=4", False), ("THC", True)]
    ok, line = R.recommendation(rows, "loss<=0.3", "4x8", 300)
    assert ok and line.startswith("Recommended: THC")
    assert line.endswith(
        "ranked above it from their curves, pruned by the race: dense, local SGD H=4 "
        "(--verify 2 trains them and it to the step budget)."
    )
    # (seen time, seen steps, s/step, pruned): a pruned row first, the survivor second
    assert R.leapfrog([0.175, 0.57], [175, 57], [1e-3, 1e-2], [True, False]) == 0  # 175 x 1 ms < 0.57 s
    assert R.leapfrog([0.01, 0.057], [10, 57], [1e-3, 1e-3], [True, False]) is None  # fewer steps only
    assert R.leapfrog([0.001, 0.057], [10, 57], [1e-4, 1e-3], [True, False]) == 0  # 57 x 0.1 ms < 0.057 s
    assert R.leapfrog([0.001, 0.057], [10, 57], [1e-4, 1e-3], [True, True]) is None  # no survivor ranked
    assert R.leapfrog([0.05, 0.09], [50, 900], [1e-3, 1e-4], [False, True]) is None  # slower than the survivor
    # two survivors: the pruned row must win with the most steps any survivor needs (200, not 57)
    assert R.leapfrog([0.001, 0.057, 0.6], [10, 57, 200], [1e-4, 1e-3, 3e-3], [True, False, False]) == 0
    assert R.leapfrog([0.001, 0.057, 0.6], [10, 57, 600], [1e-4, 1e-3, 1e-3], [True, False, False]) is None
    # the recommendation: the fastest row the race kept; the fastest row when it kept none ranked
    assert R.pick([0.175, 0.57], [True, False]) == 1
    assert R.pick([0.175, 0.57], [True, True]) == 0
    assert R.pick([math.inf, math.inf], [False, False]) is None


def _curve_to(values: np.ndarray, upto: int) -> X.Curve:
    """Seeds x steps 1..upto of ``values`` (steps x seeds of a known curve)."""
    return X.Curve(np.arange(1, upto + 1, dtype=float), values[:upto].T)


def test_the_race_runs_a_revived_arm_on_beside_the_survivors(monkeypatch):
    """``api.race_all``: four power-law curves of 1 ms steps and "cheap", an exponential one of
    0.1 ms steps.  At the first rung's equal time "cheap" is behind every other (pruned), yet its
    curve says it would win even needing as many steps as the survivors (``ranking.leapfrog``): it
    runs on beside them, catches up at the next rung's equal time and is seen to reach the target
    first, within the budget.  Without the revival it trains no further in the race."""
    from cconv.advisor import api, race

    tgt = T.parse("loss=0.2")
    t = np.arange(1, 401, dtype=float)[:, None] + np.zeros((1, 3))
    shapes = {f"s{i}": 2.0 / (1 + t / (5 - 0.3 * i)) for i in range(4)}  # 0.2 at 37-45 steps
    shapes["cheap"] = 2.0 * np.exp(-t / 75)  # 0.2 at 173 steps: 17 ms against 37 ms
    arms = [race.Arm(n, 1e-4 if n == "cheap" else 1e-3) for n in shapes]

    def observe(name: str, upto: int) -> race.Observation:
        return race.Observation(_curve_to(shapes[name], upto), upto)

    res = api.race_all(arms, observe, tgt, 400, 400)
    st = {s.arm.name: s for s in res.standings}
    assert res.spent <= res.budget
    assert "cheap" not in res.rungs[0].kept and res.rungs[0].revived == ("cheap",)
    assert "cheap" in res.rungs[1].kept  # ahead at the second rung's equal time
    assert st["cheap"].status == "reached" and st["cheap"].reached_at == pytest.approx(173, abs=1)
    monkeypatch.setattr(api, "revived", lambda *a, **k: [])
    res = api.race_all(arms, observe, tgt, 400, 400)
    assert not res.rungs[0].revived and "cheap" not in res.rungs[1].steps  # pruned, left for the second pass


def test_a_revived_arm_that_trains_no_further_stays_pruned():
    """``race.race``: an arm revived after a rung whose survivors then spend the rest of the budget
    is recorded as revived and ends pruned, at the steps it had (not a finalist)."""
    from cconv.advisor import race

    tgt = T.parse("loss=0.01")
    t = np.arange(1, 201, dtype=float)[:, None] + np.zeros((1, 3))
    shapes = {n: 2.0 * np.exp(-t / k) for n, k in zip("abcd", (20, 22, 24, 26))}
    arms = [race.Arm(n, 1e-3) for n in shapes]

    def observe(name: str, upto: int) -> race.Observation:
        return race.Observation(_curve_to(shapes[name], upto), upto)

    res = race.race(arms, observe, tgt, 200, 40, revive=lambda standings: ["d"])  # 4 x 8 steps, then 8 left
    st = {s.arm.name: s for s in res.standings}
    assert res.rungs[0].revived == ("d",) and res.spent <= 40
    assert st["d"].status == race.PRUNED and st["d"].steps == 8
