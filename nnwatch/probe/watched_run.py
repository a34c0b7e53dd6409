"""The run behind a :class:`~nnwatch.probe.watch.Watch`: its parts and its life.

A ``Watch`` is what the user holds (``step``, ``close``, ``findings``...); this is what the parts
report to: it starts the run files at the first step, keeps the findings, writes events, switches
monitoring off when a part fails, and ends the run. Its parts are made by
:mod:`nnwatch.probe._builder`, each handed only what it uses, and kept in one place, ``parts``
(the outputs beside the log, channel, detectors and export, live in ``files``); nothing here
relays a call to a part. The ``*Owner`` protocols of the parts (``CycleOwner``, ``GuardOwner``...)
are the slices of this object they see. Nothing below the probe receives it whole: the snapshot
writer and the detectors get the views of :mod:`nnwatch.probe.run_views`.

Users never see it; nnwatch's own integrations, tests and benchmarks reach it through
:func:`nnwatch.probe.watch.internals`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnwatch.diagnosis.detectors.clipping_misuse import clip_before_unscale
from nnwatch.diagnosis.own_trouble import log_failed
from nnwatch.probe import _builder, scaler_discovery
from nnwatch.probe.exit_status import Ending, last_exception
from nnwatch.probe.optimizer_target import OptimizerTarget
from nnwatch.probe.options import WatchOptions
from nnwatch.probe.outputs import start_outputs
from nnwatch.probe.run_files import (
    RankInfo,
    RunFiles,
    build_meta,
    choose_run_dir,
    optimizer_has_state,
)
from nnwatch.probe.run_views import DiagnosedView, SnapshotView
from nnwatch.probe.update_recorder import update_setup
from nnwatch.store.events import RunEnded
from nnwatch.store.exit_note import write_exit_note
from nnwatch.store.finding_log import FindingLog
from nnwatch.store.paths import RunDirError
from nnwatch.store.schema import RunMeta, RunSchema
from nnwatch.store.summary import RunSummary

log = logging.getLogger("nnwatch")

#: Where a watch goes with ``NNWATCH_DISABLE`` set: an inert watch, no hooks, no files.
DISABLE_ENV = "NNWATCH_DISABLE"


class WatchedRun:
    """One watched run's parts and state (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: OptimizerTarget,
        scaler: Any,
        options: WatchOptions,
        *,
        append: bool = False,
    ) -> None:
        self.model = model
        #: the optimizer, in its two roles: ``hook`` (whose step pre-hook marks the update; None:
        #: ``w.step()`` does) and ``source`` (where LRs, state and its step count are read)
        self.optimizer = optimizer
        self._scaler = scaler
        self.options = options
        self.name = options.name or type(model).__name__
        self.rank = RankInfo.detect()
        self.findings = FindingLog()  # the one list, each also written to events.jsonl
        self.disabled: str | None = None
        self.closed = False
        self.files = RunFiles()  # the run directory, the log and the outputs beside it
        self.meta: RunMeta | None = None  # fixed at the first step
        self._append = append  # resume=True: the run log of the run continued is appended to
        #: the interactive shell's last exception when this watch started (see taken_over)
        self.shell_exception_at_start = last_exception()
        #: the optimizer already holds state (a resumed run, or a second watch of one loop): the
        #: model has trained, so "the first loss should be ln K" does not apply
        self._resumed = optimizer_has_state(optimizer.source)
        self._warned: set[str] = set()
        if optimizer.note is not None:
            log.warning("nnwatch: %s", optimizer.note)
        self._started = time.time()
        self._ending_status: str | None = None  # how the run ended, once it has
        self._clip_before_unscale = False  # torch's clip was seen on still-scaled AMP gradients
        self._has_dir = False  # run_dir is None until the run has a directory of its own
        #: the number of the step being recorded (the next ``w.step()``): the run's place, read
        #: by every part, advanced by the step cycle at each step's end
        self.step_index = 0
        self.parts = _builder.build(
            self, model, optimizer, scaler, options,
            snapshot_owner=SnapshotView(self), on_scaled_norm=self._on_scaled_norm,
        )  # fmt: skip
        self.schema = self.parts.buffers.schema  # the record's layout, fixed at the first step
        self.step_index = self.parts.cycle.start_step  # a resumed run goes on from its last step
        self.parts.consistency = _builder.build_consistency(self, model, self.parts.plan, optimizer, options)

    def attach(self) -> bool:
        """Make the run directory and hook the model; False when the watch stays inert."""
        if os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            self.disabled = f"{DISABLE_ENV} is set"  # an inert watch: no hooks, no files
            log.info("nnwatch: %s is set; %s is not watched", DISABLE_ENV, self.name)
            return False
        try:
            self.files.dir = choose_run_dir(
                self.options.run_dir, self.name, self._started, self.rank, self.warn_once,
                append=self._append,
            )
        except (OSError, RunDirError) as exc:
            self.disable(f"cannot use the run directory ({exc}); monitoring is off for this run")
            return False
        self._has_dir = True
        parts = self.parts
        cycle = parts.cycle
        parts.attachment.attach(
            self.model, parts.plan, self.optimizer.hook, cycle.on_forward_start, cycle.on_backward,
            cycle.before_optimizer_step, cycle.first_outputs,
        )
        if self._scaler is None:
            scaler_discovery.wait_for(self._adopt_scaler)
        parts.sysmon.start()
        return True

    # ------------------------------------------------------------------------------------------
    # what the parts read
    @property
    def run_dir(self) -> Path | None:
        """The run's directory; None when monitoring is off and none was made."""
        return self.files.dir if self._has_dir else None

    # ------------------------------------------------------------------------------------------
    # the first step
    def start_run(self) -> None:
        """First step: the layer order is known, so the run files and the outputs start."""
        parts = self.parts
        order, plan, cycle = parts.layers.finalize(parts.buffers), parts.plan, parts.cycle
        names = tuple(plan.stat_names[i] for i in order)
        kinds = tuple(plan.stat_kinds[i] for i in order)
        self.schema = RunSchema(names, kinds, plan.param_layer_names, self.schema.num_lr)
        parts.buffers.schema = self.schema
        self.meta = build_meta(
            name=self.name, schema=self.schema, started=self._started, device=parts.buffers.device,
            num_classes=self.options.num_classes, rank=self.rank,
            extra={"layer_interval": parts.schedule.budget.layer_interval, "resumed": self._resumed,
                   "start_step": cycle.start_step, "tied": dict(plan.tied),
                   "micro_batches": max(1, parts.grads.backwards),
                   "output_layers": cycle.first_outputs.output_layers,
                   **cycle.loss_shape.to_extra(), **update_setup(plan, self.optimizer.source)},
        )  # fmt: skip
        try:
            self.files.start(self.meta, self._on_log_error, append=self._append, warn=self.warn_once)
        except (OSError, RunDirError) as exc:
            self.disable(f"cannot write the run log in {self.run_dir}: {exc}")
            return
        if self.files.log is not None:  # its writer's CPU counts against the same budget
            parts.schedule.budget.background = self.files.log.recent_cpu
            self.findings.write_to(self.files.log.events)
        start_outputs(
            self, parts, DiagnosedView(self),
            resumed=self._resumed, clip_before_unscale=self._clip_before_unscale,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------
    # events, findings, failures
    def _on_scaled_norm(self) -> None:
        """torch's clip (or norm) ran on gradients still multiplied by the AMP loss scale."""
        if self._clip_before_unscale:
            return
        self._clip_before_unscale = True
        scale = getattr(self._scaler, "_scale", None)
        value = float(scale) if isinstance(scale, torch.Tensor) and scale.is_cpu else math.nan
        self.findings.add(clip_before_unscale(self.step_index, value))

    def _adopt_scaler(self, scaler: Any) -> None:
        """The loop called ``GradScaler.scale()`` and no scaler was passed: use that one."""
        if self._scaler is not None or self.closed or self.disabled:
            return
        self._scaler = scaler
        parts = self.parts
        for part in (parts.grads, parts.record, parts.cycle, parts.snapshots):
            part.scaler = scaler
        self.warn_once(
            "found-scaler",
            "the loop scales its loss with a GradScaler that was not passed to watch(): nnwatch "
            "uses it (gradient norms unscaled, the AMP loss scale recorded); pass scaler= to "
            "watch() to say so",
        )

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("nnwatch: %s", message)

    def _on_log_error(self, message: str) -> None:
        """The run log failed (a full disk): kept as a finding of nnwatch's own trouble (without
        a line in events.jsonl, the file that just failed)."""
        self.findings.keep(log_failed(self.step_index, message))

    def disable(self, reason: str) -> None:
        """Switch monitoring off for the rest of the run, saying why; training goes on."""
        if self.disabled is None:
            self.disabled = reason
            log.error("nnwatch: %s; training continues without it", reason)
            self.parts.attachment.remove()
            scaler_discovery.stop_waiting(self._adopt_scaler)

    # ------------------------------------------------------------------------------------------
    def note_ending(self, ending: Ending) -> None:
        """A SIGTERM is ending the process: say how in ``exit.json`` at once, before a close that
        waits on a collective whose peer is gone may run out of time (and ``end.json`` with it)."""
        if self.closed or self.run_dir is None:
            return
        said = {k: v for k, v in ending.to_dict().items()
                if k in ("status", "reason", "signal", "exit_code") and v is not None}  # fmt: skip
        write_exit_note(self.run_dir, said, "the process itself")

    def close(self, ending: Ending) -> None:
        """End the run: remove every hook, flush the log, write ``end.json``."""
        status = ending.status
        self._ending_status = status
        self.closed = True
        if status != "finished":
            self.files.event(RunEnded(step=self.step_index, **asdict(ending)))
        parts = self.parts
        parts.attachment.remove()
        scaler_discovery.stop_waiting(self._adopt_scaler)
        if parts.consistency is not None:
            parts.consistency.close(ending.to_dict())  # reads a check in flight; tells rank 0
        parts.commands.restore()
        parts.sysmon.stop()
        cycle = parts.cycle
        try:
            cycle.finish_records()
        except Exception:  # noqa: BLE001
            pass
        share = parts.schedule.budget.own_share
        cost = {"nnwatch_own_share": round(share, 6)} if share == share else {}  # NaN: no step
        self.files.close(status, self.step_index, {**ending.to_dict(), **cost})

    def summary(self) -> RunSummary:
        """Name, status, steps, the last loss and grad norm, the findings."""
        status = "running" if not self.closed else (self._ending_status or "finished")
        if self.disabled and not self.closed:
            status = f"off ({self.disabled})"
        return self.files.summary(
            self.name, status, self.step_index - self.parts.cycle.start_step, self.schema,
            self.findings.items,
        )
