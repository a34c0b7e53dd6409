"""Which process wrote a run: pid plus process start time, so that a reused pid is never mistaken
for the trainer that once had it.

A pid alone is not an identity: the kernel hands pids out again, and a monitor that trusted one
would show a long-dead run as live because some unrelated process now has its number. The start
time of the process (from psutil, which reads ``/proc``) tells the two apart. A zombie (a killed
trainer its parent has not yet waited for) counts as gone: it will never step again.
"""

from __future__ import annotations

import os
import socket

import psutil

#: psutil derives start times from boot time plus clock ticks; two readings of the same process
#: agree to well under a second, while a reused pid belongs to a process started later.
START_TIME_TOLERANCE = 1.0


def process_start_time(pid: int) -> float | None:
    """The start time (epoch seconds) of ``pid``, or None when no live process has that pid."""
    if pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except (psutil.Error, OSError):
        return None


def own_start_time() -> float:
    """This process's start time, as written into ring headers and registry entries."""
    t = process_start_time(os.getpid())
    return float(t if t is not None else 0.0)


def same_process(pid: int, start_time: float) -> bool:
    """True when ``pid`` is alive and is the very process that started at ``start_time``."""
    now_start = process_start_time(pid)
    if now_start is None:
        return False
    if start_time <= 0:  # the writer could not read its own start time; trust the pid alone
        return True
    return abs(now_start - start_time) <= START_TIME_TOLERANCE


def this_host() -> str:
    """The host name written into entries; a pid is only meaningful on the host that owns it."""
    return socket.gethostname()
