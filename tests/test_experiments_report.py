"""Reports and figures from result directories (metric files written here by hand)."""

import math
import os

import pytest

from cconv.experiments import io, plotting, report
from cconv.experiments.config import from_dict, to_yaml


def make_run(root, name, cfg, losses, per_step_bytes, status="completed", seeds=(0,)):
    d = os.path.join(root, name)
    os.makedirs(d)
    io.atomic_write_text(os.path.join(d, io.CONFIG), to_yaml(from_dict(cfg)))
    with io.LineLog(os.path.join(d, io.METRICS)) as w:
        for seed in seeds:
            for i, loss in enumerate(losses):
                step = 10 * (i + 1)
                w.write(
                    {
                        "step": step,
                        "seed": seed,
                        "loss": loss + 0.01 * seed,
                        "test_accuracy": 1 - loss / 3,
                        "cum_bytes": step * per_step_bytes,
                        "sim_time@10GbE": step * 1e-3,
                        "sim_time": step * 1e-3,
                        "wall_time": step * 0.01,
                    }
                )
    io.write_json(os.path.join(d, io.SUMMARY), {"status": status, "error": None})
    return d


@pytest.fixture
def sweep(tmp_path):
    root = str(tmp_path / "sweep")
    base = {"workers": 2, "batch_size": 8, "target_loss": 0.5}
    make_run(root, "dense", {**base}, [2.0, 1.0, 0.4, 0.3], 1000.0)
    for r in (0.01, 0.1):
        for mem in ("none", "ef"):
            slow = 0.2 if mem == "none" else 0.0
            make_run(
                root,
                f"topk{r}{mem}",
                {**base, "compressor": {"name": "topk", "ratio": r}, "memory": mem},
                [2.0, 1.2, 0.6 + slow, 0.45 + slow],
                1000.0 * 2 * r,
                seeds=(0, 1),
            )
    make_run(
        root,
        "sign",
        {**base, "compressor": "signsgd", "memory": "ef"},
        [2.0, 1.5, 1.2, 1.0],
        1000 / 32.0,
        status="diverged",
    )
    return root


def test_load_runs_bytes_to_target(sweep):
    df = report.load_runs([sweep])
    assert len(df) == 1 + 4 * 2 + 1  # one row per (run, seed)
    dense = df[df["run"] == "dense"].iloc[0]
    assert dense["bytes_to_target"] == 30 * 1000.0 and dense["steps_to_target"] == 30
    assert dense["time_to_target"] == pytest.approx(0.03)
    ef = df[(df["run"] == "topk0.1ef") & (df["seed"] == 0)].iloc[0]
    assert ef["bytes_to_target"] == pytest.approx(40 * 200.0) and ef["compressor"] == "topk" and ef["ratio"] == 0.1
    assert math.isnan(df[df["run"] == "topk0.1none"].iloc[0]["bytes_to_target"])  # never reached
    assert df[df["run"] == "sign"].iloc[0]["status"] == "diverged"
    # an explicit target and an accuracy metric (reached when >= target)
    acc = report.load_runs([sweep], target=0.8, metric="test_accuracy")
    assert acc[acc["run"] == "dense"].iloc[0]["steps_to_target"] == 30
    text = report.format_table(df)
    assert "bytes_to_target" in text and "dense" in text


def test_load_metrics_has_config_columns(sweep):
    df = report.load_metrics([os.path.join(sweep, "dense"), os.path.join(sweep, "sign")])
    assert set(df["run"]) == {"dense", "sign"} and len(df) == 8
    assert {"compressor", "memory", "ratio", "cfg.workers", "cfg.compressor.name"} <= set(df.columns)
    with pytest.raises(ValueError, match="no such results directory"):
        report.find_runs([sweep + "_missing"])
    os.makedirs(sweep + "_empty")
    with pytest.raises(ValueError, match="no cconv runs"):
        report.find_runs([sweep + "_empty"])


@pytest.mark.slow
def test_figures_are_written(sweep, tmp_path):
    df = report.load_metrics([sweep])
    outs = plotting.family_grid(df, x="bytes", y="loss", out=str(tmp_path / "grid.png"))
    assert outs == [str(tmp_path / "grid.png"), str(tmp_path / "grid.pdf")]
    outs += plotting.curves(df, x="time", y="test_accuracy", network="10GbE", out=str(tmp_path / "c.png"))
    outs += plotting.ratio_summary(report.load_runs([sweep]), out=str(tmp_path / "ratio.png"))
    for o in outs:
        assert os.path.getsize(o) > 1000
    with pytest.raises(ValueError, match="available: 10GbE"):
        plotting.curves(df, x="time", network="100GbIB", out=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="valid: bytes, bytes_encoded, steps, time"):
        plotting.curves(df, x="epochs", out=str(tmp_path / "x.png"))


def test_aggregate_over_seeds(sweep):
    runs = report.load_runs([sweep])
    agg = report.aggregate(runs)
    assert len(agg) == 6 and agg["run"].is_unique and agg["label"].is_unique
    assert agg["run"].tolist()[0] == "dense"  # legend order: the baseline first
    ef = agg[agg["run"] == "topk0.1ef"].iloc[0]
    seeds = runs[runs["run"] == "topk0.1ef"]
    assert ef["seeds"] == 2 and ef["reached"] == 2 and ef["status"] == "completed"
    assert ef["label"] == "top-k (ratio=0.1), EF"
    assert ef["loss_mean"] == pytest.approx(seeds["loss"].mean())  # 0.45 and 0.46
    assert ef["loss_std"] == pytest.approx(seeds["loss"].std(ddof=1))
    assert ef["bytes_to_target_mean"] == pytest.approx(40 * 200.0) and ef["bytes_to_target_std"] == 0.0
    assert agg[agg["run"] == "topk0.1none"].iloc[0]["reached"] == 0
    dense = agg[agg["run"] == "dense"].iloc[0]
    assert dense["seeds"] == 1 and math.isnan(dense["loss_std"]) and dense["label"] == "dense (no compression), no EF"
    assert agg[agg["run"] == "sign"].iloc[0]["status"] == "diverged"
    text = report.format_aggregate(agg)
    lines = text.splitlines()
    assert "reached" in lines[0] and "bytes_to_target" in lines[0] and "nan" not in text
    row = next(line for line in lines if line.lstrip().startswith("top-k (ratio=0.1), EF"))
    assert "0.4550 ± 0.0071" in row and " 2/2 " in row  # loss over the two seeds; bytes equal: no ±
    assert "8kB ±" not in row and " 0/2 " in next(line for line in lines if "ratio=0.1), no EF" in line)
    mixed = runs.copy()
    mixed.loc[(mixed["run"] == "topk0.1ef") & (mixed["seed"] == 1), "status"] = "diverged"
    assert report.aggregate(mixed).set_index("run").loc["topk0.1ef", "status"] == "1 completed, 1 diverged"


def _capture(monkeypatch):
    """Keep the figures plotting would save (their legends are what a reader sees)."""
    figs = []

    def save(fig, out):
        figs.append(fig)
        return [out]

    monkeypatch.setattr(plotting, "save", save)
    return figs


def _legend(ax):
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()], leg.get_title().get_text(), leg


def test_curves_labels_bands_and_legend(sweep, tmp_path, monkeypatch):
    figs = _capture(monkeypatch)
    df = report.load_metrics([sweep])
    plotting.curves(df, band="ci95", target=0.5, out=str(tmp_path / "c.png"))
    texts, title, leg = _legend(figs[-1].axes[0])
    assert texts == [
        "dense (no compression), no EF (1 seed)",
        "signSGD, EF (1 seed)",
        "top-k (ratio=0.01), EF",
        "top-k (ratio=0.01), no EF",
        "top-k (ratio=0.1), EF",
        "top-k (ratio=0.1), no EF",
        "target training loss 0.5",
    ]
    assert title == "mean of 1-2 seeds, band: 95% CI (t, n-1 dof)"
    assert leg.get_bbox_to_anchor().x0 > figs[-1].axes[0].get_window_extent().x1 - 1  # outside: > 5 entries
    plotting.curves(df[df["run"].isin(["dense", "sign"])], band="none", legend="auto", out=str(tmp_path / "d.png"))
    texts, title, leg = _legend(figs[-1].axes[0])
    assert texts == ["dense (no compression), no EF", "signSGD, EF"] and title == ""  # one seed each: no note
    assert leg._loc == 0  # 'best'
    ax = figs[0].axes[0]
    assert len(ax.collections) == 4  # a band for each two-seed run, none for one seed
    with pytest.raises(ValueError, match="unknown legend placement 'left'"):
        plotting.curves(df, legend="left", out=str(tmp_path / "x.png"))


def test_family_grid_and_ratio_summary_variants(tmp_path, monkeypatch):
    root = str(tmp_path / "wire")
    base = {"workers": 2, "batch_size": 8, "target_loss": 0.5}
    make_run(root, "dense", base, [2.0, 1.0, 0.4, 0.3], 1000.0)
    for r in (0.01, 0.1):
        for pos, scale in (("int32", 1.0), ("golomb", 0.5)):
            cfg = {**base, "compressor": {"name": "topk", "ratio": r, "positions": pos}, "memory": "ef"}
            make_run(root, f"t{r}{pos}", cfg, [2.0, 1.2, 0.45, 0.4], 1000.0 * 2 * r * scale, seeds=(0, 1, 2))
    figs = _capture(monkeypatch)
    df = report.load_metrics([root])
    plotting.family_grid(df, band="std", out=str(tmp_path / "g.png"))
    texts, title, _ = _legend(figs[-1].axes[0])
    assert texts == ["ratio = 0.01", "ratio = 0.1", "positions=golomb", "positions=int32", "dense baseline", "EF"]
    assert title == "mean of 1-3 seeds, band: +-1 std"
    markers = {line.get_marker() for line in figs[-1].axes[0].get_lines() if line.get_color() != "black"}
    assert len(markers - {"None", "x"}) == 2  # one marker per positions
    runs = report.load_runs([root])
    plotting.ratio_summary(runs, x="bytes", band="sem", out=str(tmp_path / "r.png"))
    ax = figs[-1].axes[0]
    texts, title, _ = _legend(ax)
    assert texts == ["top-k (positions=golomb)", "top-k (positions=int32)", "dense baseline", "EF"]
    ys = sorted(tuple(line.get_ydata()) for line in ax.get_lines() if len(line.get_xdata()) == 2)
    assert ys == [(300.0, 3000.0), (600.0, 6000.0), (30000.0, 30000.0)]  # golomb, int32, dense (axhline)
    plotting.ratio_summary(runs, x="steps", out=str(tmp_path / "s.png"))
    assert figs[-1].axes[0].get_ylabel() == "steps to reach target"
    with pytest.raises(ValueError, match="no cum_bytes_encoded in these results"):
        plotting.ratio_summary(runs, x="bytes_encoded", out=str(tmp_path / "e.png"))
    with pytest.raises(ValueError, match="unknown x axis 'loss' for a ratio summary"):
        plotting.ratio_summary(runs, x="loss", out=str(tmp_path / "e.png"))


@pytest.mark.extended  # CI: test_cli.py::test_sweep_outputs_report_and_plot reports a real sweep
@pytest.mark.slow  # trains a tiny sweep (3 runs x 2 seeds)
def test_real_sweep_through_the_cli(tmp_path, capsys):
    import pandas as pd

    from cconv import cli
    from cconv.experiments import sweep as sweeps

    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "name: tiny\n"
        "base: {model: {name: mlp, hidden: [8]}, data: digits, workers: 2, batch_size: 16, steps: 16, lr: 0.1,\n"
        "       seed: [0, 1], log_every: 4, checkpoint_every: 16, network: 10GbE, name: same}\n"
        "grid:\n"
        "  compressor: [{name: topk, ratio: 0.1}, {name: qsgd, levels: 16}]\n"
        "  memory: [none]\n"
        "include:\n"
        "  - {compressor: none, memory: none}\n"
    )
    out = tmp_path / "out"
    res = sweeps.run_sweep(str(spec), str(out), figure=False, log=lambda *a, **k: None)
    assert res["completed"] == 3, res
    target = float(report.load_runs([str(out)])["loss"].max()) + 0.05  # every seed reaches it
    csv = tmp_path / "agg.csv"
    assert cli.main(["report", str(out), "--aggregate", "--target", str(target), "--csv", str(csv)]) == 0
    printed = capsys.readouterr().out
    agg = pd.read_csv(csv)
    assert len(agg) == 3 and (agg["seeds"] == 2).all() and (agg["reached"] == 2).all()
    assert agg["label"].tolist() == ["dense (no compression)", "QSGD", "top-k"]  # name: same is ignored
    assert (agg["loss_std"] > 0).all() and "±" in printed and "nan" not in printed
    for kind, extra in (("curves", ["--band", "ci95"]), ("ratio-summary", ["--target", str(target)])):
        png = tmp_path / f"{kind}.png"
        assert cli.main(["plot", str(out), "--kind", kind, *extra, "--out", str(png)]) == 0
        assert png.stat().st_size > 1000 and png.with_suffix(".pdf").stat().st_size > 1000
    capsys.readouterr()
    assert cli.main(["plot", str(out), "--kind", "ratio-summary", "--panels", "family"]) == 2
    assert "--panels applies to --kind curves" in capsys.readouterr().err


def _diverging_sweep(root):
    """A sweep directory in its file's order (top-k, then signSGD, then the baseline): signSGD without
    EF went above the axes at step 20, came back, and diverged at step 40 by its summary; top-k 0.1
    without EF leaves the axes at step 30 without diverging (the cap is 1.5 x the first loss, 3)."""
    base = {"workers": 2, "batch_size": 8}
    runs = {}
    for r in (0.01, 0.1):
        for mem in ("none", "ef"):
            cfg = {**base, "compressor": {"name": "topk", "ratio": r}, "memory": mem}
            up = r == 0.1 and mem == "none"
            runs[f"topk{r}{mem}"] = make_run(root, f"topk{r}{mem}", cfg, [2.0, 1.2, 4.0 if up else 0.6], 100.0)
    for mem in ("none", "ef"):
        cfg = {**base, "compressor": "signsgd", "memory": mem}
        losses = [2.0, 4.0, 1.0, 30.0] if mem == "none" else [2.0, 1.0, 0.5]
        runs[f"sign{mem}"] = make_run(root, f"sign{mem}", cfg, losses, 9.0)
    runs["dense"] = make_run(root, "dense", base, [2.0, 1.0, 0.4], 1000.0)
    per_seed = {"0": {"status": "diverged", "diverged_at_step": 40, "diverged_why": "loss 30 at step 40 > 10 x 2"}}
    summary = {"status": "diverged", "error": "x", "per_seed": per_seed}
    io.write_json(os.path.join(runs["signnone"], io.SUMMARY), summary)
    io.write_json(os.path.join(root, io.SWEEP_INDEX), {"name": "s", "runs": {r: {} for r in runs}, "configs": {}})
    return root


def _texts(fig):
    return {ax.get_title(): _legend(ax)[0] for ax in fig.axes if ax.get_visible() and ax.get_legend()}


def test_a_diverged_run_is_named_in_every_legend(tmp_path, monkeypatch):
    """Issue 35: signSGD without EF left the quickstart figure as an unexplained x."""
    root = _diverging_sweep(str(tmp_path / "s"))
    figs = _capture(monkeypatch)
    df = report.load_metrics([root])
    assert df.groupby("run")["diverged_at_step"].max().dropna().to_dict() == {"signnone": 40.0}
    plotting.family_grid(df, out=str(tmp_path / "g.png"))
    texts = _texts(figs[-1])
    assert "no EF: diverged at step 40" in texts["signSGD"]
    assert "ratio = 0.1, no EF: above the axis from step 30" in texts["top-k"]  # left the axes, did not diverge
    sign = next(ax for ax in figs[-1].axes if ax.get_title() == "signSGD")
    (curve,) = [ln for ln in sign.get_lines() if ln.get_color() == "tab:orange" and ln.get_marker() != "x"]
    assert list(curve.get_ydata()) == [2.0, 3.0, 1.0, 3.0]  # the excursion runs along the top; cut at step 40
    plotting.curves(df, out=str(tmp_path / "c.png"))
    (single,) = _texts(figs[-1]).values()
    assert "signSGD, no EF: diverged at step 40" in single
    assert "top-k (ratio=0.1), no EF: above the axis from step 30" in single
    assert sum("step" in t for t in single) == 2  # the others are not annotated


def test_family_panels_in_sweep_order_baseline_dashed_memories_distinct(tmp_path, monkeypatch):
    """Issue 35: panels were alphabetical, the baseline solid where the guide says dashed, and a
    family without ratios (TernGrad, signSGD) drew EF and no EF in one colour."""
    root = _diverging_sweep(str(tmp_path / "s"))
    figs = _capture(monkeypatch)
    df = report.load_metrics([root])
    assert report.sweep_order([root])[:2] == ["topk0.01none", "topk0.01ef"]
    plotting.family_grid(df, out=str(tmp_path / "g.png"), order=report.sweep_order([root]))
    axes = [ax for ax in figs[-1].axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["top-k", "signSGD"]  # the sweep file's order
    plotting.family_grid(df, out=str(tmp_path / "g.png"))  # without an order: registry (name) order
    assert [ax.get_title() for ax in figs[-1].axes if ax.get_visible()] == ["signSGD", "top-k"]
    for ax in axes:
        black = [ln for ln in ax.get_lines() if ln.get_color() == "black"]
        assert black and all(ln.get_linestyle() == "--" for ln in black)
        _, _, leg = _legend(ax)
        (handle,) = [h for h in leg.legend_handles if h.get_label() == "dense baseline"]
        assert handle.get_linestyle() == "--"
    sign = axes[1]
    curves = [ln for ln in sign.get_lines() if ln.get_color() != "black" and ln.get_marker() != "x"]
    colours = {ln.get_linestyle(): ln.get_color() for ln in curves}
    assert colours["-"] != colours["--"]  # EF solid, no EF dashed, and in two colours
    _, _, leg = _legend(sign)
    named = {h.get_label(): h.get_color() for h in leg.legend_handles}
    assert named["EF"] == colours["-"] and named["no EF"] == colours["--"]  # the legend says which


def test_plot_groups_a_sweep_by_family_by_default(tmp_path, monkeypatch, capsys):
    """Issue 35: ``cconv plot`` on a sweep drew every run in one panel (29 lines for the quickstart)."""
    from cconv import cli

    root = _diverging_sweep(str(tmp_path / "s"))
    figs = _capture(monkeypatch)
    assert cli.main(["plot", root, "--out", str(tmp_path / "p.png")]) == 0
    assert [ax.get_title() for ax in figs[-1].axes if ax.get_visible()] == ["top-k", "signSGD"]
    assert cli.main(["plot", root, "--panels", "single", "--out", str(tmp_path / "p.png")]) == 0
    assert len(figs[-1].axes) == 1 and len(_legend(figs[-1].axes[0])[0]) == 7
    one = os.path.join(root, "topk0.01ef")  # one family (and the baseline): one panel
    assert cli.main(["plot", one, os.path.join(root, "dense"), "--out", str(tmp_path / "p.png")]) == 0
    assert len(figs[-1].axes) == 1
    assert plotting.panels_for(report.load_metrics([one]), "family") == "family"
    capsys.readouterr()


def test_a_one_bit_adam_run_is_its_own_panel_its_line_named_in_its_colour(tmp_path, monkeypatch):
    """Issue 37: a 1-bit Adam run (config ``compressor: none``, its optimizer sends 1-bit momenta
    with EF) was drawn as a second dense baseline.  It is its own panel, titled by the optimizer's
    label, its line in the legend in its colour; under two decades of traffic the byte axis labels
    only 10^n and 3 x 10^n (matplotlib's 2, 3, 4, 6 x 10^n overlapped)."""
    root = str(tmp_path / "s")
    base = {"model": "mlp", "data": "digits", "workers": 2, "steps": 40, "lr": 0.1}
    onebit = {**base, "optimizer": {"name": "onebit_adam", "warmup_steps": 2}, "lr": 0.003}
    make_run(root, "dense", base, [2.0, 1.0, 0.5, 0.3], 1.0e6)
    make_run(root, "onebit", onebit, [2.0, 1.0, 0.2, 0.05], 2.0e5)
    make_run(root, "q", {**base, "compressor": {"name": "qsgd", "levels": 8}}, [2.0, 1.1, 0.6, 0.4], 3.0e5)
    figs = _capture(monkeypatch)
    df = report.load_metrics([root])
    plotting.family_grid(df, out=str(tmp_path / "g.png"))
    axes = {ax.get_title(): ax for ax in figs[-1].axes if ax.get_visible()}
    assert list(axes) == ["QSGD", "1-bit Adam"]
    ax = axes["1-bit Adam"]
    (line,) = [ln for ln in ax.get_lines() if ln.get_color() != "black"]
    _, _, leg = _legend(ax)
    named = {h.get_label(): (h.get_color(), h.get_linestyle()) for h in leg.legend_handles}
    assert named["EF"] == (line.get_color(), line.get_linestyle()) and "dense baseline" in named
    figs[-1].canvas.draw()
    lo, hi = ax.get_xlim()
    assert hi < 100 * lo
    shown = [
        t
        for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)
        if t.get_text() and lo <= t.get_position()[0] <= hi
    ]
    mantissas = {round(t.get_position()[0] / 10 ** math.floor(math.log10(t.get_position()[0])), 6) for t in shown}
    assert shown and mantissas <= {1.0, 3.0}, [t.get_text() for t in shown]
