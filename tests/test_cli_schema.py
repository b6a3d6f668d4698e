"""The command line is one declarative table per command (``cconv.cli_schema``, issue 27 item 5).

- the parser built from the tables accepts what the hand-written parser accepted, with the same
  result: ``tests/cli_parse_main.json`` holds ``vars(args)`` of the old parser (main at eb0dbfa,
  before the tables) for a list of command lines covering every option of every command;
- every command's usage error (unknown option, bad choice, missing argument, a value its type
  refuses) is one line ``cconv: error: ...`` and exit 2, with no usage block (before: only ``plan``);
- ``cconv.cli``'s usage block names exactly the options of the tables (and their choices where it
  spells them), and no command line in the docs, README, configs or code names an option that does
  not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cconv import cli
from cconv import cli_schema as S

ROOT = Path(__file__).resolve().parents[1]
OLD = json.loads((ROOT / "tests" / "cli_parse_main.json").read_text())
COMMAND_WORD = re.compile(r"\bcconv (" + "|".join(cli.COMMANDS) + r")\b")


def _parsed(argv: list[str]) -> dict:
    ns = vars(cli.build_parser().parse_args(argv))
    ns["func"] = f"{ns['func'].__module__}.{ns['func'].__qualname__}"
    return json.loads(json.dumps(ns))  # tuples as lists, as in the JSON file


@pytest.mark.parametrize("case", OLD, ids=[" ".join(c["argv"])[:60] for c in OLD])
def test_parses_as_the_hand_written_parser(case):
    assert _parsed(case["argv"]) == case["args"]


def test_the_recorded_command_lines_use_every_option():
    """The comparison above is only as good as its command lines: together they give every option."""
    given: dict[str, set[str]] = {name: set() for name in cli.COMMANDS}
    for case in OLD:
        name = next(a for a in case["argv"] if a in cli.COMMANDS)
        given[name] |= set(case["argv"])
    for name, command in cli.COMMANDS.items():
        missing = set(S.flags(command)) - given[name]
        assert not missing, f"{name}: {sorted(missing)} not in tests/cli_parse_main.json"


def test_debug_after_every_command():
    """Before, ``cconv doctor --debug`` was refused (the doctor's sub-parser had no --debug)."""
    for name in cli.COMMANDS:
        positional = ["x"] if any(o.positional for o in cli.COMMANDS[name].options) else []
        assert cli.build_parser().parse_args([name, *positional, "--debug"]).debug is True
        assert cli.build_parser().parse_args([name, *positional]).debug is False


BAD_USAGE = [
    (["bogus"], "invalid choice: 'bogus'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["run"], "the following arguments are required: config"),
    (["run", "c.yaml", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "c.yaml", "--set"], "argument --set: expected one argument"),
    (["sweep"], "the following arguments are required: config"),
    (["sweep", "s.yaml", "--figure"], "unrecognized arguments: --figure"),
    (["plot"], "the following arguments are required: results"),
    (["plot", "r", "--kind", "bars"], "argument --kind: invalid choice: 'bars'"),
    (["plot", "r", "--target", "low"], "argument --target: invalid float value: 'low'"),
    (["report"], "the following arguments are required: results"),
    (["report", "r", "--target", "1e-2x"], "argument --target: invalid float value: '1e-2x'"),
    (["doctor", "--platform", "metal"], "argument --platform: invalid choice: 'metal'"),
    (["doctor", "now"], "unrecognized arguments: now"),
    (["advise"], "the following arguments are required: config"),
    (["advise", "c.yaml", "--budget", "tenth"], "argument --budget: invalid float value: 'tenth'"),
    (["advise", "c.yaml", "--seeds", "1.5"], "argument --seeds: invalid int value: '1.5'"),
    (["plan", "--workers", "0"], "argument --workers: expected a positive integer, got '0'"),
    (["plan", "--granularity", "perlayer"], "argument --granularity: invalid choice: 'perlayer'"),
    (["plan", "--bogus"], "unrecognized arguments: --bogus"),
    (["calibrate", "--sizes", "1e3,x"], "argument --sizes: bad list '1e3,x': expected a positive integer, got 'x'"),
]


@pytest.mark.parametrize("argv, says", BAD_USAGE, ids=[" ".join(a) for a, _ in BAD_USAGE])
def test_bad_usage_is_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("cconv: error: ") and says in err, err


def test_every_command_has_a_bad_usage_case():
    assert {argv[0] for argv, _ in BAD_USAGE} >= set(cli.COMMANDS)


@pytest.mark.slow
def test_bad_usage_from_the_shell():
    """A real process: stderr is exactly the one line, stdout empty, status 2 (``cconv`` and the
    planner's own entry point)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, line in (
        (["-m", "cconv", "plot", "r", "--band", "wide"], "cconv: error: argument --band: invalid choice: 'wide'"),
        (["-m", "cconv.theory.plan_cli", "--batch", "x"], "cconv: error: argument --batch: expected a positive"),
    ):
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith(line), r.stderr
        assert r.stderr.count("\n") == 1, r.stderr


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("usage: cconv") and "COMMAND" in out and err == ""


# --------------------------------------------------------------------------- the texts name the tables


def _usage_block() -> dict[str, str]:
    """``cconv.cli``'s usage block: command -> the text of its usage lines (continuations included)."""
    block = cli.__doc__.split("\n\n")[1]
    out: dict[str, str] = {}
    name = None
    for line in block.splitlines():
        m = COMMAND_WORD.search(line)
        if m:
            name = m.group(1)
        assert name is not None, line
        out[name] = out.get(name, "") + " " + line
    return out


def _spelled(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """The ``--options`` a usage text names, and the choices it spells (``--x a|b|c``)."""
    names = set(re.findall(r"(?<![\w=-])(--[a-z][a-z0-9-]*)", text))
    choices = {f: set(c.split("|")) for f, c in re.findall(r"(--[a-z][a-z0-9-]*)[ =]([\w-]+(?:\|[\w-]+)+)", text)}
    return names, choices


def test_usage_block_names_exactly_the_tables_options():
    block = _usage_block()
    assert set(block) == set(cli.COMMANDS)
    for name, command in cli.COMMANDS.items():
        names, choices = _spelled(block[name])
        assert names == set(S.flags(command)), f"cconv {name}: {names ^ set(S.flags(command))}"
        table = {o.name: o for o in command.options}
        for flag, spelled in choices.items():
            choices = table[flag].choices
            assert spelled == {str(c) for c in (choices() if callable(choices) else choices)}, f"cconv {name} {flag}"
    assert [o.name for o in cli.COMMON] == ["--debug"] and "``--debug``" in cli.__doc__


def test_the_usage_block_would_catch_a_missing_option():
    names, _ = _spelled(_usage_block()["sweep"].replace("[--no-figure]", ""))
    assert names != set(S.flags(cli.COMMANDS["sweep"]))


TEXTS = (
    "*.md",
    "docs/*.md",
    "theory/**/*.md",
    "cconv/**/*.py",
    "studies/**/*",
    "examples/**/*",
    "scripts/*",
    "paper_figures/*.py",
    "paper_figures/*.md",
    ".ci/*",
)


def _text_files():
    for pattern in TEXTS:
        yield from (p for p in ROOT.glob(pattern) if p.is_file() and p.suffix not in (".png", ".pdf", ".npz"))


def test_no_command_line_in_the_docs_names_an_unknown_option():
    """Every ``--option`` that follows ``cconv COMMAND`` on a line (up to a closing backtick or
    quote) is an option of that command's table."""
    wrong = []
    for path in _text_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in COMMAND_WORD.finditer(line):
                span = re.split(r"[`\"']", line[m.end() :])[0]
                known = {*S.flags(cli.COMMANDS[m.group(1)]), "--debug", "--help"}
                wrong += [f"{path.relative_to(ROOT)}:{n}: cconv {m.group(1)} {f}" for f in _spelled(span)[0] - known]
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------- the schema itself


def test_texts_and_choices_can_be_made_when_the_parser_is_built():
    """A registry filled after import (e.g. by user code) is listed: help and choices may be functions."""
    seen = []
    choices = lambda: tuple(seen)  # noqa: E731
    command = S.Command(
        "demo",
        "a demo",
        lambda: "made late",
        (S.Option("--pick", choices=choices, help=lambda: f"one of {seen}"),),
        int,
    )
    seen.append("late")
    p = S.standalone(command, "demo")
    assert p.parse_args(["--pick", "late"]).pick == "late"
    assert "one of ['late']" in p.format_help() and "made late" in p.format_help()


def test_options_left_unset_keep_argparses_defaults():
    p = argparse.ArgumentParser()
    S.add_options(p, (S.Option("--flag", action="store_true"), S.Option("--n", type=int), S.Option("items", nargs="*")))
    assert vars(p.parse_args([])) == {"flag": False, "n": None, "items": []}
