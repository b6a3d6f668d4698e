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


# XLA:CPU's own defaults for the options the test session changes (conftest: the probes' fast build),
# for a test about a compiled program's fusions or bits: ``jax.jit(f, compiler_options=XLA_DEFAULTS)``.
XLA_DEFAULTS = {
    "xla_backend_optimization_level": 3,
    "xla_llvm_disable_expensive_passes": False,
    "xla_cpu_use_fusion_emitters": True,
}


def subprocess_env(users_build: bool = False) -> dict:
    """``os.environ`` for a subprocess that sets its own device count (the CLI does): XLA_FLAGS
    keeps only the session's build options (conftest), so the subprocess builds as this process;
    ``users_build``: none, XLA's defaults, as a user's ``cconv`` builds (for the claims about bits
    a user relies on, such as a resumed run's equality with an uninterrupted one)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if os.environ.get("CCONV_TEST_BUILD_FLAGS") and not users_build:
        env["XLA_FLAGS"] = os.environ["CCONV_TEST_BUILD_FLAGS"]
    return env


def cli_env(users_build: bool = False) -> dict:
    """The environment of a ``cconv`` subprocess: the CLI sets the device count itself (XLA_FLAGS
    keeps the session's build options only, ``subprocess_env``), CPU, no progress bars, this
    checkout's ``cconv``."""
    env = subprocess_env(users_build)
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0", PYTHONPATH=ROOT)
    return env


def run_cconv(
    *args, code: str | None = None, timeout: float = 300, users_build: bool = False
) -> subprocess.CompletedProcess:
    """``python -m cconv ARGS`` (or ``python -c CODE ARGS``), its output captured as text."""
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "cconv", *args]
    env = cli_env(users_build)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
