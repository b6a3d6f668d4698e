"""What-if, not kept in the model: GRACE's PowerSGD sends vectors with no compression operation
(docs/clusters.md, "Validation against published measurements", PowerSGD).

GRACE compresses every tensor Horovod hands it (``per-tensor``/``mpi``: ``Implementation.compress_vectors``
is true), but its PowerSGD compressor returns a 1-D tensor as it is (grace_dl/tensorflow/compressor/
powersgd.py, ``PowerSGDCompressor.compress``: ``if tensor_dims == 1: return [tensor], None``), its memory
leaves it alone (grace_dl/tensorflow/memory/powersgd.py: ``compensate`` returns the tensor, ``update``
returns [] when ctx is None) and ``Allreduce.send_receive`` all-reduces and averages it as the dense
baseline does.  The model charges cconv's ``powersgd`` Cost per tensor there (6 compress and 3 decode
operations at ``OP_S``, 47.7 us each, on each of ResNet-50's 107 vectors: ~46 ms an iteration).  Here a
vector the compressor's own aggregation does not compress (``Aggregation.compresses``) travels dense
with no operation.  Prints each PowerSGD case's relative error (and, where it has a dense twin, the
predicted change of compressed over dense) with and without, the count of sign misses, and the
constants ``validation.calibrate()`` fits to the calibration subset under it (the model's stated ones
are its optimum without).

    PYTHONPATH=. python scripts/grace_powersgd_vectors_whatif.py
"""

from __future__ import annotations

from unittest import mock

from cconv import compressors as C
from cconv.theory import implementation as IM
from cconv.theory import validation as V
from cconv.theory.schedule import compress as CC

_LAYER_PARTS = CC.layer_parts


def _layer_parts(name, fwd, bwd, d, method, c, workers, device, bench, shapes=(), implementation="fused", share=1.0,
                 compress_vectors=True):  # fmt: skip
    agg = C.entry_of(c).aggregation
    vectors = [tuple(s) for s in shapes if len(s) <= 1]
    if vectors and isinstance(agg, C.Aggregation) and not any(agg.compresses(c, s) for s in vectors):
        compress_vectors = False  # the compressor sends them as they are: dense, no operation
    args = (name, fwd, bwd, d, method, c, workers, device, bench, shapes, implementation, share, compress_vectors)
    return _LAYER_PARTS(*args)


def _rows() -> dict[str, tuple[float, float | None]]:
    out = {}
    every = V.CASES + V.CALIBRATION
    for case in every:
        if "PowerSGD" in case.name and case.implementation in ("per-tensor", "mpi"):
            p, twin = V.predict(case), V.dense_twin(case, every)
            out[case.name] = (p / case.published - 1, None if twin is None else p / V.predict(twin) - 1)
    return out


def _misses() -> int:
    return sum((a > 0) != (b > 0) for _, a, b in V.signs(V.table()))


def main() -> None:
    now, misses = _rows(), _misses()
    stated = {"op_s": IM.OP_S, "sort_passes": IM.SORT_PASSES, "host_bw": IM.HOST_BW, "round_s": IM.ROUND_S}
    before = V.calibration_loss(stated)
    with mock.patch.object(CC, "layer_parts", _layer_parts):
        free, misses2 = _rows(), _misses()
        loss, fit = V.calibration_loss(stated), V.calibrate()
        loss_fit = V.calibration_loss(fit)
    for name, (err, sign) in now.items():
        err2, sign2 = free[name]
        line = f"{name:54s} error {err:+.1%} -> {err2:+.1%}"
        if sign is not None:
            line += f"   compressed over dense {sign:+.1%} -> {sign2:+.1%}"
        print(line)
    print(f"sign misses over the validation cases: {misses} -> {misses2}")
    print(f"calibration loss at the stated constants {before:.4f} -> {loss:.4f}; refitted {loss_fit:.4f}")
    print("refitted: " + ", ".join(f"{k} {v:.4g} (stated {stated[k]:.4g})" for k, v in fit.items()))


if __name__ == "__main__":
    main()
