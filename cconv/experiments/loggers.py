"""Where metric lines go besides metrics.jsonl: Weights & Biases, and progress bars.

wandb is optional (the ``wandb`` extra) and **offline by default**: unless the config sets
``wandb: {mode: online}`` or the environment sets ``WANDB_MODE``, runs are written under the run
directory (``<run>/wandb/``) and can be pushed later with ``wandb sync``.  Every metric is charted
against ``cum_bytes`` (``define_metric("*", step_metric="cum_bytes")``), so loss-versus-traffic is
the default x axis there; ``step`` and ``sim_time*`` are logged too for the other axes.

Progress bars are tqdm bars on stderr, shown only when stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
from typing import Any


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


class WandbLogger:
    """Mirror metric lines to a wandb run (one wandb run per cconv run; resumes with the same id)."""

    def __init__(self, options: Any, config: dict, run_dir: str, run_name: str, run_id: str):
        opts = dict(options) if isinstance(options, dict) else {}
        mode = opts.pop("mode", None) or os.environ.get("WANDB_MODE") or "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb
        except ImportError:
            raise ValueError(
                "wandb logging is enabled but wandb is not installed (pip install 'cconv[wandb]', or set wandb: false)"
            ) from None
        self._wandb = wandb
        self.run = wandb.init(
            project=opts.pop("project", "cconv"),
            entity=opts.pop("entity", None),
            group=opts.pop("group", None),
            tags=opts.pop("tags", None),
            name=run_name,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=run_dir,
            config=config,
            reinit="finish_previous",
        )
        self.run.define_metric("cum_bytes")
        self.run.define_metric("*", step_metric="cum_bytes")

    def log(self, record: dict) -> None:
        data = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(data)

    def finish(self, summary: dict | None = None, exit_code: int | None = None) -> None:
        if summary:
            for k, v in summary.items():
                if isinstance(v, (int, float, str)):
                    self.run.summary[k] = v
        self.run.finish(exit_code=exit_code)
