"""Every engine default is written once, on its ``EngineConfig`` field: an API that takes engine
settings as keywords defaults to ``cconv.engine.config.ENGINE_DEFAULTS`` (read from the
dataclass) and a run config's engine key reads the field (``tests/test_config_engine_section.py``).

The scan reads every module of ``cconv/``: a parameter, a class field, a ``.get(KEY, default)`` or
a ``getattr(x, KEY, default)`` named like an engine field whose default is written out (a literal,
or a named constant such as ``M.NONE``) and equals the engine's is a second copy of that default:
changing the engine's would leave it behind.  A default read from somewhere (a subscript such as
``ENGINE_DEFAULTS["memory"]``, a call such as ``default_of("launcher")``) is not, nor is the
constant an engine field's default itself reads (DGC's momentum, ``cconv.memory.dgc.MOMENTUM``:
the one place it is written, named where it is used).  ``None`` is Python's "not given", not a
copy.  The layers below the engine cannot import it
(``tests/test_imports.py``): their own public factories keep their own defaults, listed below; the
engine passes every such value explicitly."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from cconv import doctor
from cconv.engine import EngineConfig
from cconv.engine.config import ENGINE_DEFAULTS
from cconv.engine.dropin import Exchange, as_optax

ROOT = Path(__file__).resolve().parent.parent
ENGINE = {f.name: f.default for f in dataclasses.fields(EngineConfig)}

# the layers below the engine: their own API's defaults (the engine passes its value:
# cconv.engine.exchange.make_plan gives momentum, masking and ef_scale to the memory, collective
# and vote to method_of)
BELOW_THE_ENGINE = {
    "cconv/memory/dgc.py:dgc_memory.masking": "DGC's memory factory",
    "cconv/memory/dgc.py:dgc.masking": "DGC's compressor wrapper",
    "cconv/memory/ef21.py:ef21_sgdm_memory.momentum": "EF21-SGDM's memory factory",
    "cconv/memory/ef21.py:ef21_sgdm.momentum": "EF21-SGDM's compressor wrapper",
    "cconv/memory/error_feedback.py:ef_memory.ef_scale": "error feedback's memory factory (plain EF)",
    "cconv/memory/error_feedback.py:error_feedback.ef_scale": "error feedback's compressor wrapper",
    "cconv/comm/aggregation.py:method_of.collective": "the aggregation method of a compressor alone",
    "cconv/comm/aggregation.py:method_of.vote": "the aggregation method of a compressor alone",
    "cconv/theory/schedule/arch.py:getattr.workers": "a planner architecture's own worker count, not the engine's",
}
# engine settings a module sets on purpose (a choice, not a default) to the default's value
CHOSEN = {
    "cconv/advisor/plan_measure.py:dict.memory": "the planner times a compressor alone: no memory",
    "cconv/experiments/config.py:dict.architecture": "ARCHITECTURE_ALIASES: gtopk is all-to-all + gtopk",
}
# keyword APIs over engine settings, and the defaults of their own that differ on purpose
KEYWORD_APIS = {
    Exchange.__init__: {"axis_name": "data", "workers": None},  # the drop-in's axis; None: the bound axis size
    as_optax: {"axis_name": "data"},
    doctor.Combo: {},
}


def _same(a, b) -> bool:
    return a is not None and type(a) is type(b) and a == b


def _reads(expr: ast.expr) -> bool:
    """The default is read from somewhere (a subscript or a call), not written out."""
    return any(isinstance(n, (ast.Subscript, ast.Call)) for n in ast.walk(expr))


def _sites(tree: ast.Module):
    """(owner, name, default expression) of every default named like an engine field."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = [*zip(pos[len(pos) - len(a.defaults) :], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            yield from ((node.name, arg.arg, d) for arg, d in pairs if d is not None)
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    yield node.name, st.target.id, st.value
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            at = {"get": 0, "getattr": 1}.get(fn)
            if at is not None and len(node.args) == at + 2 and isinstance(node.args[at], ast.Constant):
                yield fn, node.args[at].value, node.args[at + 1]
        elif isinstance(node, ast.Dict):  # {"vote": False} or {"vote": (cfg.vote, False)}
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    yield from (("dict", k.value, x) for x in (v.elts if isinstance(v, ast.Tuple) else [v]))


def _written(expr: ast.expr, tree: ast.Module) -> bool:
    """Written out here: a literal, or a named constant (followed within the module) that is."""
    if _reads(expr):
        return False
    if isinstance(expr, ast.Name):
        for st in tree.body:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == expr.id for t in targets) and st.value is not None:
                return _written(st.value, tree)
    return True


def _origins(tree: ast.Module, module: str) -> dict[str, tuple[str, str]]:
    """Module-level name -> (module, name) it is defined in: its own assignments and imports."""
    out = {}
    for st in tree.body:
        if isinstance(st, ast.ImportFrom) and st.module and not st.level:
            out.update({a.asname or a.name: (st.module, a.name) for a in st.names})
        elif isinstance(st, (ast.Assign, ast.AnnAssign)):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            out.update({t.id: (module, t.id) for t in targets if isinstance(t, ast.Name)})
    return out


def engine_sources(source: str) -> set[tuple[str, str]]:
    """(module, name) of each constant that an ``EngineConfig`` field in ``source`` (the engine's
    config module) takes its default from: ``_field(DGC_MOMENTUM, rule)``."""
    tree = ast.parse(source)
    origins = _origins(tree, "cconv.engine.config")
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineConfig"]
    calls = [st.value for st in cls.body if isinstance(st, ast.AnnAssign) and isinstance(st.value, ast.Call)]
    names = [c.args[0].id for c in calls if c.args and isinstance(c.args[0], ast.Name)]
    return {origins[n] for n in names if n in origins}


SOURCES = engine_sources((ROOT / "cconv/engine/config.py").read_text())


def copies(source: str, path: str, namespace: Callable[[], dict], sources=SOURCES) -> list[str]:
    """The engine defaults that ``source`` writes again, as ``path:owner.name = expression``
    (a named constant's value read in the module's ``namespace()``; one of ``sources``, the
    constants the engine's fields read, is no copy)."""
    tree = ast.parse(source)
    origins = _origins(tree, path.removesuffix(".py").replace("/", "."))
    out = []
    for owner, name, expr in _sites(tree):
        if name not in ENGINE or not _written(expr, tree):
            continue
        if isinstance(expr, ast.Name) and origins.get(expr.id) in sources:
            continue
        try:
            value = ast.literal_eval(expr) if isinstance(expr, ast.Constant) else eval(ast.unparse(expr), namespace())
        except Exception:  # a local name: not a module-level default
            continue
        if _same(value, ENGINE[name]):
            out.append(f"{path}:{owner}.{name} = {ast.unparse(expr)}")
    return out


def _all_copies() -> list[str]:
    out = []
    for p in sorted((ROOT / "cconv").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        mod = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        out += copies(p.read_text(), rel, lambda mod=mod: dict(vars(importlib.import_module(mod))))
    return out


def test_no_engine_default_is_written_twice():
    """Only ``EngineConfig`` writes an engine default (and the layers below their own API's)."""
    found = [c for c in _all_copies() if not c.startswith("cconv/engine/config.py:EngineConfig.")]
    assert sorted(c.split(" = ")[0] for c in found) == sorted({**BELOW_THE_ENGINE, **CHOSEN})


def test_the_engine_reads_dgcs_momentum_where_it_is_written():
    assert SOURCES == {("cconv.memory.dgc", "MOMENTUM")}
    assert ENGINE["momentum"] is importlib.import_module("cconv.memory.dgc").MOMENTUM


def test_the_scan_finds_a_second_copy():
    """The scan cannot pass vacuously: each way of writing a default again is found."""
    source = """
NONE = "none"
LAUNCHER = ENGINE_DEFAULTS["launcher"]
class Combo:
    memory: str = NONE
    launcher: str = LAUNCHER
    vote: bool = ENGINE_DEFAULTS["vote"]
def exchange(granularity="layerwise", momentum=0.5, *, compress_vectors=False, clip=None, axis_name="data"):
    return cfg.get("min_compress_size", 0), getattr(cfg, "collective", "auto"), cfg.get("sync", default_of("sync"))
def check(cfg):
    return {"local_steps": (cfg.local_steps, 1), "staleness": ENGINE_DEFAULTS["staleness"], "jitter": 0.5}
"""
    found = copies(source, "x.py", lambda: {"NONE": "none"})
    assert sorted(found) == sorted(
        [
            "x.py:Combo.memory = NONE",
            "x.py:exchange.granularity = 'layerwise'",
            "x.py:exchange.compress_vectors = False",
            "x.py:get.min_compress_size = 0",
            "x.py:getattr.collective = 'auto'",
            "x.py:dict.local_steps = 1",
        ]
    )


def test_the_scan_follows_a_source_constant_and_nothing_else():
    """The constant the engine reads is no copy where it is written or imported; a constant of
    the same value under another name, or the literal, is."""
    config = """
from cconv.memory.dgc import MOMENTUM as DGC_MOMENTUM
OWN = 1
class EngineConfig:
    momentum: float = _field(DGC_MOMENTUM, rule)
    workers: int = _field(OWN, rule)
"""
    sources = engine_sources(config)
    assert sources == {("cconv.memory.dgc", "MOMENTUM"), ("cconv.engine.config", "OWN")}
    dgc = "MOMENTUM = 0.9\nOTHER = 0.9\ndef dgc(c, momentum=MOMENTUM): ...\ndef ef(c, momentum=OTHER): ...\n"
    user = "from cconv.memory.dgc import MOMENTUM, OTHER\ndef a(momentum=MOMENTUM): ...\ndef b(momentum=0.9): ...\n"
    ns = {"MOMENTUM": 0.9, "OTHER": 0.9}
    assert copies(dgc, "cconv/memory/dgc.py", lambda: ns, sources) == ["cconv/memory/dgc.py:ef.momentum = OTHER"]
    assert copies(user, "cconv/memory/x.py", lambda: ns, sources) == ["cconv/memory/x.py:b.momentum = 0.9"]
    assert copies(dgc, "cconv/memory/other.py", lambda: ns, sources) == [
        "cconv/memory/other.py:dgc.momentum = MOMENTUM",
        "cconv/memory/other.py:ef.momentum = OTHER",
    ]


@pytest.mark.parametrize("api", KEYWORD_APIS, ids=lambda f: f.__qualname__)
def test_keyword_apis_show_the_engines_defaults(api):
    """Their signatures show the engine's values (``help(Exchange)``), except their own, listed."""
    own = KEYWORD_APIS[api]
    params = inspect.signature(api).parameters
    shared = [n for n in params if n in ENGINE and params[n].default is not inspect.Parameter.empty]
    assert shared, api
    for n in shared:
        want = own.get(n, ENGINE_DEFAULTS[n])
        assert params[n].default == want and type(params[n].default) is type(want), n


def test_engine_defaults_are_the_dataclass():
    assert dict(ENGINE_DEFAULTS) == ENGINE
