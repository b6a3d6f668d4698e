"""``cconv calibrate --out FILE`` and ``cconv plan --device-profile FILE`` (cconv.theory.device_profile):
the profile's content is checked, written only over a profile, and changes the plan as documented."""

import json

import pytest

from cconv.theory import cluster as CL
from cconv.theory import device_profile as DP
from cconv.theory import predict as PR
from cconv.theory import profiles as P

PROFILE = {
    "kind": DP.KIND,
    "version": DP.VERSION,
    "device": {"name": "toy", "flops": 1e12, "mem_bw": 1e10, "launch_s": 1e-5},
    "compressors": {"topk": [{"d": 1000, "compress_x": 3.0, "decompress_x": 1.0}]},
}


def test_profile_changes_the_plan_as_documented():
    """Compute = FLOPs / the profile's FLOP/s; the fused compress/decompress of a layer of d elements
    = its measured multiple x 4 d / the profile's bandwidth + the profile's launch cost (x P decodes
    after top-k's all-gather), d the layer's compressed elements: its vectors travel dense, uncompressed
    (the engine's default)."""
    device, bench = DP.parse(PROFILE)
    c = CL.parse("4x1", "NVLink", "10GbE", device)
    prof = P.get("resnet50")
    (row,) = PR.predict(c, "resnet50", ["topk"], sweep={"ratio": [0.01]}, bench=bench)
    assert row.compute_s == pytest.approx((prof.fwd_flops + prof.bwd_flops) / 1e12)
    n = sum(any(len(s) > 1 for s in lay.shapes) for lay in prof.layers)
    vectors = sum(s[0] for lay in prof.layers for s in lay.shapes if len(s) == 1)
    assert n == len(prof.layers) and vectors > 0  # each layer has a kernel; its biases and BN scales are vectors
    floors = 4 * (prof.params - vectors) / 1e10
    assert row.compress_s == pytest.approx(3.0 * floors + n * 1e-5 + 4 * 1.0 * floors + n * 1e-5)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({**PROFILE, "kind": "x"}, "not a cconv device profile"),
        ({**PROFILE, "version": 9}, "version 9"),
        ({**PROFILE, "device": {"name": "t", "flops": -1, "mem_bw": 1, "launch_s": 1}}, "flops must be a finite"),
        ({**PROFILE, "compressors": {"nope": [{"d": 1, "compress_x": 1, "decompress_x": 1}]}}, "not a registered"),
        ({**PROFILE, "compressors": {"topk": [{"d": 1, "compress_x": float("nan"), "decompress_x": 1}]}}, "finite"),
    ],
)
def test_bad_profiles_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        DP.parse(bad)


def test_write_replaces_only_a_profile(tmp_path):
    out = tmp_path / "p.json"
    DP.write(str(out), PROFILE)
    assert DP.load(str(out))[0].flops == 1e12
    DP.write(str(out), {**PROFILE, "device": {**PROFILE["device"], "flops": 2e12}})  # a profile: replaced
    assert DP.load(str(out))[0].flops == 2e12
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="not a cconv device profile; not overwriting"):
        DP.write(str(other), PROFILE)
    assert json.loads(other.read_text()) == {"mine": 1}


def test_plan_refuses_a_profile_beside_device_or_without_cluster(tmp_path, capsys):
    from cconv.theory import plan_cli

    out = tmp_path / "p.json"
    DP.write(str(out), PROFILE)
    base = ["--workload", "resnet50", "--methods", "none"]
    assert plan_cli.main([*base, "--cluster", "2x1", "--device", "v100", "--device-profile", str(out)]) == 2
    assert "--device or --device-profile, not both" in capsys.readouterr().err
    assert plan_cli.main([*base, "--workers", "2", "--network", "10GbE", "--device-profile", str(out)]) == 2
    assert "--device-profile need(s) --cluster" in capsys.readouterr().err
    assert plan_cli.main([*base, "--cluster", "2x1", "--device-profile", str(out)]) == 0
    assert "device toy: 1e+12 FLOP/s" in capsys.readouterr().out


@pytest.mark.slow
def test_calibrate_measures_and_plan_reads_it(tmp_path, capsys):
    from cconv import cli

    out = tmp_path / "prof.json"
    argv = ["calibrate", "--out", str(out), "--methods", "topk,signsgd", "--sizes", "1000,4000", "--repeats", "2"]
    assert cli.main(argv) == 0
    device, bench = DP.load(str(out))
    assert device.flops > 0 and device.mem_bw > 0 and device.launch_s > 0
    assert set(bench) == {"topk", "signsgd"} and all(len(r) == 2 for r in bench.values())
    capsys.readouterr()
    plan = ["plan", "--workload", "resnet50", "--cluster", "2x1", "--methods", "none,topk", "--ratios", "0.01"]
    assert cli.main([*plan, "--device-profile", str(out)]) == 0
    assert f"device {device.name}: {device.flops:.3g} FLOP/s" in capsys.readouterr().out
    assert cli.main(["calibrate", "--out", str(out), "--sizes", "10"]) == 2  # bad input: the old profile stays
    assert DP.load(str(out))[0] == device


def test_device_numbers_grow_the_problem_past_launch_cost(monkeypatch):
    """A device number is the best rate over sizes doubled until one call takes MIN_CALL_S: a call
    dominated by a fixed launch cost (a GPU's small matrix product) does not set the device's rate,
    and growth stops at the first size that runs long enough (a CPU measures one size)."""
    launch, rate = 1e-3, 1e9  # a toy device: 1 ms per call + work / 1e9 per second
    seen = []

    def fake_median(fn, arg, repeats):
        seen.append(arg)
        return launch + arg / rate

    monkeypatch.setattr(DP, "_median_s", fake_median)
    got = DP._grown_rate(lambda n: (None, n), lambda n: float(n), (1e5, 4e6, 1e8), repeats=1)
    assert seen == [1e5, 4e6]  # 1e5 takes 1.1 ms (launch-bound), 4e6 5 ms >= MIN_CALL_S: stop there
    assert got == pytest.approx(4e6 / (launch + 4e6 / rate))  # 0.8e9/s, not 1e5's 0.09e9/s
    seen.clear()
    DP._grown_rate(lambda n: (None, n), lambda n: float(n), (1e8, 1e9), repeats=1)
    assert seen == [1e8]  # long enough at once: one size, as on a CPU


def test_calibrate_refuses_its_out_before_measuring_and_makes_its_directory(tmp_path, monkeypatch, capsys):
    """``--out`` is checked before minutes of measuring (a link, a directory, another file: one
    line, exit 2, nothing measured or written); a missing directory is made, as ``report --csv``
    makes its own."""
    from cconv.theory import calibrate_cli

    measured = []
    monkeypatch.setattr(DP, "measure", lambda *a, **k: measured.append(1) or PROFILE)
    run = calibrate_cli.COMMAND.handler
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "dir.json").mkdir()
    for bad in ("notes.json", "link.json", "dir.json"):
        args = type("A", (), {"out": str(tmp_path / bad), "methods": "topk", "sizes": None, "repeats": None})
        assert run(args) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert measured == [] and not (tmp_path / "elsewhere.json").exists()
    assert json.loads(other.read_text()) == {"mine": 1}
    args = type(
        "A", (), {"out": str(tmp_path / "new" / "dir" / "p.json"), "methods": "topk", "sizes": None, "repeats": None}
    )
    assert run(args) == 0 and measured == [1]
    assert DP.load(str(tmp_path / "new" / "dir" / "p.json"))[0].flops == 1e12
