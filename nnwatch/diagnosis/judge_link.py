"""The training process's end of the detectors' own process (:mod:`nnwatch.diagnosis.judge_process`).

The detectors are Python, about 60-100 us per record; in a thread of the training process they
hold the trainer's GIL for that long on every step, which on a 0.2 ms step nearly doubles it. So a
live run whose detectors cost more than a sliver of its step time hands them, state and all, to a
process of their own that reads the run's ring (which holds every record already) and answers with
findings and snapshot requests, one JSON line each, on its stdout.

The link owns that process: it starts it with the detectors' pickled state, forwards what only
the trainer sees (the guard's per-layer values, "this run is a game"), reads its answers in a
thread that blocks on the pipe (no cost while nothing comes), and ends it with the watch: at
``close`` the process reads the ring to its end, reports, and exits. It never outlives the run:
it leaves when its stdin closes (the trainer closed the watch, or died) or its parent is gone.
Where it cannot start (no interpreter to run, a pipe refused), :meth:`start` returns None and the
detectors stay in the thread.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from nnwatch.store.child_python import CHILD_CWD, child_env, python_argv

log = logging.getLogger("nnwatch")

#: How long ``close`` waits for the process to read the ring to its end and report.
CLOSE_WAIT_S = 30.0
PROTOCOL = 1


class JudgeLink:
    """One running detectors' process, and the thread that reads its answers."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        on_finding: Callable[[dict[str, Any]], None],
        on_snapshot: Callable[[str], None],
        on_lost: Callable[[str], None],
    ) -> None:
        self.proc = proc
        self._on_finding = on_finding
        self._on_snapshot = on_snapshot
        self._on_lost = on_lost
        self._send_lock = threading.Lock()
        self._closing = False
        self._lost = False
        #: what the process said when it finished: records judged, records the ring lost to it
        self.done: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, name="nnwatch-judge-link", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        *,
        ring: Path,
        state: bytes,
        on_finding: Callable[[dict[str, Any]], None],
        on_snapshot: Callable[[str], None],
        on_lost: Callable[[str], None],
    ) -> JudgeLink | None:
        """Start the process and hand it the detectors' state; None where it cannot run."""
        if not sys.executable:
            return None
        try:
            proc = subprocess.Popen(  # noqa: S603 - our own module, run by this interpreter
                python_argv("nnwatch.diagnosis.judge_process"),  # never from the cwd: see there
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(), close_fds=True,
                cwd=CHILD_CWD,
            )  # fmt: skip
        except OSError as exc:
            log.info("nnwatch: the detectors stay in this process: %s", exc)
            return None
        header = {
            "protocol": PROTOCOL, "ring": os.path.abspath(ring), "state_len": len(state),
            "parent": os.getpid(),
        }  # fmt: skip
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(header).encode() + b"\n" + state)
            proc.stdin.flush()
        except (OSError, ValueError):
            proc.kill()
            proc.wait()
            return None
        return cls(proc, on_finding, on_snapshot, on_lost)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @property
    def alive(self) -> bool:
        return not self._lost and self.proc.poll() is None

    # -- trainer to process ----------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        """One message, as a JSON line; a process that is gone is reported once, never raised."""
        line = json.dumps(message, allow_nan=True).encode() + b"\n"
        with self._send_lock:
            stdin = self.proc.stdin
            if stdin is None or stdin.closed:
                return
            try:
                stdin.write(line)
                stdin.flush()
            except (OSError, ValueError):
                self._report_lost()

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Tell the process the run ended; wait while it reads the ring to its end and reports."""
        self._closing = True
        with self._send_lock:
            stdin = self.proc.stdin
            if stdin is not None and not stdin.closed:
                try:
                    stdin.write(b'{"end": true}\n')
                    stdin.close()
                except (OSError, ValueError):
                    pass
        self._reader.join(timeout)
        try:
            self.proc.wait(timeout=max(0.1, timeout / 10) if self._reader.is_alive() else timeout)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            log.error(
                "nnwatch: the detectors' process did not finish within %.0f s and was stopped; "
                "findings about the run's last steps may be missing", timeout,
            )  # fmt: skip
            self.proc.kill()
            self.proc.wait()
        out = self.proc.stdout
        if out is not None and not self._reader.is_alive():
            out.close()

    # -- process to trainer ----------------------------------------------------------------------
    def _read(self) -> None:
        out: IO[bytes] | None = self.proc.stdout
        if out is None:
            return
        for raw in out:
            try:
                message = json.loads(raw)
            except ValueError:
                continue  # not ours (a stray print in a library it imported): skip it
            if not isinstance(message, dict):
                continue
            try:
                if "finding" in message:
                    self._on_finding(message["finding"])
                elif "snapshot" in message:
                    self._on_snapshot(str(message["snapshot"]))
                elif "notice" in message:
                    log.warning("nnwatch: %s", message["notice"])
                elif "done" in message:
                    self.done = message["done"]
            except Exception as exc:  # noqa: BLE001 - reporting must never stop the reading
                log.error("nnwatch: could not take an answer of the detectors' process: %r", exc)
        if not self._closing or self.done is None:
            self.proc.wait()
            self._report_lost()

    def _report_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        code = self.proc.poll()
        self._on_lost(
            "the detectors' process ended"
            + (f" (exit code {code})" if code is not None else "")
            + " before the run did; findings stop here"
        )
