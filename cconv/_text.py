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
