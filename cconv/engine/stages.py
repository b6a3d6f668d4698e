"""What the steps of a run send, phase by phase, without a model: the stages a planner prices.

A run takes each step in a phase (``Trainer.phase``: its synchronization mode's ``phase``, or the
phases its mode's host decides, e.g. 0/1 Adam's from the schedule its optimizer carries); a phase
communicates or not (``SyncMode.communicates``) and, when it does, sends its tensors dense or
through the compressor at the phase's density (``SyncMode.compresses``, ``compressor_at``: a
warm-up's dense steps send dense), packed as ``cconv.engine.exchange.make_plan`` lays them out
(which tensors are compressed, one payload per tensor or one fused payload: the config's
``granularity``, ``min_compress_size``, ``compress_vectors``) -- the same decisions
``Trainer.exchange`` and ``Trainer.step_work`` make for a built trainer.

``stages(cfg, steps, shapes, optimizer)`` groups the first ``steps`` steps of such a run by what
they send (``Stage``): nothing, dense, or a compressor's payloads; ``of_optimizer`` does it for
the ``EngineConfig`` a ``cconv.engine.optimizers.MessageTransformation`` sets (its ``engine``
fields: 1-bit Adam's dense warm-up then 1-bit momenta; 0/1 Adam's mode and schedule).  The
planner (``cconv.theory.planner``) prices each stage and the run's mean; nothing here names an
optimizer or a mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from cconv import compressors as C
from cconv.compressors.base import Compressor
from cconv.engine.config import EngineConfig, Phase, phase_exchange
from cconv.engine.exchange import make_plan
from cconv.engine.modes import phase_at, sync_mode

DENSE, COMPRESSED, NOTHING = "dense", "compressed", "nothing"  # what a stage's steps send
MAX_STEPS = 10**7  # steps ``stages`` walks (one host decision each)


class Stage(NamedTuple):
    """Steps of a run that send the same thing.

    ``sends``: ``"nothing"`` (no communication), ``"dense"`` (every tensor uncompressed) or
    ``"compressed"``; ``compressor``: the compressor of a compressed stage (unwrapped, without
    memory); ``compressed``: per tensor, whether it travels compressed (the others dense);
    ``fused``: the compressed tensors travel as one flat payload; ``steps``: how many of the
    run's steps; ``first``: the first of them (0-based); ``kinds``: the phase kinds of its steps
    in order of first appearance (the mode's names)."""

    sends: str
    compressor: Compressor | None
    compressed: tuple[bool, ...]
    fused: bool
    steps: int
    first: int
    kinds: tuple[str, ...]


def _phase_fn(cfg: EngineConfig, optimizer: Any):
    """(mode, step -> Phase): ``Trainer.phase``'s rule (``modes.phase_at``)."""
    mode = sync_mode(cfg)
    host = mode.host(cfg, optimizer)
    return mode, lambda step: phase_at(mode, cfg, host, step)


def _what(cfg: EngineConfig, mode, phase: Phase, shapes: Sequence[tuple[int, ...]]) -> tuple:
    """(sends, compressor, compressed mask, fused) of one phase (``Trainer.exchange``'s rule)."""
    none = (False,) * len(shapes)
    if not mode.communicates(phase):
        return NOTHING, None, none, False
    base, memory = phase_exchange(cfg, mode, phase)
    if base is None:
        return DENSE, None, none, False
    plan = make_plan(cfg, base, shapes, memory=memory)
    if plan.comp is None or C.registered_name(base) == C.IDENTITY or not any(plan.compressed):
        return DENSE, None, none, False
    return COMPRESSED, base, tuple(plan.compressed), bool(plan.fused)


def stages(cfg: EngineConfig, steps: int, shapes: Sequence[tuple[int, ...]], optimizer: Any = None) -> list[Stage]:
    """The first ``steps`` steps of a run of ``cfg`` (with ``optimizer``, for a mode that reads
    it) on tensors of ``shapes``, grouped by what they send, in order of first step."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"stages: steps must be an integer in [1, {MAX_STEPS}], got {steps!r}")
    shapes = [tuple(int(n) for n in s) for s in shapes]
    mode, phase_at = _phase_fn(cfg, optimizer)
    seen: dict[Phase, tuple] = {}  # phase -> what it sends (a phase is static)
    groups: dict[tuple, list] = {}  # what is sent -> [first, steps, kinds]
    for step in range(steps):
        phase = phase_at(step)
        if phase not in seen:
            seen[phase] = _what(cfg, mode, phase, shapes)
        sends, comp, mask, fused = seen[phase]
        key = (sends, id(comp), mask, fused)  # a compressor per phase (``seen`` keeps it): the same one, the same id
        g = groups.setdefault(key, [step, 0, [], seen[phase]])
        g[1] += 1
        if phase.kind not in g[2]:
            g[2].append(phase.kind)
    return [Stage(w[0], w[1], w[2], w[3], n, first, tuple(kinds)) for first, n, kinds, w in groups.values()]


def of_optimizer(optimizer: Any, steps: int, shapes: Sequence[tuple[int, ...]], **fields) -> list[Stage]:
    """``stages`` of a run of a ``MessageTransformation`` under the engine fields it sets
    (``optimizer.engine``) and ``fields`` (other ``EngineConfig`` fields, e.g. ``workers``)."""
    cfg = EngineConfig(**{**fields, **optimizer.engine})
    return stages(cfg, steps, shapes, optimizer)


__all__ = ["Stage", "stages", "of_optimizer", "DENSE", "COMPRESSED", "NOTHING", "MAX_STEPS"]
