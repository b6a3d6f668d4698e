"""cconv's own optimizers for run configs: optimizers whose *message* is not the gradient.

The engine's step averages what each worker sends through the phase's ``Exchange`` (compressor,
memory, aggregation, transport) and hands the average to the optax optimizer.  Most optimizers
send their gradient and are plain optax functions (``optimizer: {name: adamw}``, looked up in optax
by ``cconv.experiments.optax_names``).  Some communication-efficient optimizers send something
else: 1-bit Adam sends its momentum b1 m + (1 - b1) g_i after the warm-up (Tang et al. 2021,
``cconv.engine.onebit_adam``).  Such an optimizer is a ``MessageTransformation``: an optax
``GradientTransformation`` with

    message(grads, state) -> what this worker sends instead of its gradient (same tree),
    engine                 the ``EngineConfig`` fields it sets (its compressor, memory, dense warm-up),
    label                  the method's name in reports and figures ("1-bit Adam"),
    schedule               what its own synchronization mode reads (0/1 Adam's policies; None: none),

and ``update(average, state, params)`` receives the workers' average of the messages.  The facts
travel on the object (the engine reads ``message``, the run's build reads ``engine``, reports and
figures read ``sent``: a run of such an optimizer is its own method, not the config's compressor);
nothing else names the optimizer.

``OPTIMIZERS`` maps a config name to its factory ``(learning_rate, **knobs) ->
MessageTransformation``; each optimizer's module registers itself at its end (``register``), and
the config's ``optimizer.name`` is looked up here before optax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from cconv.engine import modes
from cconv.engine.config import ENGINE_DEFAULTS


class MessageTransformation(NamedTuple):
    """An optax ``GradientTransformation`` (``init``, ``update``) whose workers send
    ``message(grads, state)`` instead of their gradient; ``engine``: the ``EngineConfig`` fields it
    needs (e.g. ``compressor``, ``memory``, ``warmup``); ``label``: the method's name in reports
    and figures (``sent``)."""

    init: Callable
    update: Callable
    message: Callable
    engine: dict
    label: str = ""
    schedule: Any = None


class Sent(NamedTuple):
    """What the workers of a run send, as reports and figures show it (``sent``): the method (its
    label), the compressor its messages travel through and the memory around it."""

    method: str
    compressor: Any  # a Compressor, or None: dense
    memory: str


OPTIMIZERS: dict[str, Callable[..., MessageTransformation]] = {}  # config name -> factory


def register(name: str, factory: Callable[..., MessageTransformation]) -> Callable[..., MessageTransformation]:
    """Register ``factory`` (``(learning_rate, **knobs) -> MessageTransformation``) as the run-config
    optimizer ``name``; returns it."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"optimizers.register: name must be a non-empty string, got {name!r}")
    OPTIMIZERS[name] = factory
    return factory


def message_of(optimizer: Any) -> Callable | None:
    """The ``message`` hook of an engine optimizer (None: it sends its gradient)."""
    return optimizer.message if isinstance(optimizer, MessageTransformation) else None


def sent(optimizer: Any) -> Sent | None:
    """What a ``MessageTransformation``'s workers send (its ``label``, the compressor and memory of
    its ``engine``; ``method`` is "" when it has no label); None for an optimizer that sends its
    gradient (the run's compressor and memory say what travels)."""
    if message_of(optimizer) is None:
        return None
    own = optimizer.engine
    return Sent(optimizer.label, own.get("compressor"), own.get("memory", ENGINE_DEFAULTS["memory"]))


def _same(a: Any, b: Any) -> bool:
    """Equal engine fields; compressors by name and hyper-parameters (their functions differ)."""
    if hasattr(a, "hparams") and hasattr(b, "hparams"):
        return a.name == b.name and dict(a.hparams) == dict(b.hparams)
    return a == b


def check(engine_cfg: Any, optimizer: Any) -> None:
    """One-line ValueError unless ``engine_cfg`` (an ``EngineConfig``) can run ``optimizer``: a mode that
    runs one optimizer's rules refuses the others (``SyncMode.check_optimizer``); a
    ``MessageTransformation`` needs a synchronization mode that averages its messages every step
    (``SyncMode.messages``), or the one it sets itself (``engine["sync"]``: 0/1 Adam), and the
    engine fields it names (``EngineConfig(**tx.engine, ...)``)."""
    mode = modes.sync_mode(engine_cfg)
    own_rules = getattr(mode, "check_optimizer", None)  # a mode that runs one optimizer's rules (0/1 Adam)
    if own_rules is not None:
        own_rules(optimizer)
    if message_of(optimizer) is None:
        return
    if optimizer.engine.get("sync", mode.name) != mode.name:
        raise ValueError(f"this optimizer runs under sync={optimizer.engine['sync']!r}, got {mode.name}")
    if "sync" not in optimizer.engine and not getattr(mode, "messages", False):
        ok = ", ".join(n for n, m in modes.SYNC_MODES.items() if getattr(m, "messages", False))
        raise ValueError(
            f"this optimizer sends its own messages through every step's exchange: it needs a synchronization "
            f"mode that averages them each step ({ok}, without local steps), got {mode.name}"
        )
    for k, want in optimizer.engine.items():
        if not _same(getattr(engine_cfg, k), want):
            raise ValueError(
                f"this optimizer sets EngineConfig.{k}={want!r}, got {getattr(engine_cfg, k)!r}: build the config with "
                f"EngineConfig(**optimizer.engine, ...)"
            )


__all__ = ["MessageTransformation", "Sent", "OPTIMIZERS", "register", "message_of", "sent", "check"]
