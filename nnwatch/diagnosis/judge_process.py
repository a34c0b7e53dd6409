"""The detectors in a process of their own: ``python -m nnwatch.diagnosis.judge_process``.

Started by :class:`~nnwatch.diagnosis.judge_link.JudgeLink` with, on stdin, one JSON header line
(the ring's path, the state's length, the parent's pid) and the detectors' pickled
state; then JSON lines: ``{"guard": step, "act_sum": [...], "grad_layer": [...]}`` when the
trainer's guard trips, ``{"game": true}``, ``{"end": true}``. It reads the ring every
``POLL_S`` while records come (backing off to ``IDLE_POLL_S`` while none do) and answers on
stdout, one JSON line each: ``{"finding": {...}}``,
``{"snapshot": reason}``, and at the end ``{"done": {"rows": n, "dropped": n}}``.

It never outlives the run: at an end message, at its stdin's end (the trainer closed or died) or
when its parent is gone, it reads what the ring still holds, reports and exits. It ignores Ctrl-C:
the terminal sends it to the whole process group, and the trainer, which handles it, still wants
the findings of its last steps. It imports no torch.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import select
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from nnwatch.diagnosis.live import Diagnosis
from nnwatch.store.finding import Finding
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.schema import FieldName

#: Seconds between two reads of the ring while records come (the ring holds thousands of records,
#: so even a step of 50 us leaves the reader a generous margin).
POLL_S = 0.05
#: ... and the longest wait while none come: a slow step (a second, say) finds most reads empty,
#: and each read costs the process a few hundred microseconds on a cold cache; it backs off
#: (doubling) to this, the run log's own drain interval, and goes back to ``POLL_S`` at the next
#: record. Messages wake it at once.
IDLE_POLL_S = 0.25


class _Answers:
    """The :class:`~nnwatch.diagnosis.live.DiagnosedRun` of this process: answers go to stdout."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.layer_state: tuple[np.ndarray | None, np.ndarray | None, float] = (None, None, math.nan)
        self.gone = False

    @property
    def step_index(self) -> int:
        return -1

    @property
    def guard_tripped(self) -> bool:
        return False

    def add_finding(self, finding: Finding) -> None:
        self.say({"finding": finding.to_dict()})

    def request_snapshot(self, reason: str) -> None:
        self.say({"snapshot": reason})

    def live_layer_state(self) -> tuple[np.ndarray | None, np.ndarray | None, float]:
        return self.layer_state

    def say(self, message: dict[str, Any]) -> None:
        if self.gone:
            return
        try:
            self.out.write(json.dumps(message, allow_nan=True, default=_plain).encode() + b"\n")
            self.out.flush()
        except (OSError, ValueError):
            self.gone = True  # the trainer is gone: nobody to tell


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


class _Inbox:
    """The trainer's messages, read without blocking from stdin (no thread: the order matters).

    The trainer writes a guard message before it publishes that step's record, so messages read
    *after* a ring read include every message sent before any record that read returned.
    """

    def __init__(self, fd: int, pending: bytes = b"") -> None:
        self.fd = fd
        self.buf = pending
        self.closed = False

    def wait(self, timeout: float) -> None:
        if not self.closed:
            select.select([self.fd], [], [], timeout)
        else:
            time.sleep(timeout)

    def drain(self) -> list[dict[str, Any]]:
        while not self.closed and select.select([self.fd], [], [], 0)[0]:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.closed = True  # the trainer closed the pipe, or died
                break
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for raw in lines:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            if isinstance(message, dict):
                out.append(message)
        return out


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _array(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.float32)


class Judge:
    """Feeds the ring's new records to the detectors handed over, until the run ends."""

    def __init__(self, diagnosis: Diagnosis, answers: _Answers, ring: Path, parent: int) -> None:
        self.diagnosis = diagnosis
        self.answers = answers
        self.reader = RingReader(ring, start="oldest")
        self.parent = parent
        self.rows = 0
        self.dropped = 0

    def run(self, inbox: _Inbox) -> None:
        going = True
        wait = POLL_S
        while going:
            batch = self.reader.read_batch()  # first the ring, then the messages (see _Inbox)
            self.count_dropped(batch.dropped)
            rows = batch.records
            for message in inbox.drain():
                if message.get("end"):
                    going = False
                if "guard" in message:  # the steps before the bad one first, as in the thread
                    step = int(message["guard"])
                    before = rows[FieldName.STEP] < step
                    self.feed(rows[before])
                    rows = rows[~before]
                    self.answers.layer_state = (
                        _array(message.get(FieldName.ACT_SUM)), _array(message.get(FieldName.GRAD_LAYER)),
                        _number(message.get("grad_max")),
                    )  # fmt: skip
                    self.diagnosis.on_nonfinite_grads(step)
                if message.get("game"):
                    self.diagnosis.judge_as_game()
            self.feed(rows)
            if inbox.closed or os.getppid() != self.parent:
                going = False
            if going and len(batch.records) < self.reader.slots // 4:
                wait = POLL_S if len(batch.records) else min(IDLE_POLL_S, 2 * wait)
                inbox.wait(wait)  # a message wakes it early; a ring filling up does not wait
        while True:  # what the ring still holds
            batch = self.reader.read_batch()
            self.count_dropped(batch.dropped)
            if not len(batch.records):
                break
            self.feed(batch.records)
        self.answers.say({"done": {"rows": self.rows, "dropped": self.dropped}})

    def count_dropped(self, n: int) -> None:
        """Records the trainer overwrote before this process read them: said once, in words."""
        if n and not self.dropped:
            self.answers.say({"notice": (
                f"the detectors' process fell behind the ring and missed {n} record(s); the "
                "detectors judge the run with gaps from here (the run log keeps every record)"
            )})  # fmt: skip
        self.dropped += n

    def feed(self, rows: np.ndarray) -> None:
        if len(rows):
            self.diagnosis.observe(rows)
            self.rows += len(rows)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answers
    fd = sys.stdin.fileno()
    data = b""
    while b"\n" not in data:  # raw reads: no buffered reader holds back what comes after
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return 1
        data += chunk
    line, data = data.split(b"\n", 1)
    header = json.loads(line)
    need = int(header["state_len"])
    while len(data) < need:
        chunk = os.read(fd, need - len(data))
        if not chunk:
            return 1
        data += chunk
    state, data = data[:need], data[need:]
    pipeline, spikes = pickle.loads(state)  # noqa: S301 - written by our own parent, over a pipe
    answers = _Answers(stdout)
    diagnosis = Diagnosis(pipeline.ctx, answers, handed_over=(pipeline, spikes))
    try:
        judge = Judge(diagnosis, answers, Path(header["ring"]), int(header["parent"]))
    except Exception as exc:  # noqa: BLE001 - said in words, then the link reports it lost
        print(f"nnwatch: the detectors' process cannot read the ring: {exc}", file=sys.stderr)
        return 1
    judge.run(_Inbox(fd, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
