"""Encoded bytes: the engine logs, besides the bytes its collectives move, the bytes of the encoded
messages (``Compressor.encoded_bytes``), per worker and collective algorithm
(``cconv.comm.accounting.encoded_traffic``).

A toy variable-length format stands in for the entropy coders: the payload moves the dense
values, its encoded message is a 4-byte count plus 4 bytes per nonzero, so worker w's encoded
size is known exactly from its own gradient (computed directly here).  Fixed formats log
encoded == moved.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params, worker_grad

from cconv import compressors as C
from cconv.comm import hlo
from cconv.comm.accounting import encoded_traffic
from cconv.compressors.base import Compressor, DensePayload, like_info, size_of, stateless_init
from cconv.engine import EngineConfig, build

W = 4
PAYLOAD = 4 * (6 * 16 + 16 + 16)  # every gradient entry, float32, in the toy's dense payload
CUT = 0.05  # the toy format zeroes |x| < CUT, so each worker's nonzero count differs


def toy(x):
    return jnp.where(jnp.abs(x) >= CUT, x, 0.0)


def _rle() -> Compressor:
    def compress(x, state, key):
        return DensePayload(toy(x.reshape(-1))), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(dtype)

    return Compressor(
        stateless_init,
        compress,
        decompress,
        lambda shape, dtype="float32": 4 * size_of(shape),
        lambda shape: 1.0,
        name="rle-toy",
        unbiased=False,
        aggregation="allgather",
        encoded=lambda p: 4.0 + 4.0 * jnp.count_nonzero(p.values),
    )


def _trainer(**kw):
    cfg = EngineConfig(workers=W, compressor=_rle(), **kw)
    return build(loss_fn, make_params(), optax.sgd(0.1), cfg, model_state=make_model_state())


def _own_encoded(w: int, fused: bool) -> float:
    """Worker w's encoded bytes at step 0: per compressed unit 4 + 4 * nonzeros."""
    g = worker_grad(make_params(), 0, w, W)
    leaves = jax.tree.leaves(g)
    units = [jnp.concatenate([x.reshape(-1) for x in leaves])] if fused else leaves
    return sum(4.0 + 4.0 * int(np.count_nonzero(np.asarray(toy(u)))) for u in units)


def test_encoded_traffic_formulas():
    e = np.array([10.0, 20.0, 30.0, 40.0])
    assert [float(v) for v in encoded_traffic("allgather", e, 1)] == [100 - 30, 100 - 20]
    assert [float(v) for v in encoded_traffic("allgather", e, 3)] == [100 - 10, 100 - 40]
    assert [float(v) for v in encoded_traffic("ps_push", e, 0)] == [0, 90]
    assert [float(v) for v in encoded_traffic("ps_push", e, 2)] == [30, 0]
    assert [float(v) for v in encoded_traffic("ps_pull", e, 0)] == [30, 0]
    assert [float(v) for v in encoded_traffic("ps_pull", e, 2)] == [0, 10]
    assert [float(v) for v in encoded_traffic("allgather", e[:1], 0)] == [0, 0]
    with pytest.raises(ValueError, match="not 'allreduce'"):
        encoded_traffic("allreduce", e, 0)
    # summed over ranks, a ring all-gather sends what it receives
    s = sum(float(encoded_traffic("allgather", e, r)[0]) for r in range(4))
    assert s == sum(float(encoded_traffic("allgather", e, r)[1]) for r in range(4)) == 3 * e.sum()


@pytest.mark.parametrize("granularity", ["layerwise", "fused"])
@pytest.mark.slow
def test_allgather_logs_each_workers_encoded_size(granularity):
    tr = _trainer(granularity=granularity, min_compress_size=0, compress_vectors=True)
    _, m = tr.step(tr.init(), make_batch(0), jax.random.PRNGKey(0))
    e = np.array([_own_encoded(w, granularity == "fused") for w in range(W)])
    assert len(set(e)) > 1  # the workers' messages really differ
    moved = (W - 1) * PAYLOAD  # ring all-gather of the fixed-capacity payloads, per rank
    # rank 0 forwards every message but rank 1's, and receives every message but its own; the
    # dense traffic (the model state's average) is the same in both counts
    assert float(m["bytes_sent"]) - float(m["bytes_encoded_sent"]) == pytest.approx(moved - (e.sum() - e[1]))
    assert float(m["bytes_received"]) - float(m["bytes_encoded_received"]) == pytest.approx(moved - (e.sum() - e[0]))
    assert float(m["bytes_encoded_sent"]) < float(m["bytes_sent"])
    # the table of every worker's encoded size (P x 1 kind) rides in the metrics' control all-reduce
    assert float(m["bytes_control"]) == pytest.approx(2 * (W - 1) / W * 4 * (2 + W * 1))


def test_the_compiled_program_moves_what_the_ledger_says_with_the_encoded_table():
    tr = _trainer(architecture="parameter-server", min_compress_size=0, compress_vectors=True)
    state, batch, key = tr.init(), make_batch(0), jax.random.PRNGKey(0)
    compiled = tr.lower(state, batch, key).compile()
    h_sent, h_recv = hlo.per_device_traffic(compiled.as_text(), W)
    sent, recv = tr.traffic(0, control=True)
    np.testing.assert_allclose(h_sent, sent, rtol=1e-9)
    np.testing.assert_allclose(h_recv, recv, rtol=1e-9)


def test_parameter_server_logs_worker_and_server_encoded_sizes():
    tr = _trainer(architecture="parameter-server", min_compress_size=0, compress_vectors=True)
    _, m = tr.step(tr.init(), make_batch(0), jax.random.PRNGKey(0))
    e = np.array([_own_encoded(w, False) for w in range(W)])
    dense = float(m["bytes_sent"]) - PAYLOAD  # the model state's push
    assert float(m["bytes_encoded_sent"]) == pytest.approx(dense + e[1])  # the reported worker is rank 1
    assert float(m["server_bytes_encoded_received"]) == pytest.approx(3 * dense + e[1:].sum())
    # the dense reply is a fixed format: encoded == moved
    assert float(m["bytes_encoded_received"]) == float(m["bytes_received"])
    assert float(m["server_bytes_encoded_sent"]) == float(m["server_bytes_sent"])


@pytest.mark.parametrize(
    "kw",
    [
        dict(compressor=C.topk(ratio=0.1), memory="ef"),
        dict(compressor=C.qsgd(levels=4), architecture="parameter-server"),
        dict(),
    ],
    ids=["topk", "qsgd-ps", "dense"],
)
def test_fixed_formats_log_encoded_equal_to_moved_and_no_extra_control(kw):
    tr = build(loss_fn, make_params(), optax.sgd(0.1), EngineConfig(workers=W, **kw), model_state=make_model_state())
    _, m = tr.step(tr.init(), make_batch(0), jax.random.PRNGKey(0))
    assert float(m["bytes_encoded_sent"]) == float(m["bytes_sent"])
    assert float(m["bytes_encoded_received"]) == float(m["bytes_received"])
    n_metrics = 2  # loss and mae: the control all-reduce carries only them
    assert float(m["bytes_control"]) == pytest.approx(2 * (W - 1) / W * 4 * n_metrics)
