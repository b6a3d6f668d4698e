"""Flax's NNX MNIST tutorial, data-parallel with compressed gradients: the same CNN (Conv, BatchNorm,
Dropout, Linear), ``nnx.Rngs``, ``nnx.Optimizer``, ``nnx.MultiMetric`` and ``nnx.jit`` steps, on
scikit-learn's bundled 8x8 digits (no download) over the devices of a mesh.

What changes against the tutorial (https://flax.readthedocs.io/en/latest/mnist_tutorial.html):

- the optimizer's transformation starts with ``cconv.as_optax`` (top-k 5 % + error feedback);
- ``cconv.nnx_shard(model, optimizer, mesh)`` lays both out in place (cconv's state one row per
  worker) and returns the specs; ``model`` stays the one you train and evaluate;
- the gradient step runs per worker in ``nnx.shard_map`` (each its rows of the batch; dropout
  keys differ per worker, running BatchNorm statistics are averaged after the step); the
  tutorial's ``train_step`` stays an ``nnx.jit`` that calls it and updates the metrics, so the
  metrics see the whole batch in one program.

    python examples/flax_nnx_mnist.py              # 8 simulated CPU devices, one process
"""

import os

if __name__ == "__main__":  # simulated CPU devices (a no-op on GPUs); set before jax starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from functools import partial

import jax
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import cconv


class CNN(nnx.Module):
    """The tutorial's CNN, sized for 8x8 digits."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(16, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(32, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(2 * 2 * 32, 64, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        return self.linear2(x)


def loss_fn(model: CNN, rngs: nnx.Rngs | None, batch):
    logits = model(batch["image"], rngs)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


def make_steps(mesh, specs):
    """The tutorial's ``train_step`` / ``eval_step``; the gradient step runs per worker."""

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(specs.model, specs.optimizer, P(), P("data")),
        out_specs=(P(), P("data")),
        check_vma=False,  # each worker's own gradient (with check_vma=True jax.grad would sum it)
    )
    def worker_step(model: CNN, optimizer: nnx.Optimizer, rngs: nnx.Rngs, batch):
        worker_rngs = nnx.Rngs(dropout=cconv.worker_key(rngs.dropout()))  # a different mask per worker
        grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
        (loss, logits), grads = grad_fn(model, worker_rngs, batch)
        optimizer.update(model, grads)  # compressed average over the workers, then AdamW
        nnx.update(model, cconv.sync_model_state(nnx.state(model, nnx.BatchStat)))  # running statistics
        return lax.pmean(loss, "data"), logits

    @nnx.jit
    def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, rngs: nnx.Rngs, batch):
        loss, logits = worker_step(model, optimizer, rngs, batch)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])  # in this jit: one program

    @nnx.jit
    def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
        loss, logits = loss_fn(model, None, batch)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])

    return train_step, eval_step


def batches(data, mesh, batch_size, steps, seed=0):
    """``steps`` shuffled batches of ``data``, each split over the "data" axis of ``mesh``."""
    rng, n = np.random.default_rng(seed), len(data["label"])
    order = np.concatenate([rng.permutation(n) for _ in range(steps * batch_size // n + 1)])
    for i in range(steps):
        idx = order[i * batch_size : (i + 1) * batch_size]
        yield jax.device_put({k: v[idx] for k, v in data.items()}, NamedSharding(mesh, P("data")))


def main(train_steps=300, eval_every=100, batch_size=64, workers=None, compressor=None, log=print):
    devices = jax.devices()[: workers or jax.device_count()]
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(AxisType.Auto,), devices=devices)
    ds = cconv.data.load("digits")
    train_ds = {"image": ds.train["x"].astype(np.float32), "label": ds.train["y"]}
    test_ds = {"image": ds.test["x"].astype(np.float32), "label": ds.test["y"]}
    test_ds = jax.device_put(test_ds, NamedSharding(mesh, P()))

    model = CNN(rngs=nnx.Rngs(0))
    compressor = cconv.compressors.topk(ratio=0.05) if compressor is None else compressor
    tx = optax.chain(cconv.as_optax(compressor, memory="ef"), optax.adamw(0.005, 0.9))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    rngs = nnx.Rngs(0)
    # in place: cconv's state one row per worker, the rest (and the metrics and rngs) replicated
    specs = cconv.nnx_shard(model, optimizer, mesh, replicate=(metrics, rngs))
    train_step, eval_step = make_steps(mesh, specs)

    history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
    for step, batch in enumerate(batches(train_ds, mesh, batch_size, train_steps)):
        model.train()  # dropout on, batch statistics
        train_step(model, optimizer, metrics, rngs, batch)
        if step > 0 and (step % eval_every == 0 or step == train_steps - 1):
            for metric, value in metrics.compute().items():  # a host read: blocks, every eval_every steps
                history[f"train_{metric}"].append(float(value))
            metrics.reset()
            model.eval()  # dropout off, running statistics
            eval_step(model, metrics, test_ds)
            for metric, value in metrics.compute().items():
                history[f"test_{metric}"].append(float(value))
            metrics.reset()
            log(
                f"step {step}: train loss {history['train_loss'][-1]:.3f}, accuracy "
                f"{history['train_accuracy'][-1]:.3f}; test loss {history['test_loss'][-1]:.3f}, "
                f"accuracy {history['test_accuracy'][-1]:.3f}"
            )
    tr = cconv.traffic(optimizer)  # bytes of the last step, per worker
    log(f"payload {tr.payload:.0f} B/worker/step; moved {tr.sent:.0f} B sent over {tr.workers} workers")
    return {"history": history, "traffic": tr, "model": model, "optimizer": optimizer}


if __name__ == "__main__":
    cconv.distributed.initialize()  # a no-op in one process; reads SLURM / OpenMPI / CCONV_* otherwise
    main()
