"""Training losses and evaluation metrics for a ``ModelSpec``, per task.

    loss_fn = make_loss(spec, task)   # (params, model_state, batch, key) -> (loss, (model_state, aux))
    eval_fn = make_eval(spec, task)   # (params, model_state, batch) -> {"loss": ..., ...}

=============== ========================================================== =======================
task            loss (mean over the batch)                                 metrics
=============== ========================================================== =======================
classification  softmax cross-entropy ``-log softmax(f(x))_y``             accuracy
regression      squared error ``|f(x) - y|^2`` (summed over outputs; a     --
                single output is compared with a y of shape [B])
lm              next-token cross-entropy, mean over the B*T positions      accuracy (next token);
                (logits[b, t] predicts y[b, t])                            eval adds perplexity
=============== ========================================================== =======================

``loss_fn`` runs the model in training mode (BatchNorm batch statistics, dropout with ``key``)
and returns the updated ``model_state``; ``eval_fn`` uses training-free mode (running statistics,
no dropout) and leaves the state alone.  Both are pure: jit, grad, vmap (e.g. over seeds) and
shard_map apply.  Cross-entropies are computed in float32 whatever the model's dtype.
``evaluate`` averages ``eval_fn`` over a whole split in chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from cconv.data.base import TASKS
from cconv.models.base import ModelSpec


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
    return task


def objective(task: str, outputs: jax.Array, y: jax.Array) -> tuple[jax.Array, dict]:
    """(mean loss, metrics) of ``outputs`` against targets ``y`` for ``task`` (table above)."""
    if task == "regression":
        pred = outputs
        if pred.ndim == y.ndim + 1 and pred.shape[-1] == 1:
            pred = pred[..., 0]
        if pred.shape != y.shape:
            raise ValueError(f"regression outputs {outputs.shape} do not match targets {y.shape}")
        err = (pred.astype(jnp.float32) - y.astype(jnp.float32)) ** 2
        return err.reshape(err.shape[0], -1).sum(-1).mean(), {}
    if outputs.shape[:-1] != y.shape:
        raise ValueError(
            f"{task} logits {outputs.shape} do not match labels {y.shape} (expected "
            f"logits of shape labels.shape + (num_classes,))"
        )
    logits = outputs.astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    accuracy = (jnp.argmax(logits, -1) == y).astype(jnp.float32).mean()
    return loss, {"accuracy": accuracy}


def make_loss(spec: ModelSpec, task: str) -> Callable:
    """``loss_fn(params, model_state, batch, key) -> (loss, (new_model_state, aux))``."""
    task = _check_task(task)

    def loss_fn(params, model_state, batch, key=None):
        outputs, new_state = spec.apply(params, model_state, batch["x"], True, key)
        loss, aux = objective(task, outputs, batch["y"])
        return loss, (new_state, aux)

    return loss_fn


def make_eval(spec: ModelSpec, task: str) -> Callable:
    """``eval_fn(params, model_state, batch) -> dict`` of scalars: loss and the task's metrics."""
    task = _check_task(task)

    def eval_fn(params, model_state, batch):
        outputs, _ = spec.apply(params, model_state, batch["x"], False, None)
        loss, metrics = objective(task, outputs, batch["y"])
        out = {"loss": loss, **metrics}
        if task == "lm":
            out["perplexity"] = jnp.exp(loss)
        return out

    return eval_fn


def evaluate(eval_fn: Callable, params, model_state, data: dict, batch_size: int = 1024) -> dict:
    """``eval_fn`` over a whole split, in chunks of ``batch_size`` rows, as Python floats.

    Each metric is the sample-weighted mean over chunks (exact, since every metric is a mean over
    rows); ``perplexity`` is ``exp`` of the averaged loss, not an average of perplexities.
    """
    n = len(data["y"])
    if n == 0:
        raise ValueError("evaluate: empty data")
    fn = jax.jit(eval_fn)
    sums: dict[str, float] = {}
    has_ppl = False
    for i in range(0, n, batch_size):
        chunk = {k: v[i : i + batch_size] for k, v in data.items()}
        m = len(chunk["y"])
        for k, v in fn(params, model_state, chunk).items():
            if k == "perplexity":
                has_ppl = True
            else:
                sums[k] = sums.get(k, 0.0) + float(v) * m
    out = {k: v / n for k, v in sums.items()}
    if has_ppl:
        out["perplexity"] = math.exp(out["loss"])
    return out


__all__ = ["make_loss", "make_eval", "evaluate", "objective"]
