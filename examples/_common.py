"""What the three drop-in recipes share and is not about cconv: the synthetic regression task,
the mesh over the first ``workers`` devices and global arrays that work in one process or many."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

FEATURES = 32


def mesh(workers=None):
    """A 1-D mesh named "data" over ``workers`` devices (default: every device of every process)."""
    devices = jax.devices()[: workers or jax.device_count()]
    return jax.make_mesh((len(devices),), ("data",), devices=devices)


def global_array(mesh, x, spec):
    """``x`` (the same host array in every process) as a global array laid out by ``spec``."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda idx: x[idx])


def batch(mesh, step, size=256):
    """The global batch of ``step`` (every process builds the same one), split over "data"."""
    w_true = jax.random.normal(jax.random.PRNGKey(1), (FEATURES,)) / 4
    x = jax.random.normal(jax.random.PRNGKey(100 + step), (size, FEATURES))
    y = jnp.tanh(x @ w_true)
    return global_array(mesh, x, P("data")), global_array(mesh, y, P("data"))
