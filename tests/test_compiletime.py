"""``CompileMeter``: JAX's own build-time events summed over a block."""

import jax
import jax.numpy as jnp

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
