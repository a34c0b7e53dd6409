"""The run behind a :class:`~nnwatch.probe.watch.Watch`: its parts and its life.

A ``Watch`` is what the user holds (``step``, ``close``, ``findings``...); this is what the parts
report to: it starts the run files at the first step, keeps the findings, writes events, switches
monitoring off when a part fails, and ends the run. The parts are made by
:mod:`nnwatch.probe._builder`, each handed only what it uses; the ``*Owner`` protocols of the
parts (``CycleOwner``, ``SnapshotOwner``, ``GuardOwner``...) are the slices of this object they
see. Nothing below the probe receives it whole: the snapshot writer, the detectors and the
TensorBoard export get the narrow views they declare (:meth:`snapshot_subject` and friends).

Users never see it; nnwatch's own integrations, tests and benchmarks reach it through
:func:`nnwatch.probe.watch.internals`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nnwatch.diagnosis.detectors.clipping_misuse import clip_before_unscale
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
from nnwatch.probe.update_recorder import update_setup
from nnwatch.store.events import Event, FindingEvent, RunEnded
from nnwatch.store.exit_note import write_exit_note
from nnwatch.store.finding import Finding
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
        self.scaler = scaler
        self.options = options
        self._append = append  # resume=True: the run log of the run continued is appended to
        #: the interactive shell's last exception when this watch started (see taken_over)
        self.shell_exception_at_start = last_exception()
        self.num_classes = options.num_classes
        #: the optimizer already holds state (a resumed run, or a second watch of one loop): the
        #: model has trained, so "the first loss should be ln K" does not apply
        self.resumed = optimizer_has_state(optimizer.source)
        self.name = options.name or type(model).__name__
        self.findings: list[Finding] = []
        self.disabled: str | None = None
        self.closed = False
        self.rank = RankInfo.detect()
        self._warned: set[str] = set()
        if optimizer.note is not None:
            log.warning("nnwatch: %s", optimizer.note)
        self.started = time.time()
        self.ending_status: str | None = None  # how the run ended, once it has
        self.files = RunFiles()
        self.meta: RunMeta | None = None  # fixed at the first step
        self.clip_before_unscale = False  # torch's clip was seen on still-scaled AMP gradients
        self.has_dir = False  # run_dir is None until the run has a directory of its own
        parts = _builder.build(self, model, optimizer, scaler, options)
        self.plan, self.schedule, self.budget = parts.plan, parts.schedule, parts.schedule.budget
        self.guard_on, self.schema, self.buffers = parts.guard_on, parts.schema, parts.buffers
        self.layers, self.snapshots, self.guard = parts.layers, parts.snapshots, parts.guard
        self.grads, self.commands, self.attachment = parts.grads, parts.commands, parts.attachment
        self.sysmon, self.record, self.cycle = parts.sysmon, parts.record, parts.cycle
        self.consistency = _builder.build_consistency(self, model, self.plan, optimizer, options)

    def attach(self) -> bool:
        """Make the run directory and hook the model; False when the watch stays inert."""
        if os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            self.disabled = f"{DISABLE_ENV} is set"  # an inert watch: no hooks, no files
            log.info("nnwatch: %s is set; %s is not watched", DISABLE_ENV, self.name)
            return False
        try:
            self.files.dir = choose_run_dir(
                self.options.run_dir, self.name, self.started, self.rank, self.warn_once,
                append=self._append,
            )
        except (OSError, RunDirError) as exc:
            self.disable(f"cannot use the run directory ({exc}); monitoring is off for this run")
            return False
        self.has_dir = True
        cycle = self.cycle
        self.attachment.attach(
            self.model, self.plan, self.optimizer.hook, cycle.on_forward_start, cycle.on_backward,
            cycle.before_optimizer_step, cycle.first_outputs,
        )
        if self.scaler is None:
            scaler_discovery.wait_for(self._adopt_scaler)
        self.sysmon.start()
        return True

    # ------------------------------------------------------------------------------------------
    # what the parts read
    @property
    def step_index(self) -> int:
        """The number of the step being recorded (the next ``w.step()``)."""
        return self.cycle.step_index

    @property
    def start_step(self) -> int:
        """The first step's number: 0, or where a resumed run left off."""
        return self.cycle.start_step

    @property
    def device(self) -> torch.device:
        """Where the model's parameters (and the record's device block) are."""
        return self.buffers.device

    @property
    def run_dir(self) -> Path | None:
        """The run's directory; None when monitoring is off and none was made."""
        return self.files.dir if self.has_dir else None

    @property
    def diagnosis(self) -> Any:
        """The detectors (``nnwatch.diagnosis.Diagnosis``), from the first step on."""
        return self.files.diagnosis

    @property
    def layer_interval(self) -> int:
        """Full per-layer statistics are taken every this many steps (see ``budget``)."""
        return self.budget.layer_interval

    @property
    def guard_tripped(self) -> bool:
        """Non-finite gradients were seen before an update in this run."""
        return self.guard.tripped

    @property
    def clip_override(self) -> float | None:
        """The clip threshold a monitor set (``set_clip``), if any."""
        return self.grads.override

    @property
    def paused(self) -> bool:
        return self.commands.paused

    @property
    def should_stop(self) -> bool:
        return self.commands.should_stop

    @property
    def recent(self) -> deque[bytes] | None:
        """The last records, raw, as published (None before the first step)."""
        return self.files.recent

    @property
    def stepping_optimizer(self) -> torch.optim.Optimizer | None:
        """The torch optimizer whose update a snapshot's weights precede (the hooked one)."""
        return self.optimizer.hook

    def set_log_error(self, why: str) -> None:
        """Show ``why`` in the ring header, where monitors read the run's trouble."""
        channel = self.files.channel
        if channel is not None:
            channel.set_log_error(why)

    def live_layer_state(self) -> tuple[np.ndarray | None, np.ndarray | None, float]:
        """This step's per-layer output sums and gradient norms, from the step buffers, and the
        largest finite gradient element the guard saw.

        Read only when the guard trips (on CUDA it syncs, but the guard has synced already).
        """
        out: list[np.ndarray | None] = []
        for t in (self.buffers.act_sum, self.buffers.grad_layer):
            try:
                out.append(t.detach().float().cpu().numpy().copy() if t is not None else None)
            except Exception:  # noqa: BLE001 - a missing view only loses the origin, not the finding
                out.append(None)
        seen = self.grads.grad_max  # taken before torch's clip zeroed an overflowed step
        return out[0], out[1], seen if seen == seen else self.guard.grad_max

    def recent_records(self) -> np.ndarray:
        """Up to the last 500 step records, oldest first (for snapshots and detectors)."""
        return self.files.recent_records(self.schema)

    def apply_command(self, name: str, args: dict[str, Any]) -> tuple[bool, str, int]:
        """Apply one validated command; returns (ok, error, step at which it takes effect)."""
        return self.commands.apply(name, args)

    def reply_data(self, name: str) -> dict[str, Any]:
        """What the reply to command ``name`` carries (the setting it changed, as it now stands)."""
        return self.commands.reply_data(name)

    def request_snapshot(self, reason: str = "requested") -> None:
        self.snapshots.request(reason)

    def before_update(self) -> None:
        """The probe's pre-update work (guard, pre-update snapshot state), for a framework that
        runs the forward and backward inside ``optimizer.step(closure)``."""
        self.cycle.before_optimizer_step(self.optimizer.hook, (), {})

    # ------------------------------------------------------------------------------------------
    # the first step
    def start_run(self) -> None:
        """First step: the layer order is known, so the run files and the outputs start."""
        order, plan = self.layers.finalize(self.buffers), self.plan
        names = tuple(plan.stat_names[i] for i in order)
        kinds = tuple(plan.stat_kinds[i] for i in order)
        self.schema = RunSchema(names, kinds, plan.param_layer_names, self.schema.num_lr)
        self.buffers.schema = self.schema
        self.meta = build_meta(
            name=self.name, schema=self.schema, started=self.started, device=self.device,
            num_classes=self.num_classes, rank=self.rank,
            extra={"layer_interval": self.layer_interval, "resumed": self.resumed,
                   "start_step": self.start_step, "tied": dict(plan.tied),
                   "micro_batches": max(1, self.grads.backwards),
                   "output_layers": self.cycle.first_outputs.output_layers,
                   **self.cycle.loss_shape.to_extra(), **update_setup(plan, self.optimizer.source)},
        )
        try:
            self.files.start(self.meta, self._on_log_error, append=self._append, warn=self.warn_once)
        except (OSError, RunDirError) as exc:
            self.disable(f"cannot write the run log in {self.run_dir}: {exc}")
            return
        if self.files.log is not None:  # its writer's CPU counts against the same budget
            self.budget.background = self.files.log.recent_cpu
        start_outputs(self)

    # ------------------------------------------------------------------------------------------
    # events, findings, failures
    def log_event(self, event: Event) -> None:
        self.files.event(event)

    def add_finding(self, finding: Finding) -> None:
        """Called by the detectors: keep it, log it once, write it to events.jsonl."""
        self.findings.append(finding)
        self.log_event(FindingEvent(finding=finding))
        log.warning("nnwatch: %s", finding.message)

    def on_scaled_norm(self) -> None:
        """torch's clip (or norm) ran on gradients still multiplied by the AMP loss scale."""
        if self.clip_before_unscale:
            return
        self.clip_before_unscale = True
        scale = getattr(self.scaler, "_scale", None)
        value = float(scale) if isinstance(scale, torch.Tensor) and scale.is_cpu else math.nan
        self.add_finding(clip_before_unscale(self.step_index, value))

    def _adopt_scaler(self, scaler: Any) -> None:
        """The loop called ``GradScaler.scale()`` and no scaler was passed: use that one."""
        if self.scaler is not None or self.closed or self.disabled:
            return
        self.scaler = scaler
        for part in (self.grads, self.record, self.cycle, self.snapshots):
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
        """The run log failed (a full disk): kept as a finding of nnwatch's own trouble."""
        self.findings.append(Finding(
            kind="nnwatch_error",
            severity="error",
            step=self.step_index,
            summary=message,
            remedy="free disk space or point NNWATCH_RUN_DIR at a writable disk; training goes on",
        ))

    def disable(self, reason: str) -> None:
        """Switch monitoring off for the rest of the run, saying why; training goes on."""
        if self.disabled is None:
            self.disabled = reason
            log.error("nnwatch: %s; training continues without it", reason)
            self.attachment.remove()
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
        self.ending_status = status
        self.closed = True
        if status != "finished":
            self.log_event(RunEnded(step=self.step_index, **asdict(ending)))
        self.attachment.remove()
        scaler_discovery.stop_waiting(self._adopt_scaler)
        if self.consistency is not None:
            self.consistency.close(ending.to_dict())  # reads a check in flight; tells rank 0
        self.commands.restore()
        self.sysmon.stop()
        try:
            self.buffers.flush(self.cycle.publish)
            if self.cycle.shards is not None:  # the last records, their reduce waited for
                self.cycle.shards.close(self.cycle.publish_now)
        except Exception:  # noqa: BLE001
            pass
        share = self.budget.own_share
        cost = {"nnwatch_own_share": round(share, 6)} if share == share else {}  # NaN: no step
        self.files.close(status, self.step_index, {**ending.to_dict(), **cost})

    def summary(self) -> RunSummary:
        """Name, status, steps, the last loss and grad norm, the findings."""
        status = "running" if not self.closed else (self.ending_status or "finished")
        if self.disabled and not self.closed:
            status = f"off ({self.disabled})"
        return self.files.summary(
            self.name, status, self.step_index - self.start_step, self.schema, self.findings
        )
