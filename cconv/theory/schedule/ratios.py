"""Per-layer compression ratios under an error budget (the survey's open problem 5.3).

A compressor's knob (``Entry.knob``: top-k's ratio, QSGD's levels, ...) may take a different
value v_l on every layer l.  The compression error of layer l is charged by the compressor's
worst-case constant (``cconv.theory.constants``) on a flat vector of its d_l elements, with the
gradient energy ||g_l||^2 taken proportional to d_l (every element of the model carries the same
expected energy; a profile has no gradient statistics):

    contractive (delta):  e_l(v) = (1 - delta_l(v)) d_l        (top-k: d_l - k_l)
    unbiased (omega):     e_l(v) = omega_l(v) d_l              (random-k: (d_l / k_l - 1) d_l)

Given the budget B = sum_l e_l(v0) of one global value v0, choose (v_l) with sum_l e_l(v_l) <= B
minimising the simulated iteration time (``schedules.run`` of the layers' ``compress.layer_costs``
under a schedule and an architecture).  Candidates: v0 * 2^j, j = -4..4, within the knob's
range.  The search:

1. every global value with error <= B (v0 itself among them) is simulated; the best is the
   incumbent (so the result is never worse than the best global value with the same budget);
2. Lagrangian starts: for a grid of multipliers lambda, each layer takes the value minimising
   T_l(v) + lambda e_l(v) (T_l: the layer's message, compress and decompress seconds alone);
   the feasible assignments are simulated;
3. local search from the incumbent: moves of one layer by one candidate step, and transfers
   (one layer one step down, an earlier-ready layer up to the least value that restores the
   budget; the last-ready layers first, since their messages end the iteration), evaluated by
   the simulator and accepted when feasible and faster (first improvement), until no move
   improves or ``max_evals`` simulations were run.

On 2-3 layer cases the search matches exhaustive enumeration (``tests/test_theory_profiles.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from cconv import compressors as C
from cconv.theory import constants as K
from cconv.theory import planner as PL
from cconv.theory import workloads as W
from cconv.theory.profiles import FLOAT_BYTES, Profile
from cconv.theory.schedule import arch as A
from cconv.theory.schedule import compress as CC
from cconv.theory.schedule import compressed
from cconv.theory.schedule import schedules as S
from cconv.theory.schedule import survey as SV


class RatioPlan(NamedTuple):
    """The chosen per-layer knob values (backprop order) and the global comparison."""

    knob: str
    values: tuple  # per layer, backprop order
    iter_s: float
    error: float
    budget: float
    global_value: Any
    global_iter_s: float
    best_global_value: Any
    best_global_iter_s: float
    evals: int

    @property
    def gain(self) -> float:
        """Iteration-time gain over the best global value with the same budget (>= 1)."""
        return self.best_global_iter_s / self.iter_s


def layer_error(c, d: int) -> float:
    """e_l of the module docstring for one layer of ``d`` elements."""
    k = K.constants(c, (d,))
    if k.kind == "contractive":
        return (1.0 - float(k.delta)) * d
    if k.kind == "unbiased":
        return float(k.omega) * d
    raise ValueError(f"{c.name}: per-layer ratios need a contractive or unbiased compressor (it is {k.kind})")


def candidates(method: PL.Method, value: Any, steps: int = 4) -> list:
    """v0 * 2^j, j = -steps..steps, typed and bounded by the knob's schema (sorted, unique)."""
    knob = method.knob
    if knob is None:
        raise ValueError(f"{method.name} has no knob to vary per layer")
    param = next(p for p in C.entry(method.compressor).schema.params if p.name == knob.name)
    out = set()
    for j in range(-steps, steps + 1):
        v = value * 2.0**j
        if param.type == "int":
            v = int(round(v))
        if param.low is not None and (v < param.low or (param.low_open and v == param.low)):
            continue
        if param.high is not None and (v > param.high or (getattr(param, "high_open", False) and v == param.high)):
            continue
        out.add(v)
    return sorted(out)


def _knobbed(method: PL.Method | str) -> PL.Method:
    """The planner method (by name or as is), refused without a knob to vary."""
    table = PL.all_methods()
    if isinstance(method, str):
        if method not in table:
            raise ValueError(f"unknown method {method!r}; valid: {', '.join(table)}")
        method = table[method]
    if method.knob is None:
        raise ValueError(f"{method.name} has no knob to vary per layer")
    return method


def _layer_tables(
    profile: Profile, method: PL.Method, comp: Mapping[Any, Any], workers: int, device: CC.Device, bench: Mapping
) -> tuple[list[dict], list[dict]]:
    """Per layer, knob value -> its ``LayerCost`` and its compression error (``layer_error``)."""
    costs: list[dict] = []
    errs: list[dict] = []
    for lay in profile.layers:
        d = int(round(lay.grad_bytes / FLOAT_BYTES))
        fwd, bwd = lay.fwd_flops / device.flops, lay.bwd_flops / device.flops
        args = (lay.name, fwd, bwd, d, method)
        costs.append({v: CC.layer_cost(*args, c, workers, device, bench) for v, c in comp.items()})
        errs.append({v: layer_error(c, d) if d > 0 else 0.0 for v, c in comp.items()})
    return costs, errs


def per_layer(
    profile: Profile,
    method: PL.Method | str,
    schedule: S.Schedule | str,
    arch: A.Architecture,
    workers: int,
    value: Any,
    device: CC.Device = CC.SURVEY_DEVICE,
    *,
    values: Sequence | None = None,
    fixed: Mapping[str, Any] | None = None,
    bench: Mapping | None = None,
    max_evals: int = 400,
    transfers: bool = True,
    exhaustive: bool = False,
    interference: float = 0.0,
) -> RatioPlan:
    """Per-layer knob values minimising the simulated iteration time with the error budget of
    the global ``value`` (module docstring).  ``values``: the candidates (default
    ``candidates``); ``exhaustive``: enumerate every assignment instead (small cases)."""
    method = _knobbed(method)
    if isinstance(schedule, str):
        schedule = S.get(schedule)
    name = method.knob.name
    cand = sorted(set(values)) if values is not None else candidates(method, value)
    if value not in cand:
        cand = sorted(set(cand) | {value})
    bench = CC.load_bench() if bench is None else bench
    comp = {v: C.get(method.compressor, **{**dict(fixed or {}), name: v}) for v in cand}
    costs, errs = _layer_tables(profile, method, comp, workers, device, bench)
    L = len(profile.layers)
    budget = sum(e[value] for e in errs) * (1 + 1e-12)
    cache: dict[tuple, float] = {}

    def time_of(assign: tuple) -> float:
        if assign not in cache:
            lcs = [costs[i][v] for i, v in enumerate(assign)]
            cache[assign] = S.run(lcs, schedule, arch, interference=interference).iter_s
        return cache[assign]

    def error_of(assign: tuple) -> float:
        return sum(errs[i][v] for i, v in enumerate(assign))

    glob = {v: time_of((v,) * L) for v in cand if error_of((v,) * L) <= budget}
    best_v = min(glob, key=lambda v: (glob[v], cand.index(v)))
    if exhaustive:
        feasible = (a for a in itertools.product(cand, repeat=L) if error_of(a) <= budget)
        best = min(feasible, key=lambda a: (time_of(a), error_of(a)))
    else:
        best = _search(cand, costs, errs, budget, time_of, error_of, arch, (best_v,) * L, max_evals, transfers, L)
    t, e = time_of(best), error_of(best)
    return RatioPlan(name, best, t, e, budget, value, glob[value], best_v, glob[best_v], len(cache))


def _isolated(lc: S.LayerCost, arch: A.Architecture) -> float:
    return A.cost(arch, lc.kind or "allreduce", lc.nbytes, S.reply_of(lc)) + lc.compress_s + lc.decompress_s


def _search(cand, costs, errs, budget, time_of, error_of, arch, start, max_evals, transfers, L):
    best, best_t = start, time_of(start)
    # Lagrangian starts
    iso = [{v: _isolated(c[v], arch) for v in cand} for c in costs]
    scale = max(1e-30, sum(max(i.values()) for i in iso)) / max(1e-30, budget)
    for lam in (scale * 10.0**e for e in range(-4, 5)):
        a = tuple(min(cand, key=lambda v, i=i: (iso[i][v] + lam * errs[i][v], -v)) for i in range(L))
        if error_of(a) <= budget and time_of(a) < best_t:
            best, best_t = a, time_of(a)
    # local search: single steps, then transfers: one layer one step down, an earlier-ready layer
    # (smaller backprop index) up to the least value that keeps the budget; the last-ready layers
    # first (their messages end the iteration)
    evals = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        moves = []
        for i in range(L):
            k = cand.index(best[i])
            for s in (-1, 1):
                if 0 <= k + s < len(cand):
                    moves.append(((i, cand[k + s]),))
        slack = budget - error_of(best)
        for i in range(L - 1, -1, -1):
            ki = cand.index(best[i])
            if ki == 0:
                continue
            need = errs[i][cand[ki - 1]] - errs[i][best[i]] - slack
            for j in range(i if transfers else 0):
                up = [v for v in cand[cand.index(best[j]) + 1 :] if errs[j][best[j]] - errs[j][v] >= need]
                if up:
                    moves.append(((i, cand[ki - 1]), (j, up[0])))
        for mv in moves:
            a = list(best)
            for i, v in mv:
                a[i] = v
            a = tuple(a)
            if error_of(a) > budget:
                continue
            evals += 1
            t = time_of(a)
            if t < best_t - 1e-12 * max(1.0, best_t):
                best, best_t, improved = a, t, True
                break
            if evals >= max_evals:
                break
    return best


def format_plan(plan: RatioPlan, profile: Profile) -> str:
    """The layers whose value differs from the global one (forward order), and the gain."""
    lines = [
        f"per-layer {plan.knob} under the error budget of global {plan.knob}={plan.global_value} "
        f"(sum_l e_l = {plan.budget:.4g}; used {plan.error:.4g})",
        f"{'layer':<32} {'elements':>12} {plan.knob:>10}",
    ]
    same = 0
    for lay, v in reversed(list(zip(profile.layers, plan.values))):
        if v == plan.global_value:
            same += 1
            continue
        lines.append(f"{lay.name:<32} {int(round(lay.grad_bytes / FLOAT_BYTES)):>12,} {v!s:>10}")
    lines.append(f"({same} other layer{'s' if same != 1 else ''} at {plan.knob}={plan.global_value})")
    lines += [
        "",
        f"global {plan.knob}={plan.global_value}: {plan.global_iter_s * 1e3:.2f} ms; best global with the same "
        f"budget ({plan.knob}={plan.best_global_value}): {plan.best_global_iter_s * 1e3:.2f} ms; per-layer: "
        f"{plan.iter_s * 1e3:.2f} ms (gain {plan.gain:.3f}x, {plan.evals} simulations)",
    ]
    return "\n".join(lines)


def survey_plan(
    workload: str,
    workers: int,
    net,
    method: str,
    value: Any,
    survey_method: str = "WFBP-A2A",
    device_flops: float | None = None,
    *,
    servers: int | None = None,
    interference: float | None = None,
    topology: str | None = None,
    max_evals: int = 400,
) -> tuple[RatioPlan, Profile]:
    """``per_layer`` for a survey workload (its profile scaled to the survey's C) under one of
    the survey's seven methods (``survey.METHODS``: schedule and architecture)."""
    if survey_method not in SV.METHODS:
        raise ValueError(f"unknown survey method {survey_method!r}; valid: {', '.join(SV.METHODS)}")
    m = SV.METHODS[survey_method]
    prof = compressed.profile_of(workload)
    ps = m.architecture in compressed.PS_ARCHITECTURES
    arch = A.get(m.architecture, net, workers, servers if ps else None, topology)
    device = CC.SURVEY_DEVICE._replace(flops=float(device_flops or W.SURVEY_DEVICE_FLOPS))
    kappa = SV.INTERFERENCE if interference is None else interference
    plan = per_layer(prof, method, m.schedule, arch, workers, value, device, max_evals=max_evals, interference=kappa)
    return plan, prof


__all__ = ["RatioPlan", "per_layer", "survey_plan", "candidates", "layer_error", "format_plan"]
