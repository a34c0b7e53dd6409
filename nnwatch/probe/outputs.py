"""The run's outputs beside the log, started at the first step: the live channel, the detectors
and the TensorBoard export.

Each is optional, and each is handed only what it reads: the channel (one
:class:`~nnwatch.channel.endpoint.RunEndpoint`) the run's place and the system sampler that beats
its heartbeat, the detectors a
:class:`~nnwatch.diagnosis.context.RunContext` and the :class:`~nnwatch.diagnosis.live.DiagnosedRun`
they report to, the export the run's metadata, directory and log. None of them may stop training:
a part that cannot start is switched off with one warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from torch import nn

from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.live import DiagnosedRun, Diagnosis
from nnwatch.probe.mate_watch import start_mate_watch
from nnwatch.probe.optimizer_target import OptimizerTarget
from nnwatch.probe.options import WatchOptions
from nnwatch.probe.run_files import RunFiles
from nnwatch.store.paths import default_root
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.schema import RunMeta

if TYPE_CHECKING:
    from nnwatch.probe._builder import Parts


class OutputsOwner(Protocol):
    """What starting the outputs reads of the run itself: its files, options and metadata, its
    model and optimizer; the channel and the detectors then see only their own slices."""

    @property
    def files(self) -> RunFiles: ...

    @property
    def options(self) -> WatchOptions: ...

    @property
    def meta(self) -> RunMeta | None: ...

    @property
    def run_dir(self) -> Path | None: ...

    @property
    def model(self) -> nn.Module: ...

    @property
    def optimizer(self) -> OptimizerTarget: ...

    def warn_once(self, key: str, message: str) -> None: ...


def start_outputs(
    run: OutputsOwner, parts: Parts, diagnosed: DiagnosedRun, *, resumed: bool,
    clip_before_unscale: bool,
) -> None:  # fmt: skip
    """After the log: the channel first, so that a step-0 finding reaches monitors, then the
    detectors and the TensorBoard export; then the events that came before the log.

    The channel is given the system sampler that beats its heartbeat, the detectors the
    view of the run they report to (``diagnosed``) and the facts their context holds."""
    files, opts, meta = run.files, run.options, run.meta
    run_log = files.log
    assert run_log is not None and meta is not None
    if opts.channel:
        files.add_channel(_make_channel(run, parts))
    if files.channel is not None:  # its registry entry is how this node's other ranks find it
        files.mates = start_mate_watch(meta, default_root())
    if opts.detectors:
        files.diagnosis = _make_diagnosis(
            run, parts, diagnosed, run_log, resumed=resumed, clip_before_unscale=clip_before_unscale
        )
        if files.diagnosis is not None and files.channel is not None:
            # the ring holds every record: what the detectors read if they move to a process
            files.diagnosis.attach_ring(files.channel.ring_path)
    if opts.tensorboard is not None:
        from nnwatch.export.tensorboard import attach_live  # lazy: only if asked for

        files.exporter = attach_live(meta, files.dir, run_log, opts.tensorboard)
    files.flush_early()


def _make_channel(run: OutputsOwner, parts: Parts) -> RunEndpoint | None:
    """The run's endpoint (ring, socket, registry entry), its heartbeat beaten by the system
    sampler's thread (which stops before the run files close it); the step cycle hands it the
    command handler at each step boundary."""
    try:
        assert run.meta is not None and run.run_dir is not None
        endpoint = RunEndpoint(run.meta, run.run_dir, heartbeat=None)
        parts.sysmon.beats.append(endpoint.ring.beat)
        return endpoint
    except Exception as exc:  # noqa: BLE001 - a monitor is optional; training goes on without
        run.warn_once("channel", f"live monitoring is off: {exc!r}")
        return None


def _make_diagnosis(
    run: OutputsOwner, parts: Parts, diagnosed: DiagnosedRun, run_log: RunLogWriter, *,
    resumed: bool, clip_before_unscale: bool,
) -> Diagnosis | None:  # fmt: skip
    try:
        assert run.meta is not None
        plan = parts.plan
        context = RunContext.from_live(
            run.meta, run.model, plan.params, plan.param_layer_index,
            optimizer=run.optimizer.hook or run.optimizer.source,
            num_classes=run.options.num_classes, resumed=resumed,
            clip_before_unscale=clip_before_unscale,
        )
        diag = Diagnosis(context, diagnosed)
    except Exception as exc:  # noqa: BLE001
        run.warn_once("diagnosis", f"detectors are off: {exc!r}")
        return None
    parts.snapshots.register_with(diag)
    run_log.observers.append(diag.observe)
    return diag
