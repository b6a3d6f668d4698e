"""A collective that hangs, for the fail-fast test (not collected by pytest).

    python tests/hang_worker.py TERMINATE_SECONDS STEPS

Dispatches STEPS all-reduce programs on 8 simulated CPU devices without ever waiting on a
result: beyond ~32 in flight, XLA's in-process CPU rendezvous deadlocks (DEVELOPERS.md).  With
``--xla_cpu_collective_call_terminate_timeout_seconds`` set, XLA aborts the process instead of
hanging forever; ``tests/test_engine_long.py`` checks that it dies quickly with a non-zero status
(and that the same loop blocking every 16 steps completes).
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 "
    f"--xla_cpu_collective_call_terminate_timeout_seconds={sys.argv[1]} "
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=1"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P

block_every = int(sys.argv[3]) if len(sys.argv) > 3 else 0
mesh = Mesh(np.array(jax.devices()), ("w",), axis_types=(jax.sharding.AxisType.Auto,))
f = jax.jit(jax.shard_map(lambda x: x + jax.lax.psum(x, "w") * 1e-3, mesh=mesh, in_specs=P("w"), out_specs=P("w")))
x = jnp.ones((8, 4))
for i in range(int(sys.argv[2])):
    x = f(x)
    if block_every and i % block_every == block_every - 1:
        x.block_until_ready()
x.block_until_ready()
print("finished", flush=True)
