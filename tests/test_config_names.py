"""One name per config type: ``cfg`` is a run's config (``RunConfig``, or its stored mapping in
``cconv.experiments.report``), ``engine_cfg`` the engine's (``EngineConfig``; ``Problem.engine_cfg``,
``Trainer.engine_cfg``).  The engine and the layers below it never hold a ``RunConfig`` (the
import layering, ``tests/test_imports.py``), so there the name ``cfg`` is never bound at all; above
them a parameter annotated with one type, or a name bound to a newly built ``EngineConfig``, has
that type's name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# packages that never hold a RunConfig: their config is the engine's (or their own spec)
NO_RUN_CONFIG = ("cconv/engine/", "cconv/comm/", "cconv/compressors/", "cconv/memory/", "cconv/theory/")
NAMES = {"EngineConfig": "engine_cfg", "RunConfig": "cfg"}
# a RunConfig parameter named for its role: the config another one is derived from
ROLES = {"cconv/advisor/probes.py:probe_config.base"}
ENGINE_BUILDERS = ("EngineConfig", "make_engine_config")


def _modules():
    for p in sorted((ROOT / "cconv").rglob("*.py")):
        yield p.relative_to(ROOT).as_posix(), ast.parse(p.read_text())


def _bound(tree: ast.Module):
    """(name, line) of every parameter and assignment target (an attribute's too: ``self.cfg``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            yield from ((x.arg, node.lineno) for x in [*a.posonlyargs, *a.args, *a.kwonlyargs])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id, node.lineno
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr, node.lineno


def misnamed(path: str, tree: ast.Module) -> list[str]:
    """``path:line: name`` of each config bound under the other type's name (or, below the
    experiments, under ``cfg``)."""
    out = [f"{path}:{line}: cfg" for name, line in _bound(tree) if name == "cfg" and path.startswith(NO_RUN_CONFIG)]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                ann = ast.unparse(a.annotation) if a.annotation is not None else ""
                for typ, name in NAMES.items():
                    role = f"{path}:{node.name}.{a.arg}" in ROLES
                    if ann.split(" | ")[0] == typ and a.arg != name and not role:
                        out.append(f"{path}:{node.lineno}: {a.arg}: {typ}")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            built = ast.unparse(node.value.func).split(".")[-1]
            for t in node.targets:
                if built in ENGINE_BUILDERS and isinstance(t, ast.Name) and t.id != NAMES["EngineConfig"]:
                    out.append(f"{path}:{node.lineno}: {t.id} = {built}(...)")
    return out


def test_each_config_type_has_one_name():
    assert [m for path, tree in _modules() for m in misnamed(path, tree)] == []


def test_the_check_finds_a_config_under_the_other_name():
    """It cannot pass vacuously: each way of naming a config the other type's way is found."""
    source = """
def phase(cfg, step): ...
def train(engine_cfg: RunConfig, cfg: EngineConfig | None = None): ...
def make(raw):
    ecfg = make_engine_config(raw)
    self.cfg = ecfg
"""
    assert misnamed("cconv/engine/x.py", ast.parse(source)) == [
        "cconv/engine/x.py:2: cfg",
        "cconv/engine/x.py:3: cfg",
        "cconv/engine/x.py:6: cfg",
        "cconv/engine/x.py:3: engine_cfg: RunConfig",
        "cconv/engine/x.py:3: cfg: EngineConfig",
        "cconv/engine/x.py:5: ecfg = make_engine_config(...)",
    ]
    assert misnamed("cconv/experiments/x.py", ast.parse("def run(cfg: RunConfig): ...")) == []
