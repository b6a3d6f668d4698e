"""A long run on 8 simulated devices finishes; a collective hang fails fast instead of hanging."""

import os
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params

from cconv import compressors as C
from cconv.engine import EngineConfig, build

# long engine runs: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))


def test_2000_steps_on_8_devices_blocking_every_16_steps():
    tr = build(
        loss_fn,
        make_params(),
        optax.sgd(0.05),
        EngineConfig(workers=8, compressor=C.topk(ratio=0.1), memory="ef"),
        model_state=make_model_state(),
    )
    batches = [jax.device_put(make_batch(t)) for t in range(16)]
    keys = [jax.random.PRNGKey(t) for t in range(16)]
    state = tr.init()
    first = None
    for t in range(2000):
        state, m = tr.step(state, batches[t % 16], keys[t % 16])
        if t % 16 == 15:  # the deadlock trap: never more than 16 steps in flight
            loss = float(m["loss"])
            first = loss if first is None else first
    assert state.step == 2000 and np.isfinite(loss) and loss < 0.5 * first


def run_hang(*args, timeout=60):
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "hang_worker.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return p, time.time() - t0


def test_a_collective_hang_fails_fast():
    p, dt = run_hang(2, 400)
    assert p.returncode != 0 and "finished" not in p.stdout
    assert "Termination timeout" in p.stderr and dt < 45
    p, _ = run_hang(2, 400, 16)  # the same loop, blocking every 16 steps, completes
    assert p.returncode == 0 and "finished" in p.stdout
