"""The candidates: which run-config changes the advisor probes, from a config's ``advise:`` block
or, by default, from the registries.

The block (every key optional)::

    advise:
      compressors:                 # names or {name, knob: [values], other hparams}
        - none
        - {name: topk, ratio: [0.1, 0.01]}
        - signsgd
      memory: [none, ef]           # error feedback off / on (only around a compressor)
      sync:                        # bsp | ssp | asp | gossip, or a mapping of run-config keys
        - bsp
        - {local_steps: 4}
      architectures: [all-to-all]  # or parameter-server / ps
      schedules: [wfbp]            # communication schedules: timing only, no extra probes
      include:                     # further candidates, each a mapping of run-config keys
        - {compressor: {name: topk, ratio: 0.1}, memory: ef, local_steps: 4}
      target: test_accuracy=0.9    # --target
      budget: 1.0                  # --budget (units of one full dense run's training steps)
      seeds: 3                     # --seeds

Default (no block, or a key left out): ``compressors`` = every registered compressor with a
``knob`` that lists values (``Entry.knob``), at its smallest and largest value; ``memory`` =
``[paired]``: error feedback around the compressors that are not unbiased (top-k, sign, PowerSGD,
...: the pairing of their papers) and none around the unbiased ones (QSGD, scaled random-k), read
from the compressor's bound (``cconv.theory.constants``), never from its name; ``sync`` =
``[bsp]``; ``include`` (when ``sync`` is not given either) = the dense model under local SGD,
``[{local_steps: H}]`` with H the config's ``local_steps_init`` default
(the common non-BSP mode); ``architectures`` = the config's own; ``schedules`` = the config's
``schedule`` or ``mg-wfbp`` (MG-WFBP, Shi et al., INFOCOM 2019: communication overlapped with
backpropagation, small gradients merged into larger messages, as PyTorch DDP's buckets and
Horovod's tensor fusion do; plain ``wfbp`` pays one latency per layer).  The dense baseline
(compressor ``none``, memory ``none``, the first sync and architecture) is always a candidate.
A combination the config loader or the engine refuses (e.g. ``asp`` without a parameter server)
is skipped and reported, not run.

What a researcher would choose, applied to every candidate (``cconv.advisor.probes``): a sweep
file's ``rules:`` (``when``/``set``, as ``cconv sweep`` applies them); ``ef_scale: auto`` where
error feedback runs around an unbiased compressor with omega >= 1 (cconv's theory warns that plain
EF can diverge there, ``ErrorFeedbackWarning``); and a candidate that moves exactly the dense
baseline's bytes (PowerSGD on a model without matrices) is not raced but reported as dense.

Sizes are bounded before anything is expanded: the candidate count is the product of the lists'
lengths, checked against ``MAX_CANDIDATES`` first (``count``).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # types only: the config module loads when asked
    from cconv.experiments.config import RunConfig

KEYS = ("compressors", "memory", "sync", "architectures", "schedules", "include", "target", "budget", "seeds")
DENSE = "none"
PAIRED = "paired"  # memory: EF around biased compressors, none around unbiased ones
MAX_CANDIDATES = 64  # a race over more than this is not one run's budget (a sweep's job)
MAX_SEEDS = 16
RESERVED = ("seed", "workers", "steps", "schedule", "launcher", "log_every", "checkpoint_every")
DEFAULT_SCHEDULE = "mg-wfbp"  # merged-gradient WFBP: overlap with backprop, small tensors merged (as DDP buckets)


class Candidate(NamedTuple):
    """One probed configuration: a label and the run-config keys it sets."""

    name: str
    overrides: dict

    @property
    def dense(self) -> bool:
        return self.overrides["compressor"]["name"] == DENSE


class Space(NamedTuple):
    """The parsed ``advise:`` block (module docstring)."""

    compressors: tuple
    memory: tuple
    sync: tuple
    architectures: tuple
    schedules: tuple
    include: tuple = ()
    target: str | None = None
    budget: float | None = None
    seeds: int | None = None
    plain: str = "dense"  # the name of the config's own update: "dense", or the method its optimizer sends


def _list(block: dict, key: str) -> list | None:
    v = block.get(key)
    if v is None:
        return None
    out = list(v) if isinstance(v, list) else [v]
    if not out:
        raise ValueError(f"advise.{key}: an empty list (leave the key out for the default)")
    return out


def _shown(x: Any, n: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= n else r[: n - 3] + "..."


def _points_count(spec: Any) -> int:
    """How many hyper-parameter points a compressor entry expands to (without expanding it)."""
    if not isinstance(spec, dict):
        return 1
    n = 1
    for k, v in spec.items():
        if k != "name" and isinstance(v, list):
            n *= len(v)  # lengths only: nothing is expanded
    return n


def count(block: Any) -> int:
    """The number of candidates a block asks for, counted before anything is expanded (an upper
    bound: duplicates are removed later)."""
    if not isinstance(block, dict):
        return 1
    comps = block.get("compressors")
    n_comp = (
        len(default_compressors())
        if comps is None
        else sum(_points_count(c) for c in (comps if isinstance(comps, list) else [comps]))
    )
    n = n_comp
    for key in ("memory", "sync", "architectures"):
        v = block.get(key)
        n *= len(v) if isinstance(v, list) and v else 1
    inc = block.get("include")
    return n + 2 + (len(inc) if isinstance(inc, list) else 0)


def _compressor_points(spec: Any) -> list[dict]:
    """One compressor entry of the block -> its hyper-parameter points (lists are expanded)."""
    if isinstance(spec, str):
        return [{"name": spec}]
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"advise.compressors: expected a name or a mapping with 'name', got {_shown(spec)}")
    keys = [k for k in spec if k != "name"]
    values = [spec[k] if isinstance(spec[k], list) else [spec[k]] for k in keys]
    return [{"name": spec["name"], **dict(zip(keys, combo))} for combo in itertools.product(*values)]


def default_compressors() -> list[dict]:
    """Every compressor whose registry knob lists values, at the smallest and largest value."""
    from cconv import compressors as C

    out = []
    for name in C.names():
        knob = C.entry(name).knob
        if knob is None or not knob.values:
            continue
        for v in sorted({min(knob.values), max(knob.values)}):
            out.append({"name": name, knob.name: v})
    return out


def _sync_point(spec: Any) -> dict:
    from cconv.engine.sync import public_names

    if isinstance(spec, str):
        if spec not in public_names():
            raise ValueError(
                f"advise.sync: unknown mode {_shown(spec)}; valid: {', '.join(public_names())} or a mapping"
            )
        return {"sync": spec}
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"advise.sync: expected a mode name or a mapping of run-config keys, got {_shown(spec)}")
    _no_reserved("advise.sync", spec)
    return dict(spec)


def _no_reserved(where: str, spec: dict) -> None:
    from cconv.experiments.config import FIELDS

    bad = [k for k in spec if k not in FIELDS]
    if bad:
        raise ValueError(f"{where}: unknown config key(s) {', '.join(_shown(k, 40) for k in bad[:5])}")
    fixed = [k for k in spec if k in RESERVED]
    if fixed:
        raise ValueError(
            f"{where}: {', '.join(fixed)} cannot vary between candidates (the advisor sets seed, workers, steps, "
            "logging and checkpoints for every candidate from --seeds, --cluster and the config; schedules: "
            "advise.schedules)"
        )


# the one rule for each of the block's numbers, also for the command line's --budget and --seeds
NUMBERS = {
    "budget": (lambda x: math.isfinite(x) and 0 < x <= 100, "a number of full dense runs in (0, 100]"),
    "seeds": (lambda x: isinstance(x, int) and 1 <= x <= MAX_SEEDS, f"an integer in [1, {MAX_SEEDS}]"),
}


def valid_number(key: str, v: Any) -> bool:
    """Whether ``v`` is a valid ``budget`` / ``seeds`` (``NUMBERS``)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and NUMBERS[key][0](v)


def _number(block: dict, key: str):
    v = block.get(key)
    if v is not None and not valid_number(key, v):
        raise ValueError(f"advise.{key} must be {NUMBERS[key][1]}, got {_shown(v)}")
    return v


def run_default(key: str) -> Any:
    """A run config key's default (``RunConfig``'s; imported when asked, as this module's other
    imports of cconv: the engine and jax load only when a space is checked)."""
    from cconv.experiments.config import default_of

    return default_of(key)


def parse(block: Any, cfg: RunConfig) -> Space:
    """Validate an ``advise:`` block against run config ``cfg``; one-line ValueError when malformed
    (the candidate count is checked before any list is expanded)."""
    block = {} if block is None else block
    if not isinstance(block, dict):
        raise ValueError(f"advise: expected a mapping with keys {', '.join(KEYS)}, got {type(block).__name__}")
    bad = [k for k in block if k not in KEYS]
    if bad:
        raise ValueError(
            f"advise: unknown key(s) {', '.join(_shown(k, 40) for k in bad[:5])}; valid: {', '.join(KEYS)}"
        )
    n = count(block)
    if n > MAX_CANDIDATES:
        raise ValueError(
            f"advise: the block asks for {n if n < 10**6 else 'over a million'} candidates; the limit is "
            f"{MAX_CANDIDATES} (narrow the lists, or sweep them with cconv sweep)"
        )
    comps = _list(block, "compressors")
    points = [p for c in comps for p in _compressor_points(c)] if comps is not None else default_compressors()
    memory = _list(block, "memory") or [PAIRED]
    for m in memory:
        if not isinstance(m, str):
            raise ValueError(f"advise.memory: expected names ({PAIRED}, none, ef, ...), got {_shown(m)}")
    sync = _list(block, "sync")
    sync_points = [_sync_point(s) for s in sync] if sync is not None else [{"sync": run_default("sync")}]
    arch = _list(block, "architectures") or [cfg.architecture]
    scheds = _list(block, "schedules") or [cfg.schedule or DEFAULT_SCHEDULE]
    from cconv.theory.schedule import schedules

    for s in scheds:
        if s not in schedules.names():
            raise ValueError(f"advise.schedules: unknown schedule {_shown(s)}; valid: {', '.join(schedules.names())}")
    budget, seeds = _number(block, "budget"), _number(block, "seeds")
    target = block.get("target")
    if target is not None and not isinstance(target, str):
        raise ValueError(f"advise.target: expected METRIC=VALUE, got {_shown(target)}")
    include = _list(block, "include")
    if include is None:  # default: the dense model under local SGD, the common non-BSP mode
        from cconv.experiments.config import FIELDS

        include = [{"local_steps": FIELDS["local_steps_init"].default}] if sync is None else []
    for inc in include:
        if not isinstance(inc, dict) or not inc:
            raise ValueError(f"advise.include: expected mappings of run-config keys, got {_shown(inc)}")
        _no_reserved("advise.include", inc)
    return Space(
        compressors=tuple(points),
        memory=tuple(memory),
        sync=tuple(sync_points),
        architectures=tuple(arch),
        schedules=tuple(scheds),
        include=tuple(include),
        target=target,
        budget=budget,
        seeds=seeds,
        plain=_plain(cfg),
    )


def _plain(cfg: RunConfig) -> str:
    """ "dense", or the method the config's optimizer sends when it sends its own messages (1-bit
    Adam: ``cconv.experiments.report.sent_columns``), so its candidates are not named dense."""
    from cconv.experiments.report import sent_columns

    return str(sent_columns(cfg.to_dict()).get("compressor") or "dense")


_NAMES = {
    "ratio": lambda v: f"{v * 100:g} %",
    "local_steps": lambda v: f"H={v}",
    "rank": lambda v: f"rank {v}",
    "levels": lambda v: f"{v} levels",
}


def label(comp: dict, memory: str, sync: dict, arch: str, arch0: str, sync0: dict, plain: str = "dense") -> str:
    """A human name: "dense", "top-k 1 % + EF", "dense, local SGD H=4", "QSGD levels=4, ssp";
    ``plain`` names the uncompressed update ("1-bit Adam" when the optimizer sends its own messages)."""
    from cconv import compressors as C

    name = comp["name"]
    try:
        base = plain if name == DENSE else (C.entry(name).label or name)
    except (KeyError, ValueError):
        base = name
    hp = [_NAMES.get(k, lambda v, k=k: f"{k}={v}")(v) for k, v in comp.items() if k != "name"]
    out = base + (" " + ", ".join(hp) if hp else "")
    if memory != "none":
        out += " + EF" if memory == "ef" else f" + {memory}"
    extra = []
    if sync != sync0:
        if set(sync) == {"local_steps"}:
            extra.append(f"local SGD {_NAMES['local_steps'](sync['local_steps'])}")
        else:
            extra.append(", ".join(f"{k}={v}" for k, v in sync.items()))
    if arch != arch0:
        extra.append(arch)
    return ", ".join([out, *extra])


def candidates(space: Space) -> list[Candidate]:
    """The probed candidates: compressors x memory x sync x architectures (memory only around a
    real compressor; ``paired`` resolved per compressor), the dense baseline first, duplicates
    removed."""
    sync0, arch0 = space.sync[0], space.architectures[0]
    dense = {"name": DENSE}
    out: dict[str, Candidate] = {}

    def add(comp, memory, sync, arch):
        name = label(comp, memory, sync, arch, arch0, sync0, space.plain)
        over = {"compressor": dict(comp), "memory": memory, "architecture": arch, **sync}
        out.setdefault(name, Candidate(name, over))

    add(dense, "none", sync0, arch0)
    for comp, memory, sync, arch in itertools.product(space.compressors, space.memory, space.sync, space.architectures):
        if comp["name"] == DENSE and memory not in ("none", PAIRED):  # paired: none around dense
            continue
        add(comp, paired_memory(comp) if memory == PAIRED else memory, sync, arch)
    for inc in space.include:
        comp = inc.get("compressor", dense)
        comp = {"name": comp} if isinstance(comp, str) else dict(comp)
        sync = {k: v for k, v in inc.items() if k not in ("compressor", "memory", "architecture")}
        add(comp, inc.get("memory", run_default("memory")), sync or sync0, inc.get("architecture", arch0))
    return list(out.values())


def paired_memory(comp: dict) -> str:
    """``ef`` around a compressor whose bound is not unbiased, ``none`` around an unbiased one (the
    bound from ``cconv.theory.constants`` on a probe tensor: the compressor's own entry decides)."""
    if comp["name"] == DENSE:
        return "none"
    from cconv.experiments.build import make_compressor, theory_constants

    try:
        table = theory_constants(make_compressor(comp), [(64, 64)])
    except Exception:  # noqa: BLE001 - a bad spec is reported by the probe's config check
        return "ef"
    kinds = {getattr(k, "kind", None) for k in table.values()}
    return "none" if kinds == {"unbiased"} else "ef"
