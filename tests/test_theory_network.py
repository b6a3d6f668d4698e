"""cconv.theory.network: calibration on the survey's measurements, collective times, step time."""

import math

import pytest

from cconv.comm.accounting import Collective, traffic
from cconv.theory import network as N


@pytest.mark.parametrize("name", ["10GbE", "100GbE", "100GbIB"])
def test_calibration_reproduces_survey_times_and_throughputs(name):
    net = N.get(name)
    for m in N.SURVEY_MEASUREMENTS[name]:
        assert N.p2p_time(m.nbytes, net) == pytest.approx(m.seconds, rel=0.05)
        assert N.effective_gbps(m.nbytes, net) == pytest.approx(m.gbps, rel=0.05)


def test_binary_units_explain_the_stated_throughputs():
    """1 MB = 2^20 B and 16 KB = 2^14 B reproduce the survey's Gb/s; decimal units do not."""

    def rel_errors(mb, kb):
        errs = []
        for ms in N.SURVEY_MEASUREMENTS.values():
            for m, size in zip(ms, (kb, mb)):
                errs.append(abs(8 * size / m.seconds / 1e9 - m.gbps) / m.gbps)
        return errs

    binary = rel_errors(2**20, 2**14)
    decimal = rel_errors(10**6, 16 * 10**3)
    # the 1 MB points (3 significant digits in time) decide it
    assert max(binary[1::2]) < 0.012
    assert min(decimal[1::2]) > 0.035
    assert sum(binary) < sum(decimal)


@pytest.mark.parametrize("name", ["10GbE", "100GbE", "100GbIB"])
def test_fit_minimises_relative_squared_error(name):
    ms = N.SURVEY_MEASUREMENTS[name]
    a, b = N.fit_alpha_beta(ms)

    def sse(a, b):
        obs = [(m.nbytes, t) for m in ms for t in (m.seconds, 8 * m.nbytes / (m.gbps * 1e9))]
        return sum(((a + b * n - t) / t) ** 2 for n, t in obs)

    best = sse(a, b)
    for da, db in [(1e-7, 0), (-1e-7, 0), (0, 1e-13), (0, -1e-13)]:
        assert sse(a + da, b + db) > best
    assert a > 0 and b > 0


def test_fitted_presets_values():
    """The numbers quoted in theory/network.md and the README."""
    expect = {"10GbE": (95.1e-6, 9.06), "100GbE": (21.6e-6, 17.2), "100GbIB": (6.45e-6, 89.3)}
    for name, (alpha, gbps) in expect.items():
        net = N.get(name)
        assert net.alpha == pytest.approx(alpha, rel=2e-3)
        assert net.gbps == pytest.approx(gbps, rel=2e-3)


def test_bert_large_example_441ms_and_1_08x():
    net = N.get("PCIe3x16")
    t = N.allreduce_time(N.BERT_LARGE_BYTES, 4, net)
    assert t == pytest.approx(0.441, rel=1e-9)
    assert N.BERT_LARGE_BYTES / 1e9 == pytest.approx(1.34, abs=0.005)
    speedup = 4 * 0.163 / (0.163 + t)
    assert round(speedup, 2) == 1.08
    # what 441 ms implies: NCCL's "bus bandwidth" 2(P-1)/P D / t = 4.56 GB/s, 29% of the PCIe 3.0 peak
    busbw = 2 * 3 / 4 * N.BERT_LARGE_BYTES / t
    assert busbw / 1e9 == pytest.approx(4.56, abs=0.01)
    assert busbw / N.PCIE3_X16_PEAK == pytest.approx(0.29, abs=0.005)
    # alpha is not identifiable from one large message: 0..50 us moves the time by < 0.1 %
    for alpha in (0.0, 50e-6):
        t2 = N.allreduce_time(N.BERT_LARGE_BYTES, 4, net._replace(alpha=alpha))
        assert abs(t2 - t) / t < 1e-3


def test_intra_node_presets_cite_their_sources():
    assert N.get("PCIe3x16-peak").bandwidth == pytest.approx(15.75e9, rel=1e-3)
    assert N.get("NVLink").bandwidth == pytest.approx(150e9)
    # the survey: NVLink has "more than 10x higher bandwidth than PCIe3.0" (vs the effective figure)
    assert N.get("NVLink").bandwidth / N.get("PCIe3x16").bandwidth > 10
    for net in N.PRESETS.values():
        assert net.source


def test_nvlink_is_consistent_with_the_survey_3_82x():
    """4 V100 over NVLink, BERT-Large at local batch 128, 3.82x (no overlap assumed): the compute
    time this implies must be reachable, i.e. the implied FLOP rate below the V100's peak
    (125 TFLOP/s tensor cores)."""
    t_comm = N.allreduce_time(N.BERT_LARGE_BYTES, 4, N.get("NVLink"))
    t_comp = t_comm * 3.82 / (4 - 3.82)  # from 3.82 = 4 t_comp / (t_comp + t_comm)
    rate = 597e9 / 8 * 128 / t_comp
    assert 15.7e12 < rate < 125e12  # above fp32 peak: mixed precision, plausible


def test_collective_times_by_hand():
    net = N.Network("t", alpha=1e-5, beta=1e-9)
    n = 1e6
    assert N.collective_time("allreduce", n, 8, net) == pytest.approx(14e-5 + 2 * 7 / 8 * 1e-3)
    assert N.collective_time("allgather", n, 8, net) == pytest.approx(7 * (1e-5 + 1e-3))
    assert N.allgather_time(n, 8, net, "recursive_doubling") == pytest.approx(3e-5 + 7e-3)
    assert N.collective_time("recursive_doubling", n, 8, net) == pytest.approx(3 * (1e-5 + 1e-3))
    assert N.recursive_doubling_rounds(6) == 4 and N.recursive_doubling_rounds(8) == 3
    from cconv.comm.accounting import Collective, traffic

    for p in range(2, 9):  # the planner's bytes are the busiest rank's of the engine's ledger
        sent, _ = traffic(Collective("recursive_doubling", n), p)
        assert N.bytes_sent("recursive_doubling", n, p) == pytest.approx(sent.max())
    assert N.collective_time("ps_push", n, 8, net) == pytest.approx(1e-5 + 7e-3)
    assert N.collective_time("ps_pull", n, 8, net, servers=8) == pytest.approx(1e-5 + 7 / 8 * 1e-3)
    assert N.collective_time("broadcast", n, 8, net) == pytest.approx(min(3 * (1e-5 + 1e-3), 10e-5 + 1.75e-3))
    assert N.collective_time("broadcast", 10, 8, net) == pytest.approx(3 * (1e-5 + 1e-8))
    for kind in N.COLLECTIVES:
        assert N.collective_time(kind, n, 1, net) == 0.0
        assert N.collective_time(kind, 0, 8, net) == 0.0


def test_gtopk_communication_complexity():
    """Shi et al. 2019: gTop-k costs alpha log P + 2k log P beta (beta per 4-byte element),
    top-k by all-gather 2(P-1)k beta in bandwidth: gTop-k is cheaper for every P >= 4."""
    net = N.get("10GbE")
    k = 25_000
    for p in (2, 4, 8, 16, 32, 64):
        lg = math.log2(p)
        g = N.collective_time("recursive_doubling", 8 * k, p, net)
        assert g == pytest.approx(net.alpha * lg + 2 * k * lg * (4 * net.beta))
        a = N.allgather_time(8 * k, p, net, "recursive_doubling")
        assert a == pytest.approx(net.alpha * lg + 2 * (p - 1) * k * (4 * net.beta))
        assert g <= a * (1 + 1e-12)
        if p >= 4:
            assert g < a
            assert (a - net.alpha * lg) / (g - net.alpha * lg) == pytest.approx((p - 1) / lg)


@pytest.mark.parametrize("kind", N.COLLECTIVES)
def test_bytes_sent_agree_with_the_engine_accounting(kind):
    for p in (2, 4, 8):
        sent, _ = traffic(Collective(kind, 1000.0), p)
        assert N.bytes_sent(kind, 1000.0, p) == pytest.approx(sent[-1])  # a non-root worker


def test_step_comm_time_sums_counts_and_accepts_engine_collectives():
    net = N.get("100GbIB")
    colls = [
        Collective("allreduce", 4e6, 3),
        Collective("allgather", 1e4, 2),
        ("broadcast", 100),
        {"kind": "recursive_doubling", "bytes": 8e3, "count": 1},
    ]
    want = (
        3 * N.allreduce_time(4e6, 8, net)
        + 2 * N.allgather_time(1e4, 8, net)
        + N.broadcast_time(100, 8, net)
        + N.recursive_doubling_time(8e3, 8, net)
    )
    assert N.step_comm_time(colls, 8, net) == pytest.approx(want)
    # the engine's metric all-reduce (control traffic) is not part of the algorithm's time
    ctl = colls + [Collective("allreduce", 16.0, 1, control=True)]
    assert N.step_comm_time(ctl, 8, net) == pytest.approx(want)
    assert N.step_comm_time(ctl, 8, net, include_control=True) == pytest.approx(want + N.allreduce_time(16.0, 8, net))
    # overlap with nothing to hide behind is the plain sum
    assert N.step_comm_time(colls, 8, net, N.Overlap(backward=0.0)) == pytest.approx(want)


def test_wfbp_overlap_and_fusion_by_hand():
    # P=2: allreduce time = 2 alpha + n beta
    net = N.Network("t", alpha=0.0, beta=1e-9)
    calls = [("allreduce", 1e9), ("allreduce", 1e9)]  # 1 s each
    # listed in forward order: the second tensor's gradient is ready first (t=1), the first at t=2
    assert N.step_comm_time(calls, 2, net, N.Overlap(backward=2.0)) == pytest.approx(1.0)
    assert N.step_comm_time(calls, 2, net, N.Overlap(2.0, ready=[2.0, 1.0])) == pytest.approx(1.0)
    assert N.step_comm_time(calls, 2, net, N.Overlap(2.0, ready=[0.0, 0.0])) == pytest.approx(0.0)
    # fusion waits for the last member: both sent at t=2, 2 s, exposed 2 s (no latency to save)
    assert N.step_comm_time(calls, 2, net, N.Overlap(2.0, fusion_bytes=2e9)) == pytest.approx(2.0)
    # with latency, fusion saves start-ups: 100 tiny calls of alpha-dominated cost
    lat = N.Network("lat", alpha=1e-3, beta=1e-12)
    tiny = [("allreduce", 1e3)] * 100
    unfused = N.step_comm_time(tiny, 2, lat, N.Overlap(0.01))
    fused = N.step_comm_time(tiny, 2, lat, N.Overlap(0.01, fusion_bytes=1e6))
    assert unfused == pytest.approx(100 * 2e-3 + 100e3 * 1e-12 - 0.01 + 0.01 / 100, rel=1e-6)
    assert fused == pytest.approx(2e-3 + 1e5 * 1e-12, rel=1e-6)


def test_from_config_forms():
    assert N.from_config("10gbe") == N.get("10GbE")
    assert N.from_config({"preset": "NVLink"}).beta == N.get("NVLink").beta
    mine = N.from_config({"name": "mine", "alpha": 2e-5, "beta": 1e-10})
    assert (mine.name, mine.alpha, mine.beta) == ("mine", 2e-5, 1e-10)
    u = N.from_config({"name": "eth25", "latency_us": 20, "bandwidth_gbps": 25})
    assert u.alpha == pytest.approx(20e-6) and u.bandwidth == pytest.approx(25e9 / 8)
    g = N.from_config({"latency_us": 1, "bandwidth_GBps": 12})
    assert g.bandwidth == pytest.approx(12e9) and g.name == "custom"
    assert set(N.names()) >= {"10GbE", "100GbE", "100GbIB", "PCIe3x16", "NVLink"}
    two = N.from_config(
        {"name": "dgx", "intra": "NVLink", "inter": {"latency_us": 2, "bandwidth_gbps": 200}, "per_node": 8}
    )
    assert isinstance(two, N.Hierarchical) and two.per_node == 8 and two.intra == N.get("NVLink")
    assert two.inter.bandwidth == pytest.approx(25e9)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: N.get("40GbX"), "valid presets"),  # 40GbE is a link by rate (presets.py)
        (lambda: N.from_config({"alpha": 1e-5}), "needs both"),
        (lambda: N.from_config({"alpha": 1e-5, "beta": 0}), "beta"),
        (lambda: N.from_config({"alpha": 1e-5, "beta": 1e-9, "rtt": 1}), "unknown key"),
        (lambda: N.from_config({"latency_us": 1}), "exactly one of"),
        (lambda: N.from_config(3), "preset name or a mapping"),
        (lambda: N.from_config({"intra": "NVLink", "per_node": 8}), "two-level network needs"),
        (lambda: N.from_config({"intra": "NVLink", "inter": "10GbE", "per_node": 0}), "per_node"),
        (lambda: N.collective_time("alltoall", 1, 2, N.get("10GbE")), "valid: allreduce"),
        (lambda: N.collective_time("allreduce", -1, 2, N.get("10GbE")), "nbytes"),
        (lambda: N.collective_time("allreduce", 1, 0, N.get("10GbE")), "workers"),
        (lambda: N.collective_time("ps_push", 1, 2, N.get("10GbE"), servers=3), "servers"),
        (lambda: N.collective_time("allreduce", 1, 2, "10GbE"), "Network"),
        (lambda: N.step_comm_time([("allreduce",)], 2, N.get("10GbE")), "kind, bytes"),
        (lambda: N.step_comm_time([("allreduce", 1)], 2, N.get("10GbE"), N.Overlap(1.0, ready=[1, 2])), "ready"),
    ],
)
def test_bad_input_is_one_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_step_comm_time_of_real_engine_collectives():
    """The experiment layer's path: trainer.collectives(step) -> step_comm_time (shapes only)."""
    import jax.numpy as jnp
    import optax

    from cconv import compressors as C
    from cconv.engine import EngineConfig, build

    params = {"w": jnp.zeros((64, 8)), "b": jnp.zeros((8,))}

    def loss_fn(params, model_state, batch, key):
        pred = batch["x"] @ params["w"] + params["b"]
        return jnp.mean((pred - batch["y"]) ** 2), (model_state, {})

    net = N.get("10GbE")
    topk = C.get("topk", ratio=0.125)
    payload = topk.wire_bytes((64, 8)) + topk.wire_bytes((8,))  # 64 and 1 (value, index) pairs
    for collective, kind in (("auto", "allgather"), ("gtopk", "recursive_doubling")):
        # the bias too (compress_vectors): the planner's per-layer payloads compress every tensor
        cfg = EngineConfig(workers=4, compressor=topk, memory="ef", collective=collective, compress_vectors=True)
        trainer = build(loss_fn, params, optax.sgd(0.1), cfg)
        colls = trainer.collectives(0)
        assert {c.kind for c in colls} == {kind}
        assert sum(c.bytes * c.count for c in colls) == payload == 520  # what the planner assumes
        want = sum(c.count * N.collective_time(kind, c.bytes, 4, net) for c in colls)
        assert N.step_comm_time(colls, 4, net) == pytest.approx(want)
        assert want > 0


def test_hierarchical_reduces_to_flat_and_matches_hand_values():
    intra, inter = N.Network("i", 1e-6, 1e-10), N.Network("e", 1e-5, 1e-9)
    h = N.Hierarchical("h", intra, inter, 4)
    n = 1e6
    for kind in N.COLLECTIVES:  # P <= g: everything inside the node
        assert N.collective_time(kind, n, 4, h) == pytest.approx(N.collective_time(kind, n, 4, intra))
    one = N.Hierarchical("one", intra, inter, 1)
    for kind in ("allreduce", "allgather", "recursive_doubling", "broadcast"):  # g = 1: flat inter
        assert N.collective_time(kind, n, 8, one) == pytest.approx(N.collective_time(kind, n, 8, inter))
    # P = 8 = 2 nodes x 4
    assert N.collective_time("allreduce", n, 8, h) == pytest.approx(
        2 * 3 * (1e-6 + n / 4 * 1e-10) + 2 * 1e-5 + 1 * n * 1e-9
    )
    assert N.collective_time("allgather", n, 8, h) == pytest.approx((1e-5 + 4 * n * 1e-9) + 3 * (1e-6 + 2 * n * 1e-10))
    assert N.collective_time("recursive_doubling", n, 8, h) == pytest.approx(
        2 * (1e-6 + n * 1e-10) + (1e-5 + 4 * n * 1e-9)
    )
    assert N.collective_time("ps_push", n, 8, h, servers=2) == pytest.approx(
        max(1e-5 + 4 * n / 2 * 1e-9, 1e-6 + 3 * n / 2 * 1e-10)
    )
    assert N.collective_time("broadcast", n, 8, h) == pytest.approx(
        min(1e-5 + n * 1e-9, 2e-5 + n * 1e-9) + min(2 * (1e-6 + n * 1e-10), 5e-6 + 1.5 * n * 1e-10)
    )
    with pytest.raises(ValueError, match="multiple of per_node"):
        N.collective_time("allreduce", n, 6, h)
    with pytest.raises(ValueError, match="servers"):
        N.collective_time("ps_pull", n, 8, h, servers=3)


def test_survey_testbed_presets():
    """8 nodes x 4 GPUs on PCIe3x16, nodes on each survey network; 4 GPUs = the PCIe preset."""
    for name in ("10GbE", "100GbE", "100GbIB"):
        h = N.get(f"survey-{name}")
        assert (h.intra, h.inter, h.per_node) == (N.get("PCIe3x16"), N.get(name), 4)
        assert N.allreduce_time(N.BERT_LARGE_BYTES, 4, h.intra) == pytest.approx(
            N.collective_time("allreduce", N.BERT_LARGE_BYTES, 4, h)
        )
    assert N.from_config("survey-100gbib") == N.get("survey-100GbIB")
    assert "survey-10GbE" in N.names()
