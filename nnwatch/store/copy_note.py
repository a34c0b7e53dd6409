"""A run directory that is a copy (``nnwatch pull HOST:RUN --run``), and what its source said.

A copy holds the writer's pid and host in ``meta.json`` like the original, but no process here
wrote it: judged by that pid it would read as crashed, or as live when a local process happens to
have the same pid (the same hostname, a container). So the pull writes ``copied.json`` beside the
files: where they came from, when, and how the source host judged the run at that moment; every
reader then says "a copy" and shows that, and checks no pid.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from nnwatch.store.clean_text import loads
from nnwatch.store.paths import write_private_file
from nnwatch.store.safe_read import read_small_file

COPY_FILE = "copied.json"


def write_copy_note(run_dir: Path, header: dict[str, Any], host: str) -> None:
    """Record, in a run directory just pulled, where it came from and what the source said."""
    note = {
        "host": str(host),
        "source": str(header.get("run_dir") or header.get("source") or ""),
        "source_host": str(header.get("host") or ""),
        "copied_at": time.time(),
        "state": str(header.get("status") or header.get("state") or ""),
        "live": bool(header.get("live")),
        "last_step": header.get("last_step") if isinstance(header.get("last_step"), int) else None,
        "message": str(header.get("message") or ""),
    }
    write_private_file(Path(run_dir) / COPY_FILE, (json.dumps(note, indent=1) + "\n").encode())


def read_copy_note(run_dir: Path | str) -> dict[str, Any] | None:
    """The note of a copied run (fields checked), or None for a run written on this host."""
    try:
        note = loads(read_small_file(Path(run_dir) / COPY_FILE, limit=65536))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(note, dict):
        return None
    out: dict[str, Any] = {}
    for key in ("host", "source", "source_host", "state", "message"):
        value = note.get(key)
        out[key] = value[:200] if isinstance(value, str) else ""
    at = note.get("copied_at")
    ok = isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at)
    out["copied_at"] = float(at) if ok and at is not None else None
    out["live"] = note.get("live") is True
    step = note.get("last_step")
    out["last_step"] = step if isinstance(step, int) and not isinstance(step, bool) else None
    return out


def describe_copy(note: dict[str, Any]) -> str:
    """ "a copy pulled from gpu1 at 12:03:04, not a run on this host; there it was running, at
    step 1234" """
    at = note.get("copied_at")
    when = f" at {time.strftime('%H:%M:%S', time.localtime(at))}" if at else ""
    text = f"a copy pulled from {note.get('host') or 'another host'}{when}, not a run on this host"
    state = note.get("state")
    if state:
        text += f"; there it was {state}"
        if note.get("last_step") is not None:
            text += f", at step {note['last_step']}"
        if note.get("message") and state not in ("running", "finished"):
            text += f" ({note['message']})"
    return text
