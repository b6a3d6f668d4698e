"""cconv's import graph: no cycles, and every module imports on its own (issue 27).

The graph is read statically with ``ast``: an edge ``a -> b`` for every ``import``/``from ... import``
of a ``cconv`` module anywhere in ``a`` -- at module level *and inside functions*, since a
function-level import only hides a cycle, it does not remove it -- plus ``a -> p`` for each package
``p`` that importing ``b`` initialises first (its ``__init__`` runs) and that ``a`` is not itself
inside.  Imports under ``if TYPE_CHECKING:`` never run and are left out.

An import cycle is reported as its strongly connected component (the set of modules that reach each
other), with every elementary cycle in it spelled out as a chain ``a -> b -> a``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cconv"

# Cycles tolerated for now: none (the last three -- engine config/sync/gossip, experiments
# config/runner/sweep, cli/doctor/advisor -- were broken by the leaf modules cconv.engine.modes and
# cconv._startup and by dropping config's re-export of sweep).  An entry would be the set of
# modules of one strongly connected component; the test fails on any cycle not listed and on a
# listed one that is gone.
KNOWN_CYCLES: list[frozenset[str]] = []

# Modules whose import is their run: ``python -m cconv`` (the CLI it calls is imported via cconv.cli).
NOT_IMPORTABLE_ALONE = {"cconv.__main__"}


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of cconv."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(name: str, path: Path, package: bool, known: set[str]) -> set[str]:
    """The cconv modules ``name`` imports anywhere (functions included, ``TYPE_CHECKING`` blocks not)."""
    here = name if package else name.rpartition(".")[0]

    def module_of(dotted: str) -> str:
        while dotted and dotted not in known:  # ``from m import attribute``: the module m
            dotted = dotted.rpartition(".")[0]
        return dotted

    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if _is_type_checking(node.test):
                for stmt in node.orelse:
                    self.visit(stmt)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(module_of(a.name) for a in node.names if a.name.split(".")[0] == "cconv")

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "cconv":
                found.update(module_of(f"{base}.{a.name}") for a in node.names)

    Visitor().visit(ast.parse(path.read_text(), str(path)))
    return found - {name, ""}


def _packages_of(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def import_graph() -> dict[str, set[str]]:
    """Module -> the cconv modules its import may run (see the module docstring)."""
    mods = modules()
    known = set(mods)
    graph = {}
    for name, (path, package) in mods.items():
        direct = imported(name, path, package, known)
        inits = set().union(*(_packages_of(t) for t in direct)) - _packages_of(name) - {name}
        graph[name] = direct | (inits & known)
    return graph


def components(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def chains(graph: dict[str, set[str]], comp: frozenset[str], limit: int = 40) -> list[str]:
    """The elementary cycles of one component as readable chains (each starts at its smallest module)."""
    out: list[str] = []
    order = sorted(comp)
    for i, start in enumerate(order):
        allowed = set(order[i:])

        def walk(v: str, path: list[str]) -> None:
            for w in sorted(graph[v] & allowed):
                if len(out) >= limit:
                    return
                if w == start:
                    out.append(" -> ".join(path + [start]))
                elif w not in path:
                    walk(w, path + [w])

        walk(start, [start])
    return out


def _describe(graph: dict[str, set[str]], comps: list[frozenset[str]]) -> str:
    return "\n".join(f"{sorted(c)}:\n  " + "\n  ".join(chains(graph, c)) for c in comps)


def test_graph_sees_function_level_and_skips_type_checking_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from cconv import a\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n    from cconv import c\n"
        "def f():\n    import cconv.d.e\n    from cconv.d import f\n"
    )
    known = {"cconv", "cconv.a", "cconv.b", "cconv.c", "cconv.d", "cconv.d.e"}
    assert imported("cconv.m", src, False, known) == {"cconv.a", "cconv.b", "cconv.d.e", "cconv.d"}
    comps = components({"a": {"b"}, "b": {"c", "a"}, "c": {"c"}, "d": {"a"}})
    assert comps == [frozenset({"a", "b"})]
    assert chains({"a": {"b"}, "b": {"a"}}, comps[0]) == ["a -> b -> a"]


def test_no_import_cycles_but_the_known_ones():
    graph = import_graph()
    comps = components(graph)
    new = [c for c in comps if c not in KNOWN_CYCLES]
    gone = [c for c in KNOWN_CYCLES if c not in comps]
    assert not new, "import cycles (modules that import each other, also inside functions):\n" + _describe(graph, new)
    assert not gone, f"known cycles no longer there (remove them from KNOWN_CYCLES): {[sorted(c) for c in gone]}"


_ISOLATED = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    for mod in [m for m in sys.modules if m == "cconv" or m.startswith("cconv.")]:
        del sys.modules[mod]
    try:
        importlib.import_module(name)
    except BaseException as e:
        failed[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
print(json.dumps(failed))
"""


@pytest.mark.slow
def test_every_module_imports_in_isolation():
    """Each module imported first, in a fresh ``cconv`` (third-party packages stay loaded: one process)."""
    names = sorted(set(modules()) - NOT_IMPORTABLE_ALONE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _ISOLATED, json.dumps(names)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "modules that fail to import on their own:\n" + "\n".join(f"{k}: {v}" for k, v in failed.items())
