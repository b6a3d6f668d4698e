"""Theory: compressor constants, the alpha-beta network model, simulated time, and the planner.

* ``cconv.theory.constants``: omega (unbiased) or delta (contractive), bits per element, and the
  exact x-dependent values, for every registered compressor.
* ``cconv.theory.network``: ``Network(name, alpha, beta)``, presets calibrated on the survey's
  measurements, collective times, ``step_comm_time`` for the engine's ``Collective`` lists.
* ``cconv.theory.workloads``: ResNet-50/101, VGG-16, BERT-Base/Large, GPT-2, the LSTM LM with their
  tensor shapes (``cconv.theory.profiles``: their per-layer FLOPs and bytes).
* ``cconv.theory.devices``, ``cconv.theory.cluster``: GPUs with sustained FLOP/s, and a cluster of N
  nodes x G GPUs on an intra-node link and a network; ``cconv.theory.predict``: every method's
  iteration time on a cluster; ``cconv.theory.validation``: the model against published measurements.
* ``cconv.theory.implementation``: what compress/decompress cost by implementation (cconv's fused
  program, framework ops per tensor, host-staged MPI); ``cconv.theory.device_profile`` and
  ``cconv.theory.calibrate_cli``: ``cconv calibrate``'s measured device profile.
* ``cconv.theory.planner``: predicted iteration time and speedup of every registered compressor
  (methods, sweeps and byte models read from the compressor registry); ``cconv.theory.plan_cli``:
  the ``cconv plan`` command (both imported on demand).
* ``cconv.theory.simulate``: single-process simulations that check the convergence notes.

Derivations: ``theory/*.md`` in the repository; each claim names the test that checks it.
Depends only on ``cconv.compressors`` (and ``cconv.memory`` in ``simulate``; ``device_profile`` reads
and writes its file with ``cconv.experiments.io``; the planner reads the run-config optimizers and
their phases from ``cconv.engine.optimizers`` / ``cconv.engine.stages``, lazily, only when one is
planned).
"""

from cconv.theory import constants, network, workloads
from cconv.theory.constants import Constants, bits, delta, omega
from cconv.theory.constants import constants as compressor_constants
from cconv.theory.network import Network, Overlap, collective_time, from_config, step_comm_time

__all__ = [
    "constants",
    "network",
    "workloads",
    "Constants",
    "bits",
    "compressor_constants",
    "delta",
    "omega",
    "Network",
    "Overlap",
    "collective_time",
    "from_config",
    "step_comm_time",
]
