"""``CompileMeter``: JAX's own build-time events summed over a block; ``shared_programs``' private cache
and what a killed process left of one."""

import jax
import jax.numpy as jnp
import pytest

from cconv.experiments.compiletime import CompileMeter


def test_a_new_program_is_counted_and_a_cached_one_is_not():
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())
    x = jnp.arange(7.0)
    with CompileMeter() as first:
        f(x).block_until_ready()
    with CompileMeter() as again:
        f(x).block_until_ready()
    assert first.programs == 1 and first.seconds > 0
    assert again.programs == 0 and again.seconds == 0


def test_the_threads_a_meter_hands_its_work_to_count_in_its_blocked_time():
    """``CompileMeter(also=PREFIX)``: a build in a thread so named counts in ``blocked`` (the
    advisor's training threads); one in a thread named otherwise (a build-ahead pool) does not."""
    import threading

    x = jnp.ones(4)
    with CompileMeter(also="meter-test-train") as m:
        for name, f in [
            ("meter-test-train_0", lambda x: jnp.sinh(x) * 7.0),
            ("meter-test-build_0", lambda x: jnp.cosh(x) - 4.0),
        ]:
            t = threading.Thread(target=lambda f=f: jax.jit(f)(x).block_until_ready(), name=name)
            t.start()
            t.join()
    assert m.programs == 2 and 0 < m.blocked < m.seconds
    with CompileMeter() as plain:
        t = threading.Thread(target=lambda: jax.jit(lambda x: jnp.tanh(x) + 3.0)(x), name="meter-test-train_1")
        t.start()
        t.join()
    assert plain.programs == 1 and plain.blocked == 0.0


def test_meters_nest():
    g = jax.jit(lambda x: x * 2.0)
    h = jax.jit(lambda x: x - 1.0)
    x = jnp.ones(3)
    with CompileMeter() as outer:
        g(x).block_until_ready()
        with CompileMeter() as inner:
            h(x).block_until_ready()
    assert inner.programs == 1 and outer.programs == 2 and outer.seconds >= inner.seconds


def test_a_program_built_in_another_thread_counts_as_built_not_as_this_threads_time():
    import threading

    from cconv.experiments.compiletime import waiting

    k = jax.jit(lambda x: jnp.cos(x) + 5.0)
    x = jnp.ones(4)
    with CompileMeter() as m:
        t = threading.Thread(target=lambda: k.lower(x).compile())
        t.start()
        t.join()
    assert m.programs == 1 and m.seconds > 0 and m.blocked == 0.0
    q = jax.jit(lambda x: jnp.tan(x) - 2.0)
    with CompileMeter() as w:
        t = threading.Thread(target=lambda: q.lower(x).compile())
        t.start()
        with waiting():
            t.join()
    assert w.programs == 1 and w.blocked > 0
    with CompileMeter() as here:
        jax.jit(lambda x: x / 3.0)(x).block_until_ready()
    assert here.programs == 1 and here.seconds > 0 and abs(here.blocked - here.seconds) < 1e-6


SHARED = """
import glob, json, os, tempfile
import jax, jax.numpy as jnp
from cconv.experiments.compiletime import CompileMeter, shared_programs

def make():  # a new closure each call: JAX's in-memory caches cannot share its program
    return jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())

x = jnp.arange(7.0)
with shared_programs():
    where = jax.config.jax_compilation_cache_dir
    mode = os.stat(where).st_mode & 0o777
    with CompileMeter() as first:
        a = make()(x)
    with CompileMeter() as second:
        b = make()(x)
    with CompileMeter() as other:
        jax.jit(lambda x: jnp.cos(x) - 1.0)(x).block_until_ready()
after = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
         jax.config.jax_compilation_cache_max_size)
with CompileMeter() as outside:
    make()(x).block_until_ready()
mine = tempfile.mkdtemp()
jax.config.update("jax_compilation_cache_dir", mine)
with shared_programs():
    kept = jax.config.jax_compilation_cache_dir
print(json.dumps(dict(first=first.shared, second=second.shared, other=other.shared,
    outside=outside.shared, same=bool((a == b).all()), gone=not os.path.exists(where),
    private=mode == 0o700,
    after=after, kept=kept == mine)))
"""


@pytest.mark.slow
def test_shared_programs_loads_a_program_another_closure_built_and_leaves_nothing_behind():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") and not k.startswith("CCONV_TEST")}
    res = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert (r["first"], r["second"], r["other"]) == (0, 1, 0)  # the same HLO once, a new one compiled
    assert r["same"] and r["gone"] and r["private"]
    assert r["after"] == [None, 1.0, -1]  # JAX's settings as they were
    assert r["outside"] == 0  # no cache after the block
    assert r["kept"]  # a cache the process already had is left alone


KILLED = """
import sys, time
from cconv.experiments.compiletime import shared_programs
import jax
with shared_programs():
    print(jax.config.jax_compilation_cache_dir, flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_what_a_sigkilled_process_left_is_removed_by_the_next_block_and_nothing_else(tmp_path):
    """A SIGKILLed advise or sweep cannot remove its program cache; the next ``shared_programs``
    (any process) removes it.  A live process's cache, another name, a link and a file stay."""
    import os
    import signal
    import subprocess
    import sys

    from cconv.experiments.compiletime import PREFIX, remove_stale

    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") and not k.startswith("CCONV_TEST")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True, env=env)
    left = proc.stdout.readline().strip()
    assert os.path.dirname(left) == str(tmp_path) and os.path.basename(left).startswith(f"{PREFIX}{proc.pid}-")
    live = tmp_path / f"{PREFIX}{os.getpid()}-live"  # this process: alive
    live.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / f"{PREFIX}{proc.pid}-link")
    (tmp_path / f"{PREFIX}{proc.pid}-file").write_text("not a directory")
    (tmp_path / "cconv-other-1").mkdir()
    assert remove_stale(str(tmp_path)) == []  # the process still runs: its cache is in use
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.isdir(left)  # killed: nothing could remove it
    assert remove_stale(str(tmp_path)) == [left]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [live.name, "elsewhere", f"{PREFIX}{proc.pid}-link", f"{PREFIX}{proc.pid}-file", "cconv-other-1"]
    )


def test_a_cache_another_process_removes_first_is_skipped(tmp_path, monkeypatch):
    """Two processes starting at once may both find a dead process's cache: the one that lists it
    after the other removed it skips it (it used to be an lstat of a missing path)."""
    import os

    from cconv.experiments import compiletime

    real = os.listdir
    monkeypatch.setattr(compiletime.os, "listdir", lambda where: real(where) + [f"{compiletime.PREFIX}999999999-gone"])
    assert compiletime.remove_stale(str(tmp_path)) == []
