"""Where the time of a compressed training step goes: one worker's step on one device, ablated.

Part (b) of ``run.py`` times whole steps on 8 simulated devices sharing the machine's cores.
This script splits the top-k 1% + EF step of the same problem (``--model``, default mlp1m) into
parts.  It runs the engine's per-worker step (its sync mode's ``step``, BSP here) on ONE device
with a shape-only comm (``cconv.comm.backend.DryComm``: collectives move nothing, an all-gather
hands this worker's payload back once per worker), so what is timed is one worker's compute;
the hand-written reference (``run.reference_step``'s body: ``jax.grad``, the optax update) gets
the same treatment.  All programs run interleaved, round after round, and the ratio to the
reference is the median over rounds of the per-round ratio of process CPU times.

Ablations remove one part each (timing only: they train something else):

  fixed indices   top-k's selection replaced by k evenly spaced indices
  no scatter      the gathered sum replaced by a broadcast (no dense zeros, no scatter-add of
                  the P*k gathered pairs)
  no EF           memory "none" (no p = g + e, no residual update)

so that differences of the rows give the selection, the gathered sum and error feedback.

    .venv/bin/python studies/benchmarks/step_parts.py --rounds 60
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402 - the benchmark suite's problems and configurations


def _reference(loss, optimizer, workers: int):
    import jax
    import optax

    def step(params, opt_state, batch):
        (value, _), grads = jax.value_and_grad(loss, has_aux=True)(params, {}, batch, None)
        grads = jax.tree.map(lambda g: g * workers / workers, grads)  # the pmean of one worker
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step)


def _ablations(topk):
    """(label, compressor, memory) of the top-k + EF step and its ablated variants."""
    import jax.numpy as jnp

    from cconv.compressors.sparse import gather_sparse

    def fixed_compress(x, state, key):
        flat = x.reshape(-1)
        k = max(1, round(topk.density(x.shape) * flat.size))
        return gather_sparse(flat, jnp.arange(k, dtype=jnp.int32) * (flat.size // k)), state

    def broadcast_sum(stacked, like):
        return jnp.broadcast_to(stacked.values.reshape(-1)[0], like.shape).astype(like.dtype)

    fixed = topk._replace(compress=fixed_compress)
    return [
        ("top-k 1% + EF", topk, "ef"),
        ("  fixed indices", fixed, "ef"),
        ("  no scatter", topk._replace(gathered_sum=broadcast_sum), "ef"),
        ("  fixed indices, no scatter", fixed._replace(gathered_sum=broadcast_sum), "ef"),
        ("  no EF", topk, "none"),
        ("  no EF, fixed indices, no scatter", fixed._replace(gathered_sum=broadcast_sum), "none"),
    ]


def programs(model: str, workers: int):
    """{label: (jitted fn, args, carry)}: the reference, dense and the top-k variants, each a
    one-device program of one worker's step; ``carry(out, args)`` feeds the new state back."""
    import jax
    import optax

    from cconv import compressors as C
    from cconv.comm.backend import DryComm
    from cconv.engine import EngineConfig, build

    spec, loss, batch = run._problem(model)
    rows = jax.tree.map(lambda x: x[: x.shape[0] // workers], batch)  # one worker's rows
    opt = optax.sgd(0.01, momentum=0.9)
    params = jax.tree.map(jax.numpy.copy, spec.params)
    out = {"reference": (_reference(loss, opt, workers), [params, opt.init(params), rows], (0, 1))}
    variants = [("dense", C.get("none"), "none"), *_ablations(C.get("topk", ratio=0.01))]
    for label, comp, memory in variants:
        # compress_vectors pinned: results/ were measured when biases were compressed too (the default until
        # 2026-11-27; today's default: dense)
        cfg = EngineConfig(workers=workers, compressor=comp, memory=memory, compress_vectors=True)
        tr = build(loss, spec.params, opt, cfg, model_state=spec.model_state)
        phase = tr.phase(0)
        ctx = tr._ctx(phase)
        step = tr.sync.step
        fn = jax.jit(lambda ws, b, key, ctx=ctx, phase=phase, step=step: step(DryComm(workers), ctx, phase, ws, b, key))
        out[label] = (fn, [tr._worker_init(spec.params, spec.model_state), rows, jax.random.PRNGKey(0)], (0,))
    return out


def measure(progs: dict, rounds: int) -> dict:
    import jax

    def call(label):
        fn, args, carry = progs[label]
        res = jax.block_until_ready(fn(*args))
        for i in carry:
            args[i] = res[i]

    for label in progs:
        for _ in range(3):
            call(label)
    cpu = {label: [] for label in progs}
    for _ in range(rounds):
        for label in progs:
            c0 = time.process_time()
            call(label)
            cpu[label].append(time.process_time() - c0)
    ref = cpu["reference"]
    return {
        label: {
            "cpu_ms": statistics.median(ts) * 1e3,
            "x_reference": statistics.median([t / r for t, r in zip(ts, ref)]),
        }
        for label, ts in cpu.items()
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp1m", choices=sorted(run.MODELS))
    p.add_argument("--workers", type=int, default=8, help="P: the batch rows of one worker and the gathered pairs")
    p.add_argument("--rounds", type=int, default=60)
    args = p.parse_args(argv)
    run._setup_devices(args.workers)  # build() checks that P devices exist; every program runs on the first
    res = measure(programs(args.model, args.workers), args.rounds)
    print(f"one worker's step of {args.model} (P = {args.workers}), CPU time, median of {args.rounds} rounds")
    for label, r in res.items():
        print(f"{label:36s} {r['cpu_ms']:8.2f} ms  {r['x_reference']:6.3f}x reference")
    return res


if __name__ == "__main__":
    main()
