"""What-if, not kept in the model: Espresso's compressed runs (docs/clusters.md, "Validation against
published measurements") with the per-tensor GPU compression costs Espresso's own release profiled.

Espresso's scheduler (github.com/zhuangwang93/Espresso @ a0294e3,
byteps/torch/mergeComp/scheduler/model_tensor.py and simulator_espresso.py) charges each compressed
tensor, under its two-level option, a profiled overhead on V100s: DGC 1,400 us in all, 100 us of it
decoding; EF-signSGD 810 us, 420 us decoding (``dgc_comp_overhead``, ``efsignsgd_comp_overhead``,
index 3), for a per-GPU share of at most 2^20 elements, linear in the share above it; its simulator
delays backpropagation by the encoding ("if we need to compress the tensor, delay the training
process").  Here every tensor of each workload is charged so (encoding and decoding on the compute
stream, each GPU a 1/8 share), with the cases' declarations otherwise unchanged.  Prints each
compressed case's prediction and sign against its dense twin.

    PYTHONPATH=. python scripts/espresso_whatif.py
"""

from __future__ import annotations

import math
from unittest import mock

from cconv import compressors as C
from cconv.theory import implementation as IM
from cconv.theory import validation as V

GPUS = 8  # Espresso's machines: a two-level share is 1/8 of a tensor
BASE = 2**20  # elements of a share up to which the profiled overhead holds (simulator_espresso.py)
PROFILED = {"dgc": (1400e-6, 100e-6), "scaled_sign": (810e-6, 420e-6)}  # (total, decoding) seconds


def _scale(shape: tuple) -> float:
    return max(1.0, math.prod(shape) / GPUS / BASE)


def _compress(c, shape, impl, device):
    total, dec = PROFILED[C.registered_name(c)]
    return GPUS * (total - dec) * _scale(shape)  # layer_cost charges a share (1/GPUS) of it


def _decompress(c, shape, impl, device, m):
    return GPUS * PROFILED[C.registered_name(c)][1] * _scale(shape)


def main() -> None:
    impl = IM.Implementation("espresso-profiled", True, source="Espresso's model_tensor.py (what-if)")
    with mock.patch.object(IM, "compress_s", _compress), mock.patch.object(IM, "decompress_s", _decompress):
        for case in V.CASES:
            if V.source_of(case) != "Espresso" or V.is_dense(case):
                continue
            twin = V.dense_twin(case)
            pred, dense = V.predict(case, impl), V.predict(twin)
            print(
                f"{case.name}: published {case.published:.3g}, predicted {pred:.3g} "
                f"({pred / case.published - 1:+.1%}); "
                f"compressed - dense: published {case.published / twin.published - 1:+.1%}, "
                f"predicted {pred / dense - 1:+.1%}"
            )


if __name__ == "__main__":
    main()
