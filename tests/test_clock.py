"""The one simulated clock (``cconv.experiments.clock``, issue 33 items 4 and 5): a step's time from
the work the trainer states (``Trainer.step_work``), against hand-computed values; the real step's
measurement (median per phase, compilation excluded) on a fake clock; and ``cconv advise --timing
measured`` / ``cconv plan --measure`` end to end on simulated devices."""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from cconv.comm.accounting import Collective
from cconv.engine.trainer import StepWork
from cconv.experiments import clock as CK
from cconv.theory import devices as D
from cconv.theory.network import Network
from cconv.theory.schedule.compress import Ratio

NET = Network("toy", alpha=1e-5, beta=1e-9)  # 10 us per message, 1 GB/s
P = 4


def work(step: int, **kw) -> StepWork:
    """A step that all-reduces 4 MB once (every 4th step: local, no exchange); span 1 + step / 10."""
    base = dict(
        phase=("sync" if step % 4 == 0 else "local", None),
        span=1.0 + step / 10,
        communicates=step % 4 == 0,
        collectives=(Collective("allreduce", 4e6, 1),) if step % 4 == 0 else (),
        via_server=False,
        compressor=None,
        memory="none",
        units=(),
        program=None,
    )
    return StepWork(**{**base, **kw})


class FakeTrainer:
    def __init__(self):
        self.asked = []

    def step_work(self, step):
        self.asked.append(step)
        return work(step)


def allreduce(n):  # ring all-reduce, by hand: 2 (P-1) alpha + 2 (P-1)/P n beta
    return 2 * (P - 1) * NET.alpha + 2 * (P - 1) / P * n * NET.beta


def test_a_step_is_compute_times_span_plus_exchange_plus_its_collectives():
    costs = SimpleNamespace(compute_time=2e-3, exchange_time=lambda w: 5e-4)
    ck = CK.Clock(FakeTrainer(), costs, [NET], P)
    assert ck.step_times(0) == [pytest.approx(2e-3 * 1.0 + 5e-4 + allreduce(4e6), rel=1e-12)]
    assert ck.step_times(1) == [pytest.approx(2e-3 * 1.1, rel=1e-12)]  # local: compute only, no exchange
    assert ck.step_times(8) == [pytest.approx(2e-3 * 1.8 + 5e-4 + allreduce(4e6), rel=1e-12)]
    c = ck.cost(8, NET)
    assert (c.compute_s, c.compress_s, c.comm_s) == pytest.approx((3.6e-3, 5e-4, allreduce(4e6)))
    mean = ck.mean(range(4), NET)
    by_hand = (2e-3 * (1.0 + 1.1 + 1.2 + 1.3) + 5e-4 + allreduce(4e6)) / 4
    assert mean.step_s == pytest.approx(by_hand, rel=1e-12)


def test_a_schedule_runs_the_event_simulator_on_the_same_work():
    """With a schedule, the step is ``runs.step_time`` of the stated collectives and the costs."""
    from cconv.theory.profiles import Layer, Profile
    from cconv.theory.schedule import runs

    prof = Profile("toy", (Layer("a", 1e9, 2e9, 2.4e6), Layer("b", 1e9, 2e9, 1.6e6)), 8, "")
    costs = SimpleNamespace(compute_time=2e-3, exchange_time=lambda w: 5e-4)
    ck = CK.Clock(FakeTrainer(), costs, [NET], P, schedule="wfbp", profile=prof)
    colls = list(work(0).collectives)
    assert ck.step_times(0)[0] == pytest.approx(runs.step_time(prof, colls, P, NET, "wfbp", 2e-3, 5e-4), rel=1e-12)
    assert ck.step_times(1)[0] == pytest.approx(2e-3 * 1.1)  # nothing to schedule on a local step


def test_modelled_exchange_by_hand():
    """Per compressed tensor of n elements: (x_c + 2 memory passes) F(n) + m x_d F(n) + 2 launches,
    F(n) = 4 n / B, m = P after an all-gather (1 after an all-reduce); the identity costs nothing."""
    dev = D.custom("toy", flops=1e12, mem_bw=1e11, launch_s=5e-6)
    bench = {"sel": (Ratio(1e3, 3.0, 1.0), Ratio(1e6, 5.0, 2.0))}
    c = SimpleNamespace(name="sel", aggregation="allgather")
    w = work(0, compressor=c, memory="ef", units=((1000,), (10**6,)))
    floor = lambda n: 4 * n / 1e11  # noqa: E731
    by_hand = (3 + 2) * floor(1e3) + P * 1.0 * floor(1e3) + 2 * 5e-6
    by_hand += (5 + 2) * floor(1e6) + P * 2.0 * floor(1e6) + 2 * 5e-6
    assert CK.exchange_seconds(w, dev, P, bench) == pytest.approx(by_hand, rel=1e-12)
    summable = w._replace(compressor=SimpleNamespace(name="sel", aggregation="allreduce"), memory="none")
    by_hand = 3 * floor(1e3) + 1.0 * floor(1e3) + 5 * floor(1e6) + 2.0 * floor(1e6) + 4 * 5e-6
    assert CK.exchange_seconds(summable, dev, P, bench) == pytest.approx(by_hand, rel=1e-12)
    assert CK.exchange_seconds(w._replace(compressor=None), dev, P, bench) == 0.0


def test_modelled_compute_by_hand():
    """FLOPs / sustained FLOP/s + 3 kernels per layer x launch."""
    dev = D.custom("toy", flops=1e12, mem_bw=1e11, launch_s=5e-6)
    prof = SimpleNamespace(fwd_flops=3e9, bwd_flops=6e9, layers=[1, 2, 3])
    m = CK.Modelled(None, dev, P, profile=prof)
    assert m.compute_time == pytest.approx(9e9 / 1e12 + 3 * 3 * 5e-6, rel=1e-12)


def test_trainer_states_its_steps_work():
    """``step_work``: the collectives of ``collectives`` without control traffic, the compressed
    tensors (one flat buffer when fused; PowerSGD leaves vectors dense), no compressor for the
    dense step, and local SGD's local steps do not communicate."""
    import jax.numpy as jnp
    import optax

    from cconv import compressors as C
    from cconv.engine import EngineConfig, build

    params = {"w": jnp.zeros((8, 6)), "b": jnp.zeros(6)}
    loss = lambda p, s, b, k: (jnp.sum(p["w"]) + jnp.sum(p["b"]), (s, {}))  # noqa: E731
    mk = lambda **kw: build(loss, params, optax.sgd(0.1), EngineConfig(workers=P, launcher="vmap", **kw))  # noqa: E731
    dense = mk()
    w = dense.step_work(0)
    assert w.compressor is None and w.communicates and w.span == 1.0 and not w.via_server
    assert list(w.collectives) == [c for c in dense.collectives(0) if not c.control]
    fused = mk(compressor=C.topk(ratio=0.5), granularity="fused").step_work(0)
    assert fused.compressor.name == "topk" and fused.units == ((48,),)  # the bias travels dense (by default)
    every = mk(compressor=C.topk(ratio=0.5), granularity="fused", compress_vectors=True).step_work(0)
    assert every.units == ((54,),)
    ps = mk(compressor=C.get("powersgd", rank=1)).step_work(0)
    assert ps.units == ((8, 6),)  # the bias vector travels dense
    local = mk(local_steps=2)
    assert local.step_work(0).communicates != local.step_work(1).communicates


def test_measure_step_takes_each_phases_median_and_leaves_compilation_out(monkeypatch):
    """On a fake clock: the first call of a phase (its compilation) costs 100 s and is left out;
    phase a's calls cost 1, 2, 9 s (median 2), phase b's 4 s; steps 0..3 are a, a, a, b, so the
    step is (3 x 2 + 4) / 4."""
    now = [0.0]
    costs = {"a": iter([100.0, 1.0, 9.0, 2.0]), "b": iter([100.0, 4.0, 4.0, 4.0])}

    class Trainer:
        def phase(self, s):
            return "b" if s == 3 else "a"

        def shard(self, batch):
            return batch

        def init(self, **kw):
            return SimpleNamespace(replace=lambda step: SimpleNamespace(step=step))

        def step(self, st, batch, key):
            now[0] += next(costs[self.phase(st.step)])
            return np.zeros(())

    monkeypatch.setattr(CK.time, "perf_counter", lambda: now[0])
    problem = SimpleNamespace(
        trainer=Trainer(),
        cfg=SimpleNamespace(steps=4, batch_size=2),
        ds=SimpleNamespace(train={"x": np.zeros((4, 1))}),
        specs=[SimpleNamespace(params={}, model_state={})],
    )
    assert CK.measure_step(problem, repeats=3) == pytest.approx((3 * 2.0 + 4.0) / 4)


# --------------------------------------------------------------------------- the commands

TINY = {
    "model": {"name": "mlp", "hidden": [16]},
    "data": "digits",
    "batch_size": 32,
    "steps": 40,
    "lr": 0.2,
    "advise": {"compressors": ["none", {"name": "topk", "ratio": 0.1}], "memory": ["ef"], "sync": ["bsp"]},
}


def _main(argv: list) -> int:
    """``cconv.cli.main``'s exit status (a usage error exits from argparse)."""
    from cconv.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


def _config(tmp_path, raw=TINY) -> str:
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--timing", "bogus"], "invalid choice: 'bogus'"),
        (["--measure-steps", "5"], "--measure-steps needs --timing measured"),
        (["--timing", "measured", "--measure-steps", "0"], "--measure-steps must be an integer in [1, 1000]"),
        (["--timing", "measured", "--cluster", "4x4"], "one device per worker: the cluster has 16 workers"),
        (["--timing", "measured", "TWO-SCHEDULES"], "give one of advise.schedules (bsp, wfbp)"),
        # started as 2 processes (srun, mpirun): each would race alone; refused before jax.distributed
        (["TWO-PROCESSES"], "started as 2 processes: cconv advise races in one process; only --timing measured"),
    ],
)
def test_advise_timing_refusals_exit_2_before_writing(args, match, tmp_path, capsys, monkeypatch):
    out = tmp_path / "adv"
    if "TWO-PROCESSES" in args:
        monkeypatch.setenv("CCONV_NUM_PROCESSES", "2")
        args = [a for a in args if a != "TWO-PROCESSES"]
    cluster = [] if "--cluster" in args else ["--cluster", "1x4"]
    raw = {**TINY, "advise": {**TINY["advise"], "schedules": ["bsp", "wfbp"]}} if "TWO-SCHEDULES" in args else TINY
    args = [a for a in args if a != "TWO-SCHEDULES"]
    assert _main(["advise", _config(tmp_path, raw), *cluster, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cconv: error:") and match in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    "args,match",
    [
        (["--measure-steps", "3", "--workers", "4", "--network", "10GbE"], "--measure-steps needs --measure CONFIG"),
        (["--measure", "CFG"], "--measure CONFIG needs --cluster"),
        (["--measure", "CFG", "--cluster", "1x4", "--workload", "resnet50"], "takes the model and its batch"),
        (["--measure", "CFG", "--cluster", "1x4", "--implementation", "per-tensor"], "fused"),
        (["--measure", "CFG", "--cluster", "4x4"], "one device per worker: the cluster has 16 workers"),
        (["--measure", "CFG", "--cluster", "1x4", "--measure-steps", "0"], "expected a positive integer"),
    ],
)
def test_plan_measure_refusals_exit_2(args, match, tmp_path, capsys):
    cfg = _config(tmp_path)
    assert _main(["plan", *[cfg if a == "CFG" else a for a in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


@pytest.mark.slow
def test_advise_timing_measured_end_to_end_on_simulated_devices(tmp_path):
    """A real ``cconv advise --timing measured`` process on 4 simulated CPU devices: each row's
    step is the measured one (the race's), the model's beside it, the cluster line says where it
    was measured, the JSON carries both."""
    from runs_helpers import run_cconv as cconv

    out = tmp_path / "adv"
    args = ["advise", _config(tmp_path), "--cluster", "1x4", "--target", "test_accuracy=0.8", "--seeds", "1"]
    r = cconv(*args, "--timing", "measured", "--measure-steps", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    adv = json.loads(r.stdout)
    assert adv["timing"] == "measured" and "(measured on 4 x cpu)" in adv["cluster"]
    assert {row["candidate"] for row in adv["rows"]} == {"dense", "top-k 10 % + EF"}
    for row in adv["rows"]:
        st = row["step"]
        assert st["step_s"] == st["measured_s"] > 0 and st["modelled_s"] > 0
        assert st["modelled_s"] != st["measured_s"]
    assert json.loads((out / "advice.json").read_text())["timing"] == "measured"


@pytest.mark.slow
def test_plan_measure_end_to_end_on_simulated_devices(tmp_path):
    """``cconv plan --cluster 1x4 --measure CONFIG``: every row has the model's iteration time and
    the measured step (the parameter-server row and gTop-k's recursive doubling included)."""
    from runs_helpers import run_cconv as cconv

    cfg = _config(tmp_path, {k: v for k, v in TINY.items() if k != "advise"})
    base = ["plan", "--cluster", "1x4", "--measure", cfg, "--methods", "none,topk,none-ps,gtopk", "--ratios", "0.1"]
    r = cconv(*base, "--measure-steps", "3", "--json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    assert [x["method"] for x in recs] == ["none", "topk", "none-ps", "gtopk"]
    for x in recs:
        assert x["modelled_s"] == x["iteration_time_s"] > 0 and x["measured_s"] > 0
        assert x["measured_on"] == "4 x cpu" and x["measure_steps"] == 3


def _mkdir(path):
    path.mkdir(exist_ok=True)
    return path


def _two_processes(tmp_path, *argv) -> list:
    """``cconv ARGV`` in two processes joined by ``jax.distributed`` (CCONV_* variables, gloo, one
    CPU device each), process r in ``tmp_path/p<r>`` (as on two hosts): [(exit status, stdout,
    stderr)] of process 0 and 1."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env |= dict(JAX_PLATFORMS="cpu", CCONV_COORDINATOR=f"127.0.0.1:{port}", CCONV_NUM_PROCESSES="2")
    env |= dict(PYTHONPATH=root, CCONV_PROGRESS="0")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cconv", *argv],
            cwd=_mkdir(tmp_path / f"p{r}"),
            env={**env, "CCONV_PROCESS_ID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outs, strict=True)]


@pytest.mark.slow
def test_plan_measure_across_two_processes_with_jax_distributed(tmp_path):
    """Started in every process with ``CCONV_*`` variables (as srun or mpirun would), ``plan
    --measure`` joins jax.distributed and times each row's step over both processes' devices;
    process 0 alone prints the table (gloo's own lines kept off stdout: the JSON parses), and a
    cluster that is not those devices is one line, exit 2, in each process."""
    cfg = _config(tmp_path, {k: v for k, v in TINY.items() if k != "advise"})
    base = ["plan", "--measure", cfg, "--methods", "none,topk", "--ratios", "0.1", "--measure-steps", "3"]
    (rc0, out0, err0), (rc1, out1, err1) = _two_processes(tmp_path, *base, "--cluster", "1x2", "--json")
    assert (rc0, rc1) == (0, 0), err0[-1500:] + err1[-1500:]
    recs = json.loads(out0)
    assert [x["method"] for x in recs] == ["none", "topk"] and out1 == ""
    for x in recs:
        assert x["measured_on"] == "2 x cpu in 2 processes" and x["workers"] == 2 and x["measured_s"] > 0
    _refused_in_each(
        _two_processes(tmp_path, *base, "--cluster", "1x4"),
        "--measure across 2 processes runs one worker per device of all of them: the cluster has 4 workers, "
        "the processes 2 cpu device(s)",
    )


@pytest.mark.slow
def test_advise_timing_measured_across_two_processes(tmp_path):
    """``cconv advise --timing measured`` started in two processes (jax.distributed, gloo): each
    candidate's step is timed across both, process 0 alone races (its probes on its own device,
    their checkpoints its own) and writes the advice; the other prints nothing.  A cluster that is
    not their devices is refused in one line in each (several processes without ``--timing
    measured``: ``test_advise_timing_refusals_exit_2_before_writing``)."""
    cfg = _config(tmp_path)
    base = ["advise", cfg, "--cluster", "1x2", "--target", "test_accuracy=0.5", "--seeds", "2", "--out", "adv"]
    (rc0, out0, err0), (rc1, out1, err1) = _two_processes(tmp_path, *base, "--timing", "measured", "--json")
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    adv = json.loads(out0)
    assert out1 == "" and adv["timing"] == "measured" and "measured on 2 x cpu in 2 processes" in adv["cluster"]
    assert all(r["step"]["measured_s"] > 0 for r in adv["rows"]) and adv["spent"] > 0
    assert sorted(os.listdir(tmp_path / "p0" / "adv")) == ["advice.json", "advice.png", "probes"]
    assert os.listdir(tmp_path / "p1") == []  # the other process wrote nothing
    wrong = [a if a != "1x2" else "1x4" for a in base]
    _refused_in_each(
        _two_processes(tmp_path, *wrong, "--timing", "measured"),
        "--timing measured across 2 processes runs one worker per device of all of them: the cluster has 4 "
        "workers, the processes 2 cpu device(s)",
    )


def _refused_in_each(results: list, line: str) -> None:
    """Every process refused with exit 2, nothing on stdout and the one error line ``line``."""
    for rc, out, err in results:
        assert (rc, out) == (2, "") and [x for x in err.splitlines() if x.startswith("cconv: error:")] == [
            f"cconv: error: {line}"
        ], err[-1500:]


def test_the_measured_plan_table_puts_the_measurement_beside_the_model():
    from cconv.advisor.plan_measure import format_measured
    from cconv.theory import cluster as CL
    from cconv.theory.predict import Row

    c = CL.parse("1x4")
    rows = [
        Row(m, k, "fusion", "ring", 2e-3, 1e-3, 5e-4, 1e-4, 1e4, 1.0, 0.25)
        for m, k in (("none", {}), ("gtopk", {"ratio": 0.1}))
    ]
    secs = {("none", "-"): 3e-3, ("gtopk", "ratio=0.1"): math.nan}
    cfg = SimpleNamespace(model={"name": "mlp"}, batch_size=32)
    text = format_measured(c, "tiny.yaml", cfg, rows, secs, "4 x cpu", 5, ["gtopk not measured: why"])
    lines = text.splitlines()
    assert "measured on 4 x cpu (median of 5 steps per phase" in lines[1] and "8 per worker" in lines[0]
    assert lines[4].split()[-3:] == ["2.000", "3.000", "1.50x"]
    assert lines[5].split()[-2:] == ["-", "-"] and lines[-1] == "note: gtopk not measured: why"


def test_the_clock_module_reads_no_trainer_internals():
    """The clock and the advisor's timing read the trainer through ``step_work`` (and the phase)
    only: no ``sync``, ``plan``, ``collectives``, ``_exchanges`` reach-ins."""
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("cconv/experiments/clock.py", "cconv/advisor/steptime.py"):
        text = open(os.path.join(here, "..", rel)).read()
        for inside in ("trainer.sync", "trainer.plan", "trainer.collectives", "trainer._", ".exchange_work("):
            assert inside not in text, (rel, inside)
