"""Gradient compressors: pure functions in NamedTuples (see ``cconv.compressors.base``) and
their registry entries (``cconv.compressors.registry``).

    >>> import cconv
    >>> c = cconv.compressors.get("topk", ratio=0.01)   # or cconv.compressors.topk(ratio=0.01)
    >>> sorted(cconv.compressors.names())[:3]
    ['bf16', 'dgc', 'fp16']

TRANSITIONAL (being moved): the entries below move into their compressor modules, each of which
then registers itself; this file keeps one import line per compressor.
"""

from __future__ import annotations

from statistics import NormalDist

from cconv.compressors.base import Compressor, DensePayload, EmptyState, payload_bytes
from cconv.compressors.casts import bf16 as _bf16, fp16 as _fp16
from cconv.compressors.dgc import dgc as _dgc
from cconv.compressors.identity import identity as _identity
from cconv.compressors.onebit import onebit as _onebit
from cconv.compressors.powersgd import powersgd as _powersgd
from cconv.compressors.qsgd import qsgd as _qsgd
from cconv.compressors.randomk import randomk as _randomk
from cconv.compressors.registry import (K, RATIO, Bench, Bound, Entry, Knob, Param, Schema, Theory,
                                        entries, entry, entry_of, get, hparams_of, names, ratio_or_k,
                                        register)
from cconv.compressors.scaled_sign import scaled_sign as _scaled_sign
from cconv.compressors.signsgd import signsgd as _signsgd
from cconv.compressors.stc import stc as _stc
from cconv.compressors.terngrad import terngrad as _terngrad
from cconv.compressors.threshold import threshold as _threshold
from cconv.compressors.topk import topk as _topk

SPARSE_RATIOS = (0.1, 0.01, 0.001)
_size = Schema((RATIO, K), rule=ratio_or_k)
_sparse_bench = Bench(lambda r: {"ratio": r}, 10.0)

none = identity = register("none", Entry(_identity, aggregation="allreduce", label="dense (no compression)",
                                         bench=Bench(target_x=4.0)))
fp16 = register("fp16", Entry(_fp16, aggregation="allreduce", label="fp16", bench=Bench(target_x=4.0)))
bf16 = register("bf16", Entry(_bf16, aggregation="allreduce", label="bf16", bench=Bench(target_x=4.0)))
randomk = register("randomk", Entry(
    _randomk,
    Schema((RATIO, K, Param("scaled", "bool", True), Param("shared", "bool", True)), rule=ratio_or_k),
    aggregation=lambda hp: "allreduce" if hp["shared"] else "allgather",
    knob=Knob("ratio", SPARSE_RATIOS), label="random-k",
    cases=({"ratio": 0.2}, {"ratio": 0.2, "scaled": False, "shared": False}, {"k": 3, "scaled": False}),
    bench=Bench(lambda r: {"ratio": r}, 4.0)))
topk = register("topk", Entry(_topk, _size, collectives=("gtopk",), knob=Knob("ratio", SPARSE_RATIOS),
                              label="top-k", cases=({"ratio": 0.2}, {"k": 5}), bench=_sparse_bench))
threshold = register("threshold", Entry(
    _threshold,
    Schema((Param("tau", "float", None, low=0.0, help="the magnitude threshold", show_help=True), RATIO, K),
           rule=lambda owner, v: ratio_or_k(owner, v, default_ratio=0.01)),
    knob=Knob("tau"), label="threshold", cases=({"tau": 0.5, "ratio": 0.2}, {"tau": 0.1}),
    # N(0, 1) input: P(|x| >= tau) = ratio
    bench=Bench(lambda r: {"tau": round(NormalDist().inv_cdf(1 - r / 2), 4), "ratio": r}, 10.0)))
dgc = register("dgc", Entry(
    _dgc, Schema((RATIO, K, Param("sample_ratio", "float", 0.01, low=0.0, high=1.0, low_open=True)),
                 rule=ratio_or_k),
    collectives=("gtopk",), knob=Knob("ratio", SPARSE_RATIOS), label="DGC",
    cases=({"ratio": 0.2},), bench=_sparse_bench))
terngrad = register("terngrad", Entry(
    _terngrad, Schema((Param("clip", "float", None, low=0.0, low_open=True, optional=True,
                             help="clip at clip * std(x); the paper uses 2.5"),)),
    knob=Knob("clip"), label="TernGrad", cases=({}, {"clip": 2.5}), bench=Bench(target_x=4.0)))
signsgd = register("signsgd", Entry(_signsgd, label="signSGD", bench=Bench(target_x=4.0)))
scaled_sign = register("scaled_sign", Entry(_scaled_sign, label="scaled sign (EF-signSGD)",
                                            bench=Bench(target_x=4.0)))
onebit = register("onebit", Entry(_onebit, Schema((Param("columns", "bool", False),)), label="1-bit SGD",
                                  cases=({}, {"columns": True}), bench=Bench(target_x=4.0)))
qsgd = register("qsgd", Entry(
    _qsgd, Schema((Param("levels", "int", 8, low=1, high=127, help="s, quantisation levels"),
                   Param("bucket", "int", None, low=1, optional=True))),
    knob=Knob("levels", (4, 16)), label="QSGD", cases=({"levels": 4}, {"levels": 2, "bucket": 6}),
    bench=Bench(lambda r: {"levels": 2}, 4.0)))     # 3-bit codes: the generic bit-stream packing path
stc = register("stc", Entry(_stc, _size, knob=Knob("ratio", SPARSE_RATIOS), label="STC",
                            cases=({"ratio": 0.2}, {"k": 3}), bench=_sparse_bench))
powersgd = register("powersgd", Entry(
    _powersgd, Schema((Param("rank", "int", 1, low=1), Param("seed", "int", 0))),
    aggregation="powersgd", knob=Knob("rank", (1, 4)), label="PowerSGD",
    cases=({"rank": 2}, {"rank": 1}), bench=Bench(lambda r: {"rank": 4})))

__all__ = ["Compressor", "EmptyState", "DensePayload", "payload_bytes", "get", "names", "hparams_of",
           "entry", "entry_of", "entries", "register", "Entry", "Schema", "Param", "Theory", "Bound",
           "Knob", "Bench", "identity", *names()]
