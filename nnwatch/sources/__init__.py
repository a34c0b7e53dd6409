"""Data sources the monitor reads from: a live run, a recorded run, or a fixture.

They share one interface (``RunSource``) so that the TUI never knows which it has. Nothing here
imports a UI library.
"""

from __future__ import annotations

from nnwatch.sources.base import CommandReply, RunSource, SourceError, SourceStatus, SourceUpdate

__all__ = ["CommandReply", "RunSource", "SourceError", "SourceStatus", "SourceUpdate"]
