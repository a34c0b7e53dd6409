"""``nnwatch.watch()``: the probe a training script attaches to its model and optimizer.

It hooks the model's layers, measures gradients right before ``optimizer.step()``, and turns each
``w.step()`` into one fixed-size record that goes to the run log (durable history), the ring file
(live monitors) and the detectors. Nothing here blocks or raises into the training loop: a failure
inside nnwatch is logged once and switches off only the part that failed.

:class:`Watch` is the user's facade and nothing else (``step``, ``clip_grad_norm_``, ``close``,
``run_dir``, ``findings``, ``summary``, ``request_snapshot``, ``should_stop``). Its options are one
frozen :class:`~nnwatch.probe.options.WatchOptions`; :mod:`~nnwatch.probe._builder` makes the
parts, and :class:`~nnwatch.probe.watched_run.WatchedRun` is the run they report to (its start,
events, findings, failures and end). Each concern belongs to one part:

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

import difflib
import sys
import weakref
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from nnwatch.probe import game
from nnwatch.probe.exit_status import OBSERVER, Ending, from_exception, taken_over
from nnwatch.probe.framework_link import FrameworkLink
from nnwatch.probe.optimizer_target import resolve as resolve_optimizer
from nnwatch.probe.options import WatchOptions, WatchOptionsDict
from nnwatch.probe.run_files import RankInfo as RankInfo
from nnwatch.probe.schedule import AFTER_TROUBLE as AFTER_TROUBLE
from nnwatch.probe.schedule import WARMUP_STEPS as WARMUP_STEPS
from nnwatch.probe.watched_run import WatchedRun
from nnwatch.store.events import TrainingError
from nnwatch.store.finding import Finding
from nnwatch.store.summary import RunSummary

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11; a type, never imported


class Watch:
    """One watched training run. Create it with :func:`watch`; call :meth:`step` once per step."""

    def __init__(
        self, model: nn.Module, optimizer: Any = None, scaler: Any = None,
        options: WatchOptions | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}")
        options = options if options is not None else WatchOptions()
        earlier = _take_over(model, options.resume, options.name)
        if earlier is not None:  # resume=True: go on in the same run, with its name and count
            options = options.continuing(earlier.name, earlier.step, earlier.run_dir)
        run = self._run = WatchedRun(
            model, resolve_optimizer(optimizer), scaler, options, append=earlier is not None
        )
        if not run.attach():
            return
        _LIVE[model] = self
        if options.name is not None:
            _BY_NAME[(run.name, run.rank.rank)] = weakref.ref(self)
        self._atexit = weakref.WeakMethod(self._close_at_exit)
        OBSERVER.at_exit(self._atexit)  # at exit, and before a SIGTERM ends the process
        self._noter = weakref.WeakMethod(run.note_ending)
        OBSERVER.on_terminate(self._noter)  # a SIGTERM says how the process ends, first
        print(f"nnwatch: watching {run.name} -> {run.run_dir}", file=sys.stderr)

    # ------------------------------------------------------------------------------------------
    # the step (the hot path lives in StepCycle)
    def step(self, loss: Any = None, batch: Any = None, batch_size: int | None = None) -> None:
        """Record one training step. Call it once per optimizer step, after ``optimizer.step()``.

        ``batch`` (kept for snapshots) also gives the samples/s; ``batch_size`` overrides the
        size found in it (for batches whose layout nnwatch cannot guess).
        """
        run = self._run
        if not run.disabled and not run.closed:
            run.parts.cycle.step(loss, batch, batch_size)
            if len(_LIVE) > 1:  # another net watched in this process: a GAN's pair?
                game.note_step(self, list(_LIVE.values()), _judge_as_game)
        elif not run.closed:
            run.parts.cycle.keep_pace()  # a sharded job's other ranks still count on this one

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
        run = self._run
        params = list(run.parts.plan.params if parameters is None else parameters)
        return run.parts.grads.clip(
            params, max_norm, norm_type, error_if_nonfinite, foreach,
            per_layer=parameters is None, record=not run.disabled, warn=run.warn_once,
        )

    # ------------------------------------------------------------------------------------------
    # what users read and steer
    @property
    def name(self) -> str:
        """The run's name (``name=``, else the model's class name)."""
        return self._run.name

    @property
    def run_dir(self) -> Path | None:
        """The run's directory; None when monitoring is off and none was made (never ``.``: a
        user's ``shutil.rmtree(w.run_dir)`` must not take the working directory)."""
        return self._run.run_dir

    @property
    def step_index(self) -> int:
        """The number of the step being recorded (the next ``w.step()``)."""
        return self._run.step_index

    @property
    def findings(self) -> list[Finding]:
        """What the detectors (and nnwatch about itself) found so far, oldest first."""
        return self._run.findings.items

    @property
    def disabled(self) -> str | None:
        """Why monitoring is off (training goes on without it), or None while it is on."""
        return self._run.disabled

    @property
    def closed(self) -> bool:
        """The run has ended (:meth:`close`)."""
        return self._run.closed

    @property
    def should_stop(self) -> bool:
        """A monitor asked the training loop to stop (check it in the loop)."""
        return self._run.parts.commands.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self._run.parts.commands.should_stop = bool(value)

    @property
    def framework(self) -> FrameworkLink:
        """What a framework's callback needs beyond ``step`` and ``clip_grad_norm_``: recording a
        clip the framework did, the pre-update work inside ``optimizer.step(closure)``, the LRs an
        update used (nnwatch's Lightning and transformers callbacks use it)."""
        return FrameworkLink(self._run)

    def request_snapshot(self, reason: str = "requested") -> None:
        """Snapshot the next step: its batch, RNG, and the weights from before its update."""
        self._run.parts.snapshots.request(reason)

    # ------------------------------------------------------------------------------------------
    def close(self, status: str | Ending = "finished") -> None:
        """End the run: remove every hook, flush the log, write ``end.json``. Safe to call twice.

        ``status`` is "finished" (a clean end), "crashed" or "interrupted"; the ``with`` block and
        the exit handler pass what they saw of the program's end, with its reason.
        """
        if not self._run.closed:
            self._run.close(status if isinstance(status, Ending) else Ending(str(status)))

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ending = from_exception(exc_type, exc)
        if ending.status == "crashed" and exc_type is not None and not issubclass(exc_type, SystemExit):
            self._run.files.event(TrainingError(step=self._run.step_index, error=repr(exc)))
        self.close(ending)

    def _close_at_exit(self) -> None:
        """The interpreter is exiting with the run still open: end it as the program ended."""
        self.close(OBSERVER.final())

    # ------------------------------------------------------------------------------------------
    # notebooks and REPLs
    def summary(self) -> RunSummary:
        """Name, status, steps, the last loss and grad norm, the findings: what a notebook shows."""
        return self._run.summary()

    def __repr__(self) -> str:
        return self.summary().text()

    def _repr_html_(self) -> str:
        return self.summary().html()


def internals(w: Watch) -> WatchedRun:
    """The run behind ``w``: its parts and state.

    For tests and benchmarks: not a user API, and free to change with any release. The
    integrations use :attr:`Watch.framework`.
    """
    return w._run


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
    diagnosis = w._run.files.diagnosis
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
    run = earlier._run
    if resume and not run.disabled:
        ending = Ending("finished", "continued by a new watch of the same model (resume=True)")
    else:
        ending = taken_over(run.shell_exception_at_start, same_model)
    what = (
        f"{model.__class__.__name__} was already watched"
        if same_model
        else f"a watch named {name!r} was already open in this process"
    )
    print(
        f"nnwatch: {what} ({run.name} -> {run.run_dir}); "
        + ("the new watch goes on in that run" if resume else
           f"that run ends as {ending.status}, the new watch takes over"),
        file=sys.stderr,
    )
    earlier.close(ending)
    if not resume or run.disabled:
        return None
    return _Continued(str(run.name), int(run.step_index), Path(run.files.dir))


def watch(
    model: nn.Module, optimizer: Any = None, scaler: Any = None, **options: Unpack[WatchOptionsDict]
) -> Watch:
    """Attach nnwatch to a model (and optionally its optimizer and AMP GradScaler).

    Use it as a context manager, or call ``close()`` at the end. ``optimizer`` may be None (a
    hand-written update): ``w.step()`` is then the step boundary; a wrapper around a torch
    optimizer (Lookahead and the like) is followed to the optimizer inside it. Gradient norms
    before and after clipping are recorded whoever clips: torch's ``clip_grad_norm_`` is seen directly (every
    step, torch's own value), other clipping from the gradients measured when backward ends.

    ``options`` are the fields of :class:`~nnwatch.probe.options.WatchOptions`: ``name``,
    ``num_classes`` (the first loss is then expected near ln K), ``run_dir`` (in a job of several
    ranks, rank R writes to ``<run_dir>-rR``), ``layer_interval`` (full per-layer activation stats every N steps; by
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
    known = [f.name for f in fields(WatchOptions)]
    unknown = sorted(set(options) - set(known))
    if unknown:  # as Python says it for a function's own keywords, with the option meant
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; its options are {', '.join(known)}"
        raise TypeError(f"watch() got an unexpected keyword argument {unknown[0]!r}{hint}")
    return Watch(model, optimizer, scaler, WatchOptions(**options))
