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

``stablehlo_collectives(mlir_text)`` reads the same instructions from a *lowered, not compiled*
StableHLO module (``jax.export.Exported.mlir_module()``, e.g. exported for a platform that is not
present: ``cconv.doctor``): ``"stablehlo.all_reduce"`` etc. with their result types.  Nothing is
combined there yet (one all-reduce per leaf), which changes no byte total.  A function called
from several sites counts once per call; a collective inside a ``while`` / ``case`` / ``if``
region (or in a function called from one) is flagged ``entry=False``.  ``traffic(collectives,
devices)`` applies the formulas to either parser's output.
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
    return traffic(collectives(hlo_text), devices, allow_nested)


def traffic(found: list[HloCollective], devices: int, allow_nested: bool = False):
    """(sent, received) bytes per device of parsed collectives (``collectives`` or
    ``stablehlo_collectives``), arrays of length ``devices``."""
    sent, recv = np.zeros(devices), np.zeros(devices)
    for c in found:
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


# ----------------------------------------------------------------------------- StableHLO text

_SHLO_DTYPE = {"i1": "pred", "i4": "s4", "ui4": "u4", "f8E4M3FN": "f8e4m3fn", "f8E5M2": "f8e5m2"}
_SHLO_DTYPE.update({f"i{b}": f"s{b}" for b in (8, 16, 32, 64)} | {f"ui{b}": f"u{b}" for b in (8, 16, 32, 64)})
_SHLO_OP = re.compile(r'"stablehlo\.(all_reduce|all_gather|collective_permute|reduce_scatter|all_to_all)"\(')
_SHLO_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")
_SYMBOL = r'@([\w.$\-]+|"[^"]*")'  # a function's name; quoted when it has other characters
_SHLO_FUNC = re.compile(r"^func\.func\s+(?:public\s+|private\s+)?" + _SYMBOL)
_SHLO_CALL = re.compile(r"\bcall " + _SYMBOL)
_SHLO_OPENER = re.compile(r'^(?:%[\w#:]+(?:\s*,\s*%[\w#:]+)*\s*=\s*)?"?([a-z_]+\.[a-z_]+)')
_CONTROL = ("stablehlo.while", "stablehlo.case", "stablehlo.if")


def _shlo_result_shapes(signature: str) -> tuple:
    """The result types of an op's ``(operands) -> results`` signature, in HLO dtype names."""
    out = []
    for dims, dt in _SHLO_TENSOR.findall(signature.rpartition("->")[2]):
        out.append((_SHLO_DTYPE.get(dt, dt), tuple(int(v) for v in dims.split("x") if v)))
    return tuple(out)


def _shlo_groups(text: str, key: str) -> tuple:
    m = re.search(key + r"\s*=\s*dense<(\[\[[0-9,\s\[\]]*\]\])>", text)
    if not m:
        return ()
    return tuple(tuple(int(v) for v in g.split(",") if v.strip()) for g in re.findall(r"\[([0-9,\s]*)\]", m.group(1)))


def _shlo_scan(mlir_text: str):
    """One pass over the module: per function, its collectives ``(op, attrs, signature, in
    control flow)`` and its call sites ``(callee, in control flow)``."""
    funcs: dict[str, dict] = {}
    stack: list[list] = []  # open regions: [op name, pending collective (op, attrs) or None]
    func = ""
    for line in mlir_text.splitlines():
        s = line.strip()
        in_control = any(op in _CONTROL for op, _ in stack)
        if s.startswith("}"):
            op, pending = stack.pop()
            if s.endswith("{"):  # "}, {" / "} do {": the next region of the same op
                stack.append([op, pending])
            elif pending is not None:
                funcs[func]["colls"].append((*pending, s, any(o in _CONTROL for o, _ in stack)))
            continue
        fm = _SHLO_FUNC.match(s)
        if fm:
            func = fm.group(1)
            funcs[func] = {"colls": [], "calls": []}
            stack.append(["func.func", None])
            continue
        for callee in _SHLO_CALL.findall(s):
            funcs.setdefault(func, {"colls": [], "calls": []})["calls"].append((callee, in_control))
        cm = _SHLO_OP.search(s)
        if cm and s.endswith("({"):  # a reduction region follows; the signature closes it
            stack.append([f"stablehlo.{cm.group(1)}", (cm.group(1), s)])
        elif cm:
            funcs[func]["colls"].append((cm.group(1), s, s, in_control))
        elif s == "cond {":
            stack.append(["stablehlo.while", None])
        elif s.endswith("{"):
            om = _SHLO_OPENER.match(s)
            stack.append([om.group(1) if om else s.split()[0], None])
    return funcs


def stablehlo_collectives(mlir_text: str) -> list[HloCollective]:
    """Every collective of a lowered StableHLO module's text, once per time it runs (module
    docstring): op named as in HLO (``all-reduce``...), result shapes, replica groups / pairs."""
    funcs = _shlo_scan(mlir_text)
    runs: dict[str, tuple[int, bool]] = {}

    def calls_of(name: str) -> tuple[int, bool]:  # (times the function runs, under control flow)
        if name not in runs:
            sites = [(f, ctl) for f, d in funcs.items() for callee, ctl in d["calls"] if callee == name]
            if name == "main" or not sites:
                runs[name] = (1 if name == "main" else 0, False)
            else:
                parents = [(calls_of(f), ctl) for f, ctl in sites]
                runs[name] = (sum(n for (n, _), _ in parents), any(nested or ctl for (_, nested), ctl in parents))
        return runs[name]

    found = []
    for name, d in funcs.items():
        times, nested = calls_of(name)
        for op, attrs, signature, ctl in d["colls"]:
            c = HloCollective(
                op.replace("_", "-"),
                _shlo_result_shapes(signature),
                _shlo_groups(attrs, "replica_groups"),
                _shlo_groups(attrs, "source_target_pairs"),
                name,
                not (nested or ctl),
            )
            found += [c] * times
    return found
