"""``nnwatch.watch()``: the probe a training script attaches to its model and optimizer.

It hooks the model's layers, measures gradients right before ``optimizer.step()``, and turns each
``w.step()`` into one fixed-size record that goes to the run log (durable history), the ring file
(live monitors) and the detectors. Nothing here blocks or raises into the training loop: a failure
inside nnwatch is logged once and switches off only the part that failed.

:class:`Watch` is the coordinator: it builds the parts, starts and ends the run, and answers what
users, monitors and neighbours ask; each concern belongs to one part:

- :mod:`~nnwatch.probe.step_cycle`: the step's life on the training thread (forward start, end of
  backward, the update, ``w.step()``): the hot path;
- :mod:`~nnwatch.probe.schedule`: which steps are measured and sampled, and the cost budget;
- :mod:`~nnwatch.probe.layer_hooks`: the per-layer forward hooks and the slots they write;
- :mod:`~nnwatch.probe.grad_recorder`: gradient norms before and after clipping;
- :mod:`~nnwatch.probe.guard`: what a step with non-finite gradients sets off;
- :mod:`~nnwatch.probe.snapshot_taker`: snapshot requests and what a snapshot keeps;
- :mod:`~nnwatch.probe.command_handler`: commands from monitors (pause, stop, anomaly...);
- :mod:`~nnwatch.probe.step_record`: loss, AMP, timing, memory and LR fields of the record;
- :mod:`~nnwatch.probe.run_files`: the run directory, its metadata and the run log;
- :mod:`~nnwatch.probe.attachment`: the hooks on the user's objects, and taking them off.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from nnwatch.probe import game, scaler_discovery
from nnwatch.probe.attachment import Attachment
from nnwatch.probe.buffers import StepBuffers
from nnwatch.probe.command_handler import CommandHandler
from nnwatch.probe.consistency import ConsistencyCheck
from nnwatch.probe.exit_status import (
    OBSERVER,
    Ending,
    from_exception,
    last_exception,
    taken_over,
)
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.guard import Guard
from nnwatch.probe.layer_hooks import LayerHooks
from nnwatch.probe.optimizer_target import resolve as resolve_optimizer
from nnwatch.probe.run_files import RankInfo as RankInfo
from nnwatch.probe.run_files import (
    RunFiles,
    build_meta,
    choose_run_dir,
    optimizer_has_state,
    optimizer_step,
)
from nnwatch.probe.schedule import AFTER_TROUBLE as AFTER_TROUBLE
from nnwatch.probe.schedule import WARMUP_STEPS as WARMUP_STEPS
from nnwatch.probe.schedule import Schedule
from nnwatch.probe.snapshot_taker import SnapshotTaker
from nnwatch.probe.step_cycle import StepCycle
from nnwatch.probe.step_record import StepRecord
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.store.finding import Finding
from nnwatch.store.paths import RunDirError
from nnwatch.store.schema import RunSchema
from nnwatch.store.summary import RunSummary
from nnwatch.tensors.grad_norms import LayerReducer
from nnwatch.tensors.layers import LayerPlan, plan_layers, sequence_first

log = logging.getLogger("nnwatch")


class Watch:
    """One watched training run. Create it with :func:`watch`; call :meth:`step` once per step."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any = None,
        scaler: Any = None,
        *,
        num_classes: int | None = None,
        name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        layer_interval: int | None = None,
        stat_cap: int = 65536,
        guard: bool | None = None,
        skip_nonfinite: bool = False,
        channel: bool = True,
        detectors: bool = True,
        tensorboard: Any = None,
        consistency_every: int | None = None,
        job_summary_every: int | None = None,
        budget: float | None = 0.01,
        max_interval: int = 32,
        batch_size: int | None = None,
        start_step: int | None = None,
        resume: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}")
        earlier = _take_over(model, resume, name)
        if earlier is not None:  # resume=True: go on in the same run, with its name and count
            name = name or earlier.name
            start_step = earlier.step if start_step is None else start_step
            run_dir = earlier.run_dir
        self._append = earlier is not None
        #: the interactive shell's last exception when this watch started (see taken_over)
        self.shell_exception_at_start = last_exception()
        target = resolve_optimizer(optimizer)
        #: the torch optimizer whose step pre-hook marks the update (None: ``w.step()`` does)
        self.optimizer: torch.optim.Optimizer | None = target.hook
        #: where LRs, optimizer state and its step count are read (the object the user passed,
        #: when it has param groups of its own)
        self.optimizer_source: Any = target.source
        self.model, self.scaler = model, scaler
        source = target.source
        self.num_classes = num_classes
        #: the optimizer already holds state (a resumed run, or a second watch of one loop): the
        #: model has trained, so "the first loss should be ln K" does not apply
        self.resumed = optimizer_has_state(source)
        self.name = name or type(model).__name__
        self.findings: list[Any] = []
        #: the first step's number: 0, or where a resumed run left off (``start_step``, else the
        #: step count of an optimizer that already holds state), so that the step numbers go on
        first_step = int(start_step) if start_step is not None else optimizer_step(source)
        self.stat_cap = int(stat_cap)
        self.disabled: str | None = None
        self.closed = False
        self.rank = RankInfo.detect()
        self._want_channel, self._want_detectors = channel, detectors
        self._warned: set[str] = set()
        if target.note is not None:
            log.warning("nnwatch: %s", target.note)
        self._started = time.time()
        self._ending_status: str | None = None  # how the run ended, once it has
        self.files = RunFiles()
        self.schedule = Schedule(first_step, budget, max_interval, layer_interval)
        self.budget = self.schedule.budget

        self.plan: LayerPlan = plan_layers(model)
        device = _param_device(self.plan, model)
        self.guard = (device.type == "cpu") if guard is None else bool(guard)
        num_lr = len(source.param_groups) if source is not None else 0
        self.schema = RunSchema(
            self.plan.stat_names, self.plan.stat_kinds, self.plan.param_layer_names, num_lr
        )
        self.buffers = StepBuffers(self.schema, device)
        self.layers = LayerHooks(model, self.plan, self.schedule, self, self.buffers.dev.device, stat_cap)
        self.snapshots = SnapshotTaker(model, source, scaler, self)
        self.nan_guard = Guard(
            model, self.plan, self.buffers, self.schedule, self.layers, self.snapshots, self, skip_nonfinite
        )
        reducer = LayerReducer(self.plan.param_layer_index, len(self.plan.param_layer_names))
        self.grads = GradientRecorder(
            self.plan, self.buffers, reducer, scaler,
            on_nonfinite=self.nan_guard.hit if self.optimizer is None and self.guard else None,
        )
        self.commands = CommandHandler(self, self.grads, self.budget, self.snapshots)
        self.clip_before_unscale = False  # torch's clip was seen on still-scaled AMP gradients
        self.grads.on_scaled_norm = self._clip_before_unscale
        self.attachment = Attachment(self.layers, self.grads)
        self.attachment.on_materialized = self.nan_guard.choose_sentinels
        self.sysmon = SystemSampler()
        self.record = StepRecord(self.buffers, self.sysmon, source, scaler, num_lr, self.warn_once)
        self.cycle = StepCycle(
            self, plan=self.plan, optimizer=self.optimizer, scaler=scaler, schedule=self.schedule,
            buffers=self.buffers, layers=self.layers, grads=self.grads, guard=self.nan_guard,
            guard_on=self.guard, snapshots=self.snapshots, commands=self.commands,
            record=self.record, files=self.files, start_step=first_step, batch_size=batch_size,
            seq_first=sequence_first(model),
        )
        self._tensorboard = tensorboard  # live TensorBoard export, from the run log's thread
        self._consistency = ConsistencyCheck.create(self, consistency_every, job_summary_every)

        if os.environ.get("NNWATCH_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
            self.disabled = "NNWATCH_DISABLE is set"  # an inert watch: no hooks, no files
            log.info("nnwatch: NNWATCH_DISABLE is set; %s is not watched", self.name)
            return
        self._has_dir = False  # run_dir is None until the run has a directory of its own
        try:
            self.files.dir = choose_run_dir(
                run_dir, self.name, self._started, self.rank, self.warn_once, append=self._append
            )
        except (OSError, RunDirError) as exc:
            self.disable(f"cannot use the run directory ({exc}); monitoring is off for this run")
            return
        self._has_dir = True
        cycle = self.cycle
        self.attachment.attach(
            model, self.plan, self.optimizer, cycle.on_forward_start, cycle.on_backward,
            cycle.before_optimizer_step,
        )
        if scaler is None:
            scaler_discovery.wait_for(self._adopt_scaler)
        self.sysmon.start()
        _LIVE[model] = self
        if name is not None:
            _BY_NAME[(self.name, self.rank.rank)] = weakref.ref(self)
        self._atexit = weakref.WeakMethod(self._close_at_exit)
        OBSERVER.at_exit(self._atexit)  # at exit, and before a SIGTERM ends the process
        print(f"nnwatch: watching {self.name} -> {self.run_dir}", file=sys.stderr)

    # ------------------------------------------------------------------------------------------
    # the step (the hot path lives in StepCycle)
    def step(self, loss: Any = None, batch: Any = None, batch_size: int | None = None) -> None:
        """Record one training step. Call it once per optimizer step, after ``optimizer.step()``.

        ``batch`` (kept for snapshots) also gives the samples/s; ``batch_size`` overrides the
        size found in it (for batches whose layout nnwatch cannot guess).
        """
        if not self.disabled and not self.closed:
            self.cycle.step(loss, batch, batch_size)
            if len(_LIVE) > 1:  # another net watched in this process: a GAN's pair?
                game.note_step(self, list(_LIVE.values()), _judge_as_game)

    def before_update(self) -> None:
        """The probe's pre-update work (guard, pre-update snapshot state), for a framework that
        runs the forward and backward inside ``optimizer.step(closure)``."""
        self.cycle.before_optimizer_step(self.optimizer, (), {})

    def clip_grad_norm_(
        self,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        foreach: bool | None = None,
        parameters: Iterable[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Clip like ``torch.nn.utils.clip_grad_norm_`` (bitwise) and record both norms.

        A threshold set from the monitor (``set_clip``) overrides ``max_norm`` until the run ends.
        With ``max_norm=None`` gradients are only measured, unless the monitor set a threshold.
        """
        params = list(self.plan.params if parameters is None else parameters)
        return self.grads.clip(
            params, max_norm, norm_type, error_if_nonfinite, foreach,
            per_layer=parameters is None, record=not self.disabled, warn=self.warn_once,
        )

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

    def start_run(self) -> None:
        """First step: the layer order is known, so the run files and the outputs start."""
        order, plan = self.layers.finalize(self.buffers), self.plan
        names = tuple(plan.stat_names[i] for i in order)
        kinds = tuple(plan.stat_kinds[i] for i in order)
        self.schema = RunSchema(names, kinds, plan.param_layer_names, self.schema.num_lr)
        self.buffers.schema = self.schema
        self.meta = build_meta(
            name=self.name, schema=self.schema, started=self._started, device=self.device,
            num_classes=self.num_classes, rank=self.rank,
            extra={"layer_interval": self.layer_interval, "resumed": self.resumed,
                   "start_step": self.start_step, "tied": dict(plan.tied),
                   "micro_batches": max(1, self.grads.backwards)},
        )
        try:
            self.files.start(self.meta, self._on_log_error, append=self._append, warn=self.warn_once)
        except (OSError, RunDirError) as exc:
            self.disable(f"cannot write the run log in {self.run_dir}: {exc}")
            return
        self.files.start_outputs(
            self, channel=self._want_channel, detectors=self._want_detectors, tensorboard=self._tensorboard
        )

    # ------------------------------------------------------------------------------------------
    # what the parts and neighbours read, and what monitors steer
    @property
    def run_dir(self) -> Path | None:
        """The run's directory; None when monitoring is off and none was made (never ``.``: a
        user's ``shutil.rmtree(w.run_dir)`` must not take the working directory)."""
        return self.files.dir if getattr(self, "_has_dir", False) else None

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
        return self.nan_guard.tripped

    @property
    def skip_nonfinite(self) -> bool:
        return self.nan_guard.skip

    @skip_nonfinite.setter
    def skip_nonfinite(self, value: bool) -> None:
        self.nan_guard.skip = bool(value)

    def apply_command(self, name: str, args: dict[str, Any]) -> tuple[bool, str, int]:
        """Apply one validated command; returns (ok, error, step at which it takes effect)."""
        return self.commands.apply(name, args)

    @property
    def clip_override(self) -> float | None:
        return self.grads.override

    @property
    def paused(self) -> bool:
        return self.commands.paused

    @property
    def should_stop(self) -> bool:
        """A monitor asked the training loop to stop (check it in the loop)."""
        return self.commands.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.commands.should_stop = bool(value)

    def request_snapshot(self, reason: str = "requested") -> None:
        """Snapshot the next step: its batch, RNG, and the weights from before its update."""
        self.snapshots.request(reason)

    def recent_records(self) -> np.ndarray:
        """Up to the last 500 step records, oldest first (for snapshots and detectors)."""
        return self.files.recent_records(self.schema)

    # ------------------------------------------------------------------------------------------
    # events, findings, failures
    def log_event(self, event: dict[str, Any]) -> None:
        self.files.event(event)

    def add_finding(self, finding: Any) -> None:
        """Called by the detectors: keep it, log it once, write it to events.jsonl."""
        self.findings.append(finding)
        d = finding.to_dict() if hasattr(finding, "to_dict") else dict(finding)
        self.log_event({"type": "finding", **d})
        log.warning("nnwatch: %s", getattr(finding, "message", None) or d.get("message") or d)

    def _clip_before_unscale(self) -> None:
        """torch's clip (or norm) ran on gradients still multiplied by the AMP loss scale."""
        if self.clip_before_unscale:
            return
        self.clip_before_unscale = True
        scale = getattr(self.scaler, "_scale", None)
        value = float(scale) if isinstance(scale, torch.Tensor) and scale.is_cpu else math.nan
        self.add_finding(Finding(
            kind="clipping_misuse",
            severity="warning",
            step=self.step_index,
            summary=(
                "torch's clip_grad_norm_ ran before scaler.unscale_(optimizer): it measured and "
                "clipped gradients still multiplied by the AMP loss scale"
                + (f" ({value:g})" if math.isfinite(value) else "")
                + ", so the threshold applies to the scaled norm and the real gradient is cut "
                "down by about the scale on every step."
            ),
            remedy=(
                "call scaler.unscale_(optimizer) right before clipping (then scaler.step and "
                "scaler.update as before); the grad norms nnwatch shows are torch's, scaled, "
                "until then"
            ),
            evidence={"loss_scale": value},
            onset_step=self.step_index,
        ))

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
        self.findings.append({"kind": "nnwatch_error", "severity": "error", "message": message})

    def disable(self, reason: str) -> None:
        """Switch monitoring off for the rest of the run, saying why; training goes on."""
        if self.disabled is None:
            self.disabled = reason
            log.error("nnwatch: %s; training continues without it", reason)
            self.attachment.remove()
            scaler_discovery.stop_waiting(self._adopt_scaler)

    # ------------------------------------------------------------------------------------------
    def close(self, status: str | Ending = "finished") -> None:
        """End the run: remove every hook, flush the log, write ``end.json``. Safe to call twice.

        ``status`` is "finished" (a clean end), "crashed" or "interrupted"; the ``with`` block and
        the exit handler pass what they saw of the program's end, with its reason.
        """
        if self.closed:
            return
        ending = status if isinstance(status, Ending) else Ending(str(status))
        status = ending.status
        self._ending_status = status
        self.closed = True
        if status != "finished":
            self.log_event({"type": "run_ended", "step": self.step_index, **ending.to_dict()})
        self.attachment.remove()
        scaler_discovery.stop_waiting(self._adopt_scaler)
        if self._consistency is not None:
            self._consistency.close(ending.to_dict())  # reads a check in flight; tells rank 0
        self.commands.restore()
        self.sysmon.stop()
        try:
            self.buffers.flush(self.cycle.publish)
        except Exception:  # noqa: BLE001
            pass
        share = self.budget.own_share
        cost = {"nnwatch_own_share": round(share, 6)} if share == share else {}  # NaN: no step
        self.files.close(status, self.step_index, {**ending.to_dict(), **cost})

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ending = from_exception(exc_type, exc)
        if ending.status == "crashed" and exc_type is not None and not issubclass(exc_type, SystemExit):
            self.log_event({"type": "error", "step": self.step_index, "error": repr(exc)})
        self.close(ending)

    def _close_at_exit(self) -> None:
        """The interpreter is exiting with the run still open: end it as the program ended."""
        self.close(OBSERVER.final())

    # ------------------------------------------------------------------------------------------
    # notebooks and REPLs
    def summary(self) -> RunSummary:
        """Name, status, steps, the last loss and grad norm, the findings: what a notebook shows."""
        status = "running" if not self.closed else (self._ending_status or "finished")
        if self.disabled and not self.closed:
            status = f"off ({self.disabled})"
        return self.files.summary(self.name, status, self.step_index - self.start_step, self.schema, self.findings)

    def __repr__(self) -> str:
        return self.summary().text()

    def _repr_html_(self) -> str:
        return self.summary().html()


def _param_device(plan: LayerPlan, model: nn.Module) -> torch.device:
    p = plan.params[0] if plan.params else next(model.parameters(), None)
    if p is None:
        b = next(model.buffers(), None)
        return b.device if b is not None else torch.device("cpu")
    return p.device


#: The open watch of each model: watching a model again (a re-run notebook cell) ends the earlier
#: watch first, so hooks never stack and each model reports into one run.
_LIVE: weakref.WeakKeyDictionary[nn.Module, Watch] = weakref.WeakKeyDictionary()


class _Continued(NamedTuple):
    """What a ``resume=True`` watch takes from the watch it continues."""

    name: str
    step: int
    run_dir: Path


#: The open watch of each name given to ``watch(name=...)``, per rank of this process: a notebook
#: cell that builds a new model and watches it under the same name again ends the earlier watch
#: (its ring, threads and registry entry) instead of leaving one more open run per re-run.
_BY_NAME: dict[tuple[str, int], weakref.ref[Watch]] = {}


def _judge_as_game(w: Watch) -> None:
    diagnosis = w.files.diagnosis
    if diagnosis is not None:
        diagnosis.judge_as_game()


def _take_over(model: nn.Module, resume: bool = False, name: str | None = None) -> _Continued | None:
    """Close the earlier, still open watch of ``model`` (or, for a new model, the one open under
    the same explicit ``name`` in this process and rank), saying so once; with ``resume`` return
    it, so that the new watch goes on in its run."""
    earlier = _LIVE.get(model)
    same_model = earlier is not None and not earlier.closed
    if not same_model and name is not None:
        ref = _BY_NAME.get((name, RankInfo.detect().rank))
        earlier = ref() if ref is not None else None
    if earlier is None or earlier.closed:
        return None
    if resume and not earlier.disabled:
        ending = Ending("finished", "continued by a new watch of the same model (resume=True)")
    else:
        ending = taken_over(earlier.shell_exception_at_start, same_model)
    what = (
        f"{model.__class__.__name__} was already watched"
        if same_model
        else f"a watch named {name!r} was already open in this process"
    )
    print(
        f"nnwatch: {what} ({earlier.name} -> {earlier.run_dir}); "
        + ("the new watch goes on in that run" if resume else
           f"that run ends as {ending.status}, the new watch takes over"),
        file=sys.stderr,
    )
    earlier.close(ending)
    if not resume or earlier.disabled:
        return None
    return _Continued(str(earlier.name), int(earlier.step_index), Path(earlier.files.dir))


def watch(
    model: nn.Module,
    optimizer: Any = None,
    scaler: Any = None,
    *,
    num_classes: int | None = None,
    name: str | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    layer_interval: int | None = None,
    stat_cap: int = 65536,
    guard: bool | None = None,
    skip_nonfinite: bool = False,
    channel: bool = True,
    detectors: bool = True,
    tensorboard: Any = None,
    consistency_every: int | None = None,
    job_summary_every: int | None = None,
    budget: float | None = 0.01,
    max_interval: int = 32,
    batch_size: int | None = None,
    start_step: int | None = None,
    resume: bool = False,
) -> Watch:
    """Attach nnwatch to a model (and optionally its optimizer and AMP GradScaler).

    Use it as a context manager, or call ``close()`` at the end. ``optimizer`` may be None (a
    hand-written update): ``w.step()`` is then the step boundary; a wrapper around a torch
    optimizer (Lookahead and the like) is followed to the optimizer inside it. Gradient norms
    before and after clipping are recorded whoever clips: torch's ``clip_grad_norm_`` is seen directly (every
    step, torch's own value), other clipping from the gradients measured when backward ends.

    Options: ``run_dir``, ``layer_interval`` (full per-layer activation stats every N steps; by
    default every 10, stretched to at most 100 when the cost budget needs it; an explicit N is
    kept), ``stat_cap`` (elements per activation used for the stats), ``guard`` (one non-finite
    check before ``optimizer.step()``: on by default on the CPU, where it is free),
    ``skip_nonfinite``, ``channel`` (live monitoring, default on) and ``detectors`` (default on).
    ``budget`` (default 0.01) is the share of the step time nnwatch may spend on its own work: it
    times itself and measures layer output sums and gradient norms on every k-th step only
    (k <= ``max_interval``, default 32) when measuring every step would cost more; ``None``
    measures every step whatever it costs. The first 10 steps, steps with a pending snapshot, the
    100 steps after non-finite gradients and every step while the loss spikes or climbs (and 50
    after) are always measured, and so are the steps whose per-layer stats are sampled unless
    stats are taken more often than k (``layer_interval=1``, the detailed mode); on the other
    steps the guard checks the smallest gradient near the input.
    ``batch_size`` fixes the samples per step when the batch's layout is unusual (by default the
    first tensor's leading dimension, or its second for sequence-first RNN input).
    ``tensorboard=OUT_DIR`` (or :class:`nnwatch.export.TensorBoard`) writes TensorBoard events from
    the run log's thread. Under torch.distributed, ``consistency_every`` (default 100, 0 = off)
    compares a parameter checksum across ranks with one small async all-reduce every N steps;
    ``job_summary_every=N`` (default off) sends each rank's step, loss, grad norm, step time and
    memory to rank 0 every N steps in the same slot, and rank 0 writes the job's table.
    ``start_step`` numbers the first recorded step (by default 0, or the step count of an
    optimizer that already holds state: a resumed run goes on where it left off).
    The environment variable ``NNWATCH_DISABLE=1`` makes this an inert watch (no hooks, no files).
    """
    return Watch(
        model, optimizer, scaler, num_classes=num_classes, name=name, run_dir=run_dir,
        layer_interval=layer_interval, stat_cap=stat_cap, guard=guard,
        skip_nonfinite=skip_nonfinite, channel=channel, detectors=detectors,
        tensorboard=tensorboard, consistency_every=consistency_every,
        job_summary_every=job_summary_every, budget=budget,
        max_interval=max_interval, batch_size=batch_size, start_step=start_step, resume=resume,
    )
