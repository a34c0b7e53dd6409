"""TensorBoard export: the same records nnwatch keeps, as event files TensorBoard opens.

Two entry points share one writer, so a live export and a later ``nnwatch export tensorboard``
of the same run hold the same tags and values:

- :func:`export_run` converts a run directory (finished, crashed or still running) after the fact;
- :func:`attach_live` (used by ``watch(..., tensorboard=OUT_DIR)``) registers an observer on the run
  log, so the events are written by the log's writer thread from the records it already drains.

Neither touches the training thread or the hooks. Events are framed by
:mod:`nnwatch.export.event_file`, in the calling thread (TensorBoard's own writer checksums in
pure Python on a second thread, which costs a fast training loop GIL time). Each nnwatch run becomes one TensorBoard run:
``OUT_DIR/<run directory name>`` (ranks of a distributed job get their own, ``...-r1`` etc.).

What is written, all with the step as ``global_step`` and the record's wall time:

- scalars every step: ``train/loss``, ``grad/norm`` (before clipping), ``grad/norm_clipped``,
  ``grad/clipped``, ``grad/clip_threshold``, ``grad/nonfinite``, ``train/lr`` (``train/lr/group<i>``
  with several parameter groups), ``amp/scale``, ``amp/skipped``, ``perf/*``, ``memory/*``;
- per-layer scalars on the steps whose layer stats were sampled: ``act_mean/<layer>``,
  ``act_std/<layer>``, ``act_zero/<layer>``, ``act_maxabs/<layer>``, ``act_nonfinite/<layer>``
  and ``grad_layer/<layer>`` (the layer's gradient norm);
- histograms every ``histogram_every`` steps (default 100): the distribution *across layers* of
  ``log10`` gradient norm, activation std, zero fraction and max-abs (``hist/...``). nnwatch keeps
  no raw tensors, so these are the histograms its records can honestly give;
- findings as text (``findings``), so a diagnosis shows up next to the curves.

NaN means "not measured" in nnwatch, so NaN values are left out rather than written as NaN; a
non-finite loss or gradient is still visible through ``grad/nonfinite`` and the findings.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nnwatch.export.event_file import EventFile
from nnwatch.store.event_tail import EventTail
from nnwatch.store.events import Event, FindingEvent
from nnwatch.store.paths import open_dir_nofollow
from nnwatch.store.record_split import split_records
from nnwatch.store.run_reader import load_run
from nnwatch.store.runlog import RunLogError
from nnwatch.store.schema import GRAD_LAYER_FIELD, LAYER_FIELDS_ACT, FieldName, RunMeta, fields_of

if TYPE_CHECKING:
    from nnwatch.store.runlog import RunLogWriter

log = logging.getLogger("nnwatch")

#: (record field, TensorBoard tag) for the per-step scalars; LR columns are added per group.
SCALAR_TAGS: tuple[tuple[str, str], ...] = (
    (FieldName.LOSS, "train/loss"),
    (FieldName.GRAD_NORM, "grad/norm"),
    (FieldName.GRAD_NORM_CLIPPED, "grad/norm_clipped"),
    (FieldName.CLIPPED, "grad/clipped"),
    (FieldName.CLIP_THRESHOLD, "grad/clip_threshold"),
    (FieldName.NONFINITE_GRADS, "grad/nonfinite"),
    (FieldName.AMP_SCALE, "amp/scale"),
    (FieldName.AMP_SKIPPED, "amp/skipped"),
    (FieldName.STEP_TIME, "perf/step_time"),
    (FieldName.SAMPLES_PER_SEC, "perf/samples_per_sec"),
    (FieldName.CPU_PERCENT, "perf/cpu_percent"),
    (FieldName.RSS, "memory/rss"),
    (FieldName.CUDA_ALLOCATED, "memory/cuda_allocated"),
    (FieldName.CUDA_RESERVED, "memory/cuda_reserved"),
    (FieldName.CUDA_PEAK, "memory/cuda_peak"),
)
#: Per-layer stats drawn as histograms across layers (``grad_layer`` as log10).
HISTOGRAM_FIELDS: tuple[str, ...] = (GRAD_LAYER_FIELD, FieldName.ACT_STD, FieldName.ACT_ZERO, FieldName.ACT_MAXABS)
EVENT_FILE_PREFIX = "events.out.tfevents."


class ExportError(RuntimeError):
    """An export cannot be done; the message says what happened and what to do."""


@dataclass(frozen=True)
class TensorBoard:
    """Options for the live export: ``watch(model, opt, tensorboard=TensorBoard("tb", 50))``.

    ``watch(..., tensorboard="tb")`` is the same with the defaults.
    """

    log_dir: str | os.PathLike[str]
    histogram_every: int = 100
    """Write the across-layer histograms every this many steps (0 turns them off)."""
    per_layer: bool = True
    """Write the per-layer scalars (one tag per layer and stat) on sampled steps."""


@dataclass(frozen=True)
class ExportSummary:
    """What one export wrote, for the CLI's closing line and for tests."""

    out_dir: Path
    steps: int
    layer_rows: int
    histograms: int
    findings: int


def _load_tensorboard() -> tuple[Any, Any]:
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import summary as tb_summary
    except ImportError as exc:
        raise ExportError(
            f"TensorBoard is not installed ({exc}); install it with `pip install tensorboard`"
        ) from None
    return Summary, tb_summary


class TensorBoardWriter:
    """Turns step records of one run into TensorBoard events. Not thread-safe: one caller at a time.

    Rows may be full step records or the log's scalar / layer rows: only fields are read by name.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        meta: RunMeta,
        *,
        histogram_every: int = 100,
        per_layer: bool = True,
    ) -> None:
        self._Summary, self._tb = _load_tensorboard()
        self.out_dir = Path(out_dir)  # made by the event file, never through a link
        self.meta = meta
        self.histogram_every = max(0, int(histogram_every))
        self.per_layer = per_layer
        schema = meta.schema
        self._lr_tags = (
            ["train/lr"]
            if schema.num_lr == 1
            else [f"train/lr/group{i}" for i in range(schema.num_lr)]
        )
        self._layer_tags = [
            (f, [f"{f}/{name}" for name in schema.layer_names])
            for f in fields_of(LAYER_FIELDS_ACT, schema.version)
        ] + [(GRAD_LAYER_FIELD, [f"{GRAD_LAYER_FIELD}/{n}" for n in schema.param_layer_names])]
        self._next_histogram = 0
        self._writer = EventFile(self.out_dir)
        self.steps = 0
        self.layer_rows = 0
        self.histograms = 0
        self.findings = 0
        self.closed = False

    # -- records ---------------------------------------------------------------------------------
    def add_scalars(self, rows: np.ndarray) -> None:
        """One event per step holding every measured scalar of that step."""
        if not len(rows):
            return
        names = rows.dtype.names or ()
        tags = [tag for field, tag in SCALAR_TAGS if field in names]
        cols = [rows[field].astype(np.float64) for field, _ in SCALAR_TAGS if field in names]
        if FieldName.LR in names and self._lr_tags:
            lr = rows[FieldName.LR].reshape(len(rows), -1).astype(np.float64)
            tags += self._lr_tags
            cols += [lr[:, i] for i in range(lr.shape[1])]
        values = np.stack(cols, axis=1)
        finite = np.isfinite(values).tolist()
        values_l = values.tolist()  # Python floats: protobuf takes them much faster than numpy's
        steps = rows[FieldName.STEP].tolist()
        times = rows[FieldName.TIME].tolist() if FieldName.TIME in names else [math.nan] * len(rows)
        Summary, Value = self._Summary, self._Summary.Value
        pairs = list(enumerate(tags))
        for row, ok, step, wt in zip(values_l, finite, steps, times, strict=True):
            if not math.isfinite(step):
                continue
            vals = [Value(tag=tag, simple_value=row[j]) for j, tag in pairs if ok[j]]
            if vals:
                self._add(Summary(value=vals), step, wt)
                self.steps += 1

    def add_layers(self, rows: np.ndarray, times: dict[int, float] | None = None) -> None:
        """Per-layer scalars and, when due, the across-layer histograms, for each layer row."""
        if not len(rows) or not (self.per_layer or self.histogram_every):
            return
        Summary, Value = self._Summary, self._Summary.Value
        own_time = FieldName.TIME in (rows.dtype.names or ())
        for row in rows:
            step = int(row[FieldName.STEP])
            walltime = float(row[FieldName.TIME]) if own_time else (times or {}).get(step, math.nan)
            vals = []
            if self.per_layer:
                for field, tags in self._layer_tags:
                    data = np.asarray(row[field], dtype=np.float64).reshape(-1)
                    ok = np.isfinite(data).tolist()
                    vals += [
                        Value(tag=tag, simple_value=v)
                        for tag, v, good in zip(tags, data.tolist(), ok, strict=True)
                        if good
                    ]
            if self.histogram_every and step >= self._next_histogram:
                vals += self._histograms(row)
                self._next_histogram = (step // self.histogram_every + 1) * self.histogram_every
            if vals:
                self._add(Summary(value=vals), step, walltime)
                self.layer_rows += 1

    def _histograms(self, row: np.ndarray) -> list[Any]:
        out = []
        for field in HISTOGRAM_FIELDS:
            data = np.asarray(row[field], dtype=np.float64).reshape(-1)
            tag = f"hist/{field}"
            if field == GRAD_LAYER_FIELD:
                with np.errstate(divide="ignore"):
                    data = np.log10(data)
                tag = f"hist/{field}_log10"
            data = data[np.isfinite(data)]
            if data.size:
                out.extend(self._tb.histogram(tag, data, bins="auto").value)
                self.histograms += 1
        return out

    def add_events(self, events: Iterable[Event]) -> None:
        """Findings as TensorBoard text, at the step they name."""
        for ev in events:
            if not isinstance(ev, FindingEvent):
                continue
            f = ev.finding
            # the line's own message (an older writer's wording) before the one rebuilt from it
            message = str(ev.get("message") or f.summary or f.kind)
            text = f"**{f.kind}** ({f.severity}): {message}"
            self._add(
                self._tb.text("findings", text), f.step,
                math.nan if ev.time is None else ev.time,
            )  # fmt: skip
            self.findings += 1

    def _add(self, summary: Any, step: float, walltime: float) -> None:
        wt = float(walltime) if math.isfinite(walltime) else None
        self._writer.add_summary(summary, int(step), wt)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()

    def summary(self) -> ExportSummary:
        return ExportSummary(
            self.out_dir, self.steps, self.layer_rows, self.histograms, self.findings
        )


def target_dir(out_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str]) -> Path:
    """Where one run's events go: one TensorBoard run per nnwatch run, named like its directory."""
    return Path(out_dir).expanduser() / Path(run_dir).name


def _clear_previous(target: Path, overwrite: bool) -> None:
    if os.path.lexists(target):
        try:  # an earlier export's directory, judged as the event file will judge it
            os.close(open_dir_nofollow(target))
        except OSError as exc:
            raise ExportError(f"cannot export into {target}: {exc}") from None
    old = sorted(target.glob(EVENT_FILE_PREFIX + "*")) if target.is_dir() else []
    if not old:
        return
    if not overwrite:
        raise ExportError(
            f"{target} already holds a TensorBoard export of this run; TensorBoard would show its "
            "steps twice. Pass --overwrite to replace it, or choose another OUT_DIR"
        )
    for path in old:
        path.unlink()


def export_run(
    run_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    histogram_every: int = 100,
    per_layer: bool = True,
    overwrite: bool = False,
) -> ExportSummary:
    """Write one run's history as TensorBoard events into ``OUT_DIR/<run directory name>``."""
    try:
        run = load_run(run_dir)
    except RunLogError as exc:
        raise ExportError(str(exc)) from None
    target = target_dir(out_dir, run.run_dir)
    if target.resolve() == run.run_dir.resolve():
        raise ExportError("OUT_DIR/<run name> is the run directory itself; choose another OUT_DIR")
    _clear_previous(target, overwrite)
    writer = TensorBoardWriter(
        target, run.meta, histogram_every=histogram_every, per_layer=per_layer
    )
    try:
        scalars = np.asarray(run.scalars)
        writer.add_scalars(scalars)
        times = dict(
            zip(scalars[FieldName.STEP].astype(np.int64).tolist(), scalars[FieldName.TIME].tolist(), strict=True)
        )
        writer.add_layers(np.asarray(run.layers), times)
        writer.add_events(run.events)
    finally:
        writer.close()
    return writer.summary()


# ------------------------------------------------------------------------------------------------
# Live: an observer of the run log's writer thread


class LiveExport:
    """Feeds each batch of records the run log drains into a :class:`TensorBoardWriter`.

    It runs in the log's writer thread. Any failure is reported once and turns the export off;
    training and the run log go on.
    """

    def __init__(self, meta: RunMeta, run_dir: Path, options: TensorBoard) -> None:
        self.meta = meta
        self.out_dir = target_dir(options.log_dir, run_dir)  # a live run has its directory
        _clear_previous(self.out_dir, overwrite=False)
        self.writer = TensorBoardWriter(
            self.out_dir,
            meta,
            histogram_every=options.histogram_every,
            per_layer=options.per_layer,
        )
        self._events = EventTail(Path(run_dir) / "events.jsonl")
        self.error: str | None = None

    def observe(self, rows: np.ndarray) -> None:
        if self.error is not None or self.writer.closed:
            return
        try:
            scalars, layers = split_records(rows, self.meta.schema)
            self.writer.add_scalars(scalars)
            self.writer.add_layers(
                layers, {int(s): float(t) for s, t in zip(rows[FieldName.STEP], rows[FieldName.TIME], strict=True)}
            )
            self.writer.add_events(self._events.read_events())
            self.writer.flush()  # a live TensorBoard sees each batch as soon as it is drained
        except Exception as exc:  # noqa: BLE001 - an exporter must never stop the run log
            self._fail(exc)

    def close(self) -> None:
        """Called after the run log has drained its last records."""
        if self.error is None and not self.writer.closed:
            try:
                self.writer.add_events(self._events.read_events())
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001
            pass

    def _fail(self, exc: BaseException) -> None:
        self.error = repr(exc)
        log.error(
            "nnwatch: the TensorBoard export to %s stopped: %r; training goes on", self.out_dir, exc
        )


def attach_live(
    meta: RunMeta, run_dir: Path, log_writer: RunLogWriter, option: TensorBoard | str | os.PathLike[str]
) -> LiveExport | None:
    """Start the live export of the run in ``run_dir`` (called at its first step, when its log
    opened): an observer of ``log_writer``. Never raises."""
    options = option if isinstance(option, TensorBoard) else TensorBoard(option)
    try:
        export = LiveExport(meta, run_dir, options)
    except Exception as exc:  # noqa: BLE001 - an optional export must never stop the run
        log.warning("nnwatch: the TensorBoard export is off: %s", exc)
        return None
    log_writer.observers.append(export.observe)
    print(f"nnwatch: TensorBoard events -> {export.out_dir}", flush=True, file=sys.stderr)
    return export
