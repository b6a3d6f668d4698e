"""What-if, not kept in the model: MPI's reduction on the host CPU (docs/clusters.md, "Validation
against published measurements", the sign misses of GRACE's QSGD and signSGD over MPI).

Over MPI without CUDA-aware transport, Horovod all-reduces host buffers: ``MPIAllreduce::Execute``
(horovod/common/ops/mpi_operations.cc) copies the tensors into its fusion buffer and calls
``MPI_Allreduce`` with MPI's sum, so the sums of a ring all-reduce run on the CPU (2 (P-1)/P of the
buffer read, added and written), where an all-gather only moves bytes.  The model stages both
through the host at ``HOST_BW`` and charges no reduction.  On the calibration subset it is
optimistic for dense MPI training (+19 %) and pessimistic for the quantisers, whose payloads are
all-gathered (QSGD -29 %, TernGrad -27 %, signSGD -25 %), which is the shape such a term would
fix.  Here every MPI all-reduce adds ``2 (P-1)/P b / R`` after the collective, for a host reduction
rate R on a grid, the four per-tensor constants are fitted again on the calibration subset
(``validation.calibrate``), and the validation table is summarised: the calibration loss, the
median and largest |error| and the sign misses of (compressed - dense).

    PYTHONPATH=. python scripts/mpi_host_reduce_whatif.py
"""

from __future__ import annotations

import statistics
from unittest import mock

from cconv.theory import implementation as IM
from cconv.theory import validation as V

_STAGING = IM.staging_s
RATES = (None, 10e9, 7e9, 5e9, 3.5e9, 2.5e9)  # bytes/s of the host reduction (None: the model as it is)


def _staging(rate):
    def staging(impl, kind, nbytes, workers):
        out, back = _STAGING(impl, kind, nbytes, workers)
        if rate and impl.host_bw > 0 and kind == "allreduce":
            back += 2.0 * (workers - 1) / workers * nbytes / rate
        return out, back

    return staging


def _refit(values: dict) -> dict:
    out = dict(IM.IMPLEMENTATIONS)
    for name, impl in IM.IMPLEMENTATIONS.items():
        if impl.per_tensor:  # per-tensor, mpi and ddp-hook take the fitted constants (host_bw: mpi only)
            out[name] = impl._replace(**{k: v for k, v in values.items() if k != "host_bw" or impl.host_bw})
    return out


def main() -> None:
    for rate in RATES:
        with mock.patch.object(IM, "staging_s", _staging(rate)):
            values = V.calibrate()
            loss = V.calibration_loss(values)
            with mock.patch.dict(IM.IMPLEMENTATIONS, _refit(values)):
                rows = V.table()
        errs = [abs(e) for _, _, e in rows]
        wrong = [c.name for c, pub, pred in V.signs(rows) if (pub > 0) != (pred > 0)]
        label = "none (the model)" if rate is None else f"{rate / 1e9:g} GB/s"
        print(
            f"host reduction {label}: op_s {values['op_s'] * 1e6:.1f} us, sort_passes {values['sort_passes']:g}, "
            f"host_bw {values['host_bw'] / 1e9:.2f} GB/s, round_s {values['round_s'] * 1e6:.0f} us; "
            f"calibration loss {loss:.4f}; median |error| {statistics.median(errs):.1%}, largest "
            f"{max(errs):.1%}, {sum(e > 0.35 for e in errs)} over 35 %; {len(wrong)} signs wrong: {', '.join(wrong)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
