"""A compressor carries its facts (``Compressor.entry``), whatever user code calls it.

User code renames a registered compressor (``c._replace(name="mine")``), wraps it in its own
function (a new Compressor made with ``_replace``), and the engine wraps either in error feedback
(``ef(mine)``); every consumer of the facts still sees the registered compressor's: the engine's
config checks (``votes``, warm-up's ``at_density``), the aggregation's choice (``collectives``,
the vote), the theory constants (bound, encoded bytes), the planner's implementation cost and
wire bytes.  No consumer finds them from the name.
"""

import jax.numpy as jnp
import pytest

from cconv import compressors as C
from cconv import memory as M
from cconv.comm.aggregation import method_of
from cconv.engine.config import EngineConfig, compressor_at, dgc_warmup
from cconv.engine.exchange import make_plan
from cconv.theory import constants as K
from cconv.theory import implementation as IM
from cconv.theory.devices import Device
from cconv.theory.schedule import compress as CC

SHAPE = (1000,)
DEV = Device("toy", 1e12, 1e9, 5e-6)
IMPL = IM.Implementation("toy", True, op_s=1e-5, sort_passes=10.0, host_bw=1e9)


def halved(c: C.Compressor) -> C.Compressor:
    """A user's wrapper: the same message, decoded at half scale, under its own name."""
    return c._replace(decompress=lambda p, like: 0.5 * c.decompress(p, like), name=f"half-{c.name}")


def renamed(c: C.Compressor) -> C.Compressor:
    return c._replace(name="mine")


def with_ef(c: C.Compressor) -> C.Compressor:
    return M.wrap(c, M.get("ef", c))


WRAPS = {"renamed": renamed, "wrapped": halved, "renamed+ef": lambda c: with_ef(renamed(c))}


@pytest.mark.parametrize("how", WRAPS)
def test_the_entry_travels_with_the_compressor(how):
    c = C.topk(ratio=0.01)
    w = WRAPS[how](c)
    assert w.name != "topk"
    assert C.entry_of(w) is C.entry("topk") and C.registered_name(w) == "topk"


@pytest.mark.parametrize("how", ["renamed", "wrapped"])
def test_engine_config_checks_read_the_facts(how):
    sign = WRAPS[how](C.signsgd())
    assert EngineConfig(workers=2, compressor=sign, vote=True).vote  # votes=True on signsgd's entry
    sparse = WRAPS[how](C.topk(ratio=0.01))
    cfg = EngineConfig(workers=2, compressor=sparse, warmup=dgc_warmup(10))  # at_density on topk's entry
    at = compressor_at(cfg, 0.25)
    assert C.registered_name(at) == "topk" and at.hparams["ratio"] == 0.25
    with pytest.raises(ValueError, match="vote=True needs a sign compressor"):
        EngineConfig(workers=2, compressor=sparse, vote=True)


@pytest.mark.parametrize("how", WRAPS)
def test_aggregation_choice_reads_the_facts(how):
    w = WRAPS[how](C.topk(ratio=0.01))
    assert method_of(w, "gtopk") == "gtopk"  # topk's entry lists the gtopk collective
    assert method_of(WRAPS[how](C.signsgd()), vote=True) == "vote"


@pytest.mark.parametrize("how", WRAPS)
@pytest.mark.parametrize("name, hp", [("topk", {"ratio": 0.01, "positions": "golomb"}), ("qsgd", {"levels": 4})])
def test_theory_constants_read_the_facts(how, name, hp):
    c = C.get(name, **hp)
    w = WRAPS[how](c)
    assert K.constants(w, SHAPE)[1:] == K.constants(c, SHAPE)[1:]  # all but the name
    assert K.encoded_bytes(w, SHAPE) == K.encoded_bytes(c, SHAPE)
    assert K.wire_bytes(w, SHAPE) == K.wire_bytes(c, SHAPE)


@pytest.mark.parametrize("how", WRAPS)
def test_planner_cost_reads_the_facts(how):
    c = C.get("qsgd", levels=4)
    w = WRAPS[how](c)
    assert IM.compress_s(w, SHAPE, IMPL, DEV) == IM.compress_s(c, SHAPE, IMPL, DEV)
    assert IM.decompress_s(w, SHAPE, IMPL, DEV, 4) == IM.decompress_s(c, SHAPE, IMPL, DEV, 4)
    per_tensor = IM.get("per-tensor")
    assert IM.message_bytes(w, SHAPE, 10.0, per_tensor) == IM.message_bytes(c, SHAPE, 10.0, per_tensor)
    assert CC._wire(w, SHAPE) == CC._wire(c, SHAPE)


def test_a_renamed_identity_is_still_dense():
    cfg = EngineConfig(workers=2)
    plan = make_plan(cfg, renamed(C.get(C.IDENTITY)), [SHAPE], memory=M.NONE)
    assert plan == make_plan(cfg, C.get(C.IDENTITY), [SHAPE], memory=M.NONE)


def hand_built() -> C.Compressor:
    c = C.signsgd()
    return C.Compressor(c.init, c.compress, c.decompress, c.wire_bytes, c.density, name="signsgd", unbiased=False)


def test_a_hand_built_compressor_has_no_facts_even_under_a_registered_name():
    c = hand_built()
    assert c.entry is None and C.registered_name(c) is None
    with pytest.raises(ValueError, match=r"^compressor 'signsgd' carries no registry entry") as e:
        C.entry_of(c)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="carries no registry entry"):
        K.constants(c, SHAPE)
    with pytest.raises(ValueError, match="carries no registry entry"):
        IM.compress_s(c, SHAPE, IMPL, DEV)
    assert method_of(c, "gtopk") == "allgather"  # no extra collective
    with pytest.raises(ValueError, match="vote=True needs a sign compressor"):
        EngineConfig(workers=2, compressor=c, vote=True)
    with pytest.raises(ValueError, match="carries no registry entry"):
        EngineConfig(workers=2, compressor=c, warmup=dgc_warmup(10))
    x = jnp.ones(SHAPE)  # it still compresses: facts are only what cconv asks beyond the functions
    assert c.decompress(c.compress(x, c.init(x), None)[0], x).shape == SHAPE


@pytest.mark.parametrize("how", WRAPS)
def test_the_simulated_clock_charges_a_wrapped_compressor_as_its_entry(how):
    """``cconv.experiments.clock.exchange_seconds`` finds the compressor's benchmark rows by its
    entry (a renamed top-k was an unknown compressor there), so a wrapped compressor costs what
    the registered one costs."""
    from cconv.engine.trainer import StepWork
    from cconv.experiments.clock import exchange_seconds

    def work(c):
        return StepWork(None, 1.0, True, (), False, c, "none", (SHAPE,), None)

    c = C.topk(ratio=0.01)
    assert exchange_seconds(work(WRAPS[how](c)), DEV, 8) == pytest.approx(exchange_seconds(work(c), DEV, 8))


def test_the_trainer_knows_a_renamed_identity_for_what_it_is():
    """Under error feedback the identity still has a plan, and the step's work names no
    compressor for it, whatever the user called it (``Trainer.step_work`` read the name)."""
    import optax

    from cconv.engine import build

    loss = lambda p, s, b, k: (jnp.sum(p["w"]), (s, {}))  # noqa: E731
    for c in (C.identity(), renamed(C.identity())):
        cfg = EngineConfig(workers=2, launcher="vmap", compressor=c, memory="ef")
        assert build(loss, {"w": jnp.zeros((8, 6))}, optax.sgd(0.1), cfg).step_work(0).compressor is None, c.name
