"""The run's findings have one owner, ``FindingLog``: one list, and one line each in the run's
events, appended straight to the run's event file (held until it opens), in the order they came."""

from __future__ import annotations

import threading
from pathlib import Path

from nnwatch.store.event_appender import EVENTS_FILE
from nnwatch.store.events import FindingEvent
from nnwatch.store.finding import Finding
from nnwatch.store.finding_log import EARLY_LIMIT, FindingLog
from nnwatch.store.run_reader import read_events as read_file
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.schema import RunMeta, RunSchema


def read_events(run_dir: Path) -> list[object]:
    return list(read_file(run_dir / EVENTS_FILE))


def _finding(step: int, kind: str = "loss_spike") -> Finding:
    return Finding(kind=kind, severity="warning", step=step, summary=f"spike at {step}", remedy="look")


def _log(tmp_path: Path) -> RunLogWriter:
    schema = RunSchema(("a",), ("Linear",), ("a",), num_lr=1)
    meta = RunMeta(name="t", schema=schema, pid=1, host="h", started=0.0)
    return RunLogWriter(tmp_path, meta)


def test_findings_before_the_log_opens_are_written_first_in_order(tmp_path: Path) -> None:
    findings = FindingLog()
    findings.add(_finding(0))
    findings.add(_finding(1))
    run_log = _log(tmp_path)
    findings.write_to(run_log.events)
    findings.add(_finding(2))
    findings.keep(_finding(3, "nnwatch_error"))  # kept, with no line: the log is what failed
    run_log.close()
    lines = [e for e in read_events(tmp_path) if isinstance(e, FindingEvent)]
    assert [e.finding.step for e in lines] == [0, 1, 2]
    assert [f.step for f in findings.items] == [0, 1, 2, 3]


def test_a_run_whose_log_never_opens_holds_a_bounded_number(tmp_path: Path) -> None:
    findings = FindingLog()
    for i in range(EARLY_LIMIT + 50):
        findings.add(_finding(i))
    assert len(findings.items) == EARLY_LIMIT + 50  # the list keeps them all
    run_log = _log(tmp_path)
    findings.write_to(run_log.events)
    run_log.close()
    assert sum(isinstance(e, FindingEvent) for e in read_events(tmp_path)) == EARLY_LIMIT


def test_two_threads_adding_lose_nothing(tmp_path: Path) -> None:
    findings = FindingLog()
    run_log = _log(tmp_path)
    findings.write_to(run_log.events)

    def add(base: int) -> None:
        for i in range(200):
            findings.add(_finding(base + i))

    threads = [threading.Thread(target=add, args=(k * 1000,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run_log.close()
    steps = sorted(e.finding.step for e in read_events(tmp_path) if isinstance(e, FindingEvent))
    assert steps == sorted(f.step for f in findings.items) and len(steps) == 400


def test_a_write_that_fails_can_report_itself_from_inside_add() -> None:
    """The run log tells of its own failure (a full disk) while a finding is being written: the
    finding that says so is kept, and nothing waits on itself."""
    findings = FindingLog()

    class FailingLog:
        def event(self, event: object) -> None:
            findings.keep(_finding(99, "nnwatch_error"))  # what the log's on_error does

    findings.write_to(FailingLog())
    done = threading.Event()
    threading.Thread(target=lambda: (findings.add(_finding(1)), done.set()), daemon=True).start()
    assert done.wait(30), "add() waited on itself"
    assert [f.step for f in findings.items] == [1, 99]


def test_a_failing_write_on_another_thread_never_waits_on_an_add() -> None:
    """A writer that holds its own lock while it reports a failed write (``keep``): an ``add`` on
    another thread that waits for that lock to write must not hold the findings' lock meanwhile."""
    findings = FindingLog()
    events_lock = threading.Lock()
    writing = threading.Event()

    class LockedLog:
        def event(self, event: object) -> None:
            writing.set()
            with events_lock:  # the writer's lock around its write
                pass

    findings.write_to(LockedLog())
    events_lock.acquire()  # a write in progress on the log's side...
    adder = threading.Thread(target=findings.add, args=(_finding(1),), daemon=True)
    adder.start()
    assert writing.wait(30)  # ...the add has reached the log's write, and waits for its lock
    reported = threading.Event()
    threading.Thread(
        target=lambda: (findings.keep(_finding(2, "nnwatch_error")), reported.set()), daemon=True
    ).start()  # the failed write reports itself while the log's lock is held
    try:
        assert reported.wait(30), "keep() waited on an add() that waits on the log"
    finally:
        events_lock.release()
    adder.join(30)
    assert sorted(f.step for f in findings.items) == [1, 2]
