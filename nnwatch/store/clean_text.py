"""Text from a run's files made safe to print: control characters shown, never obeyed.

A run's name, an exception message in ``end.json``, a finding's summary, a host name in a registry
entry: any of them may hold escape sequences (an exception's message is whatever the failing code
put in it), and a terminal obeys them: set its title, clear the screen, rewrite what was printed
before, or hide text. Every string a reader takes from a run's JSON files (and from the wire) goes
through :func:`loads` or :func:`clean`, which show each control character as its escape
(``\\x1b``) and keep only tabs and newlines; the CLI cleans what it prints once more at the end.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides that make a
#: terminal show text in another order than it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: str) -> str:
    """``text`` with every control character but tab and newline shown as its escape."""
    return _UNSAFE.sub(_shown, text) if _UNSAFE.search(text) else text


def clean_value(value: Any) -> Any:
    """A parsed JSON value with :func:`clean` applied to every string in it, keys included."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_value(v) for v in value]
    return value


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads`` for what a run's files hold: every string cleaned (:func:`clean`)."""
    return clean_value(json.loads(data))
