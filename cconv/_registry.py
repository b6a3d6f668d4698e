"""Name -> factory lookup with one-line errors, shared by datasets and models.

A name is either registered (a key of the registry) or an import path ``"package.module:attr"``
(``attr`` may be dotted), which names user code without registering it, e.g. in a YAML config
``model: {name: my_pkg.nets:wide_mlp, width: 512}``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping

from cconv._text import shown, shown_names


def import_path(kind: str, path: str) -> Callable:
    """The callable ``"package.module:attr"`` names; a one-line ValueError if it cannot be imported."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"{kind} {path!r}: an import path reads 'package.module:function'")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        reason = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{kind} {path!r}: cannot import it ({type(e).__name__}: {reason})") from None
    if not callable(obj):
        raise ValueError(f"{kind} {path!r}: {type(obj).__name__} is not callable")
    return obj


def lookup(kind: str, registry: Mapping[str, Callable], name: str) -> Callable:
    """The factory registered as ``name``, or the one its import path names (``"module:attr"``);
    a ValueError listing the valid names otherwise."""
    if isinstance(name, str) and name in registry:
        return registry[name]
    if isinstance(name, str) and ":" in name:
        return import_path(kind, name)
    raise ValueError(
        f"unknown {kind} {shown(name)}; valid names: {', '.join(sorted(registry))} (or 'package.module:function')"
    )


def check_hparams(kind: str, name: str, hparams: Iterable[str], accepted: list[str]) -> None:
    """A ValueError naming the accepted hyper-parameters if any of ``hparams`` is not one."""
    unknown = sorted(set(hparams) - set(accepted))
    if unknown:
        valid = ", ".join(accepted) if accepted else "(none)"
        raise ValueError(f"{kind} {shown(name)} got unknown hyper-parameter(s) {shown_names(unknown)}; valid: {valid}")
