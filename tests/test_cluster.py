"""The cluster model: NODESxGPUS parsing, links named by rate, devices, hierarchical collectives
against hand-computed values (cconv.theory.cluster)."""

import argparse
import math

import pytest

from cconv.theory import cluster as CL
from cconv.theory import devices as D
from cconv.theory import network as N
from cconv.theory import profiles as P

INTRA = N.Network("i", 1e-6, 1e-9)
INTER = N.Network("e", 1e-5, 1e-8)


def two_by_four():
    return CL.Cluster(2, 4, INTRA, INTER, D.get("v100"))


def test_hierarchical_allreduce_hand_computed():
    # g = 4, N = 2, n = 8e6: 2*3*(1e-6 + 2e6*1e-9) + 2*1*1e-5 + 2*(1/2)*8e6*1e-8
    expect = 6 * (1e-6 + 2e-3) + 2e-5 + 0.08
    assert two_by_four().collective_time("allreduce", 8e6) == pytest.approx(expect, rel=1e-12)
    assert expect == pytest.approx(0.092026, rel=1e-9)


def test_hierarchical_allgather_hand_computed():
    # (N-1)(alpha_e + g n beta_e) + (g-1)(alpha_i + N n beta_i) = (1e-5 + 0.32) + 3 (1e-6 + 0.016)
    assert two_by_four().collective_time("allgather", 8e6) == pytest.approx(0.368013, rel=1e-9)


def test_one_node_is_the_intra_ring_and_one_gpu_per_node_the_flat_inter_ring():
    one_node = CL.Cluster(1, 8, INTRA, INTER, D.get("v100"))
    assert one_node.collective_time("allreduce", 8e6) == pytest.approx(14 * 1e-6 + 14 / 8 * 8e6 * 1e-9)
    flat = CL.Cluster(8, 1, INTRA, INTER, D.get("v100"))
    assert flat.network() is INTER
    assert flat.collective_time("allreduce", 8e6) == pytest.approx(14 * 1e-5 + 14 / 8 * 8e6 * 1e-8)


def test_parse_builds_the_cluster_the_words_name():
    c = CL.parse("8x8", intra="NVLink", network="25GbE", device="a100")
    assert (c.nodes, c.gpus_per_node, c.workers) == (8, 8, 64)
    assert c.device is D.DEVICES["a100"] and c.intra is N.PRESETS["NVLink"]
    ten = N.PRESETS["10GbE"]
    assert c.inter.alpha == ten.alpha  # the TCP/IP rule: 10GbE's latency, its efficiency x 25 Gb/s
    assert c.inter.gbps == pytest.approx(2.5 * ten.gbps)
    assert isinstance(c.network(), N.Hierarchical) and c.network().per_node == 8


@pytest.mark.parametrize(
    "name, gbps",
    [
        ("3GbE", 0.3 * N.PRESETS["10GbE"].gbps),
        ("200GbIB", 2 * N.PRESETS["100GbIB"].gbps),
        ("EDR", N.PRESETS["100GbIB"].gbps),
        ("HDR", 2 * N.PRESETS["100GbIB"].gbps),
        ("4x100GbIB", 4 * N.PRESETS["100GbIB"].gbps),
        ("100GbE", N.PRESETS["100GbE"].gbps),
    ],
)
def test_links_named_by_rate(name, gbps):
    assert N.get(name).gbps == pytest.approx(gbps)


@pytest.mark.parametrize(
    "args, match",
    [
        (("0x8",), "must be >= 1"),
        (("8x0",), "must be >= 1"),
        (("8",), "NODESxGPUS"),
        (("1e30x8",), "NODESxGPUS"),
        (("9999999x9999999",), "more than"),
        (("8x8", "NVLink", "10GbE", "tpu"), "unknown device"),
        (("8x8", "NVLink", "0GbE"), "line rate"),
        (("8x8", "NVLink", "1e30GbE"), "unknown network"),
        (("8x8", "survey-10GbE"), "single link"),
        (("8x8", "NVLink", "99x10GbE"), "K x LINK"),
    ],
)
def test_bad_input_is_one_line(args, match):
    with pytest.raises(ValueError, match=match) as e:
        CL.parse(*args)
    assert "\n" not in str(e.value)


def test_from_args_defaults_and_required_cluster():
    p = argparse.ArgumentParser()
    CL.add_arguments(p)
    c = CL.from_args(p.parse_args(["--cluster", "4x8", "--network", "100GbIB", "--device", "h100"]))
    assert c.intra.name == CL.DEFAULT_INTRA and c.inter is N.PRESETS["100GbIB"] and c.device.name == "h100"
    with pytest.raises(ValueError, match="--cluster"):
        CL.from_args(p.parse_args([]))


def test_device_sustained_rates_follow_their_derivation():
    """flops = published samples/s x the profile's FLOPs per sample (cconv.theory.devices)."""
    rn50 = P.get("resnet50").flops_per_sample
    assert D.RESNET50_FLOPS_PER_IMAGE == pytest.approx(rn50)
    assert D.get("v100").flops == pytest.approx(367 * rn50)
    assert D.get("A100").flops == pytest.approx(938 * rn50)
    large = P.get("bert-large")
    assert D.get("rtx-2080ti").flops == pytest.approx(large.batch * large.flops_per_sample / 0.163)
    assert D.get("h200").flops == D.get("h100").flops and D.get("h200").peak_flops == D.get("h100").peak_flops
    assert D.get("h200").mem_bw == 4.8e12 and "4.8 TB/s" in D.get("h200").source  # the H100's die, HBM3e
    for dev in D.DEVICES.values():
        assert dev.source and 0 < dev.flops < dev.peak_flops, dev.name  # sustained below the datasheet peak
        assert math.isfinite(dev.mem_bw) and dev.mem_bw > 1e11


# --------------------------------------------------------------------------- cconv plan --cluster


def _plan(*argv):
    from cconv.theory import plan_cli

    parser = argparse.ArgumentParser(prog="cconv plan")
    plan_cli.add_arguments(parser)
    return plan_cli.run(parser.parse_args(list(argv)))


def test_plan_cluster_json_rows(capsys):
    argv = ("--cluster", "2x4", "--intra", "NVLink", "--network", "25GbE", "--device", "v100", "--workload", "lstm")
    assert _plan(*argv, "--methods", "none,topk,none-ps", "--ratios", "0.01", "--json") == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["none", "topk", "none-ps"]
    assert rows[1]["knobs"] == {"ratio": 0.01} and rows[1]["compress_s"] > 0 == rows[0]["compress_s"]
    for r in rows:
        assert r["workers"] == 8 and r["network"] == "25GbE" and r["device"] == "v100"
        parts = r["compute_s"] + r["compress_s"] + r["comm_s"]
        assert r["iteration_time_s"] == pytest.approx(parts)
        assert r["scaling_factor"] == pytest.approx(r["speedup"] / 8) and 0 < r["scaling_factor"] <= 1 + 1e-9
    assert rows[0]["architecture"] == "hierarchical" and rows[2]["architecture"] == "byteps"


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--cluster", "0x8", "--workload", "resnet50"], "must be >= 1"),
        (["--cluster", "2x8", "--device", "tpu", "--workload", "resnet50"], "unknown device"),
        (["--cluster", "2x8", "--workload", "resnet50", "--overlap"], "cannot be combined with --cluster"),
        (["--cluster", "2x8", "--workload", "resnet50", "--device-flops", "1e12"], "cannot be combined"),
        (["--cluster", "2x8", "--workload", "resnet50", "--workers", "8"], "disagrees"),
        (["--cluster", "2x8", "--params", "1000"], "cannot be combined"),
        (["--cluster", "2x8"], "needs --workload"),
        (["--cluster", "2x8", "--workload", "resnet50", "--methods", "survey"], "method sets"),
        (["--cluster", "2x8", "--workload", "resnet50", "--methods", "zip"], "unknown method"),
    ],
)
def test_plan_cluster_bad_input_one_line(argv, match, capsys):
    assert _plan(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err


def test_predict_bounds_and_decomposition():
    """Dense on one node of NVLink is near-linear; on 3 Gb/s Ethernet it is communication bound,
    and a 1 % top-k then scales better than dense on 2 nodes (its all-gather moves (N-1) g = 8
    payloads of 1/50 of the gradient per NIC, the dense all-reduce one gradient); its biases (4 v
    bytes) travel dense, as the engine sends them by default."""
    from cconv.theory import predict as PR
    from cconv.theory import profiles as P

    fast = PR.predict(CL.parse("1x8", "NVLink", "10GbE", "v100"), "resnet50", ["none"])[0]
    assert fast.scaling_factor > 0.9
    slow = CL.parse("2x8", "NVLink", "3GbE", "v100")
    dense, topk = PR.predict(slow, "vgg16", ["none", "topk"], sweep={"ratio": [0.01]})
    v = sum(s[0] for lay in P.get("vgg16").layers for s in lay.shapes if len(s) == 1)
    assert dense.scaling_factor < 0.5 < topk.scaling_factor and v > 0
    assert (
        dense.comm_s > dense.compute_s > 0
        and topk.compress_s > 0
        and topk.bytes == pytest.approx((dense.bytes - 4 * v) / 50 + 4 * v, rel=1e-3)
    )
