"""One simulated clock: seconds per training step, for the runner's ``sim_time`` and the advisor.

What a step does besides one worker's compute is stated by the trainer, once
(``Trainer.step_work(step)`` -> ``StepWork``: span, whether it communicates, its collectives
and bytes, the compressor, memory and compressed shapes, and the exchange's compute as a
program).  A clock charges it with one worker's costs (``Costs``: ``compute_time``, and
``exchange_time(work)`` for one communicating step's compression + decompression) on a network::

    step = compute x span + exchange + sum_c count_c x t_net(kind_c, bytes_c)        (no schedule)
    step = one iteration of the event simulator (``cconv.theory.schedule.runs``)   (a schedule)

with ``exchange`` = 0 on a step that does not communicate (local SGD) and ``t_net`` the
alpha-beta model of ``cconv.theory.network``.  Two sources of costs:

* ``Measured`` (the runner): on this process's first device, the fastest of 10 timed calls after
  compilation of the jitted forward + backward + update on the local batch, and of the step's own
  exchange program (``StepWork.program``, collectives on a shape-only comm).
* ``Modelled`` (the advisor): on a ``cconv.theory.devices.Device``: compute = the model's FLOPs on
  the local batch / sustained FLOP/s + ``3 x layers x launch_s``; exchange = per compressed tensor
  of n elements (``StepWork.units``) (x_c(n) + memory passes) F(n) + m x_d(n) F(n) + 2 launches,
  F(n) = 4 n / B_device, x_c, x_d cconv's benchmarked multiples of the read floor for the
  compressor (``cconv.theory.schedule.compress``), m the payloads a worker decodes (P after an
  all-gather, ``cconv.theory.implementation.decodes``), memory passes 2 with a memory (read x + e,
  write e).  Deterministic: the same on every machine.

``measure_step`` is no simulation: the real training step (the trainer's own launcher and
devices), the median of ``repeats`` timed calls per phase after its compiling call.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, NamedTuple

import jax
import numpy as np

KERNELS_PER_LAYER = 3  # forward, backward to the input, backward to the weights
MEMORY_PASSES = 2.0  # error feedback (and DGC's memory): read x + e, write the new e
REPEATS = 10  # timed calls of a measured cost (the fastest is taken)
MEASURE_REPEATS = 10  # timed real steps per phase (the median is taken)


class StepCost(NamedTuple):
    """One step's seconds, and its parts (no overlap in the parts)."""

    step_s: float
    compute_s: float  # compute x span
    comm_s: float  # the collectives' time alone
    compress_s: float  # the exchange's compute (compression + decompression)


def step_cost(work, compute_s, exchange_s, workers, net, schedule=None, profile=None, servers=None) -> StepCost:
    """``StepCost`` of a step whose work is ``work`` (``StepWork``), one worker's compute time
    ``compute_s`` and exchange time ``exchange_s`` (module docstring)."""
    from cconv.theory import network

    compute = compute_s * work.span
    ex = exchange_s if work.communicates else 0.0
    colls = list(work.collectives)
    comm = network.step_comm_time(colls, workers, net)
    if schedule is None or not colls:
        return StepCost(compute + ex + comm, compute, comm, ex)
    from cconv.theory.schedule import runs

    t = runs.step_time(profile, colls, workers, net, schedule, compute, ex, servers=servers, ps=work.via_server)
    return StepCost(t, compute, comm, ex)


def profile_of(problem: Any):
    """The run's model as layers on its local batch (``cconv.theory.profiles.from_spec``), carrying
    the run's own ``compress_vectors`` (so the model sizes its vectors as the run sends them)."""
    from cconv.theory import profiles

    cfg = problem.cfg
    x = np.asarray(problem.ds.train["x"][:1])
    b = jax.ShapeDtypeStruct((cfg.batch_size // cfg.workers, *x.shape[1:]), x.dtype)
    prof = profiles.from_spec(cfg.model["name"], problem.specs[0], b)
    return prof._replace(compress_vectors=bool(problem.engine_cfg.compress_vectors))


class Clock:
    """Seconds per step of ``trainer`` under ``costs`` on each of ``nets`` (module docstring);
    memoized per (phase, span)."""

    def __init__(self, trainer, costs, nets, workers, schedule=None, servers=None, profile=None):
        self.trainer, self.costs, self.nets, self.workers = trainer, costs, list(nets), workers
        self.schedule, self.servers, self._profile = schedule, servers, profile
        self._ex: dict = {}  # exchange seconds per phase
        self._memo: dict = {}

    @property
    def profile(self):
        """The model's layers (``profile_of``), read when a schedule first needs them."""
        if self._profile is None:
            self._profile = profile_of(self.costs.problem)
        return self._profile

    def cost(self, step: int, net, schedule=None) -> StepCost:
        """``StepCost`` of step ``step`` on ``net`` (under ``schedule``, default the clock's)."""
        w = self.trainer.step_work(step)
        sched = schedule or self.schedule
        key = (w.phase, w.span, id(net), sched)
        if key not in self._memo:
            if w.phase not in self._ex:
                self._ex[w.phase] = self.costs.exchange_time(w) if w.communicates else 0.0
            ex = self._ex[w.phase]
            prof = self.profile if sched is not None and w.collectives else None
            self._memo[key] = step_cost(w, self.costs.compute_time, ex, self.workers, net, sched, prof, self.servers)
        return self._memo[key]

    def step_times(self, step: int) -> list[float]:
        """[seconds of step ``step`` on each network]."""
        return [self.cost(step, net).step_s for net in self.nets]

    def mean(self, steps, net, schedule=None) -> StepCost:
        """The mean ``StepCost`` over ``steps`` on ``net``."""
        tot = np.zeros(4)
        for s in steps:
            tot += self.cost(s, net, schedule)
        return StepCost(*map(float, tot / len(steps)))


class SimClock(Clock):
    """A run's clock (``cconv.experiments.runner``: ``sim_time``): the run's measured costs
    (``Measured``) on each network of its config (``cfg.networks()``, logged under their labels),
    with its schedule and servers."""

    def __init__(self, cfg, trainer, calib):
        from cconv.experiments.build import network_label, resolve_network

        self.labels = [network_label(n) for n in cfg.networks()]
        nets = [resolve_network(n) for n in cfg.networks()]
        super().__init__(trainer, calib, nets, cfg.workers, cfg.schedule, getattr(cfg, "servers", None))


# --------------------------------------------------------------------------- measured costs


def timed(fn, *args, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn(*args)`` (blocked until ready), after one
    warm-up call (which compiles)."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return ts


def min_time(fn, *args, repeats: int = REPEATS) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call (which compiles).  The minimum,
    not the mean or median, is the estimate least disturbed by other processes sharing the
    machine (interference only ever adds time)."""
    return float(min(timed(fn, *args, repeats=repeats)))


class Measured:
    """One worker's costs measured on this process's first device (module docstring).

    ``compute_time``: forward, backward and optimizer update on the local batch (b = B / P rows);
    measured once per process for a given model, data, local batch and optimizer (sweeps share it).
    ``exchange_time(work)``: the step's own exchange program (memory, compression, aggregation,
    decompression of every received payload) on the shape-only ``DryComm``, once per phase.
    ``data`` holds both (a run's checkpoint keeps it, so a resumed run charges the same)."""

    _compute_cache: dict = {}  # compute time per (model, data, local batch, optimizer), per process

    def __init__(self, problem, saved: dict | None = None):
        self.problem = problem
        self.data = saved if saved is not None else {"compute_time": None, "exchange_time": {}}
        self._ready = False
        c = problem.cfg
        self._compute_key = json.dumps(
            [c.model, c.data, c.batch_size // c.workers, c.optimizer, c.lr_schedule, c.seeds()[0]],
            sort_keys=True,
            default=str,
        )

    def _setup(self):
        if self._ready:
            return
        p = self.problem
        cfg, spec = p.cfg, p.specs[0]
        b = cfg.batch_size // cfg.workers
        dev = jax.devices()[0]
        self._batch = jax.device_put({k: np.asarray(v[:b]) for k, v in p.ds.train.items()}, dev)
        self._params = jax.device_put(spec.params, dev)
        self._mstate = jax.device_put(spec.model_state, dev)
        self._key = jax.random.key(0)
        opt = p.optimizer
        self._opt_state = jax.device_put(opt.init(spec.params), dev)

        def compute(params, mstate, opt_state, batch, key):
            import optax

            (loss, _), g = jax.value_and_grad(p.loss_fn, has_aux=True)(params, mstate, batch, key)
            upd, _ = opt.update(g, opt_state, params)
            return optax.apply_updates(params, upd), g

        self._compute = jax.jit(compute)
        self._grads = self._compute(self._params, self._mstate, self._opt_state, self._batch, self._key)[1]
        self._ready = True

    @property
    def compute_time(self) -> float:
        if self.data["compute_time"] is None:
            cached = Measured._compute_cache.get(self._compute_key)
            if cached is None:
                self._setup()
                cached = min_time(self._compute, self._params, self._mstate, self._opt_state, self._batch, self._key)
                Measured._compute_cache[self._compute_key] = cached
            self.data["compute_time"] = cached
        return self.data["compute_time"]

    def exchange_time(self, work) -> float:
        name = repr(tuple(work.phase))
        if name not in self.data["exchange_time"]:
            self._setup()
            fn, args = work.program(self._grads)
            self.data["exchange_time"][name] = min_time(fn, *args, self._key)
        return self.data["exchange_time"][name]


# --------------------------------------------------------------------------- modelled costs


class Modelled:
    """One worker's costs on ``device`` (a ``cconv.theory.devices.Device``), from the model's
    FLOPs and the step's stated work (module docstring); ``workers``: P (decodes after an
    all-gather)."""

    def __init__(self, problem, device, workers: int, profile=None):
        self.problem, self.device, self.workers = problem, device, workers
        self.profile = profile if profile is not None else profile_of(problem)

    @property
    def compute_time(self) -> float:
        prof, dev = self.profile, self.device
        return (prof.fwd_flops + prof.bwd_flops) / dev.flops + KERNELS_PER_LAYER * len(prof.layers) * dev.launch_s

    def exchange_time(self, work) -> float:
        return exchange_seconds(work, self.device, self.workers)


def exchange_seconds(work, device, workers: int, bench: dict | None = None) -> float:
    """One worker's compression + decompression of a communicating step with work ``work`` on
    ``device`` (module docstring): 0 when nothing is compressed."""
    import warnings

    from cconv import compressors as C
    from cconv.theory import implementation as IM
    from cconv.theory.schedule import compress as CC

    c = work.compressor
    if c is None or not work.units:
        return 0.0
    m = IM.decodes(c.aggregation if isinstance(c.aggregation, str) else "allreduce", workers)
    bench = CC.load_bench() if bench is None else bench
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CC.EstimatedCostWarning)
        name = C.registered_name(c) or c.name  # its entry's rows, whatever user code calls it
        rows = bench.get(name) or CC.estimated_rows(name, bench)
    extra = MEMORY_PASSES if work.memory not in (None, "none") else 0.0
    total = 0.0
    for shape in work.units:
        n = float(np.prod(shape))
        cx, dx = CC.ratio_at(rows, n)
        floor = device.read_floor(n)
        total += (cx + extra) * floor + m * dx * floor + 2 * device.launch_s
    return total


# --------------------------------------------------------------------------- the real step


def measure_step(problem, repeats: int = MEASURE_REPEATS, steps: int | None = None) -> float:
    """Seconds of one real training step of ``problem`` (its trainer's own launcher and devices;
    one seed): per phase among the first ``steps`` steps (default: every step of the run, at most
    64), the median of ``repeats`` timed steps after the one that compiles it; the mean over those
    steps of their phase's median (local SGD's local and averaging steps in their proportion)."""
    tr, cfg = problem.trainer, problem.cfg
    n = min(cfg.steps, 64) if steps is None else steps
    b = cfg.batch_size
    batch = tr.shard({k: np.asarray(v[:b]) for k, v in problem.ds.train.items()})
    state = tr.init(params=problem.specs[0].params, model_state=problem.specs[0].model_state)
    key = jax.random.key(0)
    first: dict = {}
    for s in range(n):
        first.setdefault(tr.phase(s), s)
    median = {}
    for phase, s in first.items():
        median[phase] = statistics.median(timed(tr.step, state.replace(step=s), batch, key, repeats=repeats))
    return float(np.mean([median[tr.phase(s)] for s in range(n)]))


def device_label() -> str:
    """The devices a measured step ran on, e.g. ``8 x cpu``, or ``2 x cpu in 2 processes`` across
    processes (``jax.distributed``)."""
    devs = jax.devices()
    n = jax.process_count()
    return f"{len(devs)} x {devs[0].device_kind}" + (f" in {n} processes" if n > 1 else "")


__all__ = [
    "StepCost",
    "step_cost",
    "profile_of",
    "Clock",
    "min_time",
    "Measured",
    "Modelled",
    "exchange_seconds",
    "measure_step",
    "device_label",
]
