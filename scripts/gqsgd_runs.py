"""Recompute the Global-QSGD iteration times cconv checks its time model on, from the release's logs.

    git clone https://github.com/sands-lab/global-qsgd && cd global-qsgd
    git checkout f0396e5727755ac6dbc9b9d4174999700518d05d      # the logs were removed later
    python scripts/gqsgd_runs.py path/to/global-qsgd            # prints each run's ms and the JSON's

Each run of cconv/theory/gqsgd_runs.json names its log (``run``) and the statistic taken from it:
for the ImageNet runs (models/ResNet101) the median over the epochs of the epoch-mean ``Time`` that
the PyTorch ImageNet example prints at iteration 781/782; for Transformer-XL the median of the
``ms/batch`` values (each the mean of 10 steps).  Nothing is fitted here; exit 1 if a value differs.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

EPOCH_END = re.compile(r"Epoch: \[\d+\]\[781/782\]\s+Time\s+[\d.]+ \(\s*([\d.]+)\)")
MS_BATCH = re.compile(r"ms/batch\s+([\d.]+)")


def run_ms(log: str) -> float:
    """The run's iteration time in ms: the median of its epoch means, or of its ms/batch values."""
    epochs = [1e3 * float(x) for x in EPOCH_END.findall(log)]
    return round(statistics.median(epochs or [float(x) for x in MS_BATCH.findall(log)]), 1)


def main(release: str) -> int:
    data = json.loads((Path(__file__).resolve().parents[1] / "cconv/theory/gqsgd_runs.json").read_text())
    bad = 0
    for r in data["runs"]:
        log = (Path(release) / r["run"]).read_text(errors="replace")
        got = run_ms(log)
        bad += got != r["ms"]
        print(f"{r['label']:40s} {got:8.1f} ms (gqsgd_runs.json: {r['ms']})")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/gqsgd_runs.py PATH_TO_GLOBAL_QSGD_CHECKOUT")
    sys.exit(main(sys.argv[1]))
