"""Plot labels, knobs and the baseline family come from the compressor registry."""

from cconv import compressors as C
from cconv.experiments import plotting


def test_labels_and_knobs_from_entries():
    for name in C.names():
        assert plotting.family_label(name) == (C.entry(name).label or name)
    assert plotting.family_label("not_registered") == "not_registered"
    assert plotting.family_label("no_such_module:factory") == "no_such_module:factory"
    assert plotting.knobs("topk")[:2] == ["ratio", "k"]
    assert plotting.knobs("qsgd")[0] == "levels" and plotting.knobs("powersgd")[0] == "rank"
    every = {e.knob.name for e in C.entries() if e.knob is not None} | {"k"}
    assert set(plotting.knobs()) == every and set(plotting.knobs("signsgd")) == every
    assert plotting.identity_name() in C.names()
    assert plotting.family_order(["zzz", "topk", "dgc"]) == ["dgc", "topk", "zzz"]


def test_a_user_registered_compressor_gets_its_label():
    from cconv.compressors import registry

    name = "test_plot_half"
    C.register(
        name, C.Entry(lambda: C.get("fp16"), aggregation="allreduce", label="half precision", knob=C.Knob("bits", (8,)))
    )
    try:
        assert plotting.family_label(name) == "half precision"
        assert plotting.knobs(name)[0] == "bits"
    finally:
        registry._REGISTRY.pop(name)
