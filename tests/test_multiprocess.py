"""Two-process runs on localhost equal the one-process two-device run.

* ``jax.distributed`` with gloo CPU collectives (coordinator 127.0.0.1, a free port), the
  ``shard_map`` launcher over the 2 global devices;
* ``mpirun -np 2`` with the ``mpi`` launcher (mpi4jax collectives, same per-worker step code).

Each runs top-k + EF by allgather, gTop-k (ppermute / sendrecv), a parameter server
(push / pull by ppermute / send+recv), ASP, and CHOCO-SGD gossip (neighbour exchange as full
permutations) for 3 steps (``tests/mp_worker.py``).  The three launches
run concurrently to keep the wall time down.
"""

import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mp_worker.py")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    py, port = sys.executable, free_port()
    procs = {
        "single": [subprocess.Popen([py, WORKER, "single", str(d / "single.npz")], env=env)],
        "jaxdist": [
            subprocess.Popen([py, WORKER, "jaxdist", str(d / "jaxdist.npz"), str(r), str(port)], env=env)
            for r in (0, 1)
        ],
    }
    if shutil.which("mpirun") and _has("mpi4py") and _has("mpi4jax"):
        procs["mpi"] = [
            subprocess.Popen(
                ["mpirun", "--allow-run-as-root", "-np", "2", py, WORKER, "mpi", str(d / "mpi.npz")], env=env
            )
        ]
    codes = {}
    for name, ps in procs.items():
        codes[name] = [p.wait(timeout=240) for p in ps]
    return d, codes


def test_jax_distributed_two_processes_equal_one_process_two_devices(runs):
    d, codes = runs
    assert codes["single"] == [0] and codes["jaxdist"] == [0, 0]
    a, b = np.load(d / "single.npz"), np.load(d / "jaxdist.npz")
    assert sorted(a.files) == sorted(b.files) and len(a.files) == 5 * 5
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_mpirun_two_processes_equal_one_process_two_devices(runs):
    pytest.importorskip("mpi4py", reason="the mpi extra is not installed (pip install -e '.[mpi]')")
    pytest.importorskip("mpi4jax", reason="the mpi extra is not installed (pip install -e '.[mpi]')")
    if not shutil.which("mpirun"):
        pytest.skip("OpenMPI's mpirun is not installed (scripts/setup.sh installs it)")
    d, codes = runs
    assert codes["mpi"] == [0]
    a, b = np.load(d / "single.npz"), np.load(d / "mpi.npz")
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:  # MPI sums in a different order than XLA: float rounding only
        np.testing.assert_allclose(b[k], a[k], rtol=2e-6, atol=1e-6, err_msg=k)
