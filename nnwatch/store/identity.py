"""Which process wrote a run: pid plus process start time, so that a reused pid is never mistaken
for the trainer that once had it.

A pid alone is not an identity: the kernel hands pids out again, and a monitor that trusted one
would show a long-dead run as live because some unrelated process now has its number. The start
time of the process (from psutil, which reads ``/proc``) tells the two apart. A zombie (a killed
trainer its parent has not yet waited for) counts as gone: it will never step again.

A pid is also only meaningful inside its PID namespace: a trainer in a container that shares the
host's ``/dev/shm`` (and its host name) registers a pid such as 1 or 7, which on the host belongs
to another process or to none. Writers record their namespace (the inode of
``/proc/self/ns/pid``); a reader in another namespace does not check such a pid at all and judges
the run by its ring heartbeat instead.
"""

from __future__ import annotations

import functools
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


def pid_namespace() -> int:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``); 0 when it cannot be
    read (not Linux, or /proc not mounted), which readers take as "the same as mine"."""
    try:
        return int(os.stat("/proc/self/ns/pid").st_ino)
    except (OSError, ValueError):
        return 0


#: The inode the kernel gives the initial PID namespace (``PROC_PID_INIT_INO``): the host's own.
INIT_PID_NS = 0xEFFFFFFC


@functools.cache  # once per process: the random tag must stay the same
def namespace_tag() -> str:
    """What makes this process's pid unique on a machine whose ``/dev/shm`` and host name other
    PID namespaces share (two containers, both pid 1): "" in the host's own namespace (names stay
    as they were), ``-n<inode>`` in another, and a random ``-x<hex>`` (once per process) where
    the namespace cannot be read. Registry entries and sockets carry it in their names."""
    ns = pid_namespace()
    if ns == INIT_PID_NS:
        return ""
    if ns:
        return f"-n{ns}"
    import secrets

    return f"-x{secrets.token_hex(4)}"


def pid_checkable(host: str | None, pid_ns: object = 0) -> bool:
    """Whether a writer's pid can be checked from here: same host, and the same PID namespace
    when the writer recorded one (``pid_ns``, 0 or None: an older writer, taken as the same)."""
    if host is not None and host != this_host():
        return False
    if isinstance(pid_ns, bool) or not isinstance(pid_ns, int) or pid_ns <= 0:
        return True
    mine = pid_namespace()
    return mine == 0 or mine == pid_ns


def this_host() -> str:
    """The host name written into entries; a pid is only meaningful on the host that owns it."""
    return socket.gethostname()
