"""The bytes the engine logs are the bytes the compiled program's collectives move.

For every registered compressor (its first declared case, with error feedback where it is
biased) on all-to-all and on the parameter server (in CI the first
compressor of each aggregation method on the parameter server, all with ``-m extended``), and
for gTop-k, majority vote, PowerSGD, fused buffers, local SGD and a warm-up dense phase, the
step is compiled, the collectives are
read from the optimised HLO (tuple-shaped all-reduces included), their per-device traffic is
computed with the algorithm formulas, and compared with (1) the trace-time ledger
(``trainer.traffic``, control traffic included) for every device and (2) the metrics that the
compiled step itself returns.  Exact up to float rounding of the 2(P-1)/P factor.
"""

from typing import NamedTuple

import jax
import numpy as np
import optax
import pytest
import registry_cases as R
from engine_util import loss_fn, make_batch, make_model_state, make_params

from cconv import compressors as C
from cconv.comm import hlo
from cconv.engine import EngineConfig, Warmup, build

# compiles every compressor x architecture step: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

P = 4


class Registered(NamedTuple):
    """A registered compressor's case, built when the test runs."""

    name: str
    hparams: dict


def _registered(name: str, arch: str) -> tuple:
    """(id, EngineConfig keywords, step) of a registered compressor: its first declared case
    (``registry_cases.first_case``), built when the test runs (a case that does not build fails
    that test only); error feedback where the compressor is biased and its method allows it."""
    return (f"{name}-{arch}", dict(compressor=Registered(name, R.first_case(name)), architecture=arch), 0)


def _method(name: str, hp: dict) -> str:
    e = C.entry(name)
    try:
        return e.aggregation_of(e.schema.validate(name, hp))
    except ValueError:
        return name


def _ps_extended(cases):
    """Every compressor on all-to-all (its own wire format) is in CI; on the parameter server,
    whose push / pull depends only on the aggregation method, the first compressor of each
    method is, the others are ``extended``."""
    seen, out = set(), []
    for name, kw, step in cases:
        if kw["architecture"] == "parameter-server":
            method = _method(*kw["compressor"])
            if method in seen:
                out.append(pytest.param(name, kw, step, id=name, marks=pytest.mark.extended))
                continue
            seen.add(method)
        out.append(pytest.param(name, kw, step, id=name))
    return out


CASES = [_registered(n, arch) for n in C.names() for arch in ("all-to-all", "parameter-server")]
CASES = _ps_extended(CASES)
CASES += [
    ("gtopk", dict(compressor=C.topk(ratio=0.1), memory="ef", collective="gtopk"), 0),
    ("vote", dict(compressor=C.signsgd(), vote=True), 0),
    ("vote-ps", dict(compressor=C.signsgd(), vote=True, architecture="parameter-server"), 0),
    (
        "ps-downlink",
        dict(compressor=C.qsgd(levels=4), architecture="parameter-server", ps_downlink=C.topk(ratio=0.2)),
        0,
    ),
    ("randomk-gathered", dict(compressor=C.randomk(ratio=0.1), collective="allgather"), 0),
    # entropy-coded payloads (the moved buffers are their capacity; the encoded table rides in
    # the control all-reduce) and TernGrad's shared scaler (a max all-reduce, control traffic)
    ("stc-golomb", dict(compressor=C.stc(ratio=0.1, positions="golomb"), memory="ef"), 0),
    ("dgc-golomb-ps", dict(compressor=C.dgc(ratio=0.1, positions="golomb"), architecture="parameter-server"), 0),
    ("dgc-golomb", dict(compressor=C.dgc(ratio=0.1, positions="golomb"), memory="dgc"), 0),
    ("topk-ef21", dict(compressor=C.topk(ratio=0.1), memory="ef21"), 0),  # EF21's update: g + average
    ("terngrad-shared", dict(compressor=C.terngrad(shared_scale=True)), 0),
    ("terngrad-shared-ps", dict(compressor=C.terngrad(shared_scale=True), architecture="parameter-server"), 0),
    ("fused-filter", dict(compressor=C.topk(ratio=0.1), memory="ef", granularity="fused", compress_vectors=False), 0),
    ("local-sync-delta", dict(compressor=C.topk(ratio=0.2), memory="ef", local_steps=2, compress_delta=True), 1),
    ("local-step", dict(local_steps=2), 0),
    ("warmup-dense", dict(compressor=C.topk(ratio=0.05), memory="dgc", warmup=Warmup((0.5,), 1, 1)), 0),
    ("powersgd-ef", dict(compressor=C.powersgd(rank=2), memory="ef"), 0),
]


def check_hlo_bytes(kw: dict, step: int = 0) -> None:
    """The bytes logged for ``EngineConfig(workers=P, **kw)`` at ``step`` equal the compiled
    program's collectives (ledger for every device, and the step's own metrics)."""
    comp = kw.get("compressor")
    if isinstance(comp, Registered):  # built now
        kw = {**kw, "compressor": C.get(comp.name, **comp.hparams)}
        kw.setdefault("memory", "ef" if not kw["compressor"].unbiased and _ef_ok(kw) else "none")
    tr = build(loss_fn, make_params(), optax.sgd(0.1), EngineConfig(workers=P, **kw), model_state=make_model_state())
    state = tr.init().replace(step=step)
    batch, key = make_batch(0), jax.random.PRNGKey(0)
    compiled = tr.lower(state, batch, key).compile()
    h_sent, h_recv = hlo.per_device_traffic(compiled.as_text(), P)
    sent, recv = tr.traffic(step, control=True)
    np.testing.assert_allclose(h_sent, sent, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(h_recv, recv, rtol=1e-9, atol=1e-9)
    _, metrics = compiled(state.worker(), batch, key)
    r = 1 if kw.get("architecture") == "parameter-server" else 0
    assert float(metrics["bytes_sent"]) + float(metrics["bytes_control"]) == pytest.approx(h_sent[r], rel=1e-6)
    assert float(metrics["bytes_received"]) == pytest.approx(h_recv[r] - float(metrics["bytes_control"]), rel=1e-6)
    if step == 0 and kw.get("local_steps", 1) == 1:
        assert h_sent[r] > float(metrics["bytes_control"])  # real payload traffic was found


def _ef_ok(kw: dict) -> bool:
    """Error feedback is accepted for this configuration (the method's own check decides)."""
    try:
        EngineConfig(workers=P, memory="ef", **kw)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name, kw, step", [c if hasattr(c, "marks") else pytest.param(*c, id=c[0]) for c in CASES])
def test_hlo_bytes_equal_logged_bytes(name, kw, step):
    check_hlo_bytes(kw, step)
