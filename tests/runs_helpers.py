"""The tiny run config and the ``cconv`` command of the tests that train real runs
(``test_signals``, ``test_trust_files``, ``test_reliability``): one definition for all of them.

``tiny(**changes)`` is the config as a dict (for ``from_dict``), ``tiny_yaml(**changes)`` the same
as a YAML file's text (one top-level key a line, values in JSON flow style, which YAML reads),
``write_tiny(path, **changes)`` writes that file.  ``run_cconv`` runs ``python -m cconv`` (or a
``code`` snippet) in a subprocess with the environment of a user's shell (``cli_env``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {
    "model": {"name": "mlp", "hidden": [8]},
    "data": "digits",
    "workers": 2,
    "batch_size": 16,
    "steps": 12,
    "lr": 0.1,
    "compressor": {"name": "topk", "ratio": 0.1},
    "memory": "ef",
    "log_every": 4,
    "checkpoint_every": 4,
}


def tiny(**changes) -> dict:
    """``TINY`` with ``changes`` (new keys go last)."""
    return {**TINY, **changes}


def tiny_yaml(**changes) -> str:
    """``tiny(**changes)`` as YAML text."""
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in tiny(**changes).items())


def write_tiny(path, **changes) -> str:
    """Write ``tiny_yaml(**changes)`` to ``path``; its path as a string."""
    with open(path, "w") as f:
        f.write(tiny_yaml(**changes))
    return str(path)


def cli_env() -> dict:
    """The environment of a ``cconv`` subprocess: the CLI sets the device count itself (no XLA_FLAGS),
    CPU, no progress bars, this checkout's ``cconv``."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0", PYTHONPATH=ROOT)
    return env


def run_cconv(*args, code: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m cconv ARGS`` (or ``python -c CODE ARGS``), its output captured as text."""
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "cconv", *args]
    return subprocess.run(argv, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=timeout)
