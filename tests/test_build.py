"""``cconv.experiments.build``: a run is built in one pass (issue 27, item 5).

Each stage runs once per build, in the order of the module docstring; validation
(``check_names``) is the same stages without data and model; the theory is asked once per
distinct compressed shape, whatever the warnings and ``ef_scale`` need from it.
"""

from __future__ import annotations

import warnings

import jax
import pytest

from cconv.experiments import build
from cconv.experiments.config import from_dict
from cconv.theory import constants

STAGES = ("load_data", "init_models", "make_optimizer", "make_compression", "make_engine_config", "make_trainer")
TINY = {"model": {"name": "mlp", "hidden": [8, 8]}, "data": "digits", "workers": 2, "batch_size": 16, "steps": 2}


def spy_stages(monkeypatch) -> list[str]:
    """The names of the stages called from now on, in call order."""
    calls: list[str] = []
    for name in STAGES:

        def stage(*args, _real=getattr(build, name), _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(build, name, stage)
    return calls


def test_a_run_is_built_in_one_pass_each_stage_once_in_order(monkeypatch):
    calls = spy_stages(monkeypatch)
    cfg = from_dict({**TINY, "seed": [0, 1], "compressor": {"name": "topk", "ratio": 0.1}, "memory": "ef"})
    problem = build.problem(cfg)
    assert calls == list(STAGES)
    assert len(problem.specs) == len(problem.batchers) == 2 and problem.seeds == [0, 1]
    assert problem.engine_cfg.compressor.name == "topk" and problem.trainer.engine_cfg is problem.engine_cfg


def test_validation_is_the_build_without_data_and_model(monkeypatch):
    calls = spy_stages(monkeypatch)
    build.check_names(from_dict({**TINY, "architecture": "ps", "ps_downlink": {"name": "topk", "ratio": 0.1}}))
    assert calls == ["make_optimizer", "make_compression", "make_engine_config"]


def test_the_theory_is_asked_once_per_distinct_compressed_shape(monkeypatch):
    """QSGD (s = 2) under plain error feedback and SGD at lr 0.1: the error-feedback warning, the
    sign/learning-rate rule and the scale all read the same table (before: one query per shape for
    each of them).  The MLP [8, 8]: 3 distinct matrix shapes; its biases travel dense (not asked)."""
    asked: list[tuple] = []
    real = constants.constants

    def counted(c, shape, *args, **kwargs):
        asked.append(tuple(shape))
        return real(c, shape, *args, **kwargs)

    monkeypatch.setattr(constants, "constants", counted)
    monkeypatch.setattr(build, "_WARNED", set())
    cfg = from_dict({**TINY, "compressor": {"name": "qsgd", "levels": 2}, "memory": "ef", "lr": 0.1})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        problem = build.problem(cfg)
    distinct = sorted({tuple(x.shape) for x in jax.tree.leaves(problem.specs[0].params) if x.ndim > 1})
    assert len(distinct) == 3 and asked == distinct
    assert [x.category for x in w] == [build.ErrorFeedbackWarning]


SHAPES = [(64, 8), (8,), (8, 8), (8,), (8, 10), (10,)]  # the MLP [8, 8] on digits


@pytest.mark.parametrize(
    "extra,compressed",
    [
        ({}, [(8, 8), (8, 10), (64, 8)]),  # the biases travel dense (compress_vectors: false)
        ({"compress_vectors": True}, [(8,), (8, 8), (8, 10), (10,), (64, 8)]),
        ({"granularity": "fused"}, [(656,)]),  # one flat buffer of the 656 matrix entries
        ({"granularity": "fused", "compress_vectors": True}, [(682,)]),  # of all 682 parameters
        ({"compress_vectors": False, "min_compress_size": 70}, [(8, 10), (64, 8)]),  # the rest is sent dense
    ],
)
def test_the_scale_asks_only_for_the_compressed_shapes(monkeypatch, extra, compressed):
    """``ef_scale: auto`` is 1/(1 + omega) with omega the largest over the tensors the engine
    compresses; the theory is asked about those shapes only, once each."""
    asked: list[tuple] = []
    real = constants.constants
    monkeypatch.setattr(constants, "constants", lambda c, s, *a, **k: asked.append(tuple(s)) or real(c, s, *a, **k))
    cfg = from_dict({**TINY, "compressor": {"name": "qsgd", "levels": 2}, "memory": "ef", "ef_scale": "auto", **extra})
    scale = build.make_compression(cfg, SHAPES).ef_scale
    assert asked == compressed
    omega = max(real("qsgd", s, levels=2).omega for s in compressed)
    assert omega > 1 and scale == pytest.approx(1 / (1 + omega))


def test_a_compressor_that_reaches_no_tensor_warns_that_the_run_is_dense():
    """A linear model's only tensors are 1-D: with the default ``compress_vectors: false`` top-k
    would compress nothing, silently; it warns (and does not with ``compress_vectors`` or matrices)."""
    from cconv.compressors import get
    from cconv.engine import EngineConfig

    vectors = [(12,), (1,)]
    for engine_cfg, shapes, warns in [
        (EngineConfig(workers=4, compressor=get("topk", ratio=0.1)), vectors, True),
        (EngineConfig(workers=4, compressor=get("topk", ratio=0.1), compress_vectors=True), vectors, False),
        (EngineConfig(workers=4, compressor=get("topk", ratio=0.1)), SHAPES, False),
        (EngineConfig(workers=4), vectors, False),  # dense: nothing to say
    ]:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            build.warn_if_nothing_compressed(engine_cfg, shapes)
        got = [x for x in w if x.category is build.NothingCompressedWarning]
        assert len(got) == warns and (not warns or "compress_vectors: true" in str(got[0].message))


def test_a_problem_like_another_shares_its_data_and_initial_models_and_nothing_else(monkeypatch):
    """``build.problem(cfg, like=other)`` (the advisor's candidates): the same data set and initial
    models when data, model and seeds are equal -- no dataset load, no model initialised -- with
    batchers of its own (stateful); otherwise everything built anew."""
    first = build.problem(from_dict({**TINY, "seed": [0, 1]}))
    calls = spy_stages(monkeypatch)
    loads = []
    real_load = build.load_dataset
    monkeypatch.setattr(build, "load_dataset", lambda cfg: loads.append(cfg) or real_load(cfg))
    cfg = from_dict({**TINY, "seed": [0, 1], "compressor": {"name": "topk", "ratio": 0.1}, "memory": "ef"})
    p = build.problem(cfg, like=first)
    assert "init_models" not in calls and loads == []
    assert p.ds is first.ds and p.specs is first.specs and p.loss_fn is first.loss_fn
    assert all(a is not b for a, b in zip(p.batchers, first.batchers, strict=True))
    alone = build.problem(cfg)  # the same initial models as built alone
    for a, b in zip(jax.tree.leaves([s.params for s in p.specs]), jax.tree.leaves([s.params for s in alone.specs])):
        assert (a == b).all()
    other = build.problem(from_dict({**TINY, "seed": [0, 1], "model": {"name": "mlp", "hidden": [4]}}), like=first)
    assert other.specs is not first.specs and jax.tree.leaves(other.specs[0].params)[0].shape != (64, 8)
