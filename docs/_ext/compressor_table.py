"""The ``{compressor-table}`` directive: one row per registered compressor, read from the registry
(``cconv.compressors.entries()``) and the theory oracles at build time, so the table cannot go stale.

Columns: name, class (unbiased / contractive / biased, ``cconv.theory.constants``), the worst-case
constant (omega for unbiased, delta for contractive) and the bits per element of the moved payload
at the reference size (d = 10^6 fp32, ratio 0.01 where the compressor has one; PowerSGD a
1000 x 1000 matrix), the paper (the first line of the compressor module's docstring), and the wire
format (aggregation, other collectives, the schema's format choices).
"""

from __future__ import annotations

import sys

from docutils import nodes
from docutils.parsers.rst import Directive

D = 1_000_000
COLUMNS = ("name", "class", "ω / δ (d = 10⁶)", "bits / element", "paper", "wire format")


def reference_case(entry) -> tuple[tuple[int, ...], dict]:
    """(shape, hyper-parameters) of the row: the entry's example, ratio 0.01 where the schema
    has a ratio, at d = 10^6 (a square matrix for compressors that need two dimensions)."""
    hp = dict(entry.example)
    if "ratio" in entry.schema.names:
        hp.pop("k", None)
        hp["ratio"] = 0.01
    two_d = any(p.name == "rank" for p in entry.schema.params)
    return ((1000, 1000) if two_d else (D,)), hp


def paper_of(entry) -> str:
    """The compressor module's first docstring sentence (the method and its paper)."""
    doc = sys.modules[entry.factory.__module__].__doc__ or ""
    first = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    depth, start = 0, first.find("(")
    for i in range(max(start, 0), len(first) if start >= 0 else 0):
        depth += {"(": 1, ")": -1}.get(first[i], 0)
        if depth == 0:
            return first[: i + 1]  # the method and its citation, "Top-k sparsification (Aji & ...)"
    return first


def wire_format(entry, hp: dict) -> str:
    parts = [entry.aggregation_of(entry.schema.validate(entry.name, hp))]
    parts += [f"or {c}" for c in entry.collectives]
    parts += [f"{p.name}: {' | '.join(map(str, p.choices))}" for p in entry.schema.params if p.choices]
    return "; ".join(parts)


def rows() -> list[tuple[str, ...]]:
    from cconv import compressors
    from cconv.theory import constants

    out = []
    for e in compressors.entries():
        shape, hp = reference_case(e)
        hp_txt = ", ".join(f"{k}={v}" for k, v in hp.items())
        k = constants.constants(e.name, shape, **hp) if e.theory is not None else None
        if k is None:
            kind, const, bits = "no constant", "", f"{compressors.get(e.name, **hp).wire_bytes(shape) * 8 / D:.4g}"
        else:
            kind = k.kind
            const = (
                f"ω = {k.omega:.4g}"
                if kind == "unbiased"
                else _delta(k.delta)
                if k.delta is not None
                else f"none (not a contraction; error ≤ {k.omega:.4g} ‖x‖²)"
                if k.omega is not None
                else "none (not a contraction)"
            )
            const += "" if k.tight else " (bound)"
            bits = f"{k.bits:.4g}"
        name = f"{e.name} ({hp_txt})" if hp_txt else e.name
        out.append((name, kind, const, bits, paper_of(e), wire_format(e, hp)))
    return out


def _delta(delta: float) -> str:
    return f"δ = 1 − {1 - delta:.2g}" if delta > 0.99 else f"δ = {delta:.4g}"


class CompressorTable(Directive):
    has_content = False

    def run(self):
        table = nodes.table(classes=["compressor-table"])
        group = nodes.tgroup(cols=len(COLUMNS))
        table += group
        group.extend(nodes.colspec(colwidth=1) for _ in COLUMNS)
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body
        for cells, parent in [(COLUMNS, head)] + [(r, body) for r in rows()]:
            row = nodes.row()
            for text in cells:
                entry = nodes.entry()
                entry += nodes.paragraph(text=text)
                row += entry
            parent += row
        return [table]


def setup(app):
    app.add_directive("compressor-table", CompressorTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
