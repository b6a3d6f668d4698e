"""Test configuration: 8 simulated CPU devices, and collectives that fail fast instead of hanging.

These variables must be set before jax is imported anywhere, hence at the top of conftest.
"""

import os
import shutil
import sys
import tempfile

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

# One persistent compilation cache for the whole session: the xdist workers and every `python -m
# cconv` subprocess the tests start inherit these variables, so a program compiled once (the same
# small configs recur across end-to-end tests) is loaded from disk afterwards instead of compiled
# again.  The directory is fresh for each session (created here in the controller, before the workers
# start; removed at its end), never the user's cache.  jax writes an entry in place: a process that
# reads one half-written by another warns ("Error reading persistent compilation cache entry") and
# compiles the program itself.  CCONV_TEST_COMPILE_CACHE=0 turns the cache off.
_CACHE_OWNER = False
if os.environ.get("CCONV_TEST_COMPILE_CACHE", "1") != "0" and "CCONV_TEST_COMPILE_CACHE_DIR" not in os.environ:
    os.environ["CCONV_TEST_COMPILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cconv-test-jax-cache-")
    _CACHE_OWNER = True
if "CCONV_TEST_COMPILE_CACHE_DIR" in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["CCONV_TEST_COMPILE_CACHE_DIR"]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

# The tests' programs build as the advisor's probes do (``cconv.advisor.probes.FAST_BUILD``: LLVM at
# -O0 without its expensive passes, XLA's elemental emitters for fusions), read by XLA when the
# backend starts (after this import, before any device is used).  The suite is mostly XLA:CPU
# compiling small programs, which this halves (132 of its slowest tests: 4 min 03 s -> 1 min 52 s on
# 2 cores); what a program computes is the same up to rounding, and the HLO (the bytes a collective
# moves) is untouched.  CCONV_TEST_FAST_BUILD=0 builds with XLA's defaults, as users' runs do; a test
# about a compiled program's shape or bits asks for them (``runs_helpers.XLA_DEFAULTS``).
if os.environ.get("CCONV_TEST_FAST_BUILD", "1") != "0":
    from cconv.advisor.probes import FAST_BUILD  # noqa: E402

    _build = " ".join(f"--{k}={str(v).lower()}" for k, v in FAST_BUILD.items() if k not in _flags)
    os.environ["CCONV_TEST_BUILD_FLAGS"] = _build  # for subprocesses (runs_helpers.subprocess_env)
    os.environ["XLA_FLAGS"] = f"{_flags} {_build}".strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)

# pytest rewrites every test module's asserts on import and caches the result as a .pyc in
# tests/__pycache__ (git-ignored) -- unless PYTHONDONTWRITEBYTECODE is set (this machine sets it),
# when each xdist worker rewrites all ~100 modules again in every session: ~10 s of each worker's
# collection (13 s -> 4 s per worker once cached).  The pytest processes write bytecode whatever
# the variable says; what they write is the cache pytest and Python would keep anyway.
sys.dont_write_bytecode = False


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _registries_put_back():
    """Whatever a test registers (a compressor, an aggregation, a schedule) is gone after it:
    tests that enumerate the registries (the docs' compressor table and help, the planner's
    methods, the readiness check) see the same registries whatever ran before them in the worker."""
    from registry_cases import registries_restored

    with registries_restored():
        yield


def pytest_sessionstart(session):
    """Byte-compile cconv once, in the controller, before the workers start.  Every ``python -m
    cconv`` subprocess the tests start (and each isolated import in ``test_imports``) would
    otherwise compile all of cconv's source again where ``PYTHONDONTWRITEBYTECODE`` is set (an
    editable install has no ``.pyc`` of its own): about 0.15 s per process.  Up-to-date files are
    only stat'ed; ``__pycache__`` is git-ignored."""
    if hasattr(session.config, "workerinput"):
        return
    import compileall

    compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(__file__)), "cconv"), quiet=2, workers=1)


def pytest_unconfigure(config):
    """The session's compilation cache goes with the session (only the process that made it)."""
    if _CACHE_OWNER and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["CCONV_TEST_COMPILE_CACHE_DIR"], ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Two rules about the tiers and the order (DEVELOPERS.md, "Habits").

    * An ``extended`` test is also ``slow``: the fast tier (``-m "not slow"``) leaves out what CI
      leaves out.
    * Modules with a ``slow`` test run first, in their usual order, then the rest: with
      pytest-xdist, the many short tests then even out the workers at the end instead of one long
      end-to-end test keeping a core busy alone.  Whole modules move, so module-scoped fixtures are
      still set up once per worker.
    """
    for item in items:
        if item.get_closest_marker("extended") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    slow_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)
