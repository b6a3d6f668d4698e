"""How cconv echoes a user's value in a one-line message or warning: ``shown(value)``.

A config value can be anything YAML holds (a 10,000-element list, a megabyte string); a message
that repeats it must stay one short line.  ``shown`` is ``repr`` cut to ``limit`` characters,
with the number of characters left out, so every message echoes values the same way.
"""

from __future__ import annotations

from typing import Any

SHOWN_CHARS = 80  # characters of a value's repr a message shows


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters (``'...(N more chars)'`` says what was left out)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails still gets a name in the message
        text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text) - limit} more chars)"


SHOWN_NAMES = 5  # names a message lists before it counts the rest
NAME_CHARS = 40  # characters of each listed name


def shown_name(name, chars: int = NAME_CHARS) -> str:
    """``str(name)`` cut to ``chars`` characters (a key or a path echoed in a message)."""
    return shown_names([name], 1, chars)


def shown_names(names, limit: int = SHOWN_NAMES, chars: int = NAME_CHARS) -> str:
    """``a, b, c`` for the names (e.g. unknown config keys) a message lists: each ``str(name)`` cut
    to ``chars`` characters, at most ``limit`` of them, then ``... (N more)``; however many or
    however long the names are, the message stays one short line (a 1 MB key name gives ~60 chars)."""
    names = list(names)
    out = []
    for n in names[:limit]:
        text = str(n)
        out.append(text if len(text) <= chars else f"{text[:chars]}...({len(text) - chars} more chars)")
    more = len(names) - limit
    return ", ".join(out) + (f", ... ({more} more)" if more > 0 else "")
