"""One training run from a ``RunConfig``: train, log, checkpoint, resume (the run's objects are
built in one pass by ``cconv.experiments.build``).

``execute`` holds the protocol below; each concern lives in its own module:
``cconv.experiments.rundir`` (the run directory: which run it holds, the checks, the lock, the
claim, ``summary.json``), ``cconv.experiments.runstate`` (the checkpointed state: restore, save,
the clock's calibration), ``cconv.experiments.training`` (the step loop, its state one ``Loop``),
``cconv.experiments.counters`` (running totals, metric lines, the final summary),
``cconv.experiments.evaluation`` (test metrics) and ``cconv.experiments.clock`` (``SimClock``).

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
   foreign file types), and a finished run is recognized reading only (``rundir.stored_run``).
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
``cconv.engine.worker_clock``) ``t_compute`` is multiplied by the synchronization mode's span of the
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

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import NamedTuple

from cconv.experiments import build, io, runstate, signals, writers
from cconv.experiments.build import Problem
from cconv.experiments.checkpoint import Checkpointer
from cconv.experiments.config import RunConfig
from cconv.experiments.counters import Counters, final_summary
from cconv.experiments.rundir import RunDir, stored_config_diff, stored_run
from cconv.experiments.runstate import initial_state
from cconv.experiments.training import Loop, Stop, Stopped, train_steps

# ``stored_run`` / ``stored_config_diff`` (``cconv.experiments.rundir``) and ``initial_state``
# (``cconv.experiments.runstate``) keep their older address here.
__all__ = ["RunResult", "execute", "initial_state", "open_writers", "stored_config_diff", "stored_run"]

KEEP_CHECKPOINTS = 2  # checkpoints kept per run: a damaged latest one falls back to the previous
TENSORBOARD = io.TENSORBOARD  # event files of a run with tensorboard: true (one directory per seed)


class RunResult(NamedTuple):
    status: str
    summary: dict
    trained: bool = True  # False: the run had already ended, nothing was done


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
    rd = RunDir(run_dir, cfg, desc)
    seen = rd.stored()
    if seen == "finished":  # a no-op that writes nothing (no lock either) and loads nothing
        return _already(rd)
    if problem is None:
        problem = build.problem(cfg)  # data and model load before anything is created
    rd.check_creatable()  # before a lock file is put there
    with rd.claimed(seen) as kind:
        if kind == "finished":
            return _already(rd)
        try:
            return _train(problem, rd, Stop(stop_after, pause_at), nested)
        except Exception as e:  # recorded, then re-raised for the caller to report
            rd.record_failure(e)
            raise


def _already(rd: RunDir) -> RunResult:
    """The result of a run that had ended before this call: its summary, nothing trained."""
    s = rd.read_summary()
    return RunResult(s["status"], s, trained=False)


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


# --------------------------------------------------------------------------- one call's training


@signals.deferring
def _train(problem: Problem, rd: RunDir, stop: Stop = Stop(), nested: bool = False) -> RunResult:
    """Restore or start, train, write the summary (the protocol of the module docstring); a
    SIGTERM/SIGINT received meanwhile stops it at a checkpoint (``cconv.experiments.signals``).

    The resources come from one ExitStack and close in reverse order whatever happens: the
    progress bar, the metric writers (marked failed on an error), the checkpointer (which waits
    for its saves).  The summary that ends the call (``_Ending``, the stack's first entry) is
    written after all of them, once the checkpoint it names is on disk, and only when they closed
    cleanly."""
    end = _Ending(rd)
    with contextlib.ExitStack() as stack:
        stack.push(end.write)  # the first entry: it runs last
        loop = _start(problem, rd, stack, end, stop, nested)
        if loop is not None:
            _run(loop, end)
    return end.result()


def _start(
    problem: Problem, rd: RunDir, stack: contextlib.ExitStack, end: _Ending, stop: Stop, nested: bool
) -> Loop | None:
    """Open the checkpointer, restore the run (or start it), open its writers and progress bar
    (all onto ``stack``) and mark it ``running``: the loop that trains it.  None for a run that
    had ended (killed after its final checkpoint, before its summary): its summary is rebuilt
    (``_recovered``)."""
    from cconv.experiments.loggers import progress

    cfg = problem.cfg
    ckpt = stack.enter_context(contextlib.closing(rd.checkpointer(KEEP_CHECKPOINTS)))
    start, state, counters = runstate.restore(problem, ckpt, initial_state(problem))
    if start >= cfg.steps or counters.all_diverged():  # only the end of a run is checkpointed there
        rd.cut_metrics(start)
        end.done(_recovered(problem, rd, start, counters))
        return None
    clock = runstate.make_clock(problem, counters, start)  # measured before the wall clock starts
    writer = stack.enter_context(_closing_writer(open_writers(cfg, rd.path, rd.desc, start)))
    # Everything the restart needs is in place: only now is metrics.jsonl cut back to the step it
    # resumes at (emptied for a fresh start), so a restart that fails loses no line.
    rd.cut_metrics(start if start > 0 else -1)
    end.base = _summary_base(problem, rd.desc, counters)
    rd.write_summary({**end.base, "status": "running", "step": start})
    # tqdm puts the bar on the first free line: under a sweep's bar, or beside the bars of runs
    # trained at once (the advisor's rungs); ``nested``: it disappears when the run ends
    where = dict(initial=start, leave=not nested)
    bar = stack.enter_context(contextlib.closing(progress(cfg.steps, rd.desc, **where)))
    t0 = time.perf_counter() - counters.wall  # wall time goes on across resumes
    return Loop(
        problem=problem,
        state=state,
        step=start,
        counters=counters,
        clock=clock,
        writer=writer,
        bar=bar,
        ckpt=ckpt,
        stop=stop,
        t0=t0,
    )


def _run(loop: Loop, end: _Ending) -> None:
    """Train ``loop`` and settle how the call ends (``end``): completed or diverged (the final
    checkpoint saved first), paused or stopped early, or interrupted (re-raised)."""
    try:
        train_steps(loop)
    except Stopped as e:
        end.stopped(e.paused_at, loop.counters)
        return
    except signals.Interrupted as e:
        end.interrupted(e, loop.ckpt, loop.counters)
        raise
    loop.counters.wall = time.perf_counter() - loop.t0
    runstate.save(loop.problem, loop.ckpt, loop.step, loop.state, loop.counters)
    summary = final_summary(loop.problem.seeds, end.base, loop.step, loop.counters, loop.last_lines)
    loop.writer.write_summary({"status": summary["status"], **(loop.last_lines[0] or {})})
    end.done(summary)


@contextlib.contextmanager
def _closing_writer(writer: writers.MultiWriter) -> Iterator[writers.MultiWriter]:
    """``writer``, closed on the way out: marked failed on an error (not on a signal's stop)."""
    try:
        yield writer
    except signals.Interrupted:
        writer.close()
        raise
    except BaseException:
        writer.close(failed=True)
        raise
    writer.close()


def _summary_base(problem: Problem, desc: str, counters: Counters) -> dict:
    return {
        "run": desc,
        "config_digest": problem.cfg.digest(),
        "seeds": problem.seeds,
        "calibration": counters.calibration,
    }


def _recovered(problem: Problem, rd: RunDir, step: int, counters: Counters) -> dict:
    """The summary of a run whose final checkpoint exists but whose ``summary.json`` does not say
    so (a kill between the two writes, or a lost or garbled summary): rebuilt from the truth, the
    checkpoint (counters, step) and metrics.jsonl (already cut back to the checkpoint's step; the
    last line of each seed is its final line).  Nothing is trained again."""
    last_lines: list = [None] * len(problem.seeds)
    for line in io.read_jsonl(rd.file(io.METRICS)):
        if line.get("seed") in problem.seeds:
            last_lines[problem.seeds.index(line["seed"])] = line
    return final_summary(problem.seeds, _summary_base(problem, rd.desc, counters), step, counters, last_lines)


@dataclasses.dataclass
class _Ending:
    """How one call of ``_train`` ends: the summary.json it writes last (None: none; a failure is
    recorded by ``execute``) and the ``RunResult`` it returns."""

    rd: RunDir
    base: dict = dataclasses.field(default_factory=dict)  # the summary's fields at every status
    summary: dict | None = None
    status: str = "running"
    read_back: bool = False  # the result carries what summary.json says once written

    def done(self, summary: dict) -> None:
        """The run ended: completed or diverged."""
        self.summary, self.status = summary, summary["status"]

    def stopped(self, paused_at: int | None, counters: Counters) -> None:
        """The call ended before the run did: ``paused`` (checkpointed at ``paused_at``; the
        summary says so, with each seed's divergence so far) or, for ``stop_after``, ``running``
        (as a kill leaves it)."""
        if paused_at is not None:
            self.status = "paused"
            self.summary = {**self.base, "status": "paused", "step": paused_at, "diverged_why": counters.diverged_why}
        self.read_back = True

    def interrupted(self, e: signals.Interrupted, ckpt: Checkpointer, counters: Counters) -> None:
        """Stopped by a signal: ``interrupted`` at the step of its checkpoint (``e.step``; after a
        second signal, the latest checkpoint's step, which is where it resumes)."""
        step = e.step if e.step is not None else (ckpt.latest_step() or 0)
        summary = {**self.base, "status": "interrupted", "error": None, "signal": e.name, "step": step}
        self.summary = {**summary, "wall_time": counters.wall}

    def write(self, exc_type, exc, tb) -> bool:
        """Write the summary, unless closing the resources failed (an ExitStack exit callback)."""
        if self.summary is not None and (exc_type is None or issubclass(exc_type, signals.Interrupted)):
            self.rd.write_summary(self.summary)
        return False

    def result(self) -> RunResult:
        return RunResult(self.status, self.rd.read_summary() if self.read_back else self.summary)
