"""The rules that check one setting's value: ``rule(name, value, checked) -> value``, normalized
(ints stay ints, numbers become floats), or a one-line ``ValueError`` naming ``name``.

One rule per key: ``cconv.engine.config.EngineConfig`` declares each field's rule on the field
(``EngineConfig`` runs it under the name ``EngineConfig.<field>``), and the run config
(``cconv.experiments.config``) runs the same rule under the YAML key's name, turning its
``ValueError`` into a ``ConfigError``.  ``checked`` maps the names checked before (a rule that
needs another value reads it there).  A leaf module: the engine and the run config both use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real
from typing import Any

import numpy as np

from cconv._text import shown

Rule = Callable[[str, Any, Mapping[str, Any]], Any]


def is_number(v: Any) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(v, Real) and not isinstance(v, (bool, np.bool_))


def integer(lo: int = 1, *, optional: bool = False, also: tuple = ()) -> Rule:
    """An integer >= ``lo`` (``None`` when ``optional``; the words of ``also`` pass as they are)."""

    def check(name: str, v: Any, checked: Mapping) -> Any:
        if (v is None and optional) or (isinstance(v, str) and v in also):
            return v
        if not isinstance(v, Integral) or not is_number(v) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {shown(v)}")
        return int(v)

    return check


def number(
    lo: float | None = None, *, strict: bool = False, optional: bool = False, below: float | None = None
) -> Rule:
    """A finite number, as a float: >= ``lo`` (> when ``strict``), < ``below``; ``None`` when ``optional``."""

    def check(name: str, v: Any, checked: Mapping) -> float | None:
        if v is None and optional:
            return None
        if not is_number(v) or not math.isfinite(v):
            raise ValueError(f"{name} must be a number, got {shown(v)}")
        if lo is not None and (v <= lo if strict else v < lo):
            raise ValueError(f"{name} must be {'>' if strict else '>='} {lo}, got {shown(v)}")
        if below is not None and v >= below:
            raise ValueError(f"{name} must be in [{lo:g}, {below:g}), got {shown(float(v))}")
        return float(v)

    return check


def fraction(what: str, *, also: tuple = ()) -> Rule:
    """A number in (0, 1], as a float; ``None`` and the words of ``also`` pass (``what`` says so)."""

    def check(name: str, v: Any, checked: Mapping) -> Any:
        if v is None or (isinstance(v, str) and v in also):
            return v
        if not is_number(v) or not 0 < v <= 1:
            raise ValueError(f"{name} must be {what}, got {shown(v)}")
        return float(v)

    return check


def choice(options: Callable[[], Iterable[str]], *, optional: bool = False, null: str | None = None) -> Rule:
    """One of ``options()`` (asked when checked: registries fill in at import); ``None`` passes when
    ``optional`` and stands for ``null`` when one is given."""

    def check(name: str, v: Any, checked: Mapping) -> Any:
        if v is None and optional:
            return None
        v = null if v is None and null is not None else v
        valid = tuple(options())
        if not isinstance(v, str) or v not in valid:
            raise ValueError(f"{name} must be one of {', '.join(valid)}; got {shown(v)}")
        return v

    return check


def flag() -> Rule:
    """true or false (a NumPy bool too), as a bool."""

    def check(name: str, v: Any, checked: Mapping) -> bool:
        if not isinstance(v, (bool, np.bool_)):
            raise ValueError(f"{name} must be true or false, got {shown(v)}")
        return bool(v)

    return check


def string() -> Rule:
    """A string."""

    def check(name: str, v: Any, checked: Mapping) -> str:
        if not isinstance(v, str):
            raise ValueError(f"{name} must be a string, got {shown(v)}")
        return v

    return check


def numbers(count: str, item: Rule) -> Rule:
    """``None`` or a list (a tuple or an array too) of numbers, one per ``checked[count]`` (the
    length is the engine's check), each checked by ``item``; as a list."""

    def check(name: str, v: Any, checked: Mapping) -> list | None:
        if v is None:
            return None
        if not isinstance(v, (list, tuple, np.ndarray)):
            raise ValueError(f"{name} must be null or a list of {checked.get(count)} numbers, got {shown(v)}")
        return [item(f"{name}[]", x, checked) for x in v]

    return check
