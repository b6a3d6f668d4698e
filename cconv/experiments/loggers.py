"""Progress bars: tqdm bars on stderr, shown only when stderr is a terminal.

Where metric lines go (metrics.jsonl, TensorBoard, Weights & Biases) is
``cconv.experiments.writers`` (``WandbLogger`` is ``writers.WandbWriter``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from cconv.experiments.writers import WandbWriter


def progress_enabled() -> bool:
    return sys.stderr.isatty() and os.environ.get("CCONV_PROGRESS", "1") != "0"


def progress(total: int, desc: str, initial: int = 0, position: int | None = None, leave: bool = True) -> Any:
    """A tqdm bar on stderr; disabled (a no-op object) when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=desc,
        initial=initial,
        position=position,
        leave=leave,
        disable=not progress_enabled(),
        file=sys.stderr,
        dynamic_ncols=True,
        unit="step",
    )


# The wandb writer moved to ``cconv.experiments.writers`` (one ``MetricWriter`` interface for all
# backends); the old name stays importable.
WandbLogger = WandbWriter
