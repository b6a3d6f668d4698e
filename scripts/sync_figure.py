"""The synchronization-modes figure of studies/sync.yaml: test loss vs simulated time and vs
bytes, one panel per mode, equal-speed workers (solid) and 25% stragglers slowed 4x (dashed).

    python scripts/sync_figure.py results/sync paper_figures/sync

writes <prefix>_time.png/.pdf and <prefix>_bytes.png/.pdf and prints the numbers the README
quotes (final test loss, simulated time and bytes per worker of every run).
"""

from __future__ import annotations

import sys

from cconv.experiments import plotting, report

MODES = [
    ("bsp", "BSP"),
    ("ssp2", "SSP s=2"),
    ("ssp8", "SSP s=8"),
    ("asp", "ASP (PS)"),
    ("local4", "local SGD H=4"),
    ("adacomm", "AdaComm"),
    ("gossip-ring", "D-PSGD ring"),
    ("gossip-exp", "D-PSGD exponential"),
    ("choco-topk", "CHOCO top-k 1%"),
    ("choco-sign", "CHOCO scaled sign"),
]
AXES = {
    "time": ("sim_time", "simulated time on 10GbE [s]"),
    "bytes": ("cum_bytes", "bytes per worker, sent + received"),
}


def main(results: str, prefix: str) -> int:
    plt = plotting._plt()
    df = report.load_metrics([results])
    df = df[df["test_loss"].notna()]
    slow = df["cfg.stragglers.fraction"].notna() if "cfg.stragglers.fraction" in df.columns else df["step"] < 0
    df = df.assign(stragglers=slow)
    for axis, (col, label) in AXES.items():
        fig, axes = plt.subplots(2, 5, figsize=(17, 6.4), sharey=True, constrained_layout=True)
        ref = df[(df["cfg.name"] == "bsp") & ~df["stragglers"]].sort_values("step")
        for ax, (mode, title) in zip(axes.flat, MODES):
            ax.plot(ref[col], ref["test_loss"], color="0.75", lw=2.5, label="BSP, equal speeds")
            for st, ls in ((False, "-"), (True, "--")):
                g = df[(df["cfg.name"] == mode) & (df["stragglers"] == st)].sort_values("step")
                if len(g):
                    lab = "25% stragglers x4" if st else "equal speeds"
                    ax.plot(g[col], g["test_loss"], ls, color="C0" if not st else "C3", label=lab)
            ax.set_title(title)
            ax.set_xscale("log" if axis == "bytes" else "linear")
            ax.grid(alpha=0.3)
        for ax in axes[-1]:
            ax.set_xlabel(label)
        for ax in axes[:, 0]:
            ax.set_ylabel("test loss")
        axes.flat[0].legend(fontsize=8)
        fig.suptitle(
            f"digits MLP, 8 workers, 200 logged steps: test loss vs {axis} "
            "(local SGD, gossip: the averaged model; ASP: one step = 8 arrivals)"
        )
        for path in plotting.save(fig, f"{prefix}_{axis}.png"):
            print(f"wrote {path}")
    last = df.sort_values("step").groupby(["cfg.name", "stragglers"]).tail(1)
    print(f"{'mode':<14} {'stragglers':<10} {'test_loss':>9} {'sim_time s':>10} {'bytes/worker':>13}")
    for mode, _ in MODES:
        for st in (False, True):
            r = last[(last["cfg.name"] == mode) & (last["stragglers"] == st)]
            if len(r):
                r = r.iloc[0]
                print(f"{mode:<14} {str(st):<10} {r['test_loss']:>9.4f} {r['sim_time']:>10.3f} {r['cum_bytes']:>13.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
