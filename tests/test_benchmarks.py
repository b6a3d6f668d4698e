"""Smoke test of the benchmark suite on tiny sizes: every part runs, the numbers are consistent,
and the JSON / markdown outputs have the documented format.  No absolute time is asserted."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from cconv import compressors as C

# the benchmark suite's smoke run: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

RUN = Path(__file__).resolve().parent.parent / "studies" / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cconv_bench_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = [
        "--parts",
        "a,b,c,d,e",
        "--sizes",
        "4096",
        "--names",
        "topk,randomk,signsgd",
        "--repeats",
        "1",
        "--models",
        "mlp",
        "--workers",
        "2",
        "--batch",
        "8",
        "--steps",
        "1",
        "--configs",
        "topk 1% + EF",
        "--p-list",
        "2,4,16",
        "--tensors",
        "2",
        "--seeds",
        "2",
        "--seed-steps",
        "2",
        "--out",
        str(out),
        "--tag",
        "smoke",
    ]
    return bench.main(argv, log=lambda *a: None), out


def test_outputs_written_and_json_round_trips(result):
    res, out = result
    data = json.loads((out / "smoke.json").read_text())
    assert set("abcde") <= set(data) and data["machine"]["backend"] == "cpu"
    assert data["machine"]["native_topk_kernel"] is True
    md = (out / "smoke.md").read_text()
    for heading in ("## (a)", "## (b)", "## (c)", "## (d)", "## (e)", "load average", "native top-k kernel"):
        assert heading in md
    assert md.count("| 4.1e+03 | topk |") == 1


def test_part_a_rows_are_consistent(result):
    a = result[0]["a"]
    rows = {r["name"]: r for r in a["rows"]}
    assert {
        "topk",
        "randomk",
        "signsgd",
        "select.topk_indices",
        "lax.top_k(|x|)",
        "select.sample_k_distinct",
        "jax.random.choice(replace=False)",
    } <= set(rows)
    for r in a["rows"]:
        assert r["compress_x"] > 0 and math.isfinite(r["compress_x"])
        if not r.get("primitive"):
            assert r["total_x"] == pytest.approx(r["compress_x"] + r["decompress_x"])
            assert r["meets_target"] == (None if r["target_x"] is None else r["total_x"] <= r["target_x"])
    # the payload measured is the real message: its bytes equal the compressor's wire size
    for name in ("topk", "randomk", "signsgd"):
        c = C.get(name, **rows[name]["hparams"])
        assert rows[name]["payload_bytes"] == c.wire_bytes((4096,))
    assert rows["topk"]["target_x"] == 10 and rows["signsgd"]["target_x"] == 4


def test_part_b_compares_against_dense(result):
    rows = result[0]["b"]["rows"]
    assert [r["config"] for r in rows] == ["dense", "topk 1% + EF"]
    assert rows[0]["ratio_to_dense"] == 1.0
    # measured against dense blocks interleaved with its own
    assert rows[1]["ratio_to_dense"] == pytest.approx(rows[1]["step_s"] / rows[1]["dense_step_s"])
    assert rows[1]["target_x"] == 1.3
    # the CPU-time ratio is the median of per-round ratios, like the wall-clock one
    spread = rows[1]["cpu_ratio_to_reference_spread"]
    assert spread["min"] <= rows[1]["cpu_ratio_to_reference"] == spread["median"] <= spread["max"]


def test_part_c_bytes_scale_as_the_algorithms_say(result):
    c = {(r["config"], r["workers"]): r for r in result[0]["c"]["rows"]}
    assert "skipped" in c[("dense allreduce", 16)]  # the test session has 8 devices
    d2, d4 = c[("dense allreduce", 2)]["sent_worker"], c[("dense allreduce", 4)]["sent_worker"]
    assert d4 / d2 == pytest.approx((2 * 3 / 4) / (2 * 1 / 2), rel=1e-3)  # ring: 2 (P-1)/P * bytes
    t2, t4 = c[("top-k 1% allgather", 2)]["received_worker"], c[("top-k 1% allgather", 4)]["received_worker"]
    assert t4 / t2 == pytest.approx(3.0, rel=1e-3)  # allgather: (P-1) * payload
    g2, g4 = c[("gTop-k 1%", 2)]["sent_worker"], c[("gTop-k 1%", 4)]["sent_worker"]
    assert g4 / g2 == pytest.approx(2.0, rel=1e-3)  # log2 P rounds
    ps = c[("parameter server, top-k 1% up", 4)]
    assert ps["sent_worker"] < ps["received_worker"] <= ps["sent_max"] + ps["received_max"]


def test_parts_d_e_and_bad_arguments(result, bench):
    d = result[0]["d"]["rows"]
    assert {r["granularity"] for r in d} == {"layerwise", "fused"}
    assert all(r["compile_s"] > 0 and r["trace_lower_s"] > 0 for r in d)
    e = result[0]["e"]["rows"][0]
    assert e["seeds"] == 2 and e["speedup"] == pytest.approx(e["separate_total_s"] / e["vmapped_total_s"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--parts", "a,z"])
