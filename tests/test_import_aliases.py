"""One name for one thing: across ``cconv/`` an import alias names one module (or object), and a
module imported under an alias has that one alias.  ``C`` is ``cconv.compressors`` and ``M``
``cconv.memory`` everywhere (the house style, N812 off); ``P`` is jax's ``PartitionSpec``, so
``cconv.theory.profiles`` is imported by name.  Most modules are imported by name; a reader who met
``CC`` in one file knows what it is in the next.  Relative imports are resolved, and imports inside
functions count."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def aliases(path: str, tree: ast.Module):
    """``(alias, dotted name it names, "path:line")`` of each ``import x as y`` in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.asname, a.name, f"{path}:{node.lineno}") for a in node.names if a.asname)
        elif isinstance(node, ast.ImportFrom):
            base = [node.module] if node.module else []
            if node.level:
                package = list(Path(path).parent.parts)  # of ``a/b.py`` and of ``a/__init__.py``: ``a``
                base = package[: len(package) - node.level + 1] + base
            for a in node.names:
                if a.asname:
                    yield a.asname, ".".join([*base, a.name]), f"{path}:{node.lineno}"


def clashes(modules) -> list[str]:
    """One line per alias that names two things and per thing that has two aliases, with where."""
    by_alias, by_target = defaultdict(dict), defaultdict(dict)
    for path, tree in modules:
        for alias, target, where in aliases(path, tree):
            by_alias[alias].setdefault(target, where)
            by_target[target].setdefault(alias, where)
    out = [f"alias {a} names {sorted(ts.items())}" for a, ts in sorted(by_alias.items()) if len(ts) > 1]
    out += [f"{t} has aliases {sorted(als.items())}" for t, als in sorted(by_target.items()) if len(als) > 1]
    return out


def _cconv():
    for p in sorted((ROOT / "cconv").rglob("*.py")):
        yield p.relative_to(ROOT).as_posix(), ast.parse(p.read_text())


def test_each_alias_names_one_thing_and_each_thing_has_one_alias():
    assert clashes(_cconv()) == []


def test_the_scan_finds_each_kind_of_clash():
    """It cannot pass vacuously: the clashes this test was written against are found, across files,
    inside functions and through relative imports; consistent aliases are not."""
    planted = {
        "cconv/engine/config.py": "from cconv.comm import aggregation as A\nimport numpy as np\n",
        "cconv/theory/predict.py": "def f():\n    from cconv.theory.schedule import arch as A\n",
        "cconv/experiments/clock.py": "from cconv.theory.schedule import compress as CP\nimport numpy as np\n",
        "cconv/theory/schedule/ratios.py": "from . import compressed as CP\nfrom .compress import ratio_at as r\n",
        "cconv/theory/plan_cli.py": "from .schedule import compress as CC\n",
        "cconv/theory/__init__.py": "from . import profiles as P\n",
        "cconv/engine/ddp.py": "from jax.sharding import PartitionSpec as P\n",
    }
    found = clashes((path, ast.parse(src)) for path, src in planted.items())
    assert found == [
        "alias A names [('cconv.comm.aggregation', 'cconv/engine/config.py:1'), "
        "('cconv.theory.schedule.arch', 'cconv/theory/predict.py:2')]",
        "alias CP names [('cconv.theory.schedule.compress', 'cconv/experiments/clock.py:1'), "
        "('cconv.theory.schedule.compressed', 'cconv/theory/schedule/ratios.py:1')]",
        "alias P names [('cconv.theory.profiles', 'cconv/theory/__init__.py:1'), "
        "('jax.sharding.PartitionSpec', 'cconv/engine/ddp.py:1')]",
        "cconv.theory.schedule.compress has aliases [('CC', 'cconv/theory/plan_cli.py:1'), "
        "('CP', 'cconv/experiments/clock.py:1')]",
    ]
    assert dict(
        (a, t)
        for a, t, _ in aliases("cconv/theory/schedule/ratios.py", ast.parse(planted["cconv/theory/schedule/ratios.py"]))
    ) == {
        "CP": "cconv.theory.schedule.compressed",
        "r": "cconv.theory.schedule.compress.ratio_at",
    }
