"""How a trainer's process ended, when it could not write ``end.json`` itself.

``end.json`` is written at a run's close, after the log is flushed. Two ends never get there:

- a SIGTERM from the launcher tearing a job down (torchrun, after another rank failed): the run
  has at most a couple of seconds, and a close that waits on a collective whose peer is gone may
  not finish in them. The process writes this note *first*, the moment the signal arrives.
- a SIGKILL, the OOM killer, a segfault, ``os._exit``: the process says nothing at all. Another
  rank of the same job on the same node watches it (a pidfd, woken at its death) and reads its
  exit status from ``/proc`` while it is a zombie, before the launcher reaps it: "killed by
  SIGKILL" rather than "vanished without a word".

``exit.json`` sits in the run directory and has the fields of ``end.json`` that say how the run
ended (``status``, ``reason``, ``signal``, ``exit_code``, ``ended``) plus who saw it
(``observed_by``). ``end.json``, when there is one, always wins: :func:`read_exit_note` is only
asked when it is missing.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

from nnwatch.store.paths import write_private_file
from nnwatch.store.safe_read import read_small_file

EXIT_FILE = "exit.json"
#: Signals that end a process from outside, on purpose (a launcher, a scheduler, a user).
FROM_OUTSIDE = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})


def signal_name(number: int) -> str:
    """``9`` -> ``"SIGKILL"``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def ending_for_status(wait_status: int) -> dict[str, Any]:
    """The note's fields for an exit status as ``waitpid`` reports it (``/proc/PID/stat``)."""
    sig = wait_status & 0x7F
    if sig:
        name = signal_name(sig)
        outside = name in FROM_OUTSIDE
        return {
            "status": "interrupted" if outside else "crashed",
            "reason": f"{'terminated' if outside else 'killed'} by {name} (signal {sig})",
            "signal": name,
        }
    code = (wait_status >> 8) & 0xFF
    if code == 0:
        return {"status": "finished", "reason": "exit status 0", "exit_code": 0}
    return {"status": "crashed", "reason": f"the process exited with status {code}",
            "exit_code": code}  # fmt: skip


def write_exit_note(
    run_dir: str | os.PathLike[str], fields: dict[str, Any], observed_by: str
) -> bool:
    """Write ``exit.json`` into ``run_dir`` unless the run already said how it ended (its own
    ``end.json`` or an earlier note). Never raises: a note is a help, not a duty."""
    run_dir = Path(run_dir)
    try:
        if (run_dir / "end.json").exists() or (run_dir / EXIT_FILE).exists():
            return False
        note = {"ended": time.time(), **fields, "observed_by": observed_by}
        write_private_file(run_dir / EXIT_FILE, json.dumps(note).encode())
    except OSError:
        return False
    return True


def read_exit_note(run_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The note as an ``end.json``-like dict (checked field by field), or None."""
    if run_dir is None:
        return None
    try:
        raw = json.loads(read_small_file(Path(run_dir) / EXIT_FILE, limit=65536))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("status") not in ("crashed", "interrupted", "finished"):
        return None
    out: dict[str, Any] = {"status": raw["status"], "exit_note": True}
    ended = raw.get("ended")
    if isinstance(ended, (int, float)) and not isinstance(ended, bool) and math.isfinite(ended):
        out["ended"] = float(ended)
    for key in ("reason", "signal", "observed_by"):
        if isinstance(raw.get(key), str):
            out[key] = raw[key][:300]
    code = raw.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        out["exit_code"] = code
    return out
