"""Config names of optax's optimizers and schedules, looked up in optax itself (no list of ours).

A leaf of ``cconv.experiments``: ``config`` checks the names while it loads a run
(``optimizer_function``, ``schedule_function``) and ``build`` calls the functions they name, with
arguments checked against their signatures (``check_arguments``, ``inspect.signature``).

``optimizer.name`` is one of cconv's own optimizers (``cconv.engine.optimizers.OPTIMIZERS``:
``onebit_adam``), looked up first, or any optax function that takes a ``learning_rate``
(``adamw``, ``lion``, ``contrib.muon``, ...); ``lr_schedule`` is ``constant`` (= ``constant_schedule``), ``cosine``
(= ``cosine_decay_schedule``, ``SCHEDULE_ALIASES``) or any function of ``optax.schedules`` whose
name ends in ``_schedule`` or ``_decay``.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import optax

from cconv._text import shown, shown_names
from cconv.engine.optimizers import OPTIMIZERS
from cconv.experiments.errors import ConfigError

# lr_schedule spellings of optax schedules (today's strings; each takes lr and the run's length)
SCHEDULE_ALIASES: dict[str, str] = {"constant": "constant_schedule", "cosine": "cosine_decay_schedule"}
LR_SCHEDULES = tuple(SCHEDULE_ALIASES)


def _optax_attr(name: str, module: Any) -> Any:
    """``module.<name>`` (dots reach into submodules: ``contrib.muon``), or None."""
    obj = module
    for part in name.split("."):
        if not part or part.startswith("_"):
            return None
        obj = getattr(obj, part, None)
    return obj


def parameters(fn: Any) -> dict:
    """``inspect.signature(fn).parameters`` as a dict ({} when ``fn`` has no signature)."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _closest(name: str, names: list[str], n: int = 12) -> str:
    ranked = sorted(names, key=lambda x: (-difflib.SequenceMatcher(None, name, x).ratio(), x))
    return ", ".join(ranked[:n]) + (", ..." if len(ranked) > n else "")


def optimizer_names() -> list[str]:
    """optax's optimizer aliases: its top-level functions that take a ``learning_rate`` (cconv's own
    are ``cconv.engine.optimizers.OPTIMIZERS``)."""
    return sorted(
        n
        for n in dir(optax)
        if not n.startswith("_")
        and inspect.isfunction(getattr(optax, n))
        and "learning_rate" in parameters(getattr(optax, n))
    )


def optimizer_function(name: str) -> Any:
    """The function of an optimizer name: cconv's own (``OPTIMIZERS``: ``onebit_adam``) or optax's
    (``adamw``, ``contrib.muon``); one-line ConfigError unless it is one of cconv's or a function of
    optax that takes ``learning_rate``."""
    if isinstance(name, str) and name in OPTIMIZERS:
        return OPTIMIZERS[name]
    fn = _optax_attr(name, optax) if isinstance(name, str) else None
    if not inspect.isfunction(fn) or "learning_rate" not in parameters(fn):
        raise ConfigError(
            f"optimizer {shown(name)} is not an optax optimizer (a function of optax taking learning_rate) "
            f"nor one of cconv's ({', '.join(sorted(OPTIMIZERS))}); "
            f"valid: {_closest(str(name), optimizer_names())}"
        )
    return fn


def schedule_names() -> list[str]:
    """optax's schedules: the functions of ``optax.schedules`` named ``*_schedule`` or ``*_decay``
    (optax's naming; ``join_schedules`` and ``inject_*`` take functions, not config values)."""
    return sorted(
        n
        for n in dir(optax.schedules)
        if n.endswith(("_schedule", "_decay")) and inspect.isfunction(getattr(optax.schedules, n))
    )


def schedule_function(name: str) -> Any:
    """The optax schedule function of an ``lr_schedule`` name (``SCHEDULE_ALIASES`` included)."""
    real = SCHEDULE_ALIASES.get(name, name) if isinstance(name, str) else None
    if real not in schedule_names():
        raise ConfigError(
            f"lr_schedule {shown(name)} is not an optax schedule; valid: {', '.join(LR_SCHEDULES)}, "
            f"{_closest(str(name), schedule_names())}"
        )
    return getattr(optax.schedules, real)


def check_arguments(what: str, fn: Any, spec: dict, given: tuple = ()) -> None:
    """Unknown or missing arguments of ``fn`` in ``spec`` (``name`` aside; ``given`` are passed by
    cconv) as a one-line ConfigError."""
    params = parameters(fn)
    named = {k: p for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        bad = [str(k) for k in spec if k != "name" and k not in named]
        if bad:
            valid = [p for p in named if p not in given]
            raise ConfigError(f"{what}: unknown argument(s) {shown_names(bad)}; valid: {', '.join(valid)}")
    missing = [k for k, p in named.items() if p.default is inspect.Parameter.empty and k not in spec and k not in given]
    if missing:
        raise ConfigError(f"{what}: missing required argument(s) {', '.join(missing)}")
