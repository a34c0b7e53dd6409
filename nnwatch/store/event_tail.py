"""Follow ``events.jsonl`` while the trainer appends to it: complete lines only, never half of one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nnwatch.store.clean_text import loads
from nnwatch.store.events import Event
from nnwatch.store.safe_read import held_size, open_regular

#: Read at most this much per call, so a huge backlog cannot stall a monitor's poll.
MAX_READ = 4 * 1024 * 1024


class EventTail:
    """New events since the previous ``read()``. A line still being written is left for next time."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.skipped = 0  # lines that were not JSON objects

    def read_events(self) -> list[Event]:
        """New events since the previous read, typed (:mod:`nnwatch.store.events`)."""
        return [Event.from_json(d) for d in self.read()]

    def read(self) -> list[dict[str, Any]]:
        """New lines as JSON objects, as written: what the channel forwards to remote monitors."""
        try:  # never a link, never a FIFO (a plain open would wait for its writer forever)
            fd = open_regular(self.path)
        except OSError:
            return []
        try:
            size = held_size(fd)  # a hole a crash left at the end is not lines
            if size < self.offset:  # truncated or replaced: start over
                self.offset = 0
            if size == self.offset:
                return []
            data = os.pread(fd, min(MAX_READ, size - self.offset), self.offset)
        finally:
            os.close(fd)
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) >= MAX_READ:  # one absurd line: skip it rather than stall forever
                self.offset += len(data)
                self.skipped += 1
            return []
        self.offset += end + 1
        events: list[dict[str, Any]] = []
        for raw in data[: end + 1].splitlines():
            if not raw.strip():
                continue
            try:
                ev = loads(raw)
            except (ValueError, RecursionError):  # a line nested past the parser's depth too
                self.skipped += 1
                continue
            if isinstance(ev, dict):
                events.append(ev)
            else:
                self.skipped += 1
        return events
