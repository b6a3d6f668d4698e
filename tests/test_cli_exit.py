"""``cconv`` as a process ends without the interpreter's teardown (``cconv.cli._end_process``), and
owes nothing when it does: the exit status, everything written to a pipe, every ``atexit``
handler, and a thread Python would have waited for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from runs_helpers import cli_env

PLAN = ["plan", "--workload", "resnet50", "--cluster", "8x1", "--network", "10GbE", "--device", "v100"]


def _env():
    """A ``cconv`` subprocess's environment (``runs_helpers.cli_env``), its stdout to a pipe
    block-buffered, as a user's shell has it."""
    env = cli_env()
    env.pop("PYTHONUNBUFFERED", None)
    return env


def _cconv_in(code: str, args: list, cwd) -> subprocess.CompletedProcess:
    """``cconv.cli`` imported, ``code`` run, then ``main()`` as the process's command (``sys.argv``)."""
    prog = f"import sys\nfrom cconv.cli import main\n{code}\nsys.argv = ['cconv', *sys.argv[1:]]\nsys.exit(main())\n"
    return subprocess.run(
        [sys.executable, "-c", prog, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_a_piped_command_writes_all_its_output_and_keeps_its_status(tmp_path):
    """Everything printed reaches a pipe (block-buffered there) and the status is the command's."""
    out = subprocess.run(
        [sys.executable, "-m", "cconv", *PLAN, "--json"], cwd=tmp_path, env=_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)  # the whole document, flushed before the process ended
    bad = subprocess.run(
        [sys.executable, "-m", "cconv", "run", "missing.yaml"], cwd=tmp_path, env=_env(), capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "cconv: error: config file not found: missing.yaml"


@pytest.mark.slow
def test_atexit_handlers_run_and_a_non_daemon_thread_is_waited_for(tmp_path):
    """An ``atexit`` handler (a library's, here the caller's) runs before the process ends; with a
    non-daemon thread still running, the process ends through Python's exit, which waits for it."""
    code = (
        "import atexit, pathlib\n"
        "atexit.register(lambda: pathlib.Path('atexit-ran').write_text('yes'))\n"
        "print('printed before', flush=False)\n"
    )
    done = _cconv_in(code, PLAN, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("printed before")  # still in stdout's buffer when the command ended
    assert (tmp_path / "atexit-ran").read_text() == "yes"
    code = (
        "import threading, time, pathlib\n"
        "threading.Thread(target=lambda: (time.sleep(2.0), pathlib.Path('thread-done').write_text('yes'))).start()\n"
    )
    done = _cconv_in(code, PLAN, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread-done").read_text() == "yes"


def test_main_called_with_arguments_returns(capsys):
    """In-process callers (tests, scripts) pass ``argv`` and get the status back: nothing ends."""
    from cconv.cli import main

    assert main(["run", "no-such-config.yaml"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_a_process_with_mpi_initialised_is_left_to_pythons_exit(monkeypatch):
    """mpi4py finalises MPI from C when the interpreter ends (not through ``atexit``): with MPI
    initialised, ``_end_process`` returns; without, it would end the process (here: raises)."""
    import atexit
    import threading
    from types import SimpleNamespace

    from cconv import cli

    def ended(code):
        raise AssertionError(f"the process was ended with {code}")

    monkeypatch.setattr(cli.os, "_exit", ended)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: None)  # not pytest's own handlers
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.current_thread()])  # no other thread
    monkeypatch.setitem(
        sys.modules, "mpi4py.MPI", SimpleNamespace(Is_initialized=lambda: True, Is_finalized=lambda: False)
    )
    assert cli._end_process(0) is None
    monkeypatch.setitem(
        sys.modules, "mpi4py.MPI", SimpleNamespace(Is_initialized=lambda: True, Is_finalized=lambda: True)
    )
    with pytest.raises(AssertionError, match="ended with 0"):
        cli._end_process(0)
