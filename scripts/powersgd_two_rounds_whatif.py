"""What-if, not kept in the model: PowerSGD's two dependent collectives (docs/clusters.md, "Validation
against published measurements", the sign miss of GRACE's PowerSGD over NCCL on 8 servers).

GRACE's TensorFlow PowerSGD (grace_dl/tensorflow/compressor/powersgd.py) all-reduces P, orthogonalises
it, computes Q = M^T P and all-reduces Q: Q's collective waits for P's.  PyTorch's ``powerSGD_hook``
chains the same two all-reduces per bucket.  The model sends a layer's factors as one message.  Here
each message that carries PowerSGD factors is split into P's collective (the first payload leaf of
every factorised tensor) and, after it, the rest (Q and any tensor sent dense), on the same channel;
no computation is placed between them.  Prints each PowerSGD case's relative error and, where it has a
dense twin, the predicted relative change of compressed over dense, with and without the split.

    PYTHONPATH=. python scripts/powersgd_two_rounds_whatif.py
"""

from __future__ import annotations

from unittest import mock

from cconv.theory import implementation as IM
from cconv.theory import planner as PL
from cconv.theory import validation as V
from cconv.theory.schedule import compress as CC
from cconv.theory.schedule import schedules as SS

_LAYER_COST = CC.layer_cost
_FIRST: dict[str, float] = {}  # a layer's name -> bytes of P's collective (0: one message)


def _layer_cost(name, fwd, bwd, d, method, c, workers, device, bench, shapes=(), implementation="fused", share=1.0):
    lc = _LAYER_COST(name, fwd, bwd, d, method, c, workers, device, bench, shapes, implementation, share)
    first = 0.0
    if PL.per_tensor(PL.kind_of(method, c)) and lc.nbytes > 0:
        impl = IM.get(implementation)
        for s in tuple(tuple(s) for s in shapes) or ((int(d),),):
            leaves = PL.payload_leaf_bytes(c, IM.tensor_view(c, s, impl))
            first += leaves[0] if len(leaves) == 2 else 0.0  # a factorised tensor: (P, Q)
    _FIRST[name] = first
    return lc


def _message_tasks(ctx, msgs, ready, comm):
    tasks, layer_end, delays, last_on = [], {}, {}, {}
    for m, msg in enumerate(msgs):
        dep = tuple(ready[j] for j in msg.layers) + SS._release_dep(ctx, msg.release, delays, tasks)
        first = sum(_FIRST.get(ctx.layers[j].name, 0.0) for j in msg.layers)
        if first > 0:  # P's collective, then the rest of the message after it
            stages, dep = SS._stage_tasks(ctx, comm, f"it{ctx.k}/msg{m}/p", msg._replace(nbytes=first), dep, last_on)
            tasks += stages
            msg = msg._replace(nbytes=max(0.0, msg.nbytes - first))
        stages, dep = SS._stage_tasks(ctx, comm, f"it{ctx.k}/msg{m}", msg, dep, last_on)
        tasks += stages
        for j in msg.layers:
            layer_end.setdefault(j, []).append(dep[0])
    return tasks, layer_end


def _rows() -> dict[str, tuple[float, float | None]]:
    out = {}
    every = V.CASES + V.CALIBRATION
    for case in every:
        if "PowerSGD" in case.name:
            p, twin = V.predict(case), V.dense_twin(case, every)
            out[case.name] = (p / case.published - 1, None if twin is None else p / V.predict(twin) - 1)
    return out


def main() -> None:
    now = _rows()
    with mock.patch.object(CC, "layer_cost", _layer_cost), mock.patch.object(SS, "_message_tasks", _message_tasks):
        split = _rows()
    for name, (err, sign) in now.items():
        err2, sign2 = split[name]
        line = f"{name:54s} error {err:+.2%} -> {err2:+.2%}"
        if sign is not None:
            line += f"   compressed over dense {sign:+.1%} -> {sign2:+.1%}"
        print(line)


if __name__ == "__main__":
    main()
