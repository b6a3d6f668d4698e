"""cconv in a Flax Linen training loop: compressed gradients, BatchNorm, dropout, several processes.

What DDP gives you and where it is here:
- compressed gradient averaging: ``cconv.as_optax`` chained before the optimizer;
- optimizer state per worker (cconv's error-feedback residuals) and its partition specs:
  ``cconv.init_state`` (``cconv.check_specs`` validates specs you write yourself);
- per-worker dropout keys from one step key: ``cconv.worker_key``;
- BatchNorm running statistics kept equal on every worker: ``cconv.sync_model_state`` (or
  ``nn.BatchNorm(axis_name="data")`` for batch statistics synchronized in the forward pass,
  PyTorch's SyncBatchNorm).

    python examples/flax_linen.py                  # 8 simulated CPU devices, one process
    CCONV_COORDINATOR=127.0.0.1:12345 CCONV_NUM_PROCESSES=2 CCONV_PROCESS_ID=0 python examples/flax_linen.py &
    CCONV_COORDINATOR=127.0.0.1:12345 CCONV_NUM_PROCESSES=2 CCONV_PROCESS_ID=1 python examples/flax_linen.py
"""

import os

if __name__ == "__main__":  # simulated CPU devices (a no-op on GPUs); set before jax starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

import cconv

try:
    from examples._common import FEATURES, batch, global_array, mesh
except ImportError:  # run as a script: python examples/flax_linen.py
    from _common import FEATURES, batch, global_array, mesh


class MLP(nn.Module):
    sync_bn: bool = False  # True: batch statistics averaged over the workers in the forward pass

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(64)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, axis_name="data" if self.sync_bn else None)(x)
        x = nn.Dropout(0.1, deterministic=not train)(nn.relu(x))
        return nn.Dense(1)(x)[:, 0]


def main(steps=200, workers=None, compressor=None, sync_bn=False, stats="mean", log=print):
    """Train; ``stats``: "mean" averages the running statistics every step, "check" leaves them
    per worker and warns once if they differ (``cconv.sync_model_state``)."""
    m = mesh(workers)
    compressor = cconv.compressors.topk(ratio=0.05) if compressor is None else compressor
    model = MLP(sync_bn=sync_bn)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((2, FEATURES)), train=False)
    params, batch_stats = (jax.tree.map(lambda v: global_array(m, v, P()), variables[k]) for k in variables)
    tx = optax.chain(cconv.as_optax(compressor, memory="ef", axis_name="data"), optax.sgd(0.05, momentum=0.9))
    opt_state, specs = cconv.init_state(tx, params, m)

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=m,
        in_specs=(P(), P(), specs, P("data"), P("data"), P()),
        out_specs=(P(), P(), specs, P()),
        check_vma=False,
    )
    def train_step(params, batch_stats, opt_state, x, y, key):
        dropout_key = cconv.worker_key(key, "data")  # a different dropout mask on every worker

        def loss_fn(params):
            pred, new = model.apply(
                {"params": params, "batch_stats": batch_stats},
                x,
                train=True,
                rngs={"dropout": dropout_key},
                mutable=["batch_stats"],
            )
            return jnp.mean((pred - y) ** 2), new["batch_stats"]

        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        batch_stats = cconv.sync_model_state(batch_stats, "data", mode=stats)  # equal on every worker
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), batch_stats, opt_state, lax.pmean(loss, "data")

    losses = []
    for step in range(steps):
        x, y = batch(m, step)
        params, batch_stats, opt_state, loss = train_step(
            params, batch_stats, opt_state, x, y, jax.random.PRNGKey(step)
        )
        if step % 16 == 15 or step == steps - 1:  # block on a result at least every 16 steps
            losses.append(float(loss))
            log(f"step {step}  loss {losses[-1]:.4f}")
    sent = float(jax.device_get(opt_state[0].traffic["bytes_sent"].addressable_data(0))[0])
    log(f"sent {sent:.0f} B/worker/step over {m.shape['data']} workers")
    return {"losses": losses, "bytes_sent": sent, "params": params, "batch_stats": batch_stats, "opt_state": opt_state}


if __name__ == "__main__":
    cconv.distributed.initialize()  # a no-op in one process; reads SLURM / OpenMPI / CCONV_* otherwise
    main()
