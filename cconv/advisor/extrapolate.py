"""Steps to a target from a learning curve, with an interval, or the reason there is none.

A curve whose seed mean already reached the target needs no model: t* is the first crossing,
linearly interpolated in the gap between logged steps, and the interval is those two logged steps.
Otherwise the gap to the metric's best value (``cconv.advisor.target``) is extrapolated by the
family that predicts the curve's own last points best (``cconv.advisor.curves``: power law,
exponential, log-logistic S-curve, stretched exponential, or the time-stretched shape of a
reference curve that ran further, e.g. a race's survivor), with the interval on log t*::

    fast side:  z * sqrt(var_seed + var_family) + kappa * log(1 + t* / t_end)
    slow side:  z * sqrt(var_seed + var_family) + (kappa + kappa_slow) * log(1 + t* / t_end)

(``curves`` gives the terms).  The slow side may widen faster with the extrapolation
(``kappa_slow``): a learning curve's rate of progress falls as it goes (a sum of exponentials' fast
modes die out; compression's slowdown shows after the first steps), so a short curve's families
err mostly towards too few steps -- less so since the stretched exponential reads a slowing curve
itself, and the calibration now sets ``kappa_slow`` to 0.  ``z``, ``kappa`` and ``kappa_slow`` are
set on the tuning tasks of ``studies/advise/validate.py --calibrate`` and checked on the held-out
tasks there.

No prediction (``Prediction.ok`` is False) when: a seed diverged (``cconv.experiments.divergence``:
non-finite, or a training loss above 10x its first step's; ``diverged``); no family that can be
fitted brings the gap down to the target (``stalled``, with the best family's rate); t* lies more
than ``max_extrapolation`` curve lengths ahead (``not-approached``); or the seeds' own predictions
spread over more than a factor ``max_width`` (``noisy``).  Each says why in ``reason``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from cconv.advisor import curves
from cconv.advisor.target import Target

STATUSES = ("reached", "predicted", "diverged", "stalled", "not-approached", "noisy", "too-short")


class Curve(NamedTuple):
    """A learning curve: ``values[s, j]`` is seed s's metric at ``steps[j]``."""

    steps: np.ndarray
    values: np.ndarray


class Prediction(NamedTuple):
    """Steps to the target (``steps``, interval ``[lo, hi]``) or, when ``ok`` is False, why not."""

    status: str
    steps: float
    lo: float
    hi: float
    reason: str = ""
    family: str = ""  # the curve family that made the prediction ("" when observed or none)
    extrapolation: float = math.nan  # t* / t_end

    @property
    def ok(self) -> bool:
        return self.status in ("reached", "predicted")

    @property
    def observed(self) -> bool:
        return self.status == "reached"


class Settings(NamedTuple):
    """The extrapolation's constants (module docstring)."""

    min_points: int = 5
    holdout: int = 3
    z: float = 1.5  # set with the kappas on the validation's tuning tasks (studies/advise/validate.py --calibrate)
    kappa: float = 0.1
    kappa_slow: float = 0.0  # the slow side's extra widening with the extrapolation
    family_slack: float = 1.5  # families within this factor of the best held-out error count in var_family
    max_extrapolation: float = 30.0
    max_width: float = 20.0  # on exp(2 z sd_seed): the seeds' spread alone


def _none(status: str, reason: str, **kw) -> Prediction:
    return Prediction(status, math.nan, math.nan, math.nan, reason, **kw)


def first_crossing(steps: np.ndarray, values: np.ndarray, target: Target) -> tuple[float, float, float] | None:
    """(t*, previous logged step, crossing logged step) of the first logged point that reaches
    the target, t* interpolated linearly in the gap between the two; None if never reached."""
    hit = np.flatnonzero(target.reached(values))
    if hit.size == 0:
        return None
    j = int(hit[0])
    if j == 0:
        return float(steps[0]), 0.0, float(steps[0])
    g0, g1, e = target.gap(values[j - 1]), target.gap(values[j]), target.gap_target
    w = 1.0 if g0 == g1 else float(np.clip((g0 - e) / (g0 - g1), 0.0, 1.0))
    return float(steps[j - 1] + w * (steps[j] - steps[j - 1])), float(steps[j - 1]), float(steps[j])


def _seed_curves(curve: Curve) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values[seed, step]) in float64; one seed's curve gets the seed axis."""
    steps, values = np.asarray(curve.steps, np.float64), np.asarray(curve.values, np.float64)
    return steps, values[None] if values.ndim == 1 else values


def log_gap(target: Target, values) -> np.ndarray:
    """log of the gap to the metric's best value, floored at 1e-12."""
    return np.log(np.maximum(target.gap(values), 1e-12))


def reference(curve: Curve, target: Target) -> curves.Reference:
    """A curve as a reference shape for ``curves.fit_warp`` (its seed mean, steps > 0)."""
    steps, values = _seed_curves(curve)
    keep = steps > 0
    return curves.Reference(steps[keep], log_gap(target, np.nanmean(values[:, keep], 0)))


def predict(curve: Curve, target: Target, settings: Settings = Settings(), refs: tuple = ()) -> Prediction:
    """Steps to ``target`` from ``curve`` (module docstring); ``refs``: ``reference`` curves that
    ran further, whose shapes the ``warp`` family may borrow."""
    steps, values = _seed_curves(curve)
    bad = ~np.isfinite(values)
    if bad.any():
        s, j = np.argwhere(bad)[0]
        return _none("diverged", f"seed {s}: non-finite {target.metric} at step {int(steps[j])}")
    mean = values.mean(0)
    hit = first_crossing(steps, mean, target)
    if hit is not None:
        t, lo, hi = hit
        return Prediction("reached", t, lo, hi, f"reached at step {t:.0f} (observed)", extrapolation=1.0)
    keep = steps > 0
    steps, values, mean = steps[keep], values[:, keep], mean[keep]
    if len(steps) < settings.min_points:
        return _none("too-short", f"{len(steps)} logged points; a fit needs {settings.min_points}")
    return _extrapolate(steps, values, mean, target, settings, refs)


def _extrapolate(xs, values, mean, target: Target, settings: Settings, refs: tuple) -> Prediction:
    level = math.log(max(target.gap_target, 1e-12))
    fits = curves.scored(xs, log_gap(target, mean), refs, settings.holdout)
    lts = [(f, _log_t(f, level)) for f in fits]
    good = [(f, lt) for f, lt in lts if math.isfinite(lt)]
    if not good:
        best = fits[0].family if fits else "none"
        return _none(
            "stalled",
            f"no curve family brings the gap from {target.gap(mean[-1]):.3g} to {target.gap_target:.3g} "
            f"(best fit over steps {xs[0]:.0f}-{xs[-1]:.0f}: {best})",
        )
    f0, lt0 = good[0]
    near = [lt for f, lt in good if f.holdout_rmse <= settings.family_slack * max(f0.holdout_rmse, 1e-3)]
    var_family = float(np.var(near)) if len(near) > 1 else 0.0
    var_seed = _seed_variance(xs, values, target, f0, refs, level)
    return _interval(lt0, var_seed, var_family, f0.family, float(xs[-1]), settings)


def _log_t(f: curves.Fit, level: float) -> float:
    t = f.steps_to(level)
    return math.log(t) if t is not None and math.isfinite(t) and t > 0 else math.nan


def _seed_variance(xs, values, target: Target, chosen: curves.Fit, refs: tuple, level: float) -> float:
    """var_s / S of log t* of the chosen family refitted on each seed's curve (inf when a seed's
    own fit does not reach the target)."""
    if len(values) < 2:
        return 0.0
    fitter = curves.fitters(refs)[chosen.index]
    per = []
    for v in values:
        f = fitter(xs, log_gap(target, v))
        per.append(_log_t(f, level) if f is not None else math.inf)
        per[-1] = per[-1] if math.isfinite(per[-1]) else math.inf
    per = np.asarray(per)
    if not np.all(np.isfinite(per)):
        return math.inf
    return float(per.var(ddof=1) / len(per))


def _interval(
    lt: float, var_seed: float, var_family: float, family: str, t_end: float, settings: Settings
) -> Prediction:
    """t* = exp(lt) with the interval of the module docstring, or ``not-approached`` / ``noisy``."""
    ext = math.exp(lt) / t_end
    t = math.exp(lt)
    if ext > settings.max_extrapolation:
        return _none(
            "not-approached",
            f"the {family} fit puts the target at ~{t:.3g} steps, {ext:.3g}x the curve's {t_end:.0f} "
            f"(limit {settings.max_extrapolation:g}x)",
            family=family,
            extrapolation=ext,
        )
    if not math.isfinite(var_seed) or 2.0 * settings.z * math.sqrt(var_seed) > math.log(settings.max_width):
        spread = (
            "a seed's own curve does not reach it"
            if not math.isfinite(var_seed)
            else (f"{math.exp(2.0 * settings.z * math.sqrt(var_seed)):.3g}x")
        )
        return _none(
            "noisy",
            f"the seeds' own predictions spread more than {settings.max_width:g}x ({spread}) around ~{t:.3g} steps",
            family=family,
            extrapolation=ext,
        )
    sd, reach = settings.z * math.sqrt(var_seed + var_family), math.log1p(max(ext, 1.0))
    lo = max(math.exp(lt - sd - settings.kappa * reach), t_end)
    hi = math.exp(lt + sd + (settings.kappa + settings.kappa_slow) * reach)
    return Prediction(
        "predicted", t, lo, hi, f"{family} fit, {ext:.1f}x past step {t_end:.0f}", family=family, extrapolation=ext
    )


def metric_at(curve: Curve, target: Target, t: float, settings: Settings = Settings(), refs: tuple = ()) -> float:
    """The metric the best-scoring family gives at step ``t`` (the seed mean; the last logged
    value when ``t`` is inside the curve; NaN when a seed diverged or nothing can be fitted)."""
    steps, values = _seed_curves(curve)
    if not np.all(np.isfinite(values)):
        return math.nan
    mean = values.mean(0)
    if t <= steps[-1]:
        return float(np.interp(t, steps, mean))
    keep = steps > 0
    if keep.sum() < settings.min_points:
        return math.nan
    fits = curves.scored(steps[keep], log_gap(target, mean[keep]), refs, settings.holdout)
    if not fits:
        return math.nan
    gap = float(np.exp(fits[0].log_gap(np.asarray([t]))[0]))
    if not math.isfinite(gap):
        gap = float(target.gap(mean[-1]))
    return target.kind.best - gap if target.kind.higher else target.kind.best + gap
