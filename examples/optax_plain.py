"""cconv's compressed gradient averaging in a plain JAX + optax training loop.

``cconv.as_optax`` is a gradient transformation that replaces each worker's gradient by the
workers' compressed average (Horovod's ``DistributedOptimizer(opt, compression=...)``); chain your
optimizer after it and call it inside your own ``jax.shard_map`` over the worker axis.

    python examples/optax_plain.py                 # 8 simulated CPU devices, one process
    # two processes (gloo on CPU; NCCL on GPUs), each with its own devices:
    CCONV_COORDINATOR=127.0.0.1:12345 CCONV_NUM_PROCESSES=2 CCONV_PROCESS_ID=0 python examples/optax_plain.py &
    CCONV_COORDINATOR=127.0.0.1:12345 CCONV_NUM_PROCESSES=2 CCONV_PROCESS_ID=1 python examples/optax_plain.py
"""

import os

if __name__ == "__main__":  # simulated CPU devices (a no-op on GPUs); set before jax starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

import cconv

try:
    from examples._common import FEATURES, batch, global_array, mesh
except ImportError:  # run as a script: python examples/optax_plain.py
    from _common import FEATURES, batch, global_array, mesh


def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y[:, None]) ** 2)


def main(steps=200, workers=None, compressor=None, log=print):
    m = mesh(workers)
    compressor = cconv.compressors.topk(ratio=0.01) if compressor is None else compressor
    tx = optax.chain(cconv.as_optax(compressor, memory="ef", axis_name="data"), optax.adamw(3e-3))
    params = {"w1": jax.random.normal(jax.random.PRNGKey(0), (FEATURES, 64)) / 6, "w2": jnp.zeros((64, 1))}
    params = jax.tree.map(lambda p: global_array(m, p, P()), params)
    opt_state, specs = cconv.init_state(tx, params, m)  # cconv's part per worker, AdamW's replicated

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=m,
        in_specs=(P(), specs, P("data"), P("data")),
        out_specs=(P(), specs, P()),
        check_vma=False,  # each worker's own gradient (with check_vma=True jax.grad would sum it)
    )
    def train_step(params, opt_state, x, y):  # one worker: its rows of the batch
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)  # compressed average, then AdamW
        return optax.apply_updates(params, updates), opt_state, lax.pmean(loss, "data")

    losses = []
    for step in range(steps):
        params, opt_state, loss = train_step(params, opt_state, *batch(m, step))
        if step % 16 == 15 or step == steps - 1:  # block on a result at least every 16 steps
            losses.append(float(loss))
            log(f"step {step}  loss {losses[-1]:.4f}")
    sent = float(jax.device_get(opt_state[0].traffic["bytes_sent"].addressable_data(0))[0])
    log(f"sent {sent:.0f} B/worker/step over {m.shape['data']} workers")
    return {"losses": losses, "bytes_sent": sent, "params": params, "opt_state": opt_state}


if __name__ == "__main__":
    cconv.distributed.initialize()  # a no-op in one process; reads SLURM / OpenMPI / CCONV_* otherwise
    main()
