"""The command line as data: a ``Command`` is a name, its texts, a table of ``Option`` rows and a
handler; ``parser`` turns a set of commands into argparse (sub-)parsers.

Each command declares its table next to its handler (``cconv.cli``: run, sweep, plot, report;
``cconv.doctor``, ``cconv.advisor.cli``, ``cconv.theory.plan_cli``); ``cconv.cli.COMMANDS``
collects them.  A table is plain data, so tests read it too: ``tests/test_cli_schema.py`` checks
that ``cconv.cli``'s usage block and the docs name exactly the options the tables declare.

Every usage error (an unknown option, a bad choice, a missing argument, a value its ``type``
refuses) is one line ``cconv: error: ...`` on stderr and exit status 2, with no usage block: the
same form as cconv's other bad-input errors (``Parser.error``).

A leaf module: it imports nothing of cconv, so every layer that declares a command can use it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

EXIT_USAGE = 2
_MAX_MESSAGE = 400  # characters of argparse's message that are shown (it quotes what was typed)

Text = str | Callable[[], str]
"""A text, or a function that makes it when the parser is built (so that a registry filled after
import, e.g. a compressor registered by user code, is listed)."""


class Option(NamedTuple):
    """One row of a command's table: ``argparse.ArgumentParser.add_argument(name, **the rest)``.

    ``name`` is ``"--flag"`` for an option or a bare name for a positional argument.  A field left
    ``None`` is not passed to argparse (its default applies); ``help`` and ``choices`` may be
    functions called when the parser is built."""

    name: str
    help: Text | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence | Callable[[], Sequence] | None = None
    default: Any = None
    metavar: str | None = None
    nargs: str | int | None = None
    action: str | None = None

    @property
    def positional(self) -> bool:
        return not self.name.startswith("-")


class Command(NamedTuple):
    """A sub-command: ``cconv NAME [options]`` calls ``handler(args)`` (its exit status).

    ``help`` is the one line in ``cconv --help``; ``description`` and ``epilog`` frame
    ``cconv NAME --help`` (``raw``: printed as written, line breaks kept)."""

    name: str
    help: str
    description: Text
    options: tuple[Option, ...]
    handler: Callable[[argparse.Namespace], int]
    epilog: Text | None = None
    raw: bool = False


def error_line(message: str) -> str:
    """``cconv: error: MESSAGE`` on one line (white space runs joined, at most 400 characters of it)."""
    return f"cconv: error: {' '.join(str(message).split())[:_MAX_MESSAGE]}"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line ``cconv: error: ...``, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        print(error_line(message), file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _made(value: Any) -> Any:
    return value() if callable(value) else value


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """``add_argument`` for every row of ``options``, in order."""
    for o in options:
        kwargs = {k: v for k, v in o._asdict().items() if k != "name" and v is not None}
        for lazy in ("help", "choices"):
            if lazy in kwargs:
                kwargs[lazy] = _made(kwargs[lazy])
        parser.add_argument(o.name, **kwargs)


def add_command(
    sub: argparse._SubParsersAction, command: Command, common: Sequence[Option] = ()
) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` on ``sub``: the ``common`` rows first, then its own table."""
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=_made(command.description),
        epilog=_made(command.epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter if command.raw else argparse.HelpFormatter,
    )
    add_options(p, (*common, *command.options))
    p.set_defaults(func=command.handler)
    return p


def parser(
    prog: str,
    commands: Sequence[Command],
    *,
    description: str | None = None,
    epilog: str | None = None,
    options: Sequence[Option] = (),
    common: Sequence[Option] = (),
) -> Parser:
    """``prog COMMAND ...``: ``options`` before the command, ``common`` on every command as well."""
    p = Parser(prog=prog, description=description, epilog=epilog)
    add_options(p, options)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for c in commands:
        add_command(sub, c, common)
    return p


def standalone(command: Command, prog: str) -> Parser:
    """One command as a program of its own (``python -m cconv.theory.plan_cli``)."""
    p = Parser(prog=prog, description=_made(command.description), epilog=_made(command.epilog))
    add_options(p, command.options)
    return p


def flags(command: Command) -> list[str]:
    """The option names of ``command`` (``--flag``), in table order, positionals left out."""
    return [o.name for o in command.options if not o.positional]


__all__ = [
    "Option",
    "Command",
    "Parser",
    "add_options",
    "add_command",
    "parser",
    "standalone",
    "flags",
    "error_line",
    "EXIT_USAGE",
]
