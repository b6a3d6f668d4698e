"""Test configuration: 8 simulated CPU devices, and collectives that fail fast instead of hanging.

These variables must be set before jax is imported anywhere, hence at the top of conftest.
"""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# A collective that waits longer than this aborts the process (a hang fails fast instead of
# stalling CI); XLA warns after the shorter "stuck" timeout first.
if "xla_cpu_collective_call_terminate_timeout_seconds" not in _flags:
    _flags += " --xla_cpu_collective_call_terminate_timeout_seconds=60"
if "xla_cpu_collective_call_warn_stuck_timeout_seconds" not in _flags:
    _flags += " --xla_cpu_collective_call_warn_stuck_timeout_seconds=10"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _registries_put_back():
    """Whatever a test registers (a compressor, an aggregation, a schedule) is gone after it:
    tests that enumerate the registries (the docs' compressor table and help, the planner's
    methods, the readiness check) see the same registries whatever ran before them in the worker."""
    from registry_cases import registries_restored

    with registries_restored():
        yield
