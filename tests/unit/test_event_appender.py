"""``events.jsonl`` has one writer, the ``EventAppender``: lines whole from any thread, and a
failed append (a full disk, made real here with ``/dev/full`` under the file's descriptor)
reported after its lock is let go, so whoever hears of it may append an event of its own."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nnwatch.store.event_appender import EVENTS_FILE, EventAppender
from nnwatch.store.run_reader import read_events
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.schema import RunMeta, RunSchema


def _fill_disk_under(appender: EventAppender) -> None:
    """Every later write to the appender's descriptor fails with ENOSPC, as on a full disk."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, appender._fd)
    finally:
        os.close(full)


def test_lines_from_many_threads_are_whole(tmp_path: Path) -> None:
    appender = EventAppender(tmp_path, on_error=lambda why: None)

    def add(t: int) -> None:
        for i in range(200):
            appender.event({"type": "command", "command": "x" * 500, "args": {}, "step": t * 1000 + i})

    threads = [threading.Thread(target=add, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    appender.close()
    steps = sorted(ev.step for ev in read_events(tmp_path / EVENTS_FILE))  # type: ignore[attr-defined]
    assert steps == sorted(t * 1000 + i for t in range(4) for i in range(200))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_append_is_reported_outside_the_lock(tmp_path: Path) -> None:
    heard: list[str] = []

    def on_error(why: str) -> None:
        heard.append(why)
        if len(heard) == 1:
            appender.event({"type": "log_failed", "error": why})  # waits on nothing

    appender = EventAppender(tmp_path, on_error=on_error)
    _fill_disk_under(appender)
    done = threading.Event()
    threading.Thread(
        target=lambda: (appender.event({"type": "snapshot", "step": 1}), done.set()), daemon=True
    ).start()
    assert done.wait(30), "the failure report waited on the appender's own lock"
    assert len(heard) == 2 and "No space left on device" in heard[0]
    assert heard[0].startswith(f"cannot append to {EVENTS_FILE}")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_event_file_is_the_run_logs_failure(tmp_path: Path) -> None:
    schema = RunSchema(("a",), ("Linear",), ("a",), num_lr=1)
    writer = RunLogWriter(tmp_path, RunMeta(name="t", schema=schema, pid=1, host="h", started=0.0))
    told: list[str] = []
    writer.on_error.append(told.append)
    _fill_disk_under(writer.events)
    writer.events.event({"type": "snapshot", "step": 3})
    assert writer.error is not None and "No space left on device" in writer.error
    assert told == [writer.error]  # said once: the LogFailed line that also failed adds nothing
    writer.close("finished", 0)
    writer.events.event({"type": "snapshot", "step": 4})  # after close: dropped, not raised
