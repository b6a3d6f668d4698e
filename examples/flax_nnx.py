"""cconv in a Flax NNX training loop: an ``nnx.Optimizer`` whose transformation compresses.

The functional style (``nnx.split`` / ``nnx.merge`` around a ``jax.shard_map``).  The optimizer is
created once, outside the mapped step, as in any NNX program.  Its cconv part (error-feedback
residuals, key, byte counters) must exist once per worker; ``cconv.nnx_split`` makes those copies,
places everything on the mesh and returns the partition specs, so the step only merges, trains and
splits.  The values move into the returned state: the original ``model`` raises if used (it would
hold the initial weights); ``nnx.merge(graphdef, state)`` is the trained one.  For Flax's
``nnx.jit`` / ``nnx.shard_map`` style, with the model trained in place, see ``flax_nnx_mnist.py``.

    python examples/flax_nnx.py                    # 8 simulated CPU devices, one process
    CCONV_COORDINATOR=127.0.0.1:12345 CCONV_NUM_PROCESSES=2 CCONV_PROCESS_ID=0 python examples/flax_nnx.py &
    CCONV_COORDINATOR=127.0.0.1:12345 CCONV_NUM_PROCESSES=2 CCONV_PROCESS_ID=1 python examples/flax_nnx.py
"""

import os

if __name__ == "__main__":  # simulated CPU devices (a no-op on GPUs); set before jax starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec as P

import cconv

try:
    from examples._common import FEATURES, batch, mesh
except ImportError:  # run as a script: python examples/flax_nnx.py
    from _common import FEATURES, batch, mesh


class Net(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(FEATURES, 64, rngs=rngs)
        self.bn = nnx.BatchNorm(64, momentum=0.9, rngs=rngs)  # axis_name="data": SyncBatchNorm
        self.dropout = nnx.Dropout(0.1)
        self.l2 = nnx.Linear(64, 1, rngs=rngs)

    def __call__(self, x, rngs):
        return self.l2(self.dropout(jax.nn.relu(self.bn(self.l1(x))), rngs=rngs))[:, 0]


def main(steps=200, workers=None, compressor=None, log=print):
    m = mesh(workers)
    compressor = cconv.compressors.topk(ratio=0.05) if compressor is None else compressor
    model = Net(nnx.Rngs(0))
    tx = optax.chain(cconv.as_optax(compressor, memory="ef", axis_name="data"), optax.adamw(3e-3))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state, specs = cconv.nnx_split(model, optimizer, m)  # per-worker copies of cconv's state

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=m,
        in_specs=(specs, P("data"), P("data"), P()),
        out_specs=(specs, P()),
        check_vma=False,
    )
    def train_step(state, x, y, key):
        model, optimizer = nnx.merge(graphdef, state)
        dropout_key = cconv.worker_key(key, "data")  # a different dropout mask on every worker

        def loss_fn(model):
            return jnp.mean((model(x, nnx.Rngs(dropout=dropout_key)) - y) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)  # compressed average, then AdamW
        nnx.update(model, cconv.sync_model_state(nnx.state(model, nnx.BatchStat), "data"))  # running stats
        return nnx.state((model, optimizer)), lax.pmean(loss, "data")

    losses = []
    for step in range(steps):
        state, loss = train_step(state, *batch(m, step), jax.random.PRNGKey(step))
        if step % 16 == 15 or step == steps - 1:  # block on a result at least every 16 steps
            losses.append(float(loss))
            log(f"step {step}  loss {losses[-1]:.4f}")
    model, optimizer = nnx.merge(graphdef, state)  # the trained pair (the originals were moved into `state`)
    tr = cconv.traffic(state)  # the last step's bytes per worker: payload, and what the collectives moved
    log(f"payload {tr.payload:.0f} B/worker/step; sent {tr.sent:.0f} B/worker/step over {tr.workers} workers")
    return {"losses": losses, "bytes_sent": tr.sent, "traffic": tr, "model": model, "state": state}


if __name__ == "__main__":
    cconv.distributed.initialize()  # a no-op in one process; reads SLURM / OpenMPI / CCONV_* otherwise
    main()
