"""The engine's synchronization-mode registry and the names the configuration checks against: a
leaf module (it imports nothing of cconv), so that ``EngineConfig`` can validate ``sync`` and the
gossip fields while the modes themselves (``cconv.engine.sync``, ``cconv.engine.gossip``) import
the configuration, without an import cycle.

``SYNC_MODES`` maps a name to a mode object (the protocol is ``cconv.engine.sync.SyncMode``); the
modules that define modes register them here on import (``cconv.engine`` imports them all).
"""

from __future__ import annotations

from typing import Any

ADAPTIVE = "adaptive"  # local_steps: AdaComm's adaptive communication period
BSP, LOCAL, ADACOMM = "bsp", "local", "adacomm"  # the modes ``sync_mode`` chooses between
GOSSIP = ("dpsgd", "choco")  # EngineConfig.gossip: the decentralized algorithms

SYNC_MODES: dict[str, Any] = {}  # name -> SyncMode, filled by cconv.engine.sync and .gossip


def public_names() -> tuple[str, ...]:
    """The values of ``EngineConfig.sync`` (every registered mode but the internal local SGD and
    AdaComm, which plain ``bsp`` with model averaging turns into)."""
    return tuple(n for n in SYNC_MODES if n not in (LOCAL, ADACOMM))


def sync_mode(cfg) -> Any:
    """The mode ``cfg`` runs: ``cfg.sync``; plain ``bsp`` with model averaging is local SGD
    (AdaComm when ``local_steps`` is adaptive)."""
    mode = SYNC_MODES[cfg.sync]
    if mode.name != BSP or not cfg.model_averaging:
        return mode
    return SYNC_MODES[ADACOMM if cfg.local_steps == ADAPTIVE else LOCAL]


def phase_at(mode, cfg, host, step: int):
    """The ``Phase`` of step ``step``: the one the mode's host decides (AdaComm, 0/1 Adam), or
    the mode's own rule when it has none (``Trainer.phase``; ``cconv.engine.stages``)."""
    return mode.phase(cfg, step) if host is None else host.phase(step)
