"""The engine example of the docs (docs/engine.md, the Python API page) runs as printed (fewer steps) and trains."""

import os
import re

import numpy as np
import pytest

# the docs' example, 64 steps: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "engine.md")


def test_docs_engine_example_runs(capsys):
    code = re.search(r"```python\n(.*?)```", open(PAGE).read(), re.S).group(1)
    assert "range(200)" in code
    exec(compile(code.replace("range(200)", "range(64)"), "docs/engine.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    losses = [float(m) for m in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 4 and np.isfinite(losses).all() and losses[-1] < losses[0]
    assert "Collective(kind='allgather'" in out
