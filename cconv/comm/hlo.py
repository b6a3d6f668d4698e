"""Count the bytes a compiled program's collectives move, from its HLO text.

``collectives(hlo_text)`` finds every ``all-reduce``, ``all-gather``, ``collective-permute``,
``reduce-scatter`` and ``all-to-all`` instruction (and their async ``-start`` forms; the
``-done`` halves are not counted twice), with their shapes -- XLA combines several collectives
into one whose shape is a tuple such as ``(f32[10]{0}, s32[10]{0})``, so tuple shapes are
parsed -- and their replica groups or source-target pairs.  ``per_device_traffic`` applies the
same algorithm formulas as ``cconv.comm.accounting`` to them: ring all-reduce 2(n-1)/n * D,
all-gather (n-1) * D_in, collective-permute D per source->target pair.  A test checks, for every
compressor and architecture, that these totals equal what the engine logs.

Collectives inside ``while`` loops would run a data-dependent number of times: the parser
reports the computation each instruction is in, and ``per_device_traffic`` refuses programs
with collectives outside the entry computation unless told to count them once.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s4": 0.5,
    "u4": 0.5,
}
_OPS = ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all")
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>all-reduce-start|all-reduce|all-gather-start|all-gather|collective-permute-start|"
    r"collective-permute|reduce-scatter|all-to-all)\((?P<rest>.*)$"
)
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # unindented header


class HloCollective(NamedTuple):
    op: str  # all-reduce | all-gather | collective-permute | ...
    shapes: tuple  # ((dtype, dims), ...) of the result (tuple shapes flattened)
    groups: tuple  # replica groups (tuple of tuples of device ids)
    pairs: tuple  # source_target_pairs for collective-permute
    computation: str  # name of the enclosing computation
    entry: bool  # whether that computation is the entry computation

    @property
    def nbytes(self) -> float:
        return sum(_DTYPE_BYTES[dt] * int(np.prod(dims, dtype=np.int64)) for dt, dims in self.shapes)


def _shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for dt, dims in _ARRAY.findall(text):
        if dt not in _DTYPE_BYTES:
            continue
        out.append((dt, tuple(int(d) for d in dims.split(",") if d)))
    return out


def _groups(rest: str, key: str) -> tuple:
    m = re.search(key + r"=\{(\{[0-9,{} ]*\})\}", rest)
    if m:
        return tuple(
            tuple(int(v) for v in g.split(",") if v.strip()) for g in re.findall(r"\{([0-9, ]*)\}", m.group(1))
        )
    m = re.search(key + r"=\[(\d+),(\d+)\]<=\[(\d+)\]", rest)  # iota form: [groups,size]<=[n]
    if m:
        n_groups, size = int(m.group(1)), int(m.group(2))
        ids = np.arange(int(m.group(3))).reshape(n_groups, size)
        return tuple(tuple(int(v) for v in g) for g in ids)
    return ()


def collectives(hlo_text: str) -> list[HloCollective]:
    """Every collective instruction of an HLO module's text (compiled or not)."""
    found, comp, entry = [], "", False
    for line in hlo_text.splitlines():
        cm = _COMPUTATION.match(line)
        if cm:
            comp, entry = cm.group(2), bool(cm.group(1))
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op, shape_text, rest = m.group("op"), m.group("shape"), m.group("rest")
        shapes = _shapes(shape_text)
        base = op.removesuffix("-start")
        if op == "collective-permute-start":
            # (operand, result, u32[] contexts...): the operand's arrays are what moves.
            arrays = [s for s in shapes if s[1] != ()] or shapes
            shapes = arrays[: max(1, len(arrays) // 2)]
        elif op == "all-gather-start":
            shapes = shapes[len(shapes) // 2 :]  # (operands..., results...)
        found.append(
            HloCollective(
                base, tuple(shapes), _groups(rest, "replica_groups"), _groups(rest, "source_target_pairs"), comp, entry
            )
        )
    return found


def per_device_traffic(hlo_text: str, devices: int, allow_nested: bool = False):
    """(sent, received) bytes per device, arrays of length ``devices``."""
    sent, recv = np.zeros(devices), np.zeros(devices)
    for c in collectives(hlo_text):
        if not c.entry and not allow_nested:
            raise ValueError(
                f"collective {c.op} inside computation {c.computation!r} (a loop or "
                "branch): its count is data dependent; pass allow_nested=True to count once"
            )
        d = c.nbytes
        if c.op == "collective-permute":
            for s, t in c.pairs:
                sent[s] += d
                recv[t] += d
            continue
        groups = c.groups or (tuple(range(devices)),)
        for g in groups:
            n = len(g)
            if n <= 1:
                continue
            if c.op == "all-reduce":
                s = r = 2.0 * (n - 1) / n * d
            elif c.op == "all-gather":
                s = r = (n - 1) * d / n  # d is the gathered result: n inputs
            elif c.op == "reduce-scatter":
                s = r = (n - 1) * d  # d is the scattered result: 1/n of the input
            else:  # all-to-all
                s = r = (n - 1) / n * d
            for dev in g:
                sent[dev] += s
                recv[dev] += r
    return sent, recv
