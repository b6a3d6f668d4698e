"""Trust round 3 (issue 34; the umask row of issue 35): the guarantees of ``run`` and ``sweep``
reach the other commands and the loaders.  Every echoed name is bounded; the loaders read only the
bytes they use; every number the planner and the cluster options take is in range and every number
they print is finite; ``report``/``plot`` refuse a target or metric they cannot use; ``doctor``,
``report`` and ``plot`` write only regular files of their own kind, never through a link, with the
umask's mode; keys that only steer the advisor or the report are no part of a run's identity; a
sweep gives one run per distinct config, with a name of its own.

No test trains: runs are written by hand (a config.yaml, metric lines, a summary), the CLI is
called in-process (``cli.main``).  Each case takes well under a second and a few MB."""

import contextlib
import gzip
import importlib
import json
import os
import re
import stat
import subprocess
import sys
import tracemalloc
from io import StringIO

import pytest
from runs_helpers import ROOT, cli_env, tiny

from cconv import cli
from cconv import compressors as C
from cconv.data import files as F
from cconv.experiments import config as X
from cconv.experiments import io, runner, sweep
from cconv.theory import cluster as CL
from cconv.theory import plan_cli

T = importlib.import_module("cconv.data.text")  # ``cconv.data.text`` is also the loader function
LINE = 1000  # an error line echoing user input stays shorter than this (the valid config keys: ~600)


def cconv(*argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``cconv ARGV`` run in-process."""
    out, err = StringIO(), StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:  # argparse's usage errors (one line, exit 2)
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def one_error(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("cconv: error: "), err[:500]
    return lines[0]


def peak_bytes(fn) -> int:
    """Peak bytes Python allocated while ``fn()`` ran."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def fake_run(d, target_loss=None, metrics=("loss", "test_accuracy"), **changes) -> str:
    """A finished run directory written by hand: config.yaml of ``tiny(**changes)``, three metric
    lines, a completed summary."""
    os.makedirs(d)
    cfg = X.from_dict(tiny(target_loss=target_loss, **changes))
    io.atomic_write_text(os.path.join(d, io.CONFIG), X.to_yaml(cfg))
    lines = [{"step": s, "cum_bytes": 100.0 * s, **{m: 1.0 / s for m in metrics}} for s in (4, 8, 12)]
    with open(os.path.join(d, io.METRICS), "w") as f:
        f.writelines(json.dumps(l) + "\n" for l in lines)
    io.write_json(os.path.join(d, io.SUMMARY), {"status": "completed", "config_digest": cfg.digest()})
    return str(d)


def tree(root) -> dict:
    """Every entry under ``root`` (links not followed): path -> (mode, bytes or link target)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            data = (
                os.readlink(p)
                if stat.S_ISLNK(st.st_mode)
                else open(p, "rb").read()
                if stat.S_ISREG(st.st_mode)
                else None
            )
            out[os.path.relpath(p, root)] = (st.st_mode, data)
    return out


# --------------------------------------------------------------------------- 1. echoed names are bounded

HUGE = "k" * 1_000_000  # a 1 MB key name


@pytest.mark.parametrize(
    "call",
    [
        lambda: X.from_dict({HUGE: 1}),  # an unknown top-level key
        lambda: X.from_dict({"wandb": {HUGE: 1}}),  # an unknown key of a block
        lambda: X.from_dict({"lr": 0.1, "model": {"name": "mlp", HUGE: float("nan")}}),  # a bad value's path
        lambda: X.apply_overrides({}, [f"{HUGE}=1"]),  # --set
        lambda: C.get("topk", ratio=0.1, **{HUGE: 1}),  # a compressor's unknown hyper-parameter
        lambda: C.get(HUGE),  # an unknown compressor
        lambda: X.from_dict({f"{i}{HUGE[:1000]}": 1 for i in range(1000)}),  # many long unknown keys
    ],
    ids=["config-key", "block-key", "value-path", "set", "hparam", "compressor", "many-keys"],
)
def test_an_unknown_name_is_echoed_short(call):
    """Before: the key was echoed whole (a 1 MB key name gave a 1 MB error line)."""
    with pytest.raises(ValueError) as e:
        call()
    assert len(str(e.value)) < LINE and len(str(e.value).splitlines()) == 1, str(e.value)[:LINE]


def test_a_sweep_file_with_a_huge_key_is_one_short_line(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"base: {json.dumps(tiny())}\ngrid: {{lr: [0.1]}}\n? {'k' * 500_000}\n: 1\n")  # an explicit key
    rc, _, err = cconv("sweep", spec, "--out", tmp_path / "out")
    assert rc == 2 and len(one_error(err)) < LINE and "unknown sweep key" in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 2. loaders read what they use


def test_the_text_loader_reads_only_the_bytes_it_uses(tmp_path):
    """A 200 MB corpus file (sparse: no disk used) for 64 KB of tokens.  Before: the whole file was
    read and decoded (> 400 MB of Python objects); now at most 4 bytes per character used."""
    with open(tmp_path / "big.txt", "wb") as f:
        f.truncate(200 << 20)
    peak = peak_bytes(lambda: T.text(root=tmp_path, max_bytes=64 << 10, seq_len=16))
    assert peak < 8 << 20, peak


def test_the_text_loader_gives_the_bytes_it_gave_before(tmp_path):
    """Reading a prefix gives what reading the whole file and cutting did (universal newlines,
    multi-byte characters cut at ``max_bytes``)."""
    text = "é\r\nαβγ line\r\n" * 500 + "tail ✓\n"
    (tmp_path / "a.txt").write_bytes(text.encode())
    (tmp_path / "b.txt").write_text("second file\n" * 300)
    whole = "".join(open(tmp_path / n, encoding="utf-8").read() for n in ("a.txt", "b.txt")).encode()
    for cap in (1000, 1001, 9999, len(whole), len(whole) + 10):
        assert T.corpus_bytes(tmp_path, cap)[0] == whole[:cap], cap


def _gz(path, head: bytes, zeros: int) -> None:
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head)
        block = bytes(1 << 20)
        for _ in range(zeros >> 20):
            f.write(block)


@pytest.mark.parametrize(
    "head,says",
    [
        (b"GIF8", "not an IDX file"),  # a bad magic number: 4 bytes decompressed
        (bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big"), "but the file has more"),  # 2 bytes declared
    ],
    ids=["bad-magic", "longer-than-declared"],
)
def test_an_idx_gz_is_never_decompressed_past_its_header(tmp_path, head, says):
    """64 MB of zeros behind the header (a small gzip bomb).  Before: decompressed whole, then the
    magic number or the size was checked."""
    p = tmp_path / "train-images-idx3-ubyte.gz"
    _gz(p, head, 64 << 20)
    assert p.stat().st_size < 1 << 20

    def load():
        with pytest.raises(ValueError, match=says):
            F.read_idx(p)

    assert peak_bytes(load) < 4 << 20


def test_an_idx_header_declaring_more_than_the_cap_is_refused_before_reading(tmp_path):
    """A header declaring 65536 x 256 x 256 bytes (4 GiB) is refused from its 16 header bytes."""
    p = tmp_path / "x.gz"
    _gz(p, bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in (65536, 256, 256)), 1 << 20)
    with pytest.raises(ValueError, match=r"4294967296 bytes of data\), more than the 1073741824"):
        F.read_idx(p)
    with pytest.raises(ValueError, match="more than the 10 bytes"):
        F.read_idx(p, max_bytes=10)


def test_a_damaged_gzip_is_one_line(tmp_path):
    p = tmp_path / "x.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ValueError, match="cannot be read as an IDX file"):
        F.read_idx(p)


# --------------------------------------------------------------------------- 3. numbers in range, answers finite

PLAN = ("plan", "--workload", "resnet50", "--workers", "8")


@pytest.mark.parametrize(
    "argv,says",
    [
        (PLAN + ("--network", "10GbE", "--device-flops", "1e-300"), "--device-flops"),
        (PLAN + ("--network", "0." + "0" * 300 + "1GbE"), "the line rate must be in"),
        (PLAN + ("--network", "0.0000001GbE"), "the line rate must be in"),
        (PLAN + ("--network", "tiny", "--alpha", "0", "--beta", "1e-320"), "--beta"),
        (PLAN + ("--network", "10GbE", "--flops-per-sample", "1e-300", "--params", "1000", "--batch", "1"), "--flops"),
        (("plan", "--workload", "resnet50", "--cluster", "2x8", "--network", "0.0000001GbE"), "line rate"),
        (("plan", "--workload", "resnet50", "--cluster", "2x8", "--network", "64x0.0000001GbIB"), "line rate"),
    ],
    ids=["device-flops", "rate-300-zeros", "rate-1e-7", "beta-subnormal", "flops-per-sample", "cluster", "k-nics"],
)
def test_tiny_positive_rates_are_refused_in_one_line(argv, says):
    """Before: exit 0 with ``inf`` ms and ``nanx`` speedups (or 40-digit times)."""
    rc, _, err = cconv(*argv)
    assert rc == 2 and says in one_error(err) and len(one_error(err)) < LINE, err


@pytest.mark.parametrize("network", ["0.0000001GbE", "1e-9GbE", "0.0000001GbIB", "4x0.0000001GbE", "100000.1GbE"])
def test_the_cluster_options_check_their_rates(network):
    """``cconv.theory.cluster.from_args`` (what ``cconv plan --cluster`` and ``cconv advise`` read)
    refuses a rate out of range before anything is planned or trained."""
    import argparse

    args = argparse.Namespace(cluster="2x8", intra=None, network=network, device=None)
    with pytest.raises(ValueError, match="line rate must be in|unknown network"):
        CL.from_args(args)


NOT_FINITE = re.compile(r"(?<![A-Za-z0-9_.+-])[-+]?(?:inf|nan|NaN|Infinity)(?![A-Za-z])")  # as printed, or in JSON


def test_advise_refuses_a_tiny_rate_before_any_probe(tmp_path):
    """``cconv advise`` reads its cluster through ``cluster.from_args``: before, it trained every
    probe, then died on an infinite duration."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny()))
    rc, _, err = cconv("advise", cfg, "--cluster", "2x8", "--network", "0.0000001GbE", "--out", tmp_path / "adv")
    assert rc == 2 and "line rate must be in" in one_error(err)
    assert sorted(os.listdir(tmp_path)) == ["c.yaml"]


@pytest.mark.parametrize(
    "extra",
    [
        ("--network", "0.001GbE"),
        ("--network", "100000GbIB"),
        ("--network", "10GbE", "--device-flops", "1"),
        ("--network", "10GbE", "--device-flops", "1e18"),
        ("--network", "x", "--alpha", "1", "--beta", "1"),
        ("--network", "x", "--alpha", "0", "--beta", "1e-15"),
        ("--network", "10GbE", "--params", "10000000000000", "--flops-per-sample", "1e18", "--batch", "16777216"),
        ("--network", "10GbE", "--params", "1", "--flops-per-sample", "1", "--batch", "1", "--json"),
    ],
    ids=["slowest-rate", "fastest-rate", "min-flops", "max-flops", "max-alpha-beta", "min-beta", "huge", "tiny"],
)
@pytest.mark.slow  # eight plans (~1 s each)
def test_every_number_a_plan_prints_is_finite(extra):
    """At the ends of every accepted range the plan prints finite numbers, or refuses the input."""
    rc, out, err = cconv("plan", "--workload", "resnet50", "--workers", "8", *extra)
    if rc == 2:
        assert len(one_error(err)) < LINE
    else:
        assert rc == 0 and not NOT_FINITE.search(out), out


def test_a_plan_with_a_number_that_is_not_finite_is_refused():
    """The last guard behind the ranges: no ``inf``/``nan`` answer leaves the planner."""
    for text in ("none  -  inf  nanx", "compute inf ms/iteration", "speedup nan", '{"a": NaN}'):
        with pytest.raises(ValueError, match="not finite"):
            plan_cli.check_finite(text.replace("NaN", "nan"))
    assert plan_cli.check_finite("information: signsgd-inf? no; 1.5x, 2e+05 s") is not None


# --------------------------------------------------------------------------- 4. report's target and metric


@pytest.mark.parametrize(
    "extra,says",
    [
        (("--target", "inf"), "finite"),
        (("--target", "nan"), "finite"),
        (("--target", "1e400"), "finite"),
        (("--target", "-1"), "never negative"),
        (("--target", "2", "--metric", "test_accuracy"), "fraction in [0, 1]"),
        (("--metric", "nonexistent"), "no run logged it"),
        (("--metric", "x" * 100_000, "--target", "1"), "no run logged it"),
    ],
    ids=["inf", "nan", "1e400", "negative", "accuracy-above-1", "metric", "huge-metric"],
)
@pytest.mark.parametrize("command", ["report", "plot-ratio-summary"])
def test_report_refuses_a_target_or_metric_it_cannot_use(command, extra, says, tmp_path):
    """Before: exit 0 (with ``inf`` every run "reached" the target; an unknown metric an empty column)."""
    run = fake_run(tmp_path / "run")
    before = tree(tmp_path)
    argv = ["report", run] if command == "report" else ["plot", run, "--kind", "ratio-summary"]
    rc, _, err = cconv(*argv, *extra)
    assert rc == 2 and says in one_error(err) and len(one_error(err)) < LINE, err
    assert tree(tmp_path) == before


def test_report_with_a_good_target_and_metric_still_works(tmp_path):
    run = fake_run(tmp_path / "run")
    for extra in ((), ("--target", "0.5"), ("--target", "0.2", "--metric", "test_accuracy"), ("--target", "0")):
        rc, out, err = cconv("report", run, *extra)
        assert rc == 0 and run.split(os.sep)[-1] in out, err


# ------------------------------------------------ 5 and 10. outputs: only regular files of their own kind


@pytest.mark.timeout(60)  # before: a FIFO opened for writing blocked forever
@pytest.mark.parametrize("kind", ["link", "fifo", "dir"])
def test_doctor_json_never_follows_a_link_nor_blocks(kind, tmp_path):
    """Refused before the checks run (they take minutes); before, the checks ran, then ``open(FILE,
    "w")`` followed a link (truncating its target) or blocked on a FIFO."""
    target = tmp_path / "precious.txt"
    target.write_text("keep\n")
    p = tmp_path / "doctor.json"
    {"link": lambda: os.symlink(target, p), "fifo": lambda: os.mkfifo(p), "dir": p.mkdir}[kind]()
    before = tree(tmp_path)
    rc, out, err = cconv("doctor", "--json", p)
    assert rc == 2 and f"{p} is a" in one_error(err) and out == ""
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ("report", "{run}", "--csv", "{run}/config.yaml"),
        ("report", "{run}", "--csv", "{run}/metrics.jsonl"),
        ("report", "{run}", "--csv", "{run}/checkpoints/t.csv"),
        ("plot", "{run}", "--out", "{tmp}/sweep.json"),
        ("doctor", "--json", "{run}/doctor.json"),
        ("doctor", "--json", "{run}/summary.json"),
        ("calibrate", "--out", "{run}/profile.json", "--sizes", "1000"),
        ("calibrate", "--out", "{run}/config.yaml", "--sizes", "1000"),
    ],
    ids=[
        "csv-config",
        "csv-metrics",
        "csv-checkpoints",
        "plot-sweep-index",
        "doctor-in-run",
        "doctor-summary",
        "calibrate-in-run",
        "calibrate-config",
    ],
)
def test_a_command_writes_only_its_own_kind_of_file(argv, tmp_path):
    """A report, a figure, the doctor's JSON or a device profile never takes the name of a file cconv
    keeps in a run or sweep directory, nor a place inside a run's own directories; doctor's JSON and
    a profile are not results."""
    run = fake_run(tmp_path / "run")
    os.makedirs(os.path.join(run, io.CHECKPOINTS))
    argv = [a.format(run=run, tmp=tmp_path) for a in argv]
    before = tree(tmp_path)
    rc, _, err = cconv(*argv)
    assert rc == 2 and len(one_error(err)) < LINE, err
    assert tree(tmp_path) == before


@pytest.mark.slow  # draws two figures (~3 s)
def test_a_figure_may_sit_in_the_run_directory_it_shows(tmp_path):
    """``--out RUN/summary.pdf`` is a figure's name (its .png beside it), not the run's summary.json."""
    run = fake_run(tmp_path / "run")
    before = tree(tmp_path)
    rc, _, err = cconv("plot", run, "--out", f"{run}/summary.pdf")
    assert rc == 0, err
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == {"run/summary.pdf", "run/summary.png"}


@pytest.mark.slow  # draws a figure (~3 s)
def test_an_output_directory_that_is_a_link_you_chose_is_used(tmp_path):
    """The rule is about the files cconv writes, not the directory you name: a link there is yours."""
    run = fake_run(tmp_path / "run")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "chosen")
    assert cconv("report", run, "--csv", tmp_path / "chosen" / "r.csv")[0] == 0
    assert cconv("plot", run, "--out", tmp_path / "chosen" / "f.png")[0] == 0
    assert sorted(os.listdir(tmp_path / "real")) == ["f.pdf", "f.png", "r.csv"]


def test_doctor_json_is_written_through_the_io_helpers(tmp_path, monkeypatch):
    """The results go through ``io.write_json`` (atomic, regular file, umask mode), not ``open``."""
    from cconv import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda platforms, full=False: [])  # no minutes of lowering
    monkeypatch.setattr(doctor, "table", lambda results: "")
    p = tmp_path / "d.json"
    rc, _, err = cconv("doctor", "--json", p)
    assert rc == 0 and json.loads(p.read_text()) == [], err


# --------------------------------------------------------------------------- 9. files respect the umask

UMASK_CHECK = r"""
import os, sys
from cconv import cli
from cconv.experiments import io
os.umask(int(sys.argv[1], 8))
d = sys.argv[2]
io.atomic_write_text(os.path.join(d, "a.txt"), "x")
io.write_json(os.path.join(d, "b.json"), {})
assert cli.main(["report", sys.argv[3], "--csv", os.path.join(d, "r.csv")]) == 0
assert cli.main(["plot", sys.argv[3], "--out", os.path.join(d, "f.png")]) == 0
print({n: oct(os.stat(os.path.join(d, n)).st_mode & 0o777) for n in sorted(os.listdir(d))})
"""


@pytest.mark.slow  # a process that imports matplotlib and pandas (~3 s)
@pytest.mark.parametrize(
    "umask,mode",
    [
        ("022", "0o644"),
        pytest.param("077", "0o600", marks=pytest.mark.extended),
        pytest.param("002", "0o664", marks=pytest.mark.extended),
    ],
)
def test_files_respect_the_umask(umask, mode, tmp_path):
    """config.yaml, summary.json, report.csv, the figures (and advice.json, through the same
    helper) were 0600 whatever the umask (``tempfile.mkstemp``); metrics.jsonl 0644."""
    run = fake_run(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run(
        [sys.executable, "-c", UMASK_CHECK, umask, str(out), run],
        env=cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    modes = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - our own printed dict
    assert set(modes) == {"a.txt", "b.json", "r.csv", "f.png", "f.pdf"} and set(modes.values()) == {mode}, modes


def test_the_atomic_write_helper_respects_the_umask_in_process(tmp_path):
    """The same, in-process, the umask restored."""
    old = os.umask(0o022)
    try:
        io.atomic_write_text(str(tmp_path / "a"), "x")
        assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o644
        os.umask(0o077)
        io.atomic_write_text(str(tmp_path / "b"), "x")
        io.atomic_write_text(str(tmp_path / "a"), "y")  # a replaced file takes the umask of now
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o600 and (tmp_path / "a").read_text() == "y"
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]  # no temporary file left


# --------------------------------------------------------------------------- 6. plan --hparam KNOB=V


def test_plan_hparam_sets_a_knob(capsys):
    """Before: ``--hparam ratio=0.5`` was silently ignored (the output byte-identical)."""
    base = ["plan", "--workload", "resnet50", "--workers", "8", "--network", "10GbE", "--methods", "topk"]
    assert cli.main(base + ["--hparam", "ratio=0.5"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^topk\s+ratio=(\S+)", out, re.M) == ["0.5"], out
    assert cli.main(base + ["--hparam", "ratio=0.5", "--ratios", "0.1"]) == 2
    assert "swept too" in one_error(capsys.readouterr().err)


# --------------------------------------------------------------------------- 7. run identity


@pytest.mark.parametrize(
    "change",
    [{"advise": {"seeds": 2}}, {"target_loss": 0.25}, {"advise": {"seeds": 2}, "target_loss": 0.5}],
    ids=["advise-block", "target-loss", "both"],
)
def test_keys_that_steer_only_the_advisor_or_the_report_keep_a_finished_run(change, tmp_path):
    """Before: ``cconv run`` refused the finished run as a different config."""
    run = fake_run(tmp_path / "run", target_loss=1.0)
    cfg = X.from_dict(tiny(target_loss=1.0))
    new = X.from_dict({**tiny(target_loss=1.0), **change})
    assert new.digest() == cfg.digest()
    before = tree(tmp_path)
    assert runner.stored_config_diff(run, new) == [] and runner.stored_run(run, new) == "finished"
    assert tree(tmp_path) == before
    with pytest.raises(X.ConfigError, match=r"different config \(lr: 0.1 -> 0.2\)"):
        runner.stored_run(run, X.from_dict({**tiny(target_loss=1.0), **change, "lr": 0.2}))


def test_the_digest_of_a_config_without_steering_keys_is_unchanged():
    """Existing run directories keep their digest (``ADDED_FIELDS``): only a config that set
    ``target_loss`` or ``advise`` hashes as if it had not."""
    old = {"compress_vectors": True}  # the default when the pin was taken (tests/test_config_schema.py)
    assert X.from_dict(old).digest() == "05e836182166"  # tests/test_config_schema.py's pin
    assert X.from_dict({**old, "target_loss": 2.0, "advise": {"seeds": 3}}).digest() == "05e836182166"
    assert X.from_dict({}).digest() != "05e836182166"  # today's default is another config


# --------------------------------------------------------------------------- 8. sweep: one run per config


def _sweep(tmp_path, spec) -> list:
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"base": tiny(), **spec}))
    return sweep.load_sweep(str(p))[1]


def test_close_sweep_values_get_names_of_their_own(tmp_path):
    """Before: both were named ``lr=0.1`` (``{:g}``), and the sweep was refused."""
    runs = _sweep(tmp_path, {"grid": {"lr": [0.1000001, 0.1000002, 0.1, 0.01]}})
    assert [r.name for r in runs] == ["lr=0.1000001", "lr=0.1000002", "lr=0.1", "lr=0.01"]
    assert [r.config.lr for r in runs] == [0.1000001, 0.1000002, 0.1, 0.01]


def test_a_grid_point_is_one_config_whatever_the_key_order(tmp_path):
    """Before: an ``include:`` repeating a grid point with its keys in another order was a second
    run directory training the same config."""
    runs = _sweep(
        tmp_path,
        {
            "grid": {"lr": [0.1, 0.2], "memory": ["ef", "none"]},
            "include": [{"memory": "ef", "lr": 0.1}, {"lr": 0.3, "memory": "ef"}],
        },
    )
    names = [r.name for r in runs]
    assert len(names) == 5 and len({json.dumps(r.config.to_dict(), sort_keys=True) for r in runs}) == 5, names
    assert "lr=0.1,memory=ef" in names and "memory=ef,lr=0.1" not in names and "lr=0.3,memory=ef" in names


def test_distinct_configs_with_one_name_are_refused(tmp_path):
    """Names that the file system spelling makes equal (``a b`` and ``a_b``) are refused in one line."""
    with pytest.raises(X.ConfigError, match="different configs with one run name") as e:
        _sweep(tmp_path, {"grid": {"name": ["a b", "a_b"]}})
    assert len(str(e.value)) < LINE
