"""Does XLA overlap cconv's compressed exchange with the backward pass?  A measurement.

Three programs per configuration, each a ``jax.shard_map`` over P devices, timed interleaved in
the same rounds (ratios of medians over the same rounds, so machine load affects all three):

  backward   loss + ``jax.grad`` of a deep MLP (8 layers), the gradient reduced to one number
  exchange   ``cconv.Exchange`` of a gradient-shaped pytree alone (compress, communicate, average)
  step       both in one program: the layer-wise exchange of layer l may start as soon as layer
             l's gradient exists, while XLA still computes the gradients of layers < l

  ratio = t(step) / (t(backward) + t(exchange)):  1.0 = no overlap, below 1 = overlap (the
  scheduler hid part of the exchange behind backward), the floor is max(t_b, t_e) / (t_b + t_e).

    .venv/bin/python scripts/overlap_benchmark.py [--workers 8] [--rounds 15] [--out docs/_static]

writes ``overlap_<backend>.json`` and ``overlap_<backend>.png`` (the figure in docs/dropin.md).
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":
    _w = next((a.split("=")[1] for a in sys.argv if a.startswith("--workers=")), None)
    _w = _w or (sys.argv[sys.argv.index("--workers") + 1] if "--workers" in sys.argv else "8")
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_w}")
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cconv

LAYERS, WIDTH = 8, 512
CONFIGS = {"dense (none)": ("none", "none"), "top-k 1% + EF": ("topk", "ef")}


def make_params(key):
    keys = jax.random.split(key, LAYERS)
    return [{"w": jax.random.normal(k, (WIDTH, WIDTH)) / np.sqrt(WIDTH), "b": jnp.zeros(WIDTH)} for k in keys]


def loss_fn(params, x):
    for layer in params:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return jnp.mean(x**2)


def programs(mesh, ex):
    """The three jitted programs of one configuration."""
    spec = dict(mesh=mesh, check_vma=False)

    @jax.jit
    @partial(jax.shard_map, in_specs=(P(), P("data")), out_specs=P(), **spec)
    def backward(params, x):
        g = jax.grad(loss_fn)(params, x)
        return lax.pmean(sum(jnp.sum(v) for v in jax.tree.leaves(g)), "data")  # the same 4 bytes as below

    @jax.jit
    @partial(jax.shard_map, in_specs=(P(), P("data"), P()), out_specs=(P(), P("data")), **spec)
    def exchange(grads, state, key):
        avg, state, _ = ex(grads, state, key)
        return lax.pmean(sum(jnp.sum(v) for v in jax.tree.leaves(avg)), "data"), state

    @jax.jit
    @partial(jax.shard_map, in_specs=(P(), P("data"), P("data"), P()), out_specs=(P(), P("data")), **spec)
    def step(params, state, x, key):
        g = jax.grad(loss_fn)(params, x)
        avg, state, _ = ex(g, state, key)
        return lax.pmean(sum(jnp.sum(v) for v in jax.tree.leaves(avg)), "data"), state

    return backward, exchange, step


def timed(f, *args, reps=5):
    jax.block_until_ready(f(*args))
    t = time.perf_counter()
    for _ in range(reps):
        out = f(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / reps


def measure(workers: int, rounds: int, batch: int) -> dict:
    mesh = jax.make_mesh((workers,), ("data",), devices=jax.devices()[:workers])
    params = make_params(jax.random.PRNGKey(0))
    x = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (batch, WIDTH)), NamedSharding(mesh, P("data")))
    key = jax.random.PRNGKey(2)
    progs = {}
    for label, (name, memory) in CONFIGS.items():
        c = cconv.compressors.get(name, **({"ratio": 0.01} if name == "topk" else {}))
        ex = cconv.Exchange(c, memory=memory, axis_name="data")
        init = jax.jit(jax.shard_map(ex.init, mesh=mesh, in_specs=P(), out_specs=P("data"), check_vma=False))
        progs[label] = (programs(mesh, ex), init(params))
    times = {label: {"backward": [], "exchange": [], "step": []} for label in CONFIGS}
    for _ in range(rounds):  # interleaved: every program once per round
        for label, ((backward, exchange, step), state) in progs.items():
            times[label]["backward"].append(timed(backward, params, x))
            times[label]["exchange"].append(timed(exchange, params, state, key))
            times[label]["step"].append(timed(step, params, state, x, key))
    out = {}
    for label, t in times.items():
        med = {k: float(np.median(v)) for k, v in t.items()}
        ratios = np.array(t["step"]) / (np.array(t["backward"]) + np.array(t["exchange"]))
        floor = max(med["backward"], med["exchange"]) / (med["backward"] + med["exchange"])
        out[label] = {
            **{f"{k}_ms": 1e3 * v for k, v in med.items()},
            "ratio": float(np.median(ratios)),
            "ratio_q1_q3": [float(np.quantile(ratios, 0.25)), float(np.quantile(ratios, 0.75))],
            "full_overlap_floor": floor,
        }
    return out


def figure(result: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    y = np.arange(len(labels))
    for i, label in enumerate(labels):
        r = result[label]
        ax.barh(i + 0.2, r["backward_ms"], 0.35, color="tab:blue", label="backward alone" if i == 0 else None)
        ax.barh(
            i + 0.2,
            r["exchange_ms"],
            0.35,
            left=r["backward_ms"],
            color="tab:orange",
            label="exchange alone" if i == 0 else None,
        )
        ax.barh(i - 0.2, r["step_ms"], 0.35, color="tab:green", label="both in one program" if i == 0 else None)
        ax.text(r["step_ms"], i - 0.2, f"  ratio {r['ratio']:.2f}", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.set_xlabel("milliseconds per call (median)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=64, help="global batch (small: backward comparable to the exchange)")
    ap.add_argument("--out", default=None, help="directory for overlap_<backend>.json/.png (default: print only)")
    args = ap.parse_args(argv)
    result = measure(args.workers, args.rounds, args.batch)
    backend = jax.default_backend()
    for label, r in result.items():
        print(
            f"{label:>16}: backward {r['backward_ms']:.2f} ms, exchange {r['exchange_ms']:.2f} ms, "
            f"step {r['step_ms']:.2f} ms; ratio step/(backward+exchange) {r['ratio']:.3f} "
            f"(quartiles {r['ratio_q1_q3'][0]:.3f}-{r['ratio_q1_q3'][1]:.3f}; full overlap would be "
            f"{r['full_overlap_floor']:.3f})"
        )
    if args.out:
        meta = {"backend": backend, "workers": args.workers, "rounds": args.rounds, "jax": jax.__version__}
        meta.update(layers=LAYERS, width=WIDTH, batch=args.batch, cpu_count=os.cpu_count())
        with open(os.path.join(args.out, f"overlap_{backend}.json"), "w") as f:
            json.dump({"meta": meta, "result": result}, f, indent=1)
        title = f"{LAYERS}-layer MLP ({WIDTH} wide, batch {args.batch}), {args.workers} workers, {backend}"
        title += f", jax {jax.__version__}"
        figure(result, os.path.join(args.out, f"overlap_{backend}.png"), title)
    return result


if __name__ == "__main__":
    main()
