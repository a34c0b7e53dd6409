"""One training step's life on the training thread: forward start, end of backward, the update,
``w.step()``. This is the probe's hot path.

Every step runs it, measured or not, so what a light (unmeasured) step does here is nnwatch's
floor: on a small CPU step every Python line and every torch call counts, since the step has just
flushed the caches (a torch call then costs tens of microseconds, a line about one). So a light
step makes no torch call it can avoid (the loss is read as a CPU scalar, the guard's sentinel is
summed in numpy, the RNG state is taken only where a replay may need it), builds no dict or list,
and packs the record's host block, LRs included, in one call. Measured steps and the first one do
the rest: gradient norms, layer sums, statistics, the run files.

The cycle times its own work (``Schedule.own``) and charges it to the cost budget at the end of
each step; the watch (:class:`CycleOwner`) owns the run around it: whether it is off, its files,
and what the first step starts.
"""

from __future__ import annotations

import math
import struct
import time
from typing import Any, Protocol

import torch
from torch import nn

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.probe.command_handler import CommandHandler
from nnwatch.probe.first_outputs import FirstOutputs
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.guard import Guard
from nnwatch.probe.label_mix import LabelMix
from nnwatch.probe.layer_hooks import LayerHooks
from nnwatch.probe.run_files import RunFiles
from nnwatch.probe.schedule import Schedule
from nnwatch.probe.sharded_reduce import ShardedReduce
from nnwatch.probe.snapshot_taker import SnapshotTaker
from nnwatch.probe.step_record import NO_SHARES, StepRecord, batch_size_of
from nnwatch.probe.update_recorder import UpdateRecorder
from nnwatch.store.schema import HOST_FIELDS
from nnwatch.tensors.layers import LayerPlan
from nnwatch.tensors.loss_graph import LossShape, describe_loss

_LOSS = DEV_INDEX["loss"]
_STEP_FIELD = struct.Struct("<d")  # the first host field
_LOSS_FIELD = struct.Struct("<d")  # the first device field (float64 from schema 4)
assert HOST_FIELDS[0] == "step" and _LOSS == 0, "StepCycle.publish reads these two by offset"
_ENGINE = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
_clock = time.perf_counter
_now = time.time
_grad_enabled = torch.is_grad_enabled
CHECK_UPDATES = 32  # steps over which w.step() calls without an optimizer step are counted


class CycleOwner(Protocol):
    """What the step cycle needs of the watch around it."""

    #: the number of the step being recorded: the run's, advanced here at each step's end
    step_index: int

    @property
    def disabled(self) -> str | None: ...

    @property
    def closed(self) -> bool: ...

    def disable(self, reason: str) -> None:
        """Switch monitoring off for the rest of the run, saying why (training goes on)."""

    def warn_once(self, key: str, message: str) -> None: ...

    def start_run(self) -> None:
        """The first step is recorded: the layer order is known, the run files can start."""


class StepCycle:
    """Owns the step count and the step's life: which hooks fired, the record, the budget's bill."""

    def __init__(
        self,
        owner: CycleOwner,
        *,
        plan: LayerPlan,
        optimizer: Any,
        scaler: Any,
        schedule: Schedule,
        buffers: StepBuffers,
        layers: LayerHooks,
        grads: GradientRecorder,
        updates: UpdateRecorder,
        labels: LabelMix,
        guard: Guard,
        guard_on: bool,
        snapshots: SnapshotTaker,
        commands: CommandHandler,
        record: StepRecord,
        files: RunFiles,
        start_step: int,
        batch_size: int | None,
        seq_first: bool,
    ) -> None:
        self.owner = owner
        self.plan = plan
        self.optimizer = optimizer
        self.scaler = scaler
        self.schedule = schedule
        self.buffers = buffers
        self.layers = layers
        self.grads = grads
        self.updates = updates  # what each measured update did to the weights
        self.labels = labels  # the batch's label entropy, on measured steps
        self.guard = guard
        self.guard_on = guard_on  # the non-finite check before each update
        self.snapshots = snapshots
        self.commands = commands
        self.record = record
        self.files = files
        self.start_step = start_step
        self.batch_size = batch_size
        self.seq_first = seq_first
        self.has_layers = bool(plan.stat_modules)
        self.has_params = bool(plan.params)
        self.first_param = plan.params[0] if plan.params else None
        self._init_step_state()
        #: the first step's loss, read from its graph: its form and any broadcast in it
        self.loss_shape = LossShape()
        self.first_outputs = FirstOutputs()  # the model's outputs until the first loss is read
        #: a sharded model's reduce: launched at every w.step(), its records published a step late
        self.shards: ShardedReduce | None = None
        self._launched = False  # this step's reduce is launched

    def _init_step_state(self) -> None:
        """What the hooks saw of the step in progress, before the first one: the state each
        w.step() closes (and whether it came after an optimizer step)."""
        self.step_open = False  # a forward pass with gradients ran since the last w.step()
        self.backward_seen = False
        self.end_queued = False  # a callback waits for the end of the running backward pass
        self.last_time = math.nan
        #: the optimizer's step ran since the last w.step(); steps without one, in the first
        #: ``CHECK_UPDATES`` (w.step() called per micro-batch is the mistake this catches)
        self.updated = False
        self.without_update = 0
        self.closure_step = False  # the optimizer's step ran before this step's forward

    # ------------------------------------------------------------------------------------------
    # hooks
    def on_forward_start(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self.step_open or self.owner.disabled or not _grad_enabled():
            return  # validation forwards (no_grad) neither open a step nor move its RNG capture
        t0 = _clock()
        sched = self.schedule
        try:
            self.step_open = True
            guard_on = self.guard_on
            if guard_on:  # references only: the guard re-runs this forward if it goes bad
                self.guard.inputs = (args, kwargs)
            snaps = self.snapshots
            if not sched.measure and (snaps.reason is not None or self.commands.anomaly_left):
                sched.measure = True  # a step someone will look at closely is measured in full
                self.layers.arm(True)
            first = self.first_param
            if first is not None:
                b = self.buffers
                # ``is_cpu`` is a flag; ``device`` builds an object: the CPU case pays the flag only
                if (not first.is_cpu) if b.dev_np is not None else first.device != b.device:
                    self._follow_move(first.device)
            snaps.arm(guard_on)
        except Exception as exc:  # noqa: BLE001
            self.owner.disable(f"internal error at forward start: {exc!r}")
        sched.own += _clock() - t0

    def _follow_move(self, device: torch.device) -> None:
        """The model moved to another device: the record's buffers and statistics follow it."""
        for record in self.buffers.move_to(device):
            self.publish(record)
        self.layers.refresh(self.buffers.dev.device)

    def on_backward(self, param: torch.Tensor) -> None:
        self.backward_seen = True
        if not self.end_queued and not self.owner.disabled:
            self.end_queued = True  # the first of the hooked parameters in this backward
            try:
                _ENGINE.queue_callback(self.on_backward_end)
            except Exception:  # noqa: BLE001 - then the norm is taken at the update instead
                self.end_queued = False

    def on_backward_end(self) -> None:
        """Autograd finished the backward pass: the gradients are complete and not yet clipped."""
        self.end_queued = False
        if self.owner.disabled:
            return
        t0 = _clock()
        sched = self.schedule
        try:
            rec = self.grads
            rec.measure = sched.measure
            rec.on_backward_end()
            if self.optimizer is None and sched.measure:
                self.updates.before()  # a hand-written update: it happens before w.step()
        except Exception as exc:  # noqa: BLE001
            self.owner.disable(f"internal error after backward: {exc!r}")
        sched.own += _clock() - t0

    def before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.owner.disabled:
            return
        t0 = _clock()
        sched = self.schedule
        self.updated = True
        try:
            snaps = self.snapshots
            if snaps.armed and snaps.pre_state is None:
                snaps.pre_state = snaps.capture_state()  # the weights before the update
            if not self.step_open and not self.backward_seen and self.has_params:
                # optimizer.step(closure) (LBFGS): forward and backward run inside the step,
                # after this hook; the gradients here are the previous step's: w.step() measures
                self.closure_step = True
            else:
                rec = self.grads
                rec.measure = sched.measure
                total = rec.at_update()
                rec.changes.see_wiped(self.plan.params, rec.buf)
                guard_on = self.guard_on
                if total is None and guard_on and not self.guard.sentinels_finite():
                    total = rec.measure_now()  # a bad step: look at every gradient after all
                if guard_on and total is not None and not rec.finite(total):
                    if not rec.layers_done:
                        rec.measure_now()  # a bad step: every layer's gradient, for the origin
                    self.guard.hit()
                if sched.measure:
                    self.updates.before()  # after the guard: a skipped step's gradients are gone
        except Exception as exc:  # noqa: BLE001
            self.owner.disable(f"internal error before optimizer.step(): {exc!r}")
        sched.own += _clock() - t0

    # ------------------------------------------------------------------------------------------
    # the step
    def step(self, loss: Any, batch: Any, batch_size: int | None) -> None:
        """``w.step()``: record the step, publish it, decide the next one, charge the budget."""
        t0 = _clock()
        self._launched = False
        try:
            self._step(loss, batch, batch_size, t0)
        except Exception as exc:  # noqa: BLE001 - training must never crash because of nnwatch
            self.owner.disable(f"internal error in step(): {exc!r}")
            if not self._launched:
                self.keep_pace()

    def keep_pace(self) -> None:
        """A step of a rank whose probe is off: its sharded reduce still takes part, so the
        other ranks' collectives are matched."""
        shards = self.shards
        if shards is not None:
            try:
                shards.launch(-1)
            except Exception:  # noqa: BLE001
                pass

    def _step(self, loss: Any, batch: Any, batch_size: int | None, t0: float) -> None:
        now = _now()
        if not self.step_open and not self.backward_seen and self.owner.step_index > self.start_step:
            self.owner.warn_once(
                "double-step",
                "w.step() was called again with no forward or backward pass since the last call; "
                "the extra call is ignored (call it once per optimizer step)",
            )
            return
        rec, sched, record = self.grads, self.schedule, self.record
        record.loss(loss)
        measure = rec.measure = sched.measure
        _owed_norms(self, rec, measure)
        if self.scaler is not None:
            record.amp()
        shares = NO_SHARES
        if measure:
            self.updates.after()
            shares = self.updates.take_shares()
            if batch is not None:
                self.labels.record(batch)
        dt = now - self.last_time
        bs = batch_size or self.batch_size
        if bs is None and batch is not None:
            bs = batch_size_of(batch, self.seq_first)
        measured = sampled = False
        if self.has_layers:
            layers = self.layers
            if sched.measure:  # the guard's re-run of a bad step's forward may have set it
                layers.store(self.buffers)
                measured = layers.sums_stored  # a step whose forward ran no watched layer is not
            if sched.sampled:
                sampled = layers.stats.finish(self.buffers.act_stats, self.buffers.act_dead)
        record.write_host(
            self.owner.step_index, now, dt, bs, rec.threshold, sampled, measured, rec.kept, shares
        )
        if not self.layers.finalized:
            _first_step(self, loss)
        snaps = self.snapshots
        if snaps.reason is not None and snaps.armed:
            snaps.write(batch)  # a request that came mid-step waits for the next one
        if self.shards is not None:
            self._launched = True
            self.shards.launch(self.owner.step_index)
        # a light step wrote only the loss (and AMP fields), which the next step overwrites
        for done in self.buffers.commit(
            reset=measured or sampled or rec.done or rec.clip_seen or loss is None
        ):
            self.publish(done)
        self._after_step(now, t0)

    def _after_step(self, now: float, t0: float) -> None:
        sched, layers, snaps = self.schedule, self.layers, self.snapshots
        measured, sampled = sched.measure, sched.sampled
        layers.sums_stored = False
        self.guard.inputs = None
        owner = self.owner
        first = owner.step_index == self.start_step  # it also sets up the run files: not a step's cost
        step_time = now - self.last_time
        self.last_time = now
        owner.step_index = index = owner.step_index + 1
        self.step_open = self.backward_seen = self.closure_step = False
        snaps.armed = False
        hooks = sched.advance(index, snaps.reason is not None) or layers.sums_always
        if layers.sums_always and not measured:
            layers.clear_sums()  # taken for the guard only: the step went well
        self.grads.end_step(sched.measure)
        if hooks != bool(layers.handles) and self.has_layers and not self.owner.disabled:
            layers.arm(hooks)
        sched.charge(t0, step_time, measured, sampled, first)  # hook attaching included
        if index - self.start_step <= CHECK_UPDATES:
            _count_updates(self, index - self.start_step)
        commands = self.commands
        if commands.anomaly_left > 0:
            commands.step_done()
        channel = self.files.channel
        if channel is not None:  # commands from monitors, applied here; a pause holds the thread
            channel.at_step_boundary(commands)

    def publish(self, record: bytes) -> None:
        """One finished record: to the loss trend, the run log, the ring and the recent tail
        (a sharded model's a step late, once its whole norms are in)."""
        if self.shards is None:
            self._out(record)
        else:
            for data in self.shards.hold(record):
                self._out(data)

    def _out(self, data: bytes) -> None:
        # the loss as published (on a GPU a step late, so reading it costs no sync)
        self.schedule.on_loss(
            int(_STEP_FIELD.unpack_from(data, 0)[0]),
            _LOSS_FIELD.unpack_from(data, self.buffers.schema.host_size)[0],
        )
        self.files.publish(data)

    def finish_records(self) -> None:
        """At the end of the run: the records still in flight, and the sharded ones still held
        (their reduce waited for a bounded time), published."""
        for record in self.buffers.flush():
            self.publish(record)
        if self.shards is not None:
            for data in self.shards.close():
                self._out(data)


# -- outside the class: the norms w.step() owes, the first step's setup, the early steps' check ----
def _owed_norms(cycle: StepCycle, rec: GradientRecorder, measure: bool) -> None:
    """The gradient norms w.step() takes itself: the closure's last evaluation (LBFGS), the
    update boundary of a run without an optimizer, or the global norm that no update hook
    took; a step with no backward() has none, and says so once."""
    if cycle.closure_step:
        if measure and cycle.backward_seen and not rec.clip_seen:
            rec.measure_now(unscale=True)  # the closure's last evaluation
    elif cycle.optimizer is None and cycle.backward_seen:
        rec.at_update()  # without an optimizer, w.step() is the update boundary
    elif not rec.done and (measure or cycle.backward_seen):
        if cycle.backward_seen or not cycle.has_params:
            rec.measure_now(layers=measure)  # the global norm on every step
        else:
            cycle.owner.warn_once(
                "no-backward",
                "w.step() was called with no backward() since the previous step; gradient "
                "norms are not recorded for such steps",
            )


def _first_step(cycle: StepCycle, loss: Any) -> None:
    """The first step: the loss's form read from its graph, the parameters ``zero_grad()``
    clears, and the run (its files) started."""
    cycle.loss_shape = describe_loss(loss, _known_params(cycle), cycle.first_outputs.take(loss))
    if getattr(cycle.updates.optimizer, "param_groups", None):
        held = _held_ids(cycle)  # none of them: nothing zero_grad() clears to watch
        cycle.grads.cleared_params = [p for p in cycle.plan.params if id(p) in held]
    cycle.owner.start_run()


def _known_params(cycle: StepCycle) -> set[int]:
    """Ids of the parameters the watch knows: the model's and its optimizer's."""
    return {id(p) for p in cycle.plan.params} | _held_ids(cycle)


def _held_ids(cycle: StepCycle) -> set[int]:
    """Ids of the parameters the optimizer holds (none without one)."""
    held: set[int] = set()
    for group in getattr(cycle.updates.optimizer, "param_groups", None) or ():
        if isinstance(group, dict):
            held.update(id(p) for p in group.get("params", ()))
    return held


def _count_updates(cycle: StepCycle, done: int) -> None:
    """Over the first steps, count those with no optimizer step; mostly none is a loop that
    calls w.step() per micro-batch (an AMP scaler's skipped steps are not counted)."""
    if cycle.optimizer is not None and cycle.scaler is None and not cycle.updated:
        cycle.without_update += 1
    cycle.updated = False
    if done == CHECK_UPDATES and cycle.without_update * 2 >= CHECK_UPDATES:
        cycle.owner.warn_once(
            "step-per-micro-batch",
            f"w.step() ran {cycle.without_update} of the first {CHECK_UPDATES} times with no "
            "optimizer.step() since the previous call: call it once per optimizer update, "
            "after optimizer.step() (with gradient accumulation, once per update, not per "
            "micro-batch); nnwatch counts a step per w.step() call. If the loop builds a new "
            "optimizer after watch(), the one watch() was given never steps: pass None",
        )
