"""One training run from a ``RunConfig``: train, log, checkpoint, resume (the run's objects are
built in one pass by ``cconv.experiments.build``).

The loop (``execute``) is the whole protocol that makes results survive a kill:

1. ``metrics.jsonl`` lines for steps ``<= s`` are written (one fsync'ed write each) before the
   checkpoint of step ``s`` is saved; orbax saves atomically (temporary directory + rename).
2. On start, if a checkpoint exists, the state, the data iterator, the PRNG position and the
   running counters (cumulative bytes, simulated time, wall time) are restored from it and, once
   the restart is known to proceed (checkpoint restored, clock calibrated, writers open), the
   metrics file is cut back to the lines with ``step <= s`` (a partial last line included; a
   damaged line before that point is kept and reported, never a reason to cut): a resume that
   fails loses no line.  With no checkpoint the metrics file is emptied (at the same point).
   Per-step PRNG keys are ``fold_in(key, step)``, so the resumed run computes exactly the steps
   it lost.  Run files are opened through ``io.open_file`` / ``io.ensure_dir`` (no links, no
   foreign file types), and a finished run is recognized reading only (``stored_run``).
3. ``summary.json`` is replaced atomically: ``running`` at start, then ``completed``, ``diverged``
   (``cconv.experiments.divergence``: a non-finite loss, or one above 10x the first step's; the
   seed stops, the sweep goes on), ``failed`` (with the error) or
   ``interrupted`` (SIGTERM/SIGINT: checkpointed at the step reached, resumed by the next run;
   ``cconv.experiments.signals``).
4. The final checkpoint (step ``steps``, or the step at which every seed had diverged) is saved
   before the final summary.  A run restored from it has ended: its summary is rebuilt from the
   checkpoint's counters and the last metric line of each seed, nothing is trained or saved again
   (a kill between the two writes, or a lost or garbled ``summary.json``, never leaves a run stuck).

Several seeds (``seed: [0, 1, 2, 3, 4]``) run as one program: the engine is built with
``seeds=S`` (its step is vmapped over a leading seed axis inside the compiled SPMD program), the
per-seed initial models, batches and keys are stacked on that axis; every metric line carries its
``seed``.

Metric lines (one per seed every ``log_every`` steps)::

    step, seed, loss (mean training loss since the previous line), <aux> (e.g. accuracy, same
    mean), test_loss, test_<metric> (full test set), bytes_sent, bytes_received (per worker, at
    this step), cum_bytes_sent, cum_bytes_received, cum_bytes (= sent + received, per worker, since
    step 0): the bytes the collectives moved; bytes_encoded_sent, bytes_encoded_received,
    cum_bytes_encoded: the same for the encoded messages (smaller than the moved bytes only for
    entropy-coded payloads, whose buffers have a fixed capacity), density, wall_time (s since the
    start, resumes included), and when a network is set
    sim_time / sim_step_time (first network) and sim_time@<net> / sim_step_time@<net> for each.

Simulated time (issue 5 §4): ``sim_step_time = t_compute + t_compress + t_comm(step)``, where
``t_compute`` (one worker's forward and backward pass on its local batch, on one device) and
``t_compress`` (compression with the run's memory, plus decompression of every payload a worker
must decode: P of them for all-gather compressors, one otherwise) are measured once before
training (fastest of 10 timed calls after compilation), and ``t_comm(step)`` is the
alpha-beta model of ``cconv.theory.network`` applied to the collectives the step performs, as
``trainer.step_work(step)`` states them.  The clock is ``cconv.experiments.clock`` (the one the
advisor uses too, with modelled instead of measured costs).  Steps without communication (local SGD) cost
``t_compute`` only.  With a worker timing model (``stragglers``, ``jitter``, ``worker_speeds``;
``cconv.engine.timing``) ``t_compute`` is multiplied by the synchronization mode's span of the
step (``SyncMode.span``): BSP and local SGD wait for the slowest worker every step, SSP and ASP
follow their event schedules (ASP: one logged step = P gradient arrivals).  SSP and ASP lines
also carry ``staleness_mean`` / ``staleness_max`` (a line's mean over the logged steps since the
previous line, and the largest: a step metric named ``*_max`` is a maximum, the others means).
With ``schedule: bsp | wfbp | mg-wfbp | bytescheduler | fusion`` (and ``servers:``) the step
is instead one iteration of the event simulator over the run's own model profile, with the
(spanned) compute and the measured exchange times spread over its layers
(``cconv.theory.schedule.runs``), so overlap of communication with backpropagation shows in
``sim_time``; without ``schedule`` the numbers are today's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv.experiments import build, divergence, io, signals, writers
from cconv.experiments import clock as CK
from cconv.experiments.build import Problem, network_label, resolve_network, seed_keys
from cconv.experiments.checkpoint import Checkpointer, CheckpointError, decode_host_state, encode_host_state
from cconv.experiments.config import ConfigError, RunConfig, read_stored, to_yaml

# The deadlock trap (DEVELOPERS.md): never have more than this many steps in flight.
MAX_INFLIGHT = 16
EVAL_CHUNK = 1024
KEEP_CHECKPOINTS = 2  # checkpoints kept per run: a damaged latest one falls back to the previous
TENSORBOARD = io.TENSORBOARD  # event files of a run with tensorboard: true (one directory per seed)


# --------------------------------------------------------------------------- simulated time

Calibration = CK.Measured  # one worker's measured costs (``cconv.experiments.clock``)


class SimClock(CK.Clock):
    """Per-step simulated time on each configured network (module docstring): the one clock
    (``cconv.experiments.clock``) with the run's measured costs, networks, schedule and servers."""

    def __init__(self, cfg: RunConfig, trainer: Any, calib: Any):
        self.labels = [network_label(n) for n in cfg.networks()]
        nets = [resolve_network(n) for n in cfg.networks()]
        super().__init__(trainer, calib, nets, cfg.workers, cfg.schedule, getattr(cfg, "servers", None))


# --------------------------------------------------------------------------- the loop


class RunResult(NamedTuple):
    status: str
    summary: dict
    trained: bool = True  # False: the run had already ended, nothing was done


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def make_evaluator(problem: Problem) -> Callable[[Any, dict], dict]:
    """One jitted program: the trainer's model view (``trainer.params`` / ``model_state``) and the
    test metrics on a chunk, vmapped over seeds when there are several.  Call it with a state
    whose static step is 0 (other steps are other pytree structures)."""
    trainer, eval_fn = problem.trainer, problem.eval_fn
    multi = len(problem.seeds) > 1

    def ev(state, chunk):
        params, mstate = trainer.params(state), trainer.model_state(state)
        if multi:
            return jax.vmap(eval_fn, in_axes=(0, 0, None))(params, mstate, chunk)
        return eval_fn(params, mstate, chunk)

    return jax.jit(ev)


_EVALUATORS: dict[int, tuple] = {}  # id(problem) -> (problem, evaluator): a run resumed in-process compiles once


def evaluator_of(problem: Problem) -> Callable[[Any, dict], dict]:
    """``make_evaluator(problem)``, made once per problem object (the advisor pauses and resumes a
    probe several times in one process; each new jit of the evaluator would compile again)."""
    hit = _EVALUATORS.get(id(problem))
    if hit is None or hit[0] is not problem:
        if len(_EVALUATORS) >= 32:
            _EVALUATORS.pop(next(iter(_EVALUATORS)))
        hit = _EVALUATORS[id(problem)] = (problem, make_evaluator(problem))
    return hit[1]


def evaluate(problem: Problem, evaluator, state) -> list[dict]:
    """Test metrics over the whole test set (chunks, weighted by size), one dict per seed."""
    test = problem.ds.test
    n = len(test["y"])
    S = len(problem.seeds)
    sums: list[dict] = [dict() for _ in range(S)]
    st = state.replace(step=0)
    for i in range(0, n, EVAL_CHUNK):
        chunk = {k: v[i : i + EVAL_CHUNK] for k, v in test.items()}
        m = jax.device_get(evaluator(st, chunk))
        w = len(chunk["y"])
        for k, v in m.items():
            v = np.asarray(v, np.float64).reshape(S)
            for j in range(S):
                sums[j][k] = sums[j].get(k, 0.0) + float(v[j]) * w
    return [{f"test_{k}": v / n for k, v in d.items()} for d in sums]


def _refuse_foreign(run_dir: str) -> None:
    """A ConfigError for an existing, non-empty directory that holds no cconv run.  The lock and
    the temporary file of a ``config.yaml`` another process is writing (``io.atomic_write_text``:
    ``.config.yaml.<random>.tmp``, renamed into place) are a run being created, not foreign files:
    this check runs before the lock is taken, so a concurrent sweep can see them."""
    if (
        os.path.isdir(run_dir)
        and not os.path.exists(os.path.join(run_dir, io.CONFIG))
        and [f for f in os.listdir(run_dir) if not _being_created(f)]
    ):
        raise ConfigError(f"{run_dir} is not empty and holds no cconv run; choose another --out")


def _being_created(name: str) -> bool:
    """``name`` is the lock or the temporary file of a ``config.yaml`` being written."""
    return name == io.LOCK or (name.startswith(f".{io.CONFIG}.") and name.endswith(".tmp"))


def stored_config_diff(run_dir: str, cfg: RunConfig) -> list[str] | None:
    """How the config stored in ``run_dir`` differs from ``cfg`` (``diff``'s dotted ``key: old ->
    new`` entries; [] when equal), or None when the directory holds no config.  Keys that only
    steer the advisor or the report (``config.STEERING_FIELDS``) are left out.  Reads only."""
    import yaml

    from cconv.experiments.config import diff, identity

    cpath = os.path.join(run_dir, io.CONFIG)
    if not io.check_entry(cpath):
        return None
    old = identity(read_stored(cpath))  # fields added since filled in; damaged: one-line ConfigError
    if old == identity(yaml.safe_load(to_yaml(cfg))):
        return []
    return diff(old, identity(cfg.to_dict())) or ["(the stored config.yaml is written differently)"]


def different_config(run_dir: str, d: list[str]) -> ConfigError:
    """The one-line refusal of a run directory that holds another config."""
    return ConfigError(
        f"{run_dir} already holds a run with a different config ({'; '.join(d[:3])}"
        f"{'; ...' if len(d) > 3 else ''}); choose another --out"
    )


def stored_run(run_dir: str, cfg: RunConfig) -> str | None:
    """'finished' or 'resume' for a run directory that holds ``cfg``, None for one that holds no
    config.  Refuses (one line) a different config and entries cconv did not create
    (``io.check_run_dir``).  Reads only: deciding that a finished run has nothing to do writes
    nothing, also on a read-only file system."""
    io.check_run_dir(run_dir)
    d = stored_config_diff(run_dir, cfg)
    if d:
        raise different_config(run_dir, d)
    if d is None:
        return None
    return "finished" if io.is_finished(run_dir) else "resume"


def prepare_run_dir(run_dir: str, cfg: RunConfig) -> str:
    """Create/validate a run directory; returns 'finished', 'resume' or 'new'.  Never modifies a
    directory that holds a different config, nor one whose run has finished."""
    kind = stored_run(run_dir, cfg)
    if kind is not None:
        return kind
    cpath = os.path.join(run_dir, io.CONFIG)
    io.check_writable(os.path.dirname(os.path.abspath(run_dir)) or ".")
    io.check_writable(run_dir)
    _refuse_foreign(run_dir)
    io.atomic_write_text(cpath, to_yaml(cfg))
    return "new"


def execute(
    cfg: RunConfig,
    run_dir: str,
    problem: Problem | None = None,
    desc: str | None = None,
    stop_after: int | None = None,
    nested: bool = False,
    pause_at: int | None = None,
) -> RunResult:
    """Run (or resume, or skip when finished) one config into ``run_dir``.

    The run directory is locked for the whole call (``io.run_lock``): when another process holds
    it, ``io.RunLocked`` (a ValueError) is raised and nothing is touched.
    Bad input raises ConfigError/ValueError before anything is written.  Errors during training are
    recorded as status ``failed`` in summary.json and re-raised.  ``stop_after`` ends the process
    loop early (after that step, as a kill would) -- for tests of the resume path.  ``nested``:
    the progress bar sits under a sweep's bar and disappears when the run ends.  ``pause_at``:
    train to that step, checkpoint there and return status ``paused`` (``summary.json`` says so;
    the next ``execute`` resumes from it): the advisor's races continue survivors this way.
    """
    if problem is None:
        problem = build.problem(cfg)
    if stored_run(run_dir, cfg) == "finished":  # a no-op that writes nothing (no lock either)
        s = io.read_summary(run_dir)
        return RunResult(s["status"], s, trained=False)
    io.check_writable(os.path.dirname(os.path.abspath(run_dir)) or ".")
    _refuse_foreign(run_dir)  # before a lock file is put there
    io.check_writable(run_dir)
    with io.run_lock(run_dir):
        return _execute_locked(problem, cfg, run_dir, desc, _Stop(stop_after, pause_at), nested)


class _Stop(NamedTuple):
    """Where a call of ``execute`` ends before ``cfg.steps``: ``after`` (as a kill: no checkpoint)
    or ``pause`` (checkpointed, status ``paused``)."""

    after: int | None = None
    pause: int | None = None

    def due(self, step: int) -> bool:
        return any(x is not None and step >= x for x in self)


def _execute_locked(
    problem: Problem, cfg: RunConfig, run_dir: str, desc: str | None, stop: _Stop, nested: bool
) -> RunResult:
    state_kind = prepare_run_dir(run_dir, cfg)
    if state_kind == "finished":
        s = io.read_summary(run_dir)
        return RunResult(s["status"], s, trained=False)
    try:
        return _train(problem, run_dir, desc or os.path.basename(os.path.abspath(run_dir)), stop, nested)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # recorded, then re-raised for the caller to report
        msg = error_line(e)
        prev = io.read_summary(run_dir) or {}
        try:  # best effort (the disk may be full): the caller checks what was recorded
            io.write_json(
                os.path.join(run_dir, io.SUMMARY),
                {**prev, "status": "failed", "error": msg, "traceback": traceback.format_exc()},
            )
        except OSError:
            pass
        raise


def error_line(e: BaseException) -> str:
    """``Type: first line of the message``, as recorded in summary.json's ``error``."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()


def failure_recorded(run_dir: str, e: BaseException) -> bool:
    """Does ``run_dir/summary.json`` record this failure (``execute`` writes it when it can)?"""
    s = io.read_summary(run_dir) or {}
    return s.get("status") == "failed" and s.get("error") == error_line(e)


@dataclasses.dataclass
class Counters:
    """Running totals of a run, per seed; checkpointed with the state (``to_dict`` / ``from_dict``,
    a JSON mapping with these keys).

    cum_sent, cum_recv  bytes sent / received per worker since step 0 (moved by the collectives)
    cum_enc_sent, cum_enc_recv   the same for the encoded messages (= moved for fixed formats)
    sim                 simulated time since step 0, per seed and network (None: no network)
    wall                wall-clock seconds spent training, resumes included
    diverged            the step at which the seed diverged (``cconv.experiments.divergence``:
                        non-finite loss, or above 10x the first step's), per seed (None: not)
    diverged_why        that rule's one-line reason, per seed (None: not diverged)
    loss0               the seed's first step's training loss, the divergence rule's reference
    calibration         the measured compute / exchange times behind ``sim`` (None: no network)
    acc                 running sums of the metrics since the last metric line, per seed, with
                        ``_n`` (steps summed), ``_last`` (the last step's metrics) and ``_times``
                        (its simulated step times)
    """

    cum_sent: list[float]
    cum_recv: list[float]
    sim: list[list[float]] | None
    wall: float
    diverged: list[int | None]
    calibration: dict | None
    acc: list[dict]
    cum_enc_sent: list[float] = dataclasses.field(default_factory=list)
    cum_enc_recv: list[float] = dataclasses.field(default_factory=list)
    diverged_why: list = dataclasses.field(default_factory=list)
    loss0: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.cum_sent)  # counters made before the divergence rule had a reference
        self.diverged_why = self.diverged_why or [None] * n
        self.loss0 = self.loss0 or [None] * n

    @classmethod
    def fresh(cls, seeds: int) -> Counters:
        z = lambda: [0.0] * seeds
        n = lambda: [None] * seeds
        return cls(z(), z(), None, 0.0, n(), None, [dict() for _ in range(seeds)], z(), z(), n(), n())

    @classmethod
    def from_dict(cls, d: dict) -> Counters:
        # checkpoints written before encoded sizes were logged: every format was fixed (encoded = moved);
        # before the divergence rule had a reference: only its non-finite part applies (loss0 None)
        n = [None] * len(d["cum_sent"])
        d = {
            "cum_enc_sent": list(d["cum_sent"]),
            "cum_enc_recv": list(d["cum_recv"]),
            "diverged_why": n,
            "loss0": n,
            **d,
        }
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict:
        """The checkpointed mapping (shares the lists and dicts, no copy)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def all_diverged(self) -> bool:
        return all(d is not None for d in self.diverged)


class _Outputs(NamedTuple):
    """Where a run's results go while it trains."""

    writer: Any  # a writers.MultiWriter: metrics.jsonl, then TensorBoard / wandb when configured
    bar: Any  # progress bar
    ckpt: Checkpointer

    def emit(self, lines: list[dict]) -> None:
        writers.write_lines(self.writer, lines)


def open_writers(cfg: RunConfig, run_dir: str, desc: str, start: int) -> writers.MultiWriter:
    """The run's metric writers: metrics.jsonl always, TensorBoard (``<run>/tensorboard/``) when
    ``tensorboard: true``, wandb when ``wandb`` is set.  ``start``: the step the run resumes at."""
    out: list = [writers.JsonlWriter(os.path.join(run_dir, io.METRICS))]
    try:
        if cfg.tensorboard:
            out.append(writers.TensorBoardWriter(os.path.join(run_dir, TENSORBOARD), start=start))
        if cfg.wandb:
            run_id = f"{desc[:40]}-{cfg.digest()}".replace(",", "_").replace("=", "-")
            out.append(writers.WandbWriter(cfg.wandb, cfg.to_dict(), run_dir, desc, run_id=run_id))
    except BaseException:
        writers.MultiWriter(out).close(failed=True)
        raise
    return writers.MultiWriter(out)


def initial_state(problem: Problem) -> Any:
    """The trainer's initial state; several seeds: one initial model per seed on the leading axis
    (the engine's ``build(seeds=S)`` program, whose state, batch and keys carry a seed axis)."""
    trainer = problem.trainer
    if len(problem.seeds) > 1:
        return trainer.init(
            params=_stack([sp.params for sp in problem.specs]),
            model_state=_stack([sp.model_state for sp in problem.specs]),
        )
    return trainer.init()


def _restore(problem: Problem, ckpt: Checkpointer, state: Any) -> tuple[int, Any, Counters]:
    """(first step, state, counters): from the latest checkpoint (the batchers' positions
    restored), or fresh.  Touches no metric line: ``_train`` cuts metrics.jsonl back to the first
    step once the restart is known to proceed."""
    template = state
    while True:
        latest = ckpt.latest_step()
        if latest is None:
            return 0, template, Counters.fresh(len(problem.seeds))
        try:
            start, state, meta = ckpt.restore(template, latest)
            counters = Counters.from_dict(meta["counters"])
            host = [decode_host_state(st) for st in meta["batchers"]]
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore/json errors of a damaged checkpoint
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
            older = [s for s in ckpt.all_steps() if s < latest]
            if not older:
                raise CheckpointError(
                    f"checkpoint {ckpt.path(latest)} cannot be restored ({why}); remove that directory "
                    f"to restart the run from step 0 (metrics.jsonl is cut back to match)"
                ) from e
            import warnings

            moved = ckpt.set_aside(latest)
            warnings.warn(
                f"checkpoint {ckpt.path(latest)} cannot be restored ({why}); moved to {moved}, "
                f"resuming from step {older[-1]}",
                io.RecoveryWarning,
                stacklevel=2,
            )
            continue
        break
    state = state.replace(step=start)  # the step counter is static metadata, not a leaf
    problem.trainer.load_host_state(meta.get("sync_host"))  # e.g. AdaComm's period
    for b, st in zip(problem.batchers, host):
        b.load_state_dict(st)
    return start, state, counters


def _save(problem: Problem, ckpt: Checkpointer, step: int, state: Any, counters: Counters) -> None:
    ckpt.save(
        step,
        state,
        {
            "counters": counters.to_dict(),
            "batchers": [encode_host_state(b.state_dict()) for b in problem.batchers],
            **({"sync_host": h} if (h := problem.trainer.host_state()) is not None else {}),
        },
    )


def _make_clock(problem: Problem, counters: Counters, start: int) -> SimClock | None:
    """The simulated clock when the config names networks (its calibration is kept in, and on
    resume taken from, ``counters``); measured here, before the wall clock starts."""
    cfg = problem.cfg
    if not cfg.networks():
        return None
    calib = Calibration(problem, counters.calibration)
    counters.calibration = calib.data
    clock = SimClock(cfg, problem.trainer, calib)
    if counters.sim is None:
        counters.sim = [[0.0] * len(clock.nets) for _ in problem.seeds]
    clock.step_times(start)
    return clock


def _step_inputs(problem: Problem, step: int, step_keys: list) -> tuple[Any, Any]:
    """(batch, key) of one step; several seeds: stacked on a leading seed axis."""
    batch = [b.next() for b in problem.batchers]
    if len(problem.seeds) > 1:
        return (
            {k: np.stack([bt[k] for bt in batch]) for k in batch[0]},
            jnp.stack([jax.random.fold_in(k, step) for k in step_keys]),
        )
    return batch[0], jax.random.fold_in(step_keys[0], step)


def _must_flush(cfg: RunConfig, step: int, pending: int, stop: _Stop) -> bool:
    """Wait for the device here?  At most ``MAX_INFLIGHT`` steps in flight (the deadlock trap),
    and at every metric line, checkpoint, the last step and where the call stops."""
    return (
        pending >= MAX_INFLIGHT
        or step % cfg.log_every == 0
        or step == cfg.steps
        or step % cfg.checkpoint_every == 0
        or stop.due(step)
    )


def _is_max(name: str) -> bool:
    """A step metric named ``*_max`` is a maximum: a line carries the largest since the previous
    line; every other step metric, the mean."""
    return name.endswith("_max")


def _accumulate(
    problem: Problem, counters: Counters, clock: SimClock | None, pending: list[tuple[int, dict]]
) -> list[tuple[int, int, dict]]:
    """Add the host metrics of finished steps to ``counters``; returns the metric lines due, as
    (seed index, step, accumulated sums).  A loss that breaks ``cconv.experiments.divergence``'s
    rule marks its seed diverged (that line is written, later steps of the seed are not counted)."""
    cfg, multi = problem.cfg, len(problem.seeds) > 1
    records = []
    for s_idx, hm in pending:
        times = clock.step_times(s_idx) if clock else []
        for i in range(len(problem.seeds)):
            if counters.diverged[i] is not None:
                continue
            mi = {k: float(np.asarray(v)[i]) if multi else float(np.asarray(v)) for k, v in hm.items()}
            counters.cum_sent[i] += mi.get("bytes_sent", 0.0)
            counters.cum_recv[i] += mi.get("bytes_received", 0.0)
            counters.cum_enc_sent[i] += mi.get("bytes_encoded_sent", 0.0)
            counters.cum_enc_recv[i] += mi.get("bytes_encoded_received", 0.0)
            for j, t in enumerate(times):
                counters.sim[i][j] += t
            a = counters.acc[i]
            for k, v in mi.items():
                if not k.startswith("bytes_") and k != "density":
                    a[k] = max(a.get(k, -math.inf), v) if _is_max(k) else a.get(k, 0.0) + v
            a["_n"] = a.get("_n", 0) + 1
            a["_last"] = mi
            a["_times"] = times
            done = s_idx + 1
            loss = mi.get("loss", 0.0)
            why = divergence.reason(loss, counters.loss0[i], done)
            if counters.loss0[i] is None and math.isfinite(loss):
                counters.loss0[i] = loss
            bad = why is not None
            if bad:
                counters.diverged[i], counters.diverged_why[i] = done, why
            if bad or done % cfg.log_every == 0 or done == cfg.steps:
                records.append((i, done, a))
                counters.acc[i] = {}
    return records


def _metric_line(
    problem: Problem,
    counters: Counters,
    clock: SimClock | None,
    i: int,
    done: int,
    a: dict,
    test: dict | None,
    elapsed: float,
) -> dict:
    """One metrics.jsonl line (module docstring) of seed index ``i`` at step ``done``."""
    line = {"step": done, "seed": problem.seeds[i]}
    n = a.pop("_n")
    last = a.pop("_last")
    times = a.pop("_times")
    for k, v in a.items():
        line[k] = v if _is_max(k) else v / n
    if test is not None:
        line.update(test)
    line["bytes_sent"] = last.get("bytes_sent", 0.0)
    line["bytes_received"] = last.get("bytes_received", 0.0)
    line["bytes_encoded_sent"] = last.get("bytes_encoded_sent", 0.0)
    line["bytes_encoded_received"] = last.get("bytes_encoded_received", 0.0)
    if "density" in last:
        line["density"] = last["density"]
    line["cum_bytes_sent"] = counters.cum_sent[i]
    line["cum_bytes_received"] = counters.cum_recv[i]
    line["cum_bytes"] = counters.cum_sent[i] + counters.cum_recv[i]
    line["cum_bytes_encoded"] = counters.cum_enc_sent[i] + counters.cum_enc_recv[i]
    if clock:
        for j, lab in enumerate(clock.labels):
            line[f"sim_time@{lab}"] = counters.sim[i][j]
            line[f"sim_step_time@{lab}"] = times[j]
        line["sim_time"] = counters.sim[i][0]
        line["sim_step_time"] = times[0]
    line["wall_time"] = elapsed
    return line


def _train_steps(
    problem: Problem,
    state: Any,
    step: int,
    counters: Counters,
    clock: SimClock | None,
    out: _Outputs,
    t0: float,
    last_lines: list,
    stop_at: _Stop,
) -> tuple[int, Any]:
    """The step loop from ``step`` to ``cfg.steps`` (or until every seed diverged): steps are
    dispatched without waiting; every ``_must_flush`` the finished steps' metrics are fetched,
    counted, written (with a test evaluation) and the run is checkpointed.  Returns (step, state);
    raises ``_Stopped`` where ``stop_at`` says (checkpointed first for a pause).  A pending
    SIGTERM/SIGINT (``signals.pending``) ends the loop after the step just dispatched: its steps
    are flushed and written, a checkpoint is saved
    at it and ``signals.Interrupted`` is raised (at the last step the run simply ends)."""
    cfg = problem.cfg
    step_fn = problem.trainer.step
    step_keys = [seed_keys(s)["steps"] for s in problem.seeds]
    evaluator = evaluator_of(problem)
    pending: list = []
    while step < cfg.steps:
        batch, key = _step_inputs(problem, step, step_keys)
        state, m = step_fn(state, batch, key)
        pending.append((step, m))
        step += 1
        stop = signals.pending() is not None and step < cfg.steps  # SIGTERM/SIGINT: stop at this step
        if not stop and not _must_flush(cfg, step, len(pending), stop_at):
            continue
        host = jax.device_get([p[1] for p in pending])
        records = _accumulate(problem, counters, clock, [(p[0], h) for p, h in zip(pending, host)])
        steps_done = len(pending)
        pending = []
        elapsed = time.perf_counter() - t0
        if records:
            need_eval = any(counters.diverged[i] is None for i, _, _ in records)
            tests = evaluate(problem, evaluator, state) if need_eval else None
            lines = []
            for i, done, a in records:
                test = tests[i] if counters.diverged[i] is None else None
                lines.append(_metric_line(problem, counters, clock, i, done, a, test, elapsed))
                last_lines[i] = lines[-1]
            out.emit(lines)
        out.bar.update(steps_done)
        if counters.all_diverged():
            break
        pause = stop_at.pause is not None and step >= stop_at.pause and step < cfg.steps
        if stop or pause or (step % cfg.checkpoint_every == 0 and step < cfg.steps):
            counters.wall = time.perf_counter() - t0
            _save(problem, out.ckpt, step, state, counters)
        if stop:
            raise signals.Interrupted(signals.pending(), step)
        if stop_at.due(step) and step < cfg.steps:
            raise _Stopped(step if pause else None)
    return step, state


def _final_summary(problem: Problem, base: dict, step: int, counters: Counters, last_lines: list) -> dict:
    """summary.json of a run that ended: completed, or diverged (with the steps per seed)."""
    seeds, div = problem.seeds, counters.diverged
    status = "diverged" if any(d is not None for d in div) else "completed"
    per_seed = {
        str(s): {
            "status": "diverged" if div[i] is not None else "completed",
            "diverged_at_step": div[i],
            "diverged_why": counters.diverged_why[i],
            "final": last_lines[i],
        }
        for i, s in enumerate(seeds)
    }
    summary = {
        **base,
        "status": status,
        "error": None,
        "step": step,
        "wall_time": counters.wall,
        "final": last_lines[0] if len(seeds) == 1 else None,
        "per_seed": per_seed,
    }
    if status == "diverged":
        why = counters.diverged_why
        summary["error"] = "; ".join(
            f"seed {s}: {why[i] or f'non-finite loss at step {d}'}"
            for i, (s, d) in enumerate(zip(seeds, div))
            if d is not None
        )
    return summary


def _ended(cfg: RunConfig, step: int, counters: Counters) -> bool:
    """Is a checkpoint at ``step`` the final one?  Only the end of the run (``cfg.steps``, or the
    step at which every seed had diverged) is checkpointed at such a step."""
    return step >= cfg.steps or counters.all_diverged()


def _summary_base(problem: Problem, desc: str, counters: Counters) -> dict:
    return {
        "run": desc,
        "config_digest": problem.cfg.digest(),
        "seeds": problem.seeds,
        "calibration": counters.calibration,
    }


def _recover_summary(problem: Problem, run_dir: str, desc: str, step: int, counters: Counters) -> RunResult:
    """The summary of a run whose final checkpoint exists but whose ``summary.json`` does not say
    so (a kill between the two writes, or a lost or garbled summary): rebuilt from the truth, the
    checkpoint (counters, step) and metrics.jsonl (already cut back to the checkpoint's step; the
    last line of each seed is its final line).  Nothing is trained again."""
    lines = io.read_jsonl(os.path.join(run_dir, io.METRICS))
    last_lines: list = [None] * len(problem.seeds)
    for line in lines:
        if line.get("seed") in problem.seeds:
            last_lines[problem.seeds.index(line["seed"])] = line
    summary = _final_summary(problem, _summary_base(problem, desc, counters), step, counters, last_lines)
    io.write_json(os.path.join(run_dir, io.SUMMARY), summary)
    return RunResult(summary["status"], summary)


def _mark_interrupted(run_dir: str, base: dict, e: signals.Interrupted, ckpt: Checkpointer, counters: Counters) -> None:
    """summary.json of a run stopped by a signal: ``interrupted`` at the step of its checkpoint
    (``e.step``; after a second signal, the latest checkpoint's step, which is where it resumes)."""
    step = e.step if e.step is not None else (ckpt.latest_step() or 0)
    ckpt.close()
    summary = {**base, "status": "interrupted", "error": None, "signal": e.name, "step": step}
    io.write_json(os.path.join(run_dir, io.SUMMARY), {**summary, "wall_time": counters.wall})


@signals.deferring
def _train(problem: Problem, run_dir: str, desc: str, stop: _Stop = _Stop(), nested: bool = False) -> RunResult:
    """Restore or start, train, write the summary (the protocol of the module docstring); a
    SIGTERM/SIGINT received meanwhile stops it at a checkpoint (``cconv.experiments.signals``)."""
    from cconv.experiments.loggers import progress

    cfg = problem.cfg
    ckpt = Checkpointer(os.path.join(run_dir, io.CHECKPOINTS), keep=KEEP_CHECKPOINTS)
    mpath = os.path.join(run_dir, io.METRICS)
    start, state, counters = _restore(problem, ckpt, initial_state(problem))
    if _ended(cfg, start, counters):  # killed after the final checkpoint, before the summary
        ckpt.close()
        io.repair_jsonl(mpath, start)
        return _recover_summary(problem, run_dir, desc, start, counters)
    clock = _make_clock(problem, counters, start)  # measured before the wall clock starts
    writer = open_writers(cfg, run_dir, desc, start)
    # Everything the restart needs is in place: only now is metrics.jsonl cut back to the step it
    # resumes at (emptied for a fresh start), so a restart that fails loses no line.
    try:
        io.repair_jsonl(mpath, start if start > 0 else -1)
        summary_base = _summary_base(problem, desc, counters)
        io.write_json(os.path.join(run_dir, io.SUMMARY), {**summary_base, "status": "running", "step": start})
    except BaseException:
        writer.close(failed=True)
        raise
    out = _Outputs(
        writer,
        progress(cfg.steps, desc, initial=start, position=1 if nested else None, leave=not nested),
        ckpt,
    )
    t0 = time.perf_counter() - counters.wall
    last_lines: list = [None] * len(problem.seeds)
    try:
        step, state = _train_steps(problem, state, start, counters, clock, out, t0, last_lines, stop)
    except _Stopped as e:
        out.bar.close()
        ckpt.close()
        writer.close()
        return _stopped(run_dir, summary_base, counters, e.paused_at)
    except signals.Interrupted as e:
        out.bar.close()
        _mark_interrupted(run_dir, summary_base, e, ckpt, counters)
        writer.close()
        raise
    except BaseException:
        out.bar.close()
        writer.close(failed=True)
        raise
    out.bar.close()
    counters.wall = time.perf_counter() - t0
    try:
        _save(problem, ckpt, step, state, counters)
        ckpt.close()
        summary = _final_summary(problem, summary_base, step, counters, last_lines)
        io.write_json(os.path.join(run_dir, io.SUMMARY), summary)
    except BaseException:
        writer.close(failed=True)
        raise
    writer.write_summary({"status": summary["status"], **(last_lines[0] or {})})
    writer.close()
    return RunResult(summary["status"], summary)


def _stopped(run_dir: str, base: dict, counters: Counters, paused_at: int | None) -> RunResult:
    """The result of a call that ended before the run did: ``paused`` (checkpointed at
    ``paused_at``; summary.json says so, with each seed's divergence so far) or, for
    ``stop_after``, ``running`` (as a kill leaves it)."""
    if paused_at is not None:
        io.write_json(
            os.path.join(run_dir, io.SUMMARY),
            {**base, "status": "paused", "step": paused_at, "diverged_why": counters.diverged_why},
        )
        return RunResult("paused", io.read_summary(run_dir))
    return RunResult("running", io.read_summary(run_dir))


class _Stopped(Exception):
    def __init__(self, paused_at: int | None = None):
        super().__init__(paused_at)
        self.paused_at = paused_at
