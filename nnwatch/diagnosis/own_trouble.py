"""Findings about nnwatch itself: its own trouble, told in the same list as the run's.

They are made here, with every other finding's words, so that the probe only reports what
happened (the run log failed) and never writes a finding of its own.
"""

from __future__ import annotations

from nnwatch.store.finding import Finding


def log_failed(step: int, message: str) -> Finding:
    """The run log could not be written (a full disk, a directory gone): training goes on, the
    records stop reaching the disk, and the user should know why."""
    return Finding(
        kind="nnwatch_error",
        severity="error",
        step=step,
        summary=message,
        remedy="free disk space or point NNWATCH_RUN_DIR at a writable disk; training goes on",
    )
