"""The error of bad run input (a leaf module: ``config``, ``optax_names`` and ``build`` raise it)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, reported to the user as one line."""
