"""Gradient compressors: pure functions in NamedTuples (see ``cconv.compressors.base``) and
their registry entries (``cconv.compressors.registry``).

    >>> import cconv
    >>> c = cconv.compressors.get("topk", ratio=0.01)   # or cconv.compressors.topk(ratio=0.01)
    >>> sorted(cconv.compressors.names())[:3]
    ['bf16', 'dgc', 'fp16']

Each compressor module registers itself (its last statement); this file imports one validated
public factory per compressor.  ``IDENTITY`` is the registered name of the uncompressed
baseline, for layers that must refer to it without naming a compressor.
"""

from __future__ import annotations

from cconv.compressors.base import (
    AGGREGATIONS,
    DECODE,
    OWN,
    SUM,
    Aggregation,
    Compressor,
    DensePayload,
    EmptyState,
    payload_bytes,
    register_aggregation,
)
from cconv.compressors.casts import bf16, fp16
from cconv.compressors.dgc import dgc
from cconv.compressors.drive import drive
from cconv.compressors.eden import eden
from cconv.compressors.identity import IDENTITY, identity
from cconv.compressors.natural import natural
from cconv.compressors.onebit import onebit
from cconv.compressors.powersgd import powersgd
from cconv.compressors.qsgd import qsgd
from cconv.compressors.randomk import randomk
from cconv.compressors.registry import (
    Bench,
    Bound,
    Cost,
    Entry,
    Knob,
    Param,
    Schema,
    Theory,
    entries,
    entry,
    entry_of,
    get,
    hparams_of,
    known_as,
    names,
    register,
    registered_name,
)
from cconv.compressors.scaled_sign import scaled_sign
from cconv.compressors.signsgd import signsgd
from cconv.compressors.stc import stc
from cconv.compressors.terngrad import terngrad
from cconv.compressors.thc import thc
from cconv.compressors.threshold import threshold
from cconv.compressors.topk import topk

none = identity

__all__ = [
    "Compressor",
    "EmptyState",
    "DensePayload",
    "payload_bytes",
    "get",
    "names",
    "hparams_of",
    "entry",
    "entry_of",
    "registered_name",
    "entries",
    "register",
    "register_aggregation",
    "Aggregation",
    "AGGREGATIONS",
    "SUM",
    "DECODE",
    "OWN",
    "Entry",
    "Schema",
    "Param",
    "Theory",
    "Bound",
    "Cost",
    "Knob",
    "Bench",
    "IDENTITY",
    "identity",
    *names(),
]
