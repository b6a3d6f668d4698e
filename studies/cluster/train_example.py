"""Data-parallel training with compression on a cluster: one script for both launch paths.

    # jax.distributed (NCCL on GPUs, gloo on CPUs); SLURM: see slurm_jax_distributed.sbatch
    srun python studies/cluster/train_example.py
    # MPI: one process per worker, mpi4jax collectives
    mpirun -np 4 python studies/cluster/train_example.py --launcher mpi

Every process builds the same global batch from the same seed; each computes only its workers.
"""

import argparse
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launcher", choices=("shard_map", "mpi"), default="shard_map")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--global-batch", type=int, default=512)
    args = ap.parse_args()

    if args.launcher == "mpi" and "OMPI_COMM_WORLD_LOCAL_RANK" in os.environ:
        # one GPU per MPI rank (ignored on CPU-only machines)
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])

    import jax
    import optax
    from flax import nnx

    from cconv import compressors, distributed
    from cconv.engine import EngineConfig, build

    if args.launcher == "shard_map":
        info = distributed.initialize()  # SLURM / OpenMPI / CCONV_* env detection
        workers = jax.device_count()
    else:
        from mpi4py import MPI

        info = {"launcher": "mpi", "process_id": MPI.COMM_WORLD.Get_rank()}
        workers = MPI.COMM_WORLD.Get_size()
    rank0 = info["process_id"] == 0

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(32, 256, rngs=rngs)
            self.l2 = nnx.Linear(256, 10, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.relu(self.l1(x)))

    graphdef, params = nnx.split(Net(nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(params)

    def loss_fn(params, model_state, batch, key):
        logits = nnx.merge(graphdef, params)(batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return loss, (model_state, {"accuracy": (logits.argmax(-1) == batch["y"]).mean()})

    cfg = EngineConfig(
        workers=workers, compressor=compressors.topk(ratio=args.ratio), memory="ef", launcher=args.launcher
    )
    trainer = build(loss_fn, params, optax.sgd(0.1, momentum=0.9), cfg)
    state = trainer.init()
    w = jax.random.normal(jax.random.PRNGKey(1), (32, 10))
    for step in range(args.steps):
        x = jax.random.normal(jax.random.PRNGKey(10_000 + step), (args.global_batch, 32))
        state, m = trainer.step(state, {"x": x, "y": (x @ w).argmax(-1)}, jax.random.PRNGKey(step))
        if step % 16 == 15 or step == args.steps - 1:
            loss = float(m["loss"])  # blocks: at most 16 steps in flight
            if rank0:
                print(
                    f"step {step + 1}: loss {loss:.4f} accuracy {float(m['accuracy']):.3f} "
                    f"sent {float(m['bytes_sent']):.0f} B/worker/step",
                    flush=True,
                )
    if args.launcher == "shard_map":
        distributed.shutdown()


if __name__ == "__main__":
    main()
