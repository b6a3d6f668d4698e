"""Experiments: configs, runs that survive kills, sweeps, logging, reports and figures.

* ``config``      YAML run configs, validation, ``--set`` overrides, the engine's options
* ``runner``      one run: build, train, log metrics.jsonl, checkpoint, resume (``execute``)
* ``rundir``      a run directory: which run it holds, checks, lock, claim, summary.json
* ``runstate``    a run's checkpointed state: restore, save, the clock's calibration
* ``training``    the step loop (its state one ``Loop``); ``counters``: totals and metric lines
* ``evaluation``  test metrics; ``clock``: simulated time per step (``SimClock`` for a run)
* ``sweep``       grid expansion; a grid of runs: skip finished, resume interrupted, report + figure
* ``io``          atomic result files (fsync'ed JSONL lines, atomic replace)
* ``checkpoint``  orbax checkpoints of arbitrary pytrees plus host-side state
* ``writers``     metric writers (CLU-style ``write_scalars``): JSONL, TensorBoard, wandb (offline)
* ``loggers``     progress bars
* ``report``      pandas tables of runs and metric curves, bytes-to-target
* ``plotting``    convergence against bytes / steps / simulated time, ratio summaries

The command line (``cconv run|sweep|plot|report|plan``) is ``cconv.cli``.
"""

from cconv.experiments.config import ConfigError, RunConfig, load_run
from cconv.experiments.sweep import load_sweep

__all__ = ["ConfigError", "RunConfig", "load_run", "load_sweep"]
