"""The per-iteration model against published multi-GPU scaling measurements it was not fitted to
(cconv.theory.validation: what calibrated what, and the stated tolerances)."""

import statistics

import pytest

from cconv.theory import validation as V

pytestmark = pytest.mark.slow  # ~100 simulated iterations


@pytest.fixture(scope="module")
def rows():
    return V.table()


def test_every_case_within_the_stated_tolerance(rows):
    misses = {c.name: f"{err:+.1%}" for c, _, err in rows if abs(err) > V.TOLERANCE}
    assert set(misses) == set(V.KNOWN_MISSES), misses  # a new miss fails; a fixed known miss asks for an update


def test_median_error_within_the_stated_tolerance(rows):
    """Within issue 33's goal, and no worse than it stands (``MEDIAN_NOW``: lower it when the model improves)."""
    assert statistics.median(abs(err) for _, _, err in rows) <= V.MEDIAN_NOW <= V.MEDIAN_TOLERANCE


def test_compression_changes_the_speed_the_right_way(rows):
    """Issue 33's goal: the sign of (compressed - dense) right in every compressed case with a dense twin,
    except the named SIGN_MISSES; there are >= 10 such cases, some where compression slows training."""
    s = V.signs(rows)
    assert len(s) >= 10 and any(pub < 0 for _, pub, _ in s)
    wrong = {c.name for c, pub, pred in s if (pub > 0) != (pred > 0)}
    assert wrong == set(V.SIGN_MISSES), wrong


def test_calibration_and_validation_are_disjoint():
    """The constants were fitted to CALIBRATION only: no run is both fitted and checked."""
    fitted = {c.source for c in V.CALIBRATION}
    assert len(V.CALIBRATION) >= 10
    assert not fitted & {c.source for c in V.CASES + V.INCONSISTENT}
    assert all(c.network == "25GbE" for c in V.CALIBRATION)


def test_inconsistent_runs_moved_more_than_their_link():
    """GRACE's '1g' dense run moved more than 1 Gbit/s under any ring all-reduce (the reason its
    runs are shown apart), while its 10 Gbit/s dense runs stay under 10."""
    dense = [c for c in V.INCONSISTENT if c.method == V.DENSE]
    assert dense and all(V.link_bound_gbps(c) > 1.0 for c in dense)
    assert all(V.link_bound_gbps(c) < 10.0 for c in V.CASES if c.name.startswith("GRACE") and c.method == V.DENSE)


@pytest.mark.slow
def test_stated_constants_are_the_calibration_optimum():
    """implementation.py's constants are a grid point no neighbour on the grid improves (what
    ``calibrate()`` converges to on the calibration subset)."""
    import pathlib

    from cconv.theory import implementation as IM

    stated = {"op_s": IM.OP_S, "sort_passes": IM.SORT_PASSES, "host_bw": IM.HOST_BW, "round_s": IM.ROUND_S}
    best = V.calibration_loss(stated)
    without_loop = V.calibration_loss({**stated, "round_s": 0.0})  # docs/clusters.md quotes both
    doc = " ".join((pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text().split())
    assert f"from {without_loop:.4f} to {best:.4f}" in doc
    for k, grid in V.GRIDS.items():
        i = min(range(len(grid)), key=lambda j: abs(grid[j] - stated[k]))
        assert grid[i] == pytest.approx(stated[k])
        for j in (i - 1, i + 1):
            if 0 <= j < len(grid):
                assert V.calibration_loss({**stated, k: grid[j]}) >= best, (k, grid[j])


def test_cases_are_distinct_and_sourced():
    names = [c.name for c in V.CASES]
    assert len(set(names)) == len(names) >= 12
    assert all(c.source and c.published > 0 and c.metric in ("scaling", "speedup", "time_ratio") for c in V.CASES)
    assert set(V.KNOWN_MISSES) <= set(names)


def test_compressed_cases_are_predicted_with_their_compressor():
    """Issue 23 item 4: compressed runs are checked too, each through its own compressor and knob value
    (bytes, collective and compression cost), not through the dense baseline of the same setting."""
    compressed = [c for c in V.CASES if c.method != V.DENSE]
    assert len(compressed) >= 2
    for case in compressed:
        assert V.predict(case) != pytest.approx(V.predict(case._replace(method=V.DENSE, knobs=())), rel=1e-3)


def test_calibration_is_not_the_validated_number():
    """Where a report's own 1-GPU throughput calibrates the device, the prediction of one GPU on the
    same setting reproduces it exactly, so the multi-GPU number is all that is predicted."""
    case = next(c for c in V.CASES if c.one_gpu)
    one = case._replace(cluster="1x1", metric="speedup", schedule="bsp")  # no fusion cycle to wait for
    assert V.predict(one) == pytest.approx(1.0)


def test_docs_table_is_the_models(rows):
    """docs/clusters.md shows the table this code computes (regenerate it with the command there)."""
    import pathlib

    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md"
    assert V.markdown(rows) in doc.read_text()


def test_docs_calibration_and_inconsistent_tables_are_the_models():
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text()
    assert V.markdown(V.table(V.CALIBRATION), sources=False) in doc
    assert V.markdown(V.table(V.INCONSISTENT), sources=False) in doc


def test_readme_summary_is_the_models(rows):
    """The README's planner section shows the same summary (per source: cases, median and max |error|)."""
    import pathlib

    readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
    assert V.summary(rows) in readme.read_text()
    text = " ".join(readme.read_text().split())
    s = V.signs(rows)
    dense_other = [c for c, _, _ in rows if V.source_of(c) != "GRACE" and V.is_dense(c)]
    for fact in (
        f"On {len(rows)} published runs",
        f"{len(dense_other)} dense runs",
        f"the median |error| is {_pct(statistics.median(abs(e) for _, _, e in rows))}",
        f"{len(s)} compressed cases come from three independent sources",
        f"right in {sum((a > 0) == (b > 0) for _, a, b in s)} of them",
        f"{_WORDS.get(len(V.KNOWN_MISSES), len(V.KNOWN_MISSES))} named misses",
    ):
        assert fact in text, fact


_WORDS = dict(enumerate("zero one two three four five six seven eight nine ten".split()))


def test_grace_methods_map_to_entries_through_known_as():
    """The GRACE data names methods as GRACE does; the entries declare those names (no code outside
    a compressor's module names it), and an undeclared name is refused, not guessed."""
    import json
    from pathlib import Path

    import pytest

    from cconv import compressors as C
    from cconv.theory import validation as V

    rows = json.loads(Path(V.__file__).with_name("grace_runs.json").read_text(encoding="utf-8"))
    for r in rows:
        if r["method"]:
            name = C.known_as(r["method"])
            assert r["method"] in C.entry(name).known_as
    with pytest.raises(ValueError, match="no compressor"):
        C.known_as("grace:NoSuchCompressor")


def _pct(x: float, signed: bool = False) -> str:
    return (f"{x:+.1%}" if signed else f"{x:.1%}").replace("%", " %")


def test_docs_numbers_are_the_models(rows):
    """The figures docs/clusters.md quotes in its prose come from the tables this code computes."""
    import pathlib

    doc = " ".join((pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text().split())
    cal = V.table(V.CALIBRATION)
    inc = V.table(V.INCONSISTENT)
    s = V.signs(rows)
    dense_1g = next(c for c in V.INCONSISTENT if c.method == V.DENSE)
    dense_other = [e for c, _, e in rows if V.source_of(c) != "GRACE" and V.is_dense(c)]
    above = sum(e > 0 for e in dense_other)
    grace = [pub for c, pub, _ in s if V.source_of(c) == "GRACE"]
    worst = max(cal, key=lambda r: abs(r[2]))[2]
    for text in (
        f"{len(rows)} published multi-GPU measurements",
        f"Median |error| {statistics.median(abs(e) for _, _, e in rows):.1%} over the {len(rows)} cases".replace(
            "%", " %"
        ),
        f"GRACE's {len(cal)} runs at 25 Gbit/s only",
        f"median |error| {_pct(statistics.median(abs(e) for _, _, e in cal))}, largest {_pct(worst, True)}",
        f"{statistics.median(abs(e) for _, _, e in inc):.0%} off in the median".replace("%", " %"),
        f"at least {V.link_bound_gbps(dense_1g):.2f} Gbit/s",
        f"Compression slows training in {sum(pub < 0 for _, pub, _ in s)} of the {len(s)} compressed cases",
        f"{sum(p < 0 for p in grace)} of GRACE's {len(grace)}",
        f"right in {sum((a > 0) == (b > 0) for _, a, b in s)} of the {len(s)}",
        f"{len(V.SIGN_MISSES)} of {len(s)} wrong",
        f"{above} of the {len(dense_other)} dense predictions",
    ):
        assert text in doc, text


def test_three_independent_sources_of_compressed_runs(rows):
    """Issue 33's goal: >= 10 compressed cases from >= 3 independent sources, none fitted, at least one
    where compression slows training outside GRACE; dense runs of a transformer and an LSTM language
    model on 8-GPU nodes."""
    compressed = [c for c, _, _ in rows if not V.is_dense(c)]
    sources = {V.source_of(c) for c in compressed}
    assert len(compressed) >= 10 and len(sources) >= 3
    assert any(pub < 0 for c, pub, _ in V.signs(rows) if V.source_of(c) != "GRACE")
    eight = {c.workload for c in V.CASES if V.is_dense(c) and c.cluster.endswith("x8")}
    assert {"gpt2", "lstm-wt2"} <= eight


def test_new_sources_are_data_with_their_quotes():
    """Each new source is a data file naming where each number was read: Espresso's Table 1 rows are
    quoted and every scaling factor is in its quote; Global-QSGD's runs name their log and quote a line."""
    import json
    from pathlib import Path

    here = Path(V.__file__)
    esp = json.loads(here.with_name("espresso_runs.json").read_text(encoding="utf-8"))
    quotes = " ".join(esp["quote"])
    assert all(f"{r['scaling']:g}" in quotes for r in esp["runs"])
    gq = json.loads(here.with_name("gqsgd_runs.json").read_text(encoding="utf-8"))
    assert all(r["run"].endswith(".txt") and r["quote"] for r in gq["runs"])
    from cconv import compressors as C

    for data in (esp, gq):  # methods are the sources' names, each declared by exactly one compressor entry
        assert all(C.known_as(r["method"]) for r in data["runs"] if r["method"])


def test_time_ratio_is_the_iteration_time_over_the_dense_runs():
    """A time_ratio case is predicted as its iteration time over the dense run's on the same cluster."""
    case = next(c for c in V.CASES if c.metric == "time_ratio")
    assert V.predict(case._replace(method=V.DENSE, knobs=())) == pytest.approx(1.0)


def test_docs_numbers_of_the_new_sources_are_the_models(rows):
    """The figures docs/clusters.md quotes for Espresso's and Global-QSGD's cases come from the model,
    before and after their re-declaration (``REDECLARED``)."""
    import math
    import pathlib

    from cconv.theory import cluster as CL
    from cconv.theory import implementation as IM
    from cconv.theory import predict as PR
    from cconv.theory import profiles as P

    doc = " ".join((pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text().split())
    err = {c.name: e for c, _, e in rows}
    sign = {c.name: (pub, pred) for c, pub, pred in V.signs(rows)}
    by = {c.name: c for c, _, _ in rows}
    old = [
        (by[n]._replace(**V.REDECLARED[n]), None, V.predict(by[n]._replace(**V.REDECLARED[n]))) for n in V.REDECLARED
    ]
    before = {c.name: p / c.published - 1 for c, _, p in old}
    pred = {c.name: p for c, p, _ in rows}
    old_sign = {c.name: p / pred[V.dense_twin(c).name] - 1 for c, _, p in old if c.metric == "scaling"}
    esp, gq = "Espresso 8x8 V100 ", "Global-QSGD 1x4 A100 "
    lstm, bert, gpt = esp + "LSTM WikiText-2 DGC 0.01", esp + "BERT-base SQuAD EFSignSGD", esp + "GPT2 DGC 0.01"
    wq, tq = gq + "Wide ResNet-101-2 QSGD 8-bit", gq + "Transformer-XL QSGD 8-bit"
    pct0 = lambda x: f"{x:+.0%}".replace("%", " %")  # noqa: E731
    dense_esp = [abs(e) for n, e in err.items() if n.startswith(esp) and V.is_dense(by[n])]
    texts = [
        f"({_pct(err[esp + 'GPT2 dense'], True)}, {_pct(err[esp + 'LSTM WikiText-2 dense'], True)})",
        f"({pct0(err[wq])}, {pct0(err[tq])}) where per tensor they were {pct0(before[wq])} and {pct0(before[tq])}",
        f"PowerSGD on Wide ResNet-101-2 ({pct0(err[gq + 'Wide ResNet-101-2 PowerSGD r=4'])})",
        f"({pct0(err[gpt])}, {pct0(err[bert])}, {pct0(err[lstm])})",
        f"({_pct(sign[gpt][0], True)}, {_pct(sign[bert][0], True)}) and a loss ({_pct(sign[lstm][0], True)})",
        f"they were {pct0(before[gpt])}, {pct0(before[bert])} and {pct0(before[lstm])}",
        f"already {min(dense_esp):.0%}-{max(dense_esp):.0%} optimistic".replace("%-", "-").replace("%", " %"),
        f"({_pct(sign[lstm][0], True)} published, {_pct(sign[lstm][1], True)} predicted",
        f"({_pct(sign[bert][0], True)} published, {_pct(old_sign[bert], True)} predicted with every GPU's payload",
    ]
    assert (sign[bert][0] > 0) == (sign[bert][1] > 0) != (old_sign[bert] > 0)  # the sign the two-level fixed
    vectors = [s for lay in P.get("wide-resnet101-2").layers for s in lay.shapes if len(s) == 1]
    assert round(3 * len(vectors) / sum(len(lay.shapes) for lay in P.get("wide-resnet101-2").layers)) == 2
    case = by[lstm]
    c = CL.parse(case.cluster, case.intra, case.network, V.device_of(case))
    kw = dict(batch=case.batch, implementation=IM.get(case.implementation))
    sweep = {k: [v] for k, v in case.knobs}
    dgc = PR.predict(c, case.workload, [case.method], sweep=sweep, architecture=case.architecture, **kw)[0]
    dense = PR.predict(c, case.workload, [V.DENSE_PS], **kw)[0]
    texts += [f"({dgc.compress_s * 1e3:.1f} ms)", f"the {(dense.comm_s - dgc.comm_s) * 1e3:.0f} ms of traffic"]
    assert not math.isclose(dgc.compress_s, 0.0)
    for text in texts:
        assert text in doc, text


def test_redeclared_cases_and_the_before_after_table():
    """The cases declared anew after their misses were seen are named (Global-QSGD's four, Espresso's
    three compressed), each with a declaration that differs from its current one, and docs/clusters.md
    shows their before/after table as the code computes it."""
    import pathlib

    by = {c.name: c for c in V.CASES}
    assert {V.source_of(by[n]) for n in V.REDECLARED} == {"Global-QSGD", "Espresso"}
    assert len(V.REDECLARED) == 7 and not any(V.is_dense(by[n]) for n in V.REDECLARED)
    for name, old in V.REDECLARED.items():
        assert any(getattr(by[name], k) != v for k, v in old.items()), name
    gq = [c for c in V.CASES if V.source_of(c) == "Global-QSGD"]
    assert {(c.implementation, c.schedule) for c in gq} == {("ddp-hook", "wfbp")}  # PyTorch DDP hooks
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text()
    assert V.before_after() in doc


def test_docs_near_tie_numbers_are_the_models(rows):
    """docs/clusters.md's random-k 50 % near tie quotes the published changes of both runs."""
    import pathlib

    doc = " ".join((pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text().split())
    pub = {c.name: p for c, p, _ in V.signs(rows)}
    ef, plain = (pub[f"GRACE 8x1 10 Gbit/s random-k 0.5{m} (MPI)"] for m in (" EF", ""))
    assert f"ran {_pct(plain, True)} against dense where this one ran {_pct(ef, True)}" in doc


def test_horovod_2017_ticks_and_their_effect_in_the_docs(rows):
    """Horovod's chart cases run the 2017 background loop (``fusion-2017``); docs/clusters.md quotes
    its tick at 512 and 128 GPUs and each chart case's error with and without it, from the model."""
    import pathlib

    from cconv.theory import cluster as CL
    from cconv.theory.schedule import arch as A
    from cconv.theory.schedule import schedules as S

    doc = " ".join((pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text().split())
    charts = [c for c, _, _ in rows if c.name.startswith("Horovod")]
    assert len(charts) == 4 and {c.schedule for c in charts} == {"fusion-2017"}
    for gpus in (512, 128):
        net = CL.parse(f"{gpus // 4}x4", "PCIe3x16", "25GbRoCE").network()
        assert f"{S.get('fusion-2017').period_s(A.get('ring', net, gpus)) * 1e3:.1f} ms at {gpus}" in doc
    err = {c.name: e for c, _, e in rows}
    before = {c.name: V.predict(c._replace(schedule="fusion")) / c.published - 1 for c in charts}
    big = "Horovod 128x4 P100 ResNet-101"
    assert before[big] < -V.TOLERANCE <= err[big]  # the miss it fixed
    assert f"moves to {_pct(err[big], True)}" in doc
    for name in set(before) - {big}:
        assert f"from {_pct(before[name], True)} to {_pct(err[name], True)}" in doc, name
