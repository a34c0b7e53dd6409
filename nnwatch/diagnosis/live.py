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

A thread still shares the trainer's GIL. So the detectors time themselves, and once they cost more
than ``HAND_OVER_SHARE`` (0.1 %) of the step time (a fast loop: on a 0.2 ms step they nearly
double it; a slow one: its records come one by one, each on a cold cache),
they hand their state to a process of their own that reads the ring
(:mod:`~nnwatch.diagnosis.judge_link`); findings then come back one poll (50 ms) later. Where
there is no ring or no process can start, they stay here. ``NNWATCH_DETECTORS`` = ``thread`` or
``process`` (at the first records) overrides the choice.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.judge_link import JudgeLink
from nnwatch.diagnosis.pipeline import Pipeline
from nnwatch.diagnosis.row import Row
from nnwatch.diagnosis.spikes import SpikeTrigger
from nnwatch.store.finding import Finding
from nnwatch.store.schema import FieldName

log = logging.getLogger("nnwatch")

#: Seconds of one batch during which the detectors hand the GIL back after every record (the
#: writer drains every 0.25 s; a healthy batch takes a few milliseconds of that).
HAND_BACK_FOR = 0.1
#: Detector CPU per record, as a share of the median step time, past which they move to a
#: process of their own (a tenth of the probe's 1% budget: the detectors run on a cold cache
#: after every batch of steps, 0.2-0.3 ms a record after a 70 ms step, and what stays in this
#: process adds to the probe's own share; a process costs a core's sliver, not the trainer's GIL)...
HAND_OVER_SHARE = 0.001
#: ... judged once this many records and seconds have been seen (a short run never pays a process)
HAND_OVER_AFTER = (256, 2.0)


def _placement() -> str:
    """``NNWATCH_DETECTORS``: ``thread``, ``process`` or ``auto`` (the default)."""
    value = os.environ.get("NNWATCH_DETECTORS", "auto").strip().lower()
    return value if value in ("thread", "process") else "auto"


class DiagnosedRun(Protocol):
    """What the live detectors need of the run they watch: where findings and snapshot requests
    go, and, when the guard trips, the probe's per-layer values of the step."""

    @property
    def step_index(self) -> int: ...

    @property
    def guard_tripped(self) -> bool: ...

    def add_finding(self, finding: Finding) -> None: ...

    def request_snapshot(self, reason: str) -> None: ...

    def live_layer_state(self) -> tuple[np.ndarray | None, np.ndarray | None, float]:
        """This step's per-layer output sums and gradient norms (a host copy; may sync), and the
        largest finite gradient element the guard saw (NaN when not looked at)."""


class RecordObserver(Protocol):
    """Something else that reads each batch of records after the detectors, in the writer thread
    (the snapshot taker's :class:`~nnwatch.diagnosis.snapshot.SnapshotRecords`)."""

    def observe(self, rows: np.ndarray) -> None: ...


class Diagnosis:
    """Detectors for one watched run. Findings go to ``run.add_finding``: the run keeps the one
    list of them."""

    def __init__(
        self,
        context: RunContext,
        run: DiagnosedRun,
        handed_over: tuple[Pipeline, SpikeTrigger] | None = None,
    ) -> None:
        """``handed_over``: the state of detectors that moved here (their own process), which
        go on from it and stay where they are."""
        self.run = run
        self.context = context
        self.pipeline, self.spikes = handed_over or (Pipeline(context), SpikeTrigger())
        self._lock = threading.Lock()
        self.rows_seen = 0
        #: give the GIL back after each record (off for bench/writer_stalls.py's comparison, and
        #: in the detectors' own process, where no training thread waits for it)
        self.hand_back = handed_over is None
        #: the run's ring file, where a process of the detectors' own would read the records
        self.ring: Path | None = None
        #: the detectors' own process, once they moved there
        self.link: JudgeLink | None = None
        self.placement = "thread" if handed_over is not None else _placement()
        self._cost = 0.0  # detector CPU seconds so far (thread time)
        self._first_seen: float | None = None
        #: what reads the records after the detectors (see :meth:`add_observer`)
        self.observers: list[RecordObserver] = []
        if run.guard_tripped and run.step_index == 0:
            # The guard tripped on step 0, before this object existed (it is created at the end
            # of the first step); the step's buffers still hold its per-layer values.
            self.on_nonfinite_grads(0)

    # -- writer thread ---------------------------------------------------------------------------
    def observe(self, rows: np.ndarray) -> None:
        """Feed new records (in step order) to every detector (or, once they moved to their own
        process, only pass them on to the observers)."""
        if self.link is not None:
            self._pass_on(rows)
            return
        started = time.thread_time()
        self._feed(rows)
        self._pass_on(rows)
        self._cost += time.thread_time() - started
        if self.placement != "thread" and self.ring is not None and self._worth_a_process(rows):
            self._hand_over()

    def add_observer(self, observer: RecordObserver) -> None:
        """Have ``observer`` read every batch of records once the detectors have judged it."""
        self.observers.append(observer)

    def _pass_on(self, rows: np.ndarray) -> None:
        for observer in self.observers:
            observer.observe(rows)

    def _feed(self, rows: np.ndarray) -> None:
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

    def attach_ring(self, ring: Path) -> None:
        """The run's ring, where the detectors' own process would read; with
        ``NNWATCH_DETECTORS=process`` they move there now."""
        self.ring = ring
        if self.placement == "process":
            self._hand_over()

    def _worth_a_process(self, rows: np.ndarray) -> bool:
        now = time.monotonic()
        if self._first_seen is None:
            self._first_seen = now
        records, seconds = HAND_OVER_AFTER
        if self.rows_seen < records or now - self._first_seen < seconds:
            return False
        step_times = rows[FieldName.STEP_TIME][np.isfinite(rows[FieldName.STEP_TIME])]
        if not len(step_times):
            return False
        per_record = self._cost / self.rows_seen
        return per_record > HAND_OVER_SHARE * float(np.median(step_times))

    def _hand_over(self) -> None:
        """Move the detectors, state and all, to their own process (see the module's docstring)."""
        assert self.ring is not None
        self.placement = "thread"  # one try: a process that cannot start is not tried again
        with self._lock:
            try:
                state = pickle.dumps((self.pipeline, self.spikes), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - a detector's state that will not pickle
                log.info("nnwatch: the detectors stay in this process: %r", exc)
                return
            self.link = JudgeLink.start(
                ring=self.ring, state=state,
                on_finding=self._finding_from_process, on_snapshot=self._request_snapshot,
                on_lost=self._process_lost,
            )  # fmt: skip

    def _finding_from_process(self, d: dict[str, Any]) -> None:
        self._emit(Finding.from_dict(d))

    def _process_lost(self, why: str) -> None:
        log.error("nnwatch: %s", why)

    # -- training thread -------------------------------------------------------------------------
    def judge_as_game(self) -> None:
        """This run is one side of a game (a GAN): its loss level means nothing alone."""
        self.pipeline.history.obs.adversarial = True
        if self.link is not None:
            self.link.send({"game": True})

    def on_nonfinite_grads(self, step: int) -> None:
        """The guard found non-finite gradients before ``optimizer.step()`` of ``step``."""
        link = self.link
        if link is not None:  # the detectors' process judges it, with this step's layer values
            act_sum, grad_layer, grad_max = self.run.live_layer_state()
            link.send({
                "guard": step,
                FieldName.ACT_SUM: None if act_sum is None else act_sum.tolist(),
                FieldName.GRAD_LAYER: None if grad_layer is None else grad_layer.tolist(),
                "grad_max": grad_max,
            })  # fmt: skip
            return
        det = self.pipeline.nan_detector()
        if det is None or (det.episode.active and det.episode.opened_at <= step):
            return
        act_sum, grad_layer, grad_max = self.run.live_layer_state()
        with self._lock:
            finding = self.pipeline.on_guard(step, act_sum, grad_layer, grad_max)
            if finding is not None:
                self._emit(finding)

    def close(self) -> None:
        """In the thread, nothing to release: the writer flushes its last records after this, and
        they still count. A process of the detectors' own reads the ring to its end first."""
        with self._lock:  # a hand-over under way in the writer thread finishes first
            self.placement = "thread"  # the log's last drain comes after this: judged here
            link = self.link
        if link is not None:
            link.close()

    # ------------------------------------------------------------------------------------------
    def _emit(self, finding: Finding) -> None:
        try:
            self.run.add_finding(finding)
        except Exception as exc:  # noqa: BLE001 - reporting must not stop the detectors
            log.error("nnwatch: could not report a finding: %r (%s)", exc, finding.message)

    def _request_snapshot(self, reason: str) -> None:
        try:
            self.run.request_snapshot(reason)
        except Exception as exc:  # noqa: BLE001
            log.warning("nnwatch: could not request a snapshot: %r", exc)
