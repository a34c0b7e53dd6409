"""Makes a watched run's parts and hands each one only what it uses (private to the probe).

The parts are wired here, once, so that no part reaches for another through the run: the hot
path (:class:`~nnwatch.probe.step_cycle.StepCycle`) is given the parts it drives, the guard the
buffers and hooks it reads, the commands the recorder and budget they steer. The run itself
(:class:`~nnwatch.probe.watched_run.WatchedRun`) is handed to a part only through that part's
``*Owner`` protocol: the few callbacks (warnings, events, the first step) it reports to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from nnwatch.probe.attachment import Attachment
from nnwatch.probe.buffers import StepBuffers
from nnwatch.probe.command_handler import CommandHandler, CommandOwner
from nnwatch.probe.consistency import CheckOwner, ConsistencyCheck
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.guard import Guard, GuardOwner
from nnwatch.probe.label_mix import LabelMix
from nnwatch.probe.layer_hooks import HookOwner, LayerHooks
from nnwatch.probe.optimizer_target import OptimizerTarget
from nnwatch.probe.options import WatchOptions
from nnwatch.probe.run_files import RunFiles, optimizer_step
from nnwatch.probe.schedule import Schedule
from nnwatch.probe.sharded_grads import ShardedGradientRecorder
from nnwatch.probe.sharded_reduce import ShardedReduce, sharded_model
from nnwatch.probe.snapshot_taker import SnapshotOwner, SnapshotTaker
from nnwatch.probe.step_cycle import CycleOwner, StepCycle
from nnwatch.probe.step_record import StepRecord
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.probe.update_recorder import UpdateRecorder
from nnwatch.store.schema import RunSchema
from nnwatch.tensors.grad_norms import LayerReducer
from nnwatch.tensors.layers import LayerPlan, plan_layers, sequence_first


class PartsOwner(CycleOwner, HookOwner, GuardOwner, CommandOwner, CheckOwner, Protocol):
    """The run the parts report to (:class:`~nnwatch.probe.watched_run.WatchedRun`): each part
    sees only its own ``*Owner`` slice of it; the builder also wires the run files."""

    @property
    def files(self) -> RunFiles: ...


@dataclass(slots=True)
class Parts:
    """What :func:`build` makes: the run's parts, wired to each other (and the cross-rank check,
    made once the others are in place)."""

    plan: LayerPlan
    schedule: Schedule
    buffers: StepBuffers
    layers: LayerHooks
    snapshots: SnapshotTaker
    guard: Guard
    grads: GradientRecorder
    commands: CommandHandler
    attachment: Attachment
    sysmon: SystemSampler
    record: StepRecord
    cycle: StepCycle
    consistency: ConsistencyCheck | None = None


def build(
    run: PartsOwner, model: nn.Module, optimizer: OptimizerTarget, scaler: Any, options: WatchOptions,
    *, snapshot_owner: SnapshotOwner, on_scaled_norm: Callable[[], None],
) -> Parts:
    """The parts of ``run``: the layer plan, the buffers, the hooks, the step cycle and the rest.
    The snapshots report through ``snapshot_owner`` (the run as the snapshot writer reads it);
    ``on_scaled_norm`` hears of a clip on still-scaled AMP gradients."""
    source = optimizer.source
    #: the first step's number: 0, or where a resumed run left off (``start_step``, else the
    #: step count of an optimizer that already holds state), so that the step numbers go on
    first_step = int(options.start_step) if options.start_step is not None else optimizer_step(source)
    schedule = Schedule(first_step, options.budget, options.max_interval, options.layer_interval)
    plan = plan_layers(model)
    device = _param_device(plan, model)
    guard_on = (device.type == "cpu") if options.guard is None else bool(options.guard)
    num_lr = len(source.param_groups) if source is not None else 0
    schema = RunSchema(plan.stat_names, plan.stat_kinds, plan.param_layer_names, num_lr)
    buffers = StepBuffers(schema, device)
    layers = LayerHooks(model, plan, schedule, run, buffers.dev.device, int(options.stat_cap))
    snapshots = SnapshotTaker(model, source, scaler, snapshot_owner)
    guard = Guard(model, plan, buffers, schedule, layers, snapshots, run, options.skip_nonfinite)
    reducer = LayerReducer(plan.param_layer_index, len(plan.param_layer_names))
    on_nonfinite = guard.hit if optimizer.hook is None and guard_on else None
    shards = ShardedReduce(plan, buffers, reducer) if sharded_model(plan.params) else None
    if shards is not None:  # FSDP2, tensor parallel: whole norms, reduced across the ranks
        guard.sharded = True
        layers.sums_always = guard_on  # the guard's origin of a NaN, with no forward re-run
        grads: GradientRecorder = ShardedGradientRecorder(
            plan, buffers, reducer, scaler, on_nonfinite=on_nonfinite, shards=shards
        )
    else:
        grads = GradientRecorder(plan, buffers, reducer, scaler, on_nonfinite=on_nonfinite)
    grads.on_scaled_norm = on_scaled_norm
    commands = CommandHandler(run, grads, schedule.budget, snapshots)
    attachment = Attachment(layers, grads)
    attachment.on_materialized = guard.choose_sentinels
    sysmon = SystemSampler()
    record = StepRecord(buffers, sysmon, source, scaler, num_lr, run.warn_once)
    updates = UpdateRecorder(plan, buffers, source)
    if shards is not None:
        updates.on_sums = shards.take_updates
    cycle = StepCycle(
        run, plan=plan, optimizer=optimizer.hook, scaler=scaler, schedule=schedule,
        buffers=buffers, layers=layers, grads=grads, guard=guard, guard_on=guard_on,
        updates=updates, labels=LabelMix(buffers, options.num_classes),
        snapshots=snapshots, commands=commands, record=record, files=run.files,
        start_step=first_step, batch_size=options.batch_size, seq_first=sequence_first(model),
    )
    cycle.shards = shards
    return Parts(
        plan, schedule, buffers, layers, snapshots, guard, grads, commands,
        attachment, sysmon, record, cycle,
    )


def build_consistency(
    run: PartsOwner, model: nn.Module, plan: LayerPlan, optimizer: OptimizerTarget,
    options: WatchOptions,
) -> ConsistencyCheck | None:
    """The cross-rank check (and job summary), made once the run's other parts are in place: its
    first beat already reads the run's step."""
    return ConsistencyCheck.create(
        run, model, plan, optimizer.hook, options.consistency_every, options.job_summary_every
    )


def _param_device(plan: LayerPlan, model: nn.Module) -> torch.device:
    p = plan.params[0] if plan.params else next(model.parameters(), None)
    if p is None:
        b = next(model.buffers(), None)
        return b.device if b is not None else torch.device("cpu")
    return p.device
