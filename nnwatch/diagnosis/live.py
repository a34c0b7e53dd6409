"""The detectors attached to a live run: fed by the run-log writer thread, and by the guard.

``Diagnosis(context, run)`` is created by the probe at the first ``w.step()``; ``run`` is the
:class:`DiagnosedRun` it reports to (findings, snapshot requests), nothing more. The writer thread calls
:meth:`observe` with each batch of new records (off the training thread: a detector never slows a
step down, it only acts one step late). It hands the GIL back after every record: a batch is a
quarter second of steps, tens of milliseconds of Python at a thousand steps a second, and
held in one piece it stalled the training thread for up to CPython's 5 ms switch interval each
time that thread came back from a torch kernel (``bench/writer_stalls.py``: the steps' tail, p99.9
and the time lost in stalls, back to the bare loop's with the hand-back). The one exception is the guard: when the single
``isfinite`` check before ``optimizer.step()`` trips, the training thread calls
:meth:`on_nonfinite_grads` and the NaN finding is issued on the spot, with the weights still clean.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.pipeline import Pipeline
from nnwatch.diagnosis.row import Row
from nnwatch.diagnosis.snapshot import complete_pending
from nnwatch.diagnosis.spikes import SpikeTrigger
from nnwatch.store.finding import Finding

log = logging.getLogger("nnwatch")

#: Seconds of one batch during which the detectors hand the GIL back after every record (the
#: writer drains every 0.25 s; a healthy batch takes a few milliseconds of that).
HAND_BACK_FOR = 0.1


class DiagnosedRun(Protocol):
    """What the live detectors need of the run they watch: where findings and snapshot requests
    go, and, when the guard trips, the probe's per-layer values of the step."""

    @property
    def step_index(self) -> int: ...

    @property
    def guard_tripped(self) -> bool: ...

    def add_finding(self, finding: Finding) -> None: ...

    def request_snapshot(self, reason: str) -> None: ...

    def live_layer_state(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """This step's per-layer output sums and gradient norms (a host copy; may sync)."""


class Diagnosis:
    """Detectors for one watched run. Findings go to ``run.add_finding`` (and ``self.findings``)."""

    def __init__(self, context: RunContext, run: DiagnosedRun) -> None:
        self.run = run
        self.context = context
        self.pipeline = Pipeline(self.context)
        self.findings: list[Finding] = []
        self.spikes = SpikeTrigger()
        self._lock = threading.Lock()
        self.rows_seen = 0
        #: give the GIL back after each record (off only for bench/writer_stalls.py's comparison)
        self.hand_back = True
        if run.guard_tripped and run.step_index == 0:
            # The guard tripped on step 0, before this object existed (it is created at the end
            # of the first step); the step's buffers still hold its per-layer values.
            self.on_nonfinite_grads(0)

    # -- writer thread ---------------------------------------------------------------------------
    def observe(self, rows: np.ndarray) -> None:
        """Feed new records (in step order) to every detector."""
        hand_back = self.hand_back
        until = time.perf_counter() + HAND_BACK_FOR
        with self._lock:
            hist = self.pipeline.history
            for row in Row.batch(rows):
                if row.step <= self.pipeline.last_step:
                    continue  # a record seen twice (e.g. re-published after a device move)
                self.rows_seen += 1
                if self.spikes.check(row, hist):
                    self._request_snapshot(f"grad_norm_spike at step {row.step}")
                for finding in self.pipeline.feed_row(row):
                    self._emit(finding)
                if hand_back:
                    time.sleep(0)  # releases the GIL: a waiting training thread takes it now
                    # a loop that holds the GIL in Python between kernels would hand it back
                    # only every switch interval: past this, hold it and catch up instead
                    hand_back = time.perf_counter() < until
        complete_pending(self.run, rows)

    # -- training thread -------------------------------------------------------------------------
    def judge_as_game(self) -> None:
        """This run is one side of a game (a GAN): its loss level means nothing alone."""
        self.pipeline.history.obs.adversarial = True

    def on_nonfinite_grads(self, step: int) -> None:
        """The guard found non-finite gradients before ``optimizer.step()`` of ``step``."""
        det = self.pipeline.nan_detector()
        if det is None or (det.episode.active and det.episode.opened_at <= step):
            return
        act_sum, grad_layer = self.run.live_layer_state()
        with self._lock:
            finding = self.pipeline.on_guard(step, act_sum, grad_layer)
            if finding is not None:
                self._emit(finding)

    def close(self) -> None:
        """Nothing to release: the writer flushes its last records after this, and they still count."""

    # ------------------------------------------------------------------------------------------
    def _emit(self, finding: Finding) -> None:
        self.findings.append(finding)
        try:
            self.run.add_finding(finding)
        except Exception as exc:  # noqa: BLE001 - reporting must not stop the detectors
            log.error("nnwatch: could not report a finding: %r (%s)", exc, finding.message)

    def _request_snapshot(self, reason: str) -> None:
        try:
            self.run.request_snapshot(reason)
        except Exception as exc:  # noqa: BLE001
            log.warning("nnwatch: could not request a snapshot: %r", exc)
