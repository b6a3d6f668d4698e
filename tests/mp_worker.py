"""A small training run for the multi-process tests (not collected by pytest).

    python tests/mp_worker.py single OUT               # 1 process, 2 devices (reference)
    python tests/mp_worker.py jaxdist OUT RANK PORT    # 2 processes, jax.distributed + gloo
    mpirun -np 2 python tests/mp_worker.py mpi OUT     # 2 processes, mpi4jax

Writes OUT (rank 0): the loss trajectory and the final parameters, as .npz.

    python tests/mp_worker.py ckpt-single OUT              # the checkpointed run, 1 process, 2 devices
    python tests/mp_worker.py ckpt-jaxdist OUT RANK PORT   # the same, 2 processes
    mpirun -np 2 python tests/mp_worker.py mpi-long OUT    # 2000 steps under mpirun (to kill a rank)

The checkpointed run (top-k + EF, ``CKPT_STEPS`` steps) saves a cconv checkpoint (orbax, every
process writes its shards) into ``OUT.ckpt`` every ``CKPT_EVERY`` steps and resumes from the
latest one when started again; each rank writes its last finished step to ``OUT.progress<RANK>``
(for the test to know when to kill one), and rank 0 the final parameters to OUT with the step it
resumed from.
"""

import os
import sys

mode, out = sys.argv[1], sys.argv[2]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count="
    + ("2" if mode in ("single", "ckpt-single") else "1")
    + " --xla_cpu_collective_call_terminate_timeout_seconds=60"
)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from engine_util import loss_fn, make_batch, make_model_state, make_params  # noqa: E402

from cconv import compressors as C  # noqa: E402
from cconv import distributed  # noqa: E402
from cconv.engine import EngineConfig, build  # noqa: E402

CKPT_STEPS, CKPT_EVERY = 40, 8

if mode in ("jaxdist", "ckpt-jaxdist"):
    rank, port = int(sys.argv[3]), int(sys.argv[4])
    distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank, initialization_timeout=60)
launcher = "mpi" if mode.startswith("mpi") else "shard_map"


def checkpointed_run() -> None:
    from cconv.experiments.checkpoint import Checkpointer

    tr = build(
        loss_fn,
        make_params(),
        optax.sgd(0.1, momentum=0.9),
        EngineConfig(workers=2, launcher=launcher, compressor=C.topk(ratio=0.2), memory="ef"),
        model_state=make_model_state(),
    )
    state, start = tr.init(), 0
    ckpt = Checkpointer(out + ".ckpt")
    if ckpt.latest_step() is not None:
        start, state, _ = ckpt.restore(state)
        state = state.replace(step=start)
    for t in range(start, CKPT_STEPS):
        state, m = tr.step(state, make_batch(t % 8), jax.random.PRNGKey(t))
        float(m["loss"])  # one step in flight (and a failed collective raises here)
        if (t + 1) % CKPT_EVERY == 0 and t + 1 < CKPT_STEPS:
            ckpt.save(t + 1, state, {})
        with open(f"{out}.progress{jax.process_index()}", "w") as fh:
            fh.write(str(t + 1))
    ckpt.close()
    params = {k: np.asarray(jax.device_get(v)) for k, v in tr.params(state).items()}
    if tr.launcher.is_main():
        np.savez(out, resumed_from=np.array(start), **params)


def long_mpi_run() -> None:
    """Steps until killed; each rank writes ``PID STEP`` to ``OUT.progress<RANK>``."""
    tr = build(
        loss_fn,
        make_params(),
        optax.sgd(0.1),
        EngineConfig(workers=2, launcher="mpi", compressor=C.topk(ratio=0.2), memory="ef"),
        model_state=make_model_state(),
    )
    state, rank = tr.init(), tr.launcher.mpi.rank()
    for t in range(2000):
        state, m = tr.step(state, make_batch(t % 8), jax.random.PRNGKey(t))
        float(m["loss"])
        with open(f"{out}.progress{rank}", "w") as fh:
            fh.write(f"{os.getpid()} {t + 1}")


def equivalence_run() -> None:
    cfgs = {
        "topk-ef": dict(compressor=C.topk(ratio=0.2), memory="ef"),
        "gtopk": dict(compressor=C.topk(ratio=0.2), memory="ef", collective="gtopk"),
        "ps-qsgd": dict(compressor=C.qsgd(levels=4), architecture="parameter-server"),
        # a synchronization mode with host-scheduled inputs (as SSP) and lax.cond(rank == arrival)
        "asp": dict(compressor=C.topk(ratio=0.2), memory="ef", sync="asp", architecture="parameter-server", jitter=0.5),
        # decentralized: CHOCO-SGD's neighbour exchange as full permutations (ppermute / MPI sendrecv)
        "choco": dict(compressor=C.topk(ratio=0.2), sync="gossip", gossip="choco", gossip_gamma=0.5),
    }
    result = {}
    for name, kw in cfgs.items():
        tr = build(
            loss_fn,
            make_params(),
            optax.sgd(0.1, momentum=0.9),
            EngineConfig(workers=2, launcher=launcher, **kw),
            model_state=make_model_state(),
        )
        state, losses = tr.init(), []
        for t in range(3):
            state, m = tr.step(state, make_batch(t), jax.random.PRNGKey(t))
            losses.append(float(m["loss"]))
        result[name + "/loss"] = np.array(losses)
        result[name + "/bytes"] = np.array([float(m["bytes_sent"]), float(m["bytes_received"])])
        for k, v in tr.params(state).items():
            result[f"{name}/{k}"] = np.asarray(v)
    if tr.launcher.is_main():
        np.savez(out, **result)


{"ckpt-single": checkpointed_run, "ckpt-jaxdist": checkpointed_run, "mpi-long": long_mpi_run}.get(
    mode, equivalence_run
)()
distributed.shutdown()
# the liveness watch has returned: a daemon thread still in JAX's client at the interpreter's end
# aborted 1 exit in 12 ("exception not rethrown", exit 134) before shutdown joined it
assert distributed.PeerWatch.watcher is None or not distributed.PeerWatch.watcher.is_alive()
