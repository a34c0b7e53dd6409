"""What the CLI prints, with every control character shown rather than obeyed.

A run's name, a path, an exception message from ``end.json``, a host's answer over ssh: what the
commands print comes from files and hosts that anyone may have written, and a terminal obeys the
escape sequences in it (a new title, a cleared screen, text rewritten or hidden). The readers in
the store clean what they parse; this cleans once more at the very end, whatever the source:
``sys.stdout`` and ``sys.stderr`` are wrapped while a command runs. The binary side (``pack``'s
stream on ``sys.stdout.buffer``) and the monitor (Textual writes to ``sys.__stderr__``) are not
touched.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from nnwatch.store.clean_text import clean


class CleanStream:
    """A text stream whose ``write`` shows control characters (see the module's docstring)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(clean(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def clean_output() -> Iterator[None]:
    """Wrap ``sys.stdout`` and ``sys.stderr`` for the duration of a command."""
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None:
        sys.stdout = CleanStream(sys.stdout)  # type: ignore[assignment]
    if sys.stderr is not None:
        sys.stderr = CleanStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
