"""What the monitor's threads report, in the words the user reads: a run that is lost, crashed or
hung says so, and a monitor-side failure shows in the error's own words rather than as a screen
that silently stops changing. Pure functions: the app shows what they return."""

from __future__ import annotations

from dataclasses import dataclass

from textual.notifications import SeverityLevel

from nnwatch.tui import format as fmt
from nnwatch.tui.messages import SnapshotWritten


@dataclass(frozen=True)
class Notice:
    """One toast: its text, title, severity and how long it stays (None: Textual's default)."""

    text: str
    title: str
    severity: SeverityLevel = "information"
    timeout: float | None = None


def run_state(state: str, previous: str, note: str) -> Notice | None:
    """What a change of the run's state tells the user; None for a change not worth a toast."""
    said = f": {note}" if note else ""
    if state in ("lost", "crashed"):
        what = "lost" if state == "lost" else "crashed"
        text = f"The run is {what}{said}. Its history stays on screen; r reconnects."
        return Notice(text, f"run {what}", "error", 8)
    if state == "hung":
        return Notice(f"The trainer stopped stepping{said}.", "run hung", "warning")
    if state == "finished" and previous != "connecting":
        return Notice("The run finished.", "finished")
    if state == "interrupted" and previous != "connecting":
        return Notice(f"The run was interrupted{said}.", "interrupted")
    if state == "live" and previous in ("lost", "hung", "paused"):
        return Notice("The run is live again.", "live")
    return None


def reader_failed(what: str, message: str) -> Notice:
    """A reader thread raised: the error's own words (the source reader's is a bug of ours)."""
    hint = (
        " The monitor keeps retrying; please report this as an nnwatch bug."
        if what == "reader"
        else ""
    )
    return Notice(f"{what} failed: {message}.{hint}", f"{what} failed", "error", 15)


def snapshot_written(message: SnapshotWritten, host: str | None) -> Notice:
    """Where a new snapshot lies, and for a run on another host how to get at it."""
    reason = f" ({message.reason})" if message.reason else ""
    where = f"{host}:{message.path}" if host else message.path
    hint = "; i inspects it here, P copies it here" if host else ""
    return Notice(f"step {fmt.count(message.step)}: {where}{reason}{hint}", "snapshot written")
