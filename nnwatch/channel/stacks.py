"""Where a process is: every thread's Python stack, as the command server answers ``stacks``.

Gathered by the command server's own thread (``sys._current_frames()`` and ``traceback``), never
by the training thread: a rank blocked in C (a gloo or NCCL collective, a data loader's queue)
has released the GIL, so its server still answers and shows the line it waits on. A rank that
holds the GIL for good (a stopped process, a C loop that never releases it) cannot answer, and a
monitor says so instead. This is what people otherwise run ``py-spy dump`` on each node for.

The answer is plain JSON: one entry per thread (name, whether it is the main thread or one of
nnwatch's own, and its frames oldest first as ``[file, line, function, source]``). The frames
are capped at :data:`MAX_FRAMES` per thread (the innermost kept), and so is the source text.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Any

#: Frames kept per thread (the innermost): deep recursion must not make the answer huge.
MAX_FRAMES = 64
MAX_LINE = 160
#: nnwatch names its own threads with this prefix; monitors show them apart from the program's.
OWN_PREFIX = "nnwatch"


def own_stacks(max_frames: int = MAX_FRAMES) -> dict[str, Any]:
    """This process's threads and their stacks, now (called on the command server's thread)."""
    by_ident = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        thread = by_ident.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        try:
            summary = traceback.extract_stack(frame)[-max_frames:]
        except Exception:  # noqa: BLE001 - a frame that cannot be read still names its thread
            summary = traceback.StackSummary()
        frames = [
            [fs.filename, fs.lineno or 0, fs.name, (fs.line or "")[:MAX_LINE]] for fs in summary
        ]
        threads.append({
            "name": name, "main": ident == main, "own": name.startswith(OWN_PREFIX),
            "daemon": bool(thread.daemon) if thread is not None else None, "frames": frames,
        })  # fmt: skip
    threads.sort(key=lambda t: (not t["main"], t["own"], t["name"]))
    return {"threads": threads, "taken_at": time.time()}


def format_thread(thread: dict[str, Any], indent: str = "  ") -> list[str]:
    """One thread's stack as ``py-spy dump`` and tracebacks print it: innermost call last."""
    kind = " (main)" if thread.get("main") else ""
    lines = [f"{indent}Thread {thread.get('name', '?')}{kind}:"]
    for file, line, func, source in thread.get("frames") or []:
        lines.append(f'{indent}  File "{file}", line {line}, in {func}')
        if source:
            lines.append(f"{indent}    {source}")
    return lines


def innermost(thread: dict[str, Any]) -> str:
    """Where a thread is, in a few words: ``backward (torch/_tensor.py:648)``."""
    frames = thread.get("frames") or []
    if not frames:
        return "no Python frame"
    file, line, func, _ = frames[-1]
    return f"{func} ({_short_path(str(file))}:{line})"


def _short_path(path: str) -> str:
    """The last two parts of a path: enough to recognise, short enough for a table cell."""
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])
