"""``events.jsonl``: the run's events (findings, snapshots, commands, its end), a JSON line each.

Events are rare, so each is written at once, from whichever thread has one: the training thread
(a command applied, a skipped step), the detectors (a finding), the log's writer (its own failure).
They share this one file and nothing else of the run log: a finding is appended here, never handed
back to the writer whose thread fed the detectors. One lock keeps the lines whole; a write that
fails is reported through ``on_error`` once the lock is let go, so that whoever hears of it may
append an event of its own (the log's failure, in its own words).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.store.events import Event, as_event
from nnwatch.store.paths import open_for_append

EVENTS_FILE = "events.jsonl"


class EventAppender:
    """Appends event lines to ``events.jsonl`` in ``run_dir``, from any thread."""

    def __init__(self, run_dir: Path, on_error: Callable[[str], None]) -> None:
        self.path = Path(run_dir) / EVENTS_FILE
        self._on_error = on_error
        self._lock = threading.Lock()
        self._fd = open_for_append(self.path)

    def event(self, event: Event | Mapping[str, Any]) -> None:
        """Append one event line (a typed event, or the dict of a line, as callers before the
        types wrote). The line is stamped with the time it is written, unless the event
        carries its own."""
        fields = {"time": time.time(), **as_event(event).to_json()}
        line = (json.dumps(fields, default=json_default, sort_keys=True) + "\n").encode()
        failed = ""
        with self._lock:
            if self._fd < 0:
                return
            try:
                os.write(self._fd, line)
            except OSError as exc:
                failed = f"cannot append to {EVENTS_FILE}: {exc.strerror or exc}"
        if failed:
            self._on_error(failed)

    def close(self) -> None:
        """Close the file; later events are dropped (the run has ended). Safe to call twice."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def json_default(obj: Any) -> Any:
    """How a line with numpy values or paths is written (the run log's end.json too)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)  # a path, or anything else a line may carry
