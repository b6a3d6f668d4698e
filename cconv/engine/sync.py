"""Synchronization modes: how the workers' updates meet, one object each (``SYNC_MODES``).

A mode is the *learning-algorithm* axis of the surveys (BSP, local SGD, SSP, ASP, gossip),
orthogonal to compression: every mode moves its messages through the phase's ``Exchange``
(``cconv.engine.dropin``), so every compressor and memory composes with it.  The protocol
(``SyncMode``):

    check(engine_cfg)                      bad input (one-line ValueError), called by ``EngineConfig``
    init(engine_cfg, params)               extra per-worker state (a pytree in ``WorkerState.sync``,
                                    so checkpoints carry it; None: nothing)
    phase(engine_cfg, step)                the static phase of step ``step`` (one compiled program each)
    inputs(engine_cfg, step)               host-decided per-step arrays (e.g. the timing model's version
                                    schedule), replicated to every worker; None: none
    step(comm, ctx, phase, ws, batch, key, host)
                                    one worker's step -> (new ``WorkerState``, metrics)
    compresses(engine_cfg, phase)          does this phase's exchange use the compressor (+ memory)?
    communicates(phase)             does this phase communicate at all?
    dry(comm, ex, ws, phase)        what ``step`` communicates, on shapes (``DryComm``)
    host(engine_cfg, optimizer)            a per-trainer host object deciding phases from what the run
                                    observed (AdaComm) or from the optimizer's schedule (0/1
                                    Adam, ``cconv.engine.zero_one_mode``), or None: ``phase``/``observe``/
                                    ``state_dict``/``load_state_dict`` (the checkpoint carries it)
    span(engine_cfg, step)                 compute time of a step in units of one measured worker step
                                    (``cconv.engine.worker_clock``; the simulated clock)
    average_view(engine_cfg)               evaluate the workers' average model (True) or worker 0's
    check_optimizer(optimizer)      optional: a mode that runs one optimizer's rules refuses
                                    the others (one-line ValueError; ``optimizers.check``)
    messages                        every step averages what the optimizer sends
                                    (``gradient_step``), so an optimizer whose message is not its
                                    gradient (``cconv.engine.optimizers``) can run under it

``sync_mode(engine_cfg)`` picks the mode: ``engine_cfg.sync`` ("bsp" by default), where ``bsp`` with
``local_steps > 1`` or ``post_local_switch > 0`` is local SGD (``local_steps='adaptive'``:
AdaComm).  Adding a mode is one class and one ``SYNC_MODES`` entry.

Launchers: every mode runs on shard_map, pmap and mpi (and multi-process jax.distributed): the
host inputs travel with the (replicated) key, the extra state is per worker like the rest.
ASP's ``lax.cond(rank == arrival)`` keeps the work at one gradient per worker per logged step
where each worker is its own device or process; a launcher that simulates the P workers with
``jax.vmap`` on one device turns the cond into a select (P gradients per arrival: same result,
P times the compute).
"""

from __future__ import annotations

import abc
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cconv.comm.backend import DryComm
from cconv.engine import worker_clock
from cconv.engine.config import Phase, phase_of
from cconv.engine.dropin import traffic_metrics
from cconv.engine.exchange import exchange, init_state
from cconv.engine.modes import SYNC_MODES, public_names, sync_mode
from cconv.engine.optimizers import message_of
from cconv.engine.step import StepContext, WorkerState, apply_update, local_grad, reduce_metrics


class SyncMode(abc.ABC):
    """Base class and protocol (module docstring); defaults are those of BSP; ``step`` is each
    mode's own."""

    name = ""
    messages = False  # every step averages what the optimizer sends (``gradient_step``): message optimizers run

    def check(self, engine_cfg) -> None:  # noqa: B027 - by default a mode accepts every config
        """Raise a one-line ValueError for what this mode cannot do with ``engine_cfg``."""

    def init(self, engine_cfg, params) -> Any:
        return None

    def phase(self, engine_cfg, step: int) -> Phase:
        return phase_of(engine_cfg, step)

    def host(self, engine_cfg, optimizer=None) -> Any:
        return None

    def inputs(self, engine_cfg, step: int) -> np.ndarray | None:
        return None

    @abc.abstractmethod
    def step(self, comm, ctx: StepContext, phase: Phase, s: WorkerState, batch, key, host=None):
        """One worker's step under this mode: (new state, metrics).  BSP: own gradient -> local
        clip -> exchange (compress, communicate, decompress, average) -> optax update
        (``gradient_step``); local SGD: local updates and model averaging; ...  ``key`` is the
        same on every worker (shared-key compressors rely on it); ``host``: the mode's per-step
        host inputs (``inputs``), replicated."""

    def compresses(self, engine_cfg, phase: Phase) -> bool:
        return True

    def communicates(self, phase: Phase) -> bool:
        return True

    def dry(self, comm, ex, ws: WorkerState, phase: Phase) -> None:
        if self.communicates(phase):
            ex.exchange(comm, ws.params, ws.comp_state, jax.random.PRNGKey(0))
            ex.average(comm, ws.model_state)

    def average_view(self, engine_cfg) -> bool:
        return False

    def exchange_work(self, engine_cfg, plan, grads) -> tuple[Any, tuple]:
        """(jitted fn, args): the compute of one step's exchange that the simulated clock charges
        (memory, compression, decoding of what a worker receives; the collectives themselves are a
        shape-only ``DryComm``): by default the phase's gradient exchange ``plan``."""
        comm = DryComm(engine_cfg.workers)
        state = init_state(plan, jax.tree.leaves(grads))
        return jax.jit(lambda g, s, k: exchange(comm, plan, g, s, k)), (grads, state)

    def span(self, engine_cfg, step: int) -> float:
        """Compute time of step ``step`` in units of one measured worker step (the simulated
        clock adds communication): BSP waits for the slowest worker."""
        return span_of_slowest(engine_cfg, step)


def span_of_slowest(engine_cfg, step: int) -> float:
    """A step that waits for every worker lasts as long as the slowest one's compute."""
    return float(worker_clock.compute_times(engine_cfg, step).max()) if worker_clock.heterogeneous(engine_cfg) else 1.0


def gradient_step(comm, ctx, phase, s, batch, key, at=None, local=None):
    """BSP's step, the gradient taken at ``at`` (default: the worker's params; SSP: a stale
    version): (new state, metrics); ``local``: extra metrics, identical on every worker."""
    k_loss, k_comm = jax.random.split(key)
    at = s.params if at is None else at
    loss, model_state, aux, grads = local_grad(comm, ctx, at, s.model_state, batch, k_loss)
    ex = ctx.exchanges[phase]
    send = message_of(ctx.optimizer)  # an optimizer that sends something else (1-bit Adam: its momentum)
    grads = grads if send is None else send(grads, s.opt_state)
    grads, comp_state = ex.exchange(comm, grads, s.comp_state, k_comm)
    params, opt_state = apply_update(ctx, grads, s.opt_state, s.params)
    model_state = ex.average(comm, model_state)  # e.g. BatchNorm running statistics
    metrics = reduce_metrics(comm, ctx, ex, grads, {"loss": loss, **aux}, local)
    return s._replace(params=params, model_state=model_state, opt_state=opt_state, comp_state=comp_state), metrics


class BSP(SyncMode):
    """Bulk-synchronous SGD: every step averages the workers' (compressed) gradients, then each
    worker applies the same optax update: x <- x - eta * opt(1/P sum_i D(C(g_i)))."""

    name = "bsp"
    messages = True

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        return gradient_step(comm, ctx, phase, s, batch, key)


class LocalSGD(SyncMode):
    """Local SGD (Stich 2019; post-local SGD, Lin et al. 2020): H local optax steps, then the
    models are averaged through the anchor (the last average): x <- a + 1/P sum_i D(C(x_i - a)),
    the delta compressed only with ``compress_delta``.  Phases "local" / "sync" (and "bsp"
    before ``post_local_switch``)."""

    name = "local"

    def init(self, engine_cfg, params):
        return None  # the anchor lives in WorkerState.anchor (checkpoint layout of earlier versions)

    def compresses(self, engine_cfg, phase):
        return phase.kind == "bsp" or engine_cfg.compress_delta

    def communicates(self, phase):
        return phase.kind != "local"

    def average_view(self, engine_cfg):
        return True

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        if phase.kind == "bsp":  # before post_local_switch
            return gradient_step(comm, ctx, phase, s, batch, key)
        k_loss, k_comm = jax.random.split(key)
        loss, model_state, aux, grads = local_grad(comm, ctx, s.params, s.model_state, batch, k_loss)
        ex = ctx.exchanges[phase]
        params, opt_state = apply_update(ctx, grads, s.opt_state, s.params)
        comp_state, anchor = s.comp_state, s.anchor
        if phase.kind == "sync":  # average the models
            delta = jax.tree.map(jnp.subtract, params, anchor)
            delta, comp_state = ex.exchange(comm, delta, comp_state, k_comm)
            params = anchor = jax.tree.map(jnp.add, anchor, delta)
            model_state = ex.average(comm, model_state)
        metrics = reduce_metrics(comm, ctx, ex, grads, {"loss": loss, **aux})
        new = s._replace(params=params, model_state=model_state, opt_state=opt_state, comp_state=comp_state)
        return new._replace(anchor=anchor), metrics


class AdaCommHost:
    """AdaComm's host state (Wang and Joshi 2019, "Adaptive communication strategies to achieve
    the best error-runtime trade-off in local-update SGD"): the communication period

        H_t = ceil(sqrt(F(x_t) / F(x_0)) * H_0)

    re-evaluated every ``adapt_every`` steps, F(x_0) the training loss of step 0 and F(x_t) the
    mean training loss of the last ``adapt_every`` steps (mean over seeds under ``seeds``: one
    program, one schedule); a new H takes effect at the next averaging step.  Phases stay static
    (one compiled program per kind): the host decides each step's kind from the losses it has
    observed (``observe``, which reads the step's loss: one device round trip every
    ``adapt_every`` steps).  ``state_dict`` / ``load_state_dict``: the checkpoint carries it.
    """

    def __init__(self, engine_cfg):
        self.engine_cfg = engine_cfg
        self.h = int(engine_cfg.local_steps_init)
        self.next_sync = self.h - 1
        self.kinds = ""  # decided kinds: "l" local, "s" sync
        self.loss0: float | None = None
        self.window: list = []  # losses of the current window (device scalars until read)
        self.history: list[tuple[int, int]] = [(0, self.h)]  # (step, H) at each change

    def observe(self, step: int, metrics: dict) -> None:
        loss = metrics["loss"]
        if step == 0:
            self.loss0 = float(jnp.mean(loss))
        self.window.append(loss)

    def _adapt(self, t: int) -> None:
        f = float(np.mean([float(jnp.mean(x)) for x in self.window[-self.engine_cfg.adapt_every :]]))
        self.window = []
        if self.loss0 is None or not (np.isfinite(f) and np.isfinite(self.loss0)) or self.loss0 <= 0:
            return
        h = max(1, math.ceil(math.sqrt(max(f, 0.0) / self.loss0) * self.engine_cfg.local_steps_init))
        if h != self.h:
            self.h = h
            self.history.append((t, h))

    def phase(self, step: int) -> Phase:
        while len(self.kinds) <= step:
            t = len(self.kinds)
            if t > 0 and t % self.engine_cfg.adapt_every == 0:
                self._adapt(t)
            sync = t == self.next_sync
            if sync:
                self.next_sync = t + self.h
            self.kinds += "s" if sync else "l"
        density = self.engine_cfg.warmup.density(step) if self.engine_cfg.warmup is not None else None
        return Phase(density, "sync" if self.kinds[step] == "s" else "local")

    def state_dict(self) -> dict:
        self.window = [float(jnp.mean(x)) for x in self.window]
        return {
            "h": self.h,
            "next_sync": self.next_sync,
            "kinds": self.kinds,
            "loss0": self.loss0,
            "window": list(self.window),
            "history": [list(x) for x in self.history],
        }

    def load_state_dict(self, d: dict) -> None:
        self.h, self.next_sync, self.kinds = int(d["h"]), int(d["next_sync"]), str(d["kinds"])
        self.loss0, self.window = d["loss0"], list(d["window"])
        self.history = [tuple(x) for x in d["history"]]


class AdaComm(LocalSGD):
    """Local SGD with AdaComm's adaptive period (``local_steps='adaptive'``; ``AdaCommHost``)."""

    name = "adacomm"

    def check(self, engine_cfg):
        if engine_cfg.post_local_switch > 0:
            raise ValueError("local_steps='adaptive' (AdaComm) and post_local_switch cannot be combined")

    def host(self, engine_cfg, optimizer=None):
        return AdaCommHost(engine_cfg)

    def phase(self, engine_cfg, step):
        raise ValueError("AdaComm's phases depend on the observed losses: ask Trainer.phase")


def _ring(params, slots: int):
    """``slots`` copies of ``params`` on a leading axis (a ring buffer of parameter versions)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (slots, *jnp.shape(x))), params)


def _put(buf, slot, tree):
    return jax.tree.map(lambda b, x: lax.dynamic_update_index_in_dim(b, x, slot, 0), buf, tree)


def _get(buf, slot):
    return jax.tree.map(lambda b: lax.dynamic_index_in_dim(b, slot, 0, keepdims=False), buf)


def _staleness_metrics(stale) -> dict:
    stale = jnp.asarray(stale, jnp.float32)
    return {"staleness_mean": stale.mean(), "staleness_max": stale.max()}


_SCHEDULES: dict = {}


def _schedule(kind, engine_cfg, bound: int):
    """The event schedule of ``engine_cfg``'s timing model (memoized per timing configuration)."""
    key = (
        kind.__name__,
        engine_cfg.workers,
        bound,
        engine_cfg.stragglers,
        engine_cfg.jitter,
        engine_cfg.worker_speeds,
        engine_cfg.timing_seed,
    )
    if key not in _SCHEDULES:
        _SCHEDULES[key] = kind(engine_cfg, bound)
    return _SCHEDULES[key]


class SSP(SyncMode):
    """Stale-synchronous parallel (Ho et al. 2013), staleness bound s (``engine_cfg.staleness``).

    Clock t's update aggregates every worker's clock-t gradient exactly as BSP does (same
    exchange: compressor, memory, aggregation), x_{t+1} = x_t - eta opt(1/P sum_i D(C(g_i))),
    but worker i's gradient g_i = grad f_i(x_{v(i,t)}) is computed on version
    v(i,t) in [t - s, t], decided by the timing model's event schedule
    (``cconv.engine.worker_clock.SSPSchedule``).  Every version a clock uses exists when it starts, so
    the P gradients are computed in parallel: the state keeps a ring buffer of the last s + 1
    versions (``WorkerState.sync``; version v in slot v mod (s+1)), and the host passes each
    worker's slot as an input array, so one compiled program serves every step.  s = 0 is BSP
    bit for bit.  Metrics: ``staleness_mean`` / ``staleness_max`` = t - v(i, t) over workers.
    """

    name = "ssp"
    messages = True

    def check(self, engine_cfg):
        if engine_cfg.model_averaging:
            raise ValueError("sync='ssp' with local SGD (local_steps > 1 or post_local_switch) is not defined")

    def init(self, engine_cfg, params):
        return _ring(params, engine_cfg.staleness + 1)

    def inputs(self, engine_cfg, step):
        v = _schedule(worker_clock.SSPSchedule, engine_cfg, engine_cfg.staleness).version(step)
        slots = engine_cfg.staleness + 1
        return np.stack([v % slots, step - v, np.full_like(v, step % slots)]).astype(np.int32)

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        buf = _put(s.sync, host[2, 0], s.params)  # version t joins the ring
        at = _get(buf, host[0, comm.rank()])
        new, metrics = gradient_step(comm, ctx, phase, s, batch, key, at, _staleness_metrics(host[1]))
        return new._replace(sync=buf), metrics

    def span(self, engine_cfg, step):
        return _schedule(worker_clock.SSPSchedule, engine_cfg, engine_cfg.staleness).span(step)


def _asp_cap(engine_cfg) -> int:
    return 2 * engine_cfg.workers if engine_cfg.max_staleness is None else engine_cfg.max_staleness


class ASP(SyncMode):
    """Asynchronous parallel SGD on a parameter server (Downpour, Dean et al. 2012; Hogwild-style
    delayed updates, Recht et al. 2011): every gradient is applied on its own as it arrives,
    x_{n+1} = x_n - eta opt(D(C(grad f(x_{n - tau_n})))), the delays tau_n from the timing
    model's event schedule (``cconv.engine.worker_clock.ASPSchedule``; equal speeds: tau = P - 1).

    **One logged step = P gradient arrivals** (each consumes a local mini-batch of B/P rows, so a
    logged step consumes the global batch B as a BSP step does; plots compare modes at equal
    samples).  Arrival j of a step consumes the j-th rows of the global batch; the timing model
    decides its base version and which simulated worker w_j computes it (a fast worker may
    arrive twice in a logged step, a straggler not at all).  Device w is simulated worker w: it
    computes the arrivals w_j = w with its own compressor memory (EF, DGC), so a worker's
    residual carries over to that worker's next gradient, as in real asynchronous training.  With
    heterogeneous timing the rows of arrival j reach device w_j by an unrecorded masked sum (the
    data a real worker reads locally); with equal speeds w_j = j and no rows move.  The loss and
    model state are averaged over the P arrivals.

    Exact replay, sequentially: a ``lax.scan`` over the P arrivals; each device keeps the
    server's model and a ring buffer of the last ``max_staleness`` + 1 versions (replicated),
    arrival j's gradient and compression (with memory) run under ``lax.cond(rank == j)`` (no P x
    compute: each device computes once per logged step), the decompressed update is broadcast
    (an unrecorded sum over devices, exact: the others add zeros) and every device applies it.
    The trade-off: P sequential gradient computations per logged step (latency, not work);
    computing all P in parallel would be exact only when every base version predates the step,
    which stragglers break.  Bytes: each worker pushes its compressed gradient and pulls the
    dense model once per logged step on average: the parameter-server transport's accounting of
    a BSP step (``architecture='parameter-server'`` is required); encoded = moved bytes.
    Each arrival is a full optimizer step, so a logged step makes P updates of size eta: scale
    the learning rate (about 1/P of BSP's) accordingly.
    """

    name = "asp"

    def check(self, engine_cfg):
        if engine_cfg.architecture != "parameter-server":
            raise ValueError("sync='asp' is a parameter server: it needs architecture='parameter-server'")
        if engine_cfg.model_averaging:
            raise ValueError("sync='asp' with local SGD (local_steps > 1 or post_local_switch) is not defined")
        if engine_cfg.vote or engine_cfg.collective != "auto" or engine_cfg.ps_downlink is not None:
            raise ValueError("sync='asp' applies each gradient on its own: no vote, collective or ps_downlink")

    def init(self, engine_cfg, params):
        return _ring(params, _asp_cap(engine_cfg) + 1)

    def inputs(self, engine_cfg, step):
        p, slots = engine_cfg.workers, _asp_cap(engine_cfg) + 1
        who, base = _schedule(worker_clock.ASPSchedule, engine_cfg, _asp_cap(engine_cfg)).arrivals(step, p)
        n = step * p + np.arange(p)
        rows = [base % slots, n % slots, n - base]
        if worker_clock.heterogeneous(engine_cfg):  # a 4th row, the arrivals' workers (its presence is static)
            rows.append(who)
        elif not np.array_equal(who, np.arange(p)):
            raise AssertionError(f"ASP with equal speeds: arrival order {who} is not the worker order")
        return np.stack(rows).astype(np.int32)

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        k_loss, k_comm = jax.random.split(key)
        ex, rank, solo = ctx.exchanges[phase], comm.rank(), DryComm(1)
        plan = ex.plan_of(s.params)
        own = jax.eval_shape(lambda: local_grad(comm, ctx, s.params, s.model_state, batch, k_loss)[:3])

        moving = host.shape[0] == 4  # static: arrivals computed away from their rows' device
        vary = jnp.asarray(rank) * 0  # zeros typed like per-worker values (shard_map's varying axes)
        if moving:  # every device's rows on every device, once per step (one unrecorded sum)
            slot = jnp.arange(comm.size) == rank
            everyone = jax.tree.map(
                lambda x: comm._psum(jnp.where(slot.reshape((-1,) + (1,) * x.ndim), x[None], jnp.zeros((), x.dtype))),
                batch,
            )

        def rows_of(j):
            if not moving:
                return batch
            return jax.tree.map(lambda x: x[j] + vary.astype(x.dtype), everyone)  # arrival j's rows

        def arrival(carry, j):
            params, opt_state, buf, comp_state, mine = carry
            buf = _put(buf, host[1, j], params)  # version n (the current one) joins the ring
            rows = rows_of(j)

            def compute(comp_state):
                loss, ms, aux, g = local_grad(comm, ctx, _get(buf, host[0, j]), s.model_state, rows, k_loss)
                u, comp_state = exchange(solo, plan, g, comp_state, jax.random.fold_in(k_comm, j))
                return u, comp_state, jax.tree.map(jnp.add, mine, (loss, ms, aux))

            def skip(comp_state):
                return jax.tree.map(jnp.zeros_like, params), comp_state, mine

            u, comp_state, mine = lax.cond(rank == (host[3, j] if moving else j), compute, skip, comp_state)
            u = comm._psum(u)  # the arriving update on every device (the others add zeros)
            params, opt_state = apply_update(ctx, u, opt_state, params)
            return (params, opt_state, buf, comp_state, mine), None

        # this device's sums over the arrivals it computed; averaged over devices, the arrivals' mean
        mine = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype) + vary.astype(x.dtype), own)
        carry = (s.params, s.opt_state, s.sync, s.comp_state, mine)
        (params, opt_state, buf, comp_state, (loss, model_state, aux)), _ = lax.scan(
            arrival, carry, jnp.arange(comm.size)
        )
        model_state = ex.average(comm, model_state)
        dry = DryComm(comm.size, like=comm)
        jax.eval_shape(lambda: self.dry(dry, ex, s, phase))
        metrics = reduce_metrics(comm, ctx, ex, s.params, {"loss": loss, **aux}, _staleness_metrics(host[2]))
        ps = traffic_metrics(dry, ctx.report_rank)  # the parameter server's push + pull
        metrics.update({k: v for k, v in ps.items() if k != "bytes_control"})
        new = s._replace(params=params, model_state=model_state, opt_state=opt_state, comp_state=comp_state)
        return new._replace(sync=buf), metrics

    def span(self, engine_cfg, step):
        return _schedule(worker_clock.ASPSchedule, engine_cfg, _asp_cap(engine_cfg)).span(step, engine_cfg.workers)


# the registry lives in the leaf module cconv.engine.modes (EngineConfig validates against it)
SYNC_MODES.update({m.name: m for m in (BSP(), LocalSGD(), AdaComm(), SSP(), ASP())})


__all__ = [
    "SyncMode",
    "SYNC_MODES",
    "BSP",
    "LocalSGD",
    "AdaComm",
    "AdaCommHost",
    "SSP",
    "ASP",
    "sync_mode",
    "public_names",
    "gradient_step",
]
