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
      probe: 0.1                   # --probe (fraction of the config's steps)
      seeds: 3                     # --seeds

Default (no block, or a key left out): ``compressors`` = every registered compressor with a
``knob`` that lists values (``Entry.knob``), at its smallest and largest value; ``memory`` =
``[none, ef]``; ``sync`` = ``[bsp]``; ``include`` (when ``sync`` is not given either) = the dense
model under local SGD, ``[{local_steps: H}]`` with H the config's ``local_steps_init`` default
(the common non-BSP mode); ``architectures`` = the config's own; ``schedules`` = the config's
``schedule`` or ``mg-wfbp`` (MG-WFBP, Shi et al., INFOCOM 2019: communication overlapped with
backpropagation, small gradients merged into larger messages, as PyTorch DDP's buckets and
Horovod's tensor fusion do; plain ``wfbp`` pays one latency per layer).  The dense baseline
(compressor ``none``, memory ``none``, the first sync and architecture) is always a candidate.
A combination the config loader or the engine refuses (e.g. ``asp`` without a parameter server)
is skipped and reported, not run.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

KEYS = ("compressors", "memory", "sync", "architectures", "schedules", "include", "target", "probe", "seeds")
DENSE = "none"
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
    probe: float | None = None
    seeds: int | None = None


def _list(block: dict, key: str) -> list | None:
    v = block.get(key)
    if v is None:
        return None
    return list(v) if isinstance(v, list) else [v]


def _compressor_points(spec: Any) -> list[dict]:
    """One compressor entry of the block -> its hyper-parameter points (lists are expanded)."""
    if isinstance(spec, str):
        return [{"name": spec}]
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"advise.compressors: expected a name or a mapping with 'name', got {spec!r}")
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
            raise ValueError(f"advise.sync: unknown mode {spec!r}; valid: {', '.join(public_names())} or a mapping")
        return {"sync": spec}
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"advise.sync: expected a mode name or a mapping of run-config keys, got {spec!r}")
    return dict(spec)


def parse(block: Any, cfg: Any) -> Space:
    """Validate an ``advise:`` block against run config ``cfg``; one-line ValueError when malformed."""
    from cconv.experiments.config import FIELDS

    block = {} if block is None else block
    if not isinstance(block, dict):
        raise ValueError(f"advise: expected a mapping with keys {', '.join(KEYS)}, got {type(block).__name__}")
    bad = [k for k in block if k not in KEYS]
    if bad:
        raise ValueError(f"advise: unknown key(s) {', '.join(map(str, bad))}; valid: {', '.join(KEYS)}")
    comps = _list(block, "compressors")
    points = [p for c in comps for p in _compressor_points(c)] if comps is not None else default_compressors()
    memory = _list(block, "memory") or ["none", "ef"]
    for m in memory:
        if not isinstance(m, str):
            raise ValueError(f"advise.memory: expected names (none, ef, dgc), got {m!r}")
    sync = _list(block, "sync")
    sync_points = [_sync_point(s) for s in sync] if sync is not None else [{"sync": "bsp"}]
    arch = _list(block, "architectures") or [cfg.architecture]
    scheds = _list(block, "schedules") or [cfg.schedule or DEFAULT_SCHEDULE]
    from cconv.theory.schedule import schedules as S

    for s in scheds:
        if s not in S.names():
            raise ValueError(f"advise.schedules: unknown schedule {s!r}; valid: {', '.join(S.names())}")
    probe, seeds = block.get("probe"), block.get("seeds")
    if probe is not None and (isinstance(probe, bool) or not isinstance(probe, (int, float)) or not 0 < probe <= 1):
        raise ValueError(f"advise.probe must be a fraction in (0, 1], got {probe!r}")
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise ValueError(f"advise.seeds must be an integer >= 1, got {seeds!r}")
    target = block.get("target")
    if target is not None and not isinstance(target, str):
        raise ValueError(f"advise.target: expected METRIC=VALUE, got {target!r}")
    include = _list(block, "include")
    if include is None:  # default: the dense model under local SGD, the common non-BSP mode
        include = [{"local_steps": FIELDS["local_steps_init"].default}] if sync is None else []
    for inc in include:
        if not isinstance(inc, dict) or not inc:
            raise ValueError(f"advise.include: expected mappings of run-config keys, got {inc!r}")
        bad = [k for k in inc if k not in FIELDS]
        if bad:
            raise ValueError(f"advise.include: unknown config key(s) {', '.join(map(str, bad))}")
    return Space(
        tuple(points),
        tuple(memory),
        tuple(sync_points),
        tuple(arch),
        tuple(scheds),
        tuple(include),
        target,
        probe,
        seeds,
    )


def _label(comp: dict, memory: str, sync: dict, arch: str, arch0: str, sync0: dict) -> str:
    hp = ",".join(f"{k}={v}" for k, v in comp.items() if k != "name")
    bits = [comp["name"] + (f"({hp})" if hp else "")]
    if memory != "none":
        bits.append(memory)
    if sync != sync0:
        bits.append(",".join(f"{k}={v}" for k, v in sync.items()))
    if arch != arch0:
        bits.append(arch)
    return " ".join(bits)


def candidates(space: Space) -> list[Candidate]:
    """The probed candidates: compressors x memory x sync x architectures (memory only around a
    real compressor), the dense baseline first, duplicates removed."""
    sync0, arch0 = space.sync[0], space.architectures[0]
    dense = {"name": DENSE}
    out: dict[str, Candidate] = {}

    def add(comp, memory, sync, arch):
        name = _label(comp, memory, sync, arch, arch0, sync0)
        over = {"compressor": dict(comp), "memory": memory, "architecture": arch, **sync}
        out.setdefault(name, Candidate(name, over))

    add(dense, "none", sync0, arch0)
    for comp, memory, sync, arch in itertools.product(space.compressors, space.memory, space.sync, space.architectures):
        if comp["name"] == DENSE and memory != "none":
            continue
        add(comp, memory, sync, arch)
    for inc in space.include:
        comp = inc.get("compressor", dense)
        comp = {"name": comp} if isinstance(comp, str) else dict(comp)
        sync = {k: v for k, v in inc.items() if k not in ("compressor", "memory", "architecture")}
        add(comp, inc.get("memory", "none"), sync or sync0, inc.get("architecture", arch0))
    return list(out.values())
