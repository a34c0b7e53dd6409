"""``nnwatch.watch()``: the probe a training script attaches to its model and optimizer.

It hooks the model's layers, measures gradients right before ``optimizer.step()``, and turns each
``w.step()`` into one fixed-size record that goes to the run log (durable history), the ring file
(live monitors) and the detectors. Nothing here blocks or raises into the training loop: a failure
inside nnwatch is logged once and switches off only the part that failed.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import random
import socket
import struct
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nnwatch import grad as gradmath
from nnwatch._version import __version__
from nnwatch.distributed import job_extra
from nnwatch.paths import RunDirError, default_root, ensure_private_dir, make_run_dir
from nnwatch.probe import clip_intercept
from nnwatch.probe.activation_stats import StatBlock, layer_sum
from nnwatch.probe.budget import CostBudget
from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.probe.consistency import ConsistencyCheck
from nnwatch.probe.exit_status import OBSERVER, Ending, from_exception
from nnwatch.probe.grad_norms import LayerReducer, sentinel_params, sentinels_finite
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.hook_hiding import ProbeHook, hide_hooks, release_hooks
from nnwatch.probe.layers import LayerPlan, first_tensor, plan_layers, sequence_first
from nnwatch.probe.loss_trend import HOLD, LossTrend
from nnwatch.probe.sysmon import SystemSampler
from nnwatch.runlog import RunLogWriter
from nnwatch.schema import HOST_FIELDS, RunMeta, RunSchema
from nnwatch.summary import RunSummary, last_finite

log = logging.getLogger("nnwatch")

_N_HOST = len(HOST_FIELDS)
_HOST_PACK = struct.Struct(f"<{_N_HOST}d")
_NO_CUDA = (math.nan, math.nan, math.nan)
_LOSS = DEV_INDEX["loss"]
_STEP_FIELD = struct.Struct("<d")  # the first host field
_LOSS_FIELD = struct.Struct("<f")  # the first device field
assert HOST_FIELDS[0] == "step" and _LOSS == 0, "Watch._publish reads these two by offset"
_ENGINE = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
assert HOST_FIELDS[5:12] == (
    "layer_stats", "cuda_allocated", "cuda_reserved", "cuda_peak", "cpu_percent", "rss", "layer_sums"
), "Watch._step writes the host block in this order"
RECENT_STEPS = 500  # records kept in memory for snapshots
WARMUP_STEPS = 10  # steps measured in full at the start, whatever the budget says
DEFAULT_LAYER_INTERVAL = 10  # full per-layer stats every 10 steps, stretched if over budget
AFTER_TROUBLE = 100  # steps measured in full after non-finite gradients were seen
MEMORY_EVERY = 0.2  # seconds between two reads of the CUDA allocator's statistics


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def detect(cls) -> RankInfo:
        """From torch.distributed when it is initialised, else from the launcher's variables."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(
                    dist.get_rank(),
                    int(os.environ.get("LOCAL_RANK", dist.get_rank())),
                    dist.get_world_size(),
                )
        except Exception:  # noqa: BLE001 - a broken process group must not stop the probe
            pass
        env = os.environ
        return cls(
            int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1))
        )


def _capture_rng(full: bool = True) -> dict[str, Any]:
    """RNG states at the start of a step, for an exact replay of its forward pass.

    torch's own generators cost about 1 us and are taken on every guarded step; numpy's and
    Python's (about 40 us together) only when a snapshot was asked for ahead of the step, since a
    model's forward rarely draws from them.
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if full:
        state["numpy"] = np.random.get_state()
        state["python"] = random.getstate()
    return state


def _gpu_uuids(device: torch.device) -> list[str]:
    """The UUID of the run's GPU, so a monitor can match it in NVML whatever the index order."""
    if device.type != "cuda":
        return []
    try:
        return [str(torch.cuda.get_device_properties(device).uuid)]
    except Exception:  # noqa: BLE001 - a driver hiccup must not stop the run
        return []


def _to_cpu(obj: Any) -> Any:
    """A detached CPU copy of a nested structure of tensors (a state_dict, a batch)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_to_cpu(v) for v in obj]
        return type(obj)(items) if isinstance(obj, list) else tuple(items)
    return obj


def _draws_random_numbers(model: nn.Module) -> bool:
    """Whether the forward pass may draw from the RNG (dropout and friends, by module type).

    Capturing the RNG state costs ~50 us a step on a CPU right after a step; a model without such
    modules replays exactly without it (functional ``F.dropout`` calls are not seen here: the
    replay then reports that it diverged).
    """
    random_types: tuple[type, ...] = (nn.modules.dropout._DropoutNd, nn.RReLU)
    return any(isinstance(m, random_types) or "dropout" in type(m).__name__.lower() for m in model.modules())


def _batch_size(batch: Any, seq_first: bool = False) -> int | None:
    """Samples in the batch: (x, y) tuples, dicts of token ids, a tensor.

    The batch dimension is the first tensor's leading one, or its second for a model whose
    recurrent layers take sequence-first input (``(T, B, ...)``, PyTorch's RNN default).
    """
    dim = 1 if seq_first else 0
    if type(batch) is tuple and batch and type(batch[0]) is torch.Tensor and batch[0].dim() > dim:
        return int(batch[0].shape[dim])  # the usual (x, y), without building a list
    if isinstance(batch, dict):
        items: Any = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        items = list(batch)
    else:
        items = [batch]
    t = next((b for b in items if isinstance(b, torch.Tensor) and b.dim() > dim), None)
    return int(t.shape[dim]) if t is not None else None


class Watch:
    """One watched training run. Create it with :func:`watch`; call :meth:`step` once per step."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
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
        budget: float | None = 0.01,
        max_interval: int = 32,
        batch_size: int | None = None,
        start_step: int | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}")
        _take_over(model)
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.num_classes = num_classes
        #: the optimizer already holds state (a resumed run, or a second watch of one loop): the
        #: model has trained, so "the first loss should be ln K" does not apply
        self.resumed = _optimizer_has_state(optimizer)
        self.name = name or type(model).__name__
        self.findings: list[Any] = []
        self.should_stop = False
        #: the first step's number: 0, or where a resumed run left off (``start_step``, else the
        #: step count of an optimizer that already holds state), so that the step numbers go on
        self.start_step = int(start_step) if start_step is not None else _optimizer_step(optimizer)
        self.step_index = self.start_step
        self.stat_cap = int(stat_cap)
        self.skip_nonfinite = skip_nonfinite
        self.disabled: str | None = None
        self.closed = False
        self.run_dir = Path()
        self.rank = RankInfo.detect()
        self._warned: set[str] = set()
        self._handles: list[Any] = []
        self._layer_hooks: list[Callable[..., None]] = []
        self._layer_handles: list[Any] = []  # attached only for measured steps
        self._log: RunLogWriter | None = None
        self._channel: Any = None
        self._diagnosis: Any = None
        self._want_channel = channel
        self._want_detectors = detectors
        self._started = time.time()
        self._last_time = math.nan
        self._step_open = False
        self._backward_seen = False
        self._end_queued = False  # a callback waits for the end of the running backward pass
        self.batch_size = batch_size
        self._ending_status: str | None = None  # how the run ended, once it has
        self._anomaly_left = 0
        self._anomaly_prev: bool | None = None
        self._paused = False
        self._snapshot_reason: str | None = None
        self._rng_at_start: dict[str, Any] | None = None
        self._pre_state: dict[str, Any] | None = None
        self._snapshot_armed = False  # a snapshot was pending when this step's forward began
        self._guard_tripped = False
        self._order: list[int] = []
        self._finalized = False
        self._recent: deque[bytes] | None = None  # the last records, raw, for snapshots
        # cost budget: measure layer sums and gradient norms on every k-th step (see budget.py)
        self.budget = CostBudget(
            budget, max_interval, DEFAULT_LAYER_INTERVAL if layer_interval is None else layer_interval,
            stretch_stats=layer_interval is None,
        )
        self._measure = True  # this step's layer sums and gradient norms are measured
        self._since_measured = 0
        self._measure_until = self.start_step + WARMUP_STEPS
        self._loss_trend = LossTrend()  # measures every step while the loss goes wrong
        self._memory_at = -math.inf  # when the CUDA memory gauges were last read
        self._memory = _NO_CUDA
        self._own = 0.0  # seconds spent in nnwatch's own code during this step
        self._sums: list[torch.Tensor | None] = []  # this step's layer output sums, by slot
        self._layers_off: set[int] = set()  # layers whose hook failed once
        self._sums_stored = False
        self._inputs: tuple[Any, Any] | None = None  # this step's forward arguments
        self._rerun = False

        self.plan: LayerPlan = plan_layers(model)
        if not self.plan.stat_modules:
            self._warn_once(
                "no-layers",
                f"found no layers to watch in {type(model).__name__} (no Linear, Conv, Norm, "
                "attention or activation modules); per-layer statistics are off, loss and "
                "gradient norms are still recorded",
            )
        self.device = self._param_device()
        self.guard = (self.device.type == "cpu") if guard is None else bool(guard)
        self._reducer = LayerReducer(self.plan.param_layer_index, len(self.plan.param_layer_names))
        self._sentinels = sentinel_params(self.plan.params, self.plan.param_layer_index)
        self._has_layers = bool(self.plan.stat_modules)
        self._first_param = self.plan.params[0] if self.plan.params else None
        self._random_forward = _draws_random_numbers(model)
        self._seq_first = sequence_first(model)
        self._slots = list(range(len(self.plan.stat_modules)))
        self._sums = [None] * len(self._slots)
        num_lr = len(optimizer.param_groups) if optimizer is not None else 0
        self.schema = RunSchema(
            self.plan.stat_names, self.plan.stat_kinds, self.plan.param_layer_names, num_lr
        )
        self._buf = StepBuffers(self.schema, self.device)
        self.grads = GradientRecorder(
            self.plan, self._buf, self._reducer, scaler,
            on_nonfinite=self._on_guard_hit if optimizer is None and self.guard else None,
        )
        self._refresh_views()
        self._sampled = True  # step 0 always samples per-layer stats
        self._sysmon = SystemSampler()
        self._tensorboard = tensorboard  # live TensorBoard export, from the run log's thread
        self._exporter: Any = None
        self._consistency = ConsistencyCheck.create(self, consistency_every)  # ranks, every N steps

        if os.environ.get("NNWATCH_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
            self.disabled = "NNWATCH_DISABLE is set"  # an inert watch: no hooks, no files
            log.info("nnwatch: NNWATCH_DISABLE is set; %s is not watched", self.name)
            return
        try:
            self.run_dir = self._make_run_dir(run_dir)
        except (OSError, RunDirError) as exc:
            self._disable(f"cannot use the run directory ({exc}); monitoring is off for this run")
            return
        self._attach_hooks()
        self._sysmon.start()
        _LIVE[model] = self
        self._atexit = weakref.WeakMethod(self._close_at_exit)
        atexit.register(_close_at_exit, self._atexit)
        print(f"nnwatch: watching {self.name} -> {self.run_dir}", file=sys.stderr)

    # ------------------------------------------------------------------------------------------
    # set-up
    def _param_device(self) -> torch.device:
        p = self.plan.params[0] if getattr(self, "plan", None) and self.plan.params else None
        if p is None:
            p = next(self.model.parameters(), None)
        if p is None:
            b = next(self.model.buffers(), None)
            return b.device if b is not None else torch.device("cpu")
        return p.device

    def _make_run_dir(self, run_dir: str | os.PathLike[str] | None) -> Path:
        if run_dir is not None:
            path = Path(run_dir).expanduser()
            if (path / "meta.json").exists():  # an earlier run's directory: never mix two logs
                n = 2
                while (path.parent / f"{path.name}-{n}").exists():
                    n += 1
                fresh = path.parent / f"{path.name}-{n}"
                self._warn_once(
                    "run-dir-reused",
                    f"{path} already holds a run; this one is written to {fresh} instead",
                )
                path = fresh
            return make_run_dir(path)  # never another user's directory, never a symlink
        root = ensure_private_dir(default_root())
        runs = ensure_private_dir(root / "runs")
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in self.name)[:40] or "run"
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self._started))
        suffix = f"-r{self.rank.rank}" if self.rank.world_size > 1 else ""
        base = f"{safe}-{stamp}-{os.getpid()}{suffix}"
        for n in range(1000):  # two watches of one name in the same second get -2, -3, ...
            path = runs / (base if n == 0 else f"{base}-{n + 1}")
            try:
                path.mkdir(mode=0o700)
                return path
            except FileExistsError:
                continue
        raise RunDirError(f"could not create a fresh run directory under {runs}")

    def _attach_hooks(self) -> None:
        """Hooks on the model (marked, so a saved or copied model leaves them out), on the
        parameters at both ends (one of them gets a gradient in any backward that reaches the
        model), on torch's clip functions and on the optimizer."""
        self._hidden_classes = hide_hooks(self.model)
        self._handles.append(
            self.model.register_forward_pre_hook(ProbeHook(self._on_forward_start), with_kwargs=True)
        )
        self._layer_hooks = [ProbeHook(self._make_layer_hook(i)) for i in range(len(self.plan.stat_modules))]
        self._arm_layer_hooks(True)
        params = self.plan.params
        self._hooked_params = []
        for p in dict.fromkeys((params[0], params[-1]) if params else ()):
            self._hooked_params.append((p, p._post_accumulate_grad_hooks is None))
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_backward))
        clip_intercept.listen(self.grads)
        OBSERVER.install()
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._before_optimizer_step))

    def _arm_layer_hooks(self, on: bool) -> None:
        """Attach the per-layer forward hooks for a measured step, detach them for a light one.

        A module with no hooks takes PyTorch's fast call path, so a light step costs the model
        nothing per layer (an idle hook costs a few microseconds per call on a cold CPU cache).
        """
        if on == bool(self._layer_handles):
            return
        if on:
            self._layer_handles = [
                m.register_forward_hook(fn) for m, fn in zip(self.plan.stat_modules, self._layer_hooks, strict=True)
            ]
        else:
            for h in self._layer_handles:
                h.remove()
            self._layer_handles = []

    def _refresh_views(self) -> None:
        """Per-layer statistics block, rebuilt when slots are reordered or the buffers move device."""
        b = self._buf
        self._stats = StatBlock(len(self._slots), b.dev.device, self.stat_cap)

    # ------------------------------------------------------------------------------------------
    # hooks (hot path: no host sync, no allocation that grows with the run)
    def _on_forward_start(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self._step_open or self.disabled or not torch.is_grad_enabled():
            return  # validation forwards (no_grad) neither open a step nor move its RNG capture
        t0 = time.perf_counter()
        try:
            self._step_open = True
            if self.guard:  # references only: the guard re-runs this forward if it goes bad
                self._inputs = (args, kwargs)
            if not self._measure and (self._snapshot_reason is not None or self._anomaly_left):
                self._measure = True  # a step someone will look at closely is measured in full
                self._arm_layer_hooks(True)
            first = self._first_param
            if first is not None and first.device != self._buf.device:
                dev = first.device
                self._buf.move_to(dev, self._publish)
                self.device = dev
                self._refresh_views()
            self._snapshot_armed = self._snapshot_reason is not None
            if self._snapshot_armed:
                self._rng_at_start = _capture_rng(full=True)
            elif self.guard and self._random_forward:
                # the guard may snapshot this step; its replay needs the RNG the forward drew from
                self._rng_at_start = _capture_rng(full=False)
            else:
                self._rng_at_start = None
        except Exception as exc:  # noqa: BLE001
            self._disable(f"internal error at forward start: {exc!r}")
        self._own += time.perf_counter() - t0

    def _make_layer_hook(self, i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            # the guard's re-run of a bad step's forward runs under no_grad and always measures
            if self._rerun:
                measure = True
            elif self.disabled or i in self._layers_off or not torch.is_grad_enabled():
                return
            else:
                measure = self._measure
                if not (measure or self._sampled):
                    return
            t0 = time.perf_counter()
            try:
                x = first_tensor(output)
                if x is not None:
                    if not self._finalized and i not in self._order:
                        self._order.append(i)
                    x = x.detach()
                    slot = self._slots[i]
                    total = None
                    if measure:
                        total = layer_sum(x)
                        earlier = self._sums[slot]
                        self._sums[slot] = total if earlier is None else earlier + total
                    if self._sampled:
                        self._stats.add(x, slot, total)
            except Exception as exc:  # noqa: BLE001 - never raise into the forward pass
                self._layer_failed(i, exc)
            self._own += time.perf_counter() - t0

        return hook

    def _on_backward(self, param: torch.Tensor) -> None:
        self._backward_seen = True
        if not self._end_queued and not self.disabled:
            self._end_queued = True  # the first of the hooked parameters in this backward
            try:
                _ENGINE.queue_callback(self._on_backward_end)
            except Exception:  # noqa: BLE001 - then the norm is taken at the update instead
                self._end_queued = False

    def _on_backward_end(self) -> None:
        """Autograd finished the backward pass: the gradients are complete and not yet clipped."""
        self._end_queued = False
        if self.disabled:
            return
        t0 = time.perf_counter()
        try:
            self.grads.measure = self._measure
            self.grads.on_backward_end()
        except Exception as exc:  # noqa: BLE001
            self._disable(f"internal error after backward: {exc!r}")
        self._own += time.perf_counter() - t0

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.disabled:
            return
        t0 = time.perf_counter()
        try:
            rec = self.grads
            rec.measure = self._measure
            total = rec.at_update()
            if total is None and self.guard and not sentinels_finite(self._sentinels):
                total = rec.measure_now()  # a bad step: look at every gradient after all
            if self._snapshot_armed and self._pre_state is None:
                self._pre_state = self._capture_state()
            if self.guard and total is not None and not rec.finite(total):
                self._on_guard_hit()
        except Exception as exc:  # noqa: BLE001
            self._disable(f"internal error before optimizer.step(): {exc!r}")
        self._own += time.perf_counter() - t0

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
        limit = self.grads.override if self.grads.override is not None else max_norm
        if self.disabled:
            if limit is None:
                return gradmath.global_norm(params, norm_type)
            return gradmath.clip_grad_norm_(params, limit, norm_type, error_if_nonfinite, foreach)
        total, present, norms = gradmath.param_grad_norms(params, norm_type, foreach)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
            )
        if limit is not None:
            gradmath.clip_grads_with_norm_(params, limit, total, foreach)
        try:
            b, rec = self._buf, self.grads
            tot32 = total.to(device=b.dev.device, dtype=torch.float32)
            b.slot("grad_norm").copy_(tot32)
            b.slot("nonfinite_grads").copy_(~torch.isfinite(tot32))
            if parameters is None and norms:
                self._reducer.write(torch.stack([n.float() for n in norms]), present, b.grad_layer, norm_type)
            if limit is not None:
                rec.record_clip(tot32, float(limit))
            rec.done, rec.total = True, tot32
        except Exception as exc:  # noqa: BLE001 - clipping happened; recording must not raise
            self._warn_once("clip-record", f"could not record the clip: {exc!r}")
        return total

    # ------------------------------------------------------------------------------------------
    # the step
    def step(self, loss: Any = None, batch: Any = None, batch_size: int | None = None) -> None:
        """Record one training step. Call it once per optimizer step, after ``optimizer.step()``.

        ``batch`` (kept for snapshots) also gives the samples/s; ``batch_size`` overrides the
        size found in it (for batches whose layout nnwatch cannot guess).
        """
        if self.disabled or self.closed:
            return
        t0 = time.perf_counter()
        try:
            self._step(loss, batch, batch_size, t0)
        except Exception as exc:  # noqa: BLE001 - training must never crash because of nnwatch
            self._disable(f"internal error in step(): {exc!r}")

    def _step(self, loss: Any, batch: Any, batch_size: int | None, t0: float) -> None:
        now = time.time()
        if not self._step_open and not self._backward_seen and self.step_index > self.start_step:
            self._warn_once(
                "double-step",
                "w.step() was called again with no forward or backward pass since the last call; "
                "the extra call is ignored (call it once per optimizer step)",
            )
            return
        b, rec = self._buf, self.grads
        self._record_loss(loss)
        rec.measure = self._measure
        if self.optimizer is None and self._backward_seen:
            rec.at_update()  # without an optimizer, w.step() is the update boundary
        elif not rec.done and self._measure:
            if self._backward_seen or not self.plan.params:
                rec.measure_now()
            elif self.plan.params:
                self._warn_once(
                    "no-backward",
                    "w.step() was called with no backward() since the previous step; gradient "
                    "norms are not recorded for such steps",
                )
        if self.scaler is not None:
            self._record_amp()
        dt = now - self._last_time
        bs = batch_size or self.batch_size
        if bs is None and batch is not None:
            bs = _batch_size(batch, self._seq_first)
        measured = self._measure and self._has_layers
        if measured:
            self._store_sums()
            measured = self._sums_stored  # a step whose forward ran no watched layer is not
        sampled = self._sampled and self._has_layers and self._stats.finish(b.act_stats)
        # the host block in schema order (asserted at import), written in one call: on a CPU whose
        # caches the step just flushed, every Python-level call costs tens of microseconds
        mem = self._cuda_memory(b.device, now) if b.on_cuda else _NO_CUDA
        sysmon = self._sysmon
        _HOST_PACK.pack_into(
            b.record_view,
            0,
            self.step_index,
            now,
            dt,
            bs / dt if bs and dt > 0 else math.nan,
            rec.threshold,
            1.0 if sampled else 0.0,
            *mem,
            sysmon.cpu_percent,
            sysmon.rss,
            1.0 if measured else 0.0,
        )
        if self.optimizer is not None:
            host = b.host
            off = _N_HOST
            for group in self.optimizer.param_groups[: self.schema.num_lr]:
                lr = group.get("lr", math.nan)
                if isinstance(lr, torch.Tensor):
                    lr = float(lr) if lr.device.type == "cpu" else math.nan
                host[off] = lr
                off += 1
        if not self._finalized:
            self._finalize()
        if self._snapshot_reason is not None and self._snapshot_armed:
            self._write_snapshot(batch)  # a request that came mid-step waits for the next one
        # a light step wrote only the loss (and AMP fields), which the next step overwrites
        b.commit(self._publish, reset=measured or sampled or rec.done or rec.clip_seen or loss is None)
        self._after_step(now, t0)

    def _cuda_memory(self, device: torch.device, now: float) -> tuple[float, float, float]:
        """Allocated, reserved and peak bytes, read at most every ``MEMORY_EVERY`` seconds.

        Each of ``torch.cuda.memory_allocated()``, ``memory_reserved()`` and
        ``max_memory_allocated()`` flattens the allocator's whole statistics tree in Python:
        measured on an H200, the three took 1.5 ms per step, most of a small model's step. One
        nested read (~30 us) a few times a second keeps the gauges current at no visible cost.
        """
        if now - self._memory_at >= MEMORY_EVERY:
            self._memory_at = now
            try:
                stats = torch.cuda.memory_stats_as_nested_dict(device)
                allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
                self._memory = (
                    float(allocated["current"]), float(reserved["current"]), float(allocated["peak"])
                )
            except Exception:  # noqa: BLE001 - a gauge, never a reason to stop
                self._memory = _NO_CUDA
        return self._memory

    def _record_loss(self, loss: Any) -> None:
        slot = self._buf.loss
        if loss is None:
            slot.fill_(math.nan)  # a light step does not reset the record: no stale loss
            return
        if isinstance(loss, torch.Tensor):
            if loss.dim() == 0:
                host = self._buf.dev_np
                if host is not None and loss.is_cpu:
                    host[_LOSS] = loss.item()  # a CPU scalar: no sync, cheaper than copy_
                else:
                    slot.copy_(loss.detach())  # the usual case on a GPU, in two calls
                return
            value = loss.detach()
            if value.numel() != 1:
                self._warn_once(
                    "loss-shape",
                    f"the loss passed to w.step() has shape {tuple(value.shape)}, not a scalar; "
                    "nnwatch records its mean (pass loss.mean() to silence this)",
                )
                value = value.float().mean()
            slot.copy_(value.reshape(()))
        else:
            try:
                slot.fill_(float(loss))
            except (TypeError, ValueError):
                self._warn_once(
                    "loss-type",
                    f"w.step() got a loss of type {type(loss).__name__}; pass the loss tensor",
                )

    def _record_amp(self) -> None:
        sc = self.scaler
        if sc is None or not getattr(sc, "is_enabled", lambda: False)():
            return
        scale = getattr(sc, "_scale", None)  # the tensor itself: get_scale() would sync
        if not isinstance(scale, torch.Tensor):
            return
        b = self._buf
        s = scale.detach().reshape(()).to(b.dev.device, torch.float32)
        b.slot("amp_scale").copy_(s)
        prev = getattr(self, "_prev_scale", None)
        if prev is None:
            init = float(getattr(sc, "_init_scale", math.inf) or math.inf)
            prev = self._prev_scale = torch.full((), init, device=b.dev.device)
        b.slot("amp_skipped").copy_(s < prev)  # the scale only drops when a step was skipped
        prev.copy_(s)

    def _store_sums(self) -> None:
        """This step's layer sums into the record: one stack instead of an add per layer."""
        sums = self._sums
        if not sums:
            return
        act_sum = self._buf.act_sum
        present = [t for t in sums if t is not None]
        if not present:
            return  # stored already (the guard's re-run), or no layer ran
        self._sums_stored = True
        if len(present) == len(sums):
            torch.stack(present, out=act_sum)
        else:  # a layer that was not called (or was switched off) sums to 0 on a measured step
            act_sum.zero_()
            for slot, t in enumerate(sums):
                if t is not None:
                    act_sum[slot].copy_(t)
        for slot in range(len(sums)):
            sums[slot] = None

    @property
    def layer_interval(self) -> int:
        """Full per-layer statistics are taken every this many steps (see ``budget``)."""
        return self.budget.layer_interval

    def _after_step(self, now: float, t0: float) -> None:
        measured = self._measure
        self._sums_stored = False
        self._inputs = None
        sampled = self._sampled
        first = self.step_index == self.start_step  # it also sets up the run files: not a step's cost
        step_time = now - self._last_time
        self._last_time = now
        self.step_index += 1
        self._step_open = False
        self._backward_seen = False
        self._snapshot_armed = False
        budget = self.budget
        self._sampled = self.step_index % budget.layer_interval == 0
        self._since_measured = 0 if measured else self._since_measured + 1
        self._measure = (
            (self._sampled and budget.measures_sampled_steps())
            or self.step_index < self._measure_until
            or self._since_measured + 1 >= budget.interval
            or self._snapshot_reason is not None
        )
        self.grads.end_step(self._measure)
        hooks = self._measure or self._sampled
        if hooks != bool(self._layer_handles) and self._has_layers and not self.disabled:
            self._arm_layer_hooks(hooks)
        if not first:  # the whole of this step's own work, hook attaching included
            budget.add(self._own + (time.perf_counter() - t0), step_time, measured, sampled)
        self._own = 0.0
        if self._anomaly_left > 0:
            self._anomaly_left -= 1
            if self._anomaly_left == 0 and self._anomaly_prev is not None:
                torch.autograd.set_detect_anomaly(self._anomaly_prev)
                self._anomaly_prev = None
        if self._channel is not None:
            self._channel.after_step(self)

    def _publish(self, record: memoryview) -> None:
        data = bytes(record)
        # the loss as published (on a GPU one step late, so reading it costs no sync): while it
        # spikes or climbs, every step is measured, so an explosion is never between two samples
        step = _STEP_FIELD.unpack_from(data, 0)[0]
        if self._loss_trend.add(int(step), _LOSS_FIELD.unpack_from(data, self.schema.host_size)[0]):
            self._measure_until = max(self._measure_until, int(step) + 2 + HOLD)
        if self._recent is not None:
            self._recent.append(data)
        if self._log is not None:
            self._log.put(data)
        if self._channel is not None:
            self._channel.publish(record)

    # ------------------------------------------------------------------------------------------
    # first step: layer order, run files, channel
    def _finalize(self) -> None:
        order = list(self._order) + [i for i in range(len(self.plan.stat_modules)) if i not in self._order]
        self._finalized = True
        if order != list(range(len(order))):
            self._buf.permute_layers(order)
            new_slot = [0] * len(order)
            for pos, reg in enumerate(order):
                new_slot[reg] = pos
            self._slots = new_slot
            self._refresh_views()
        names = tuple(self.plan.stat_names[i] for i in order)
        kinds = tuple(self.plan.stat_kinds[i] for i in order)
        self.schema = RunSchema(names, kinds, self.plan.param_layer_names, self.schema.num_lr)
        self._buf.schema = self.schema
        self.meta = RunMeta(
            name=self.name,
            schema=self.schema,
            pid=os.getpid(),
            host=socket.gethostname(),
            started=self._started,
            device=str(self.device),
            num_classes=self.num_classes,
            rank=self.rank.rank,
            local_rank=self.rank.local_rank,
            world_size=self.rank.world_size,
            nnwatch_version=__version__,
            torch_version=torch.__version__,
            extra={
                "argv": list(sys.argv),
                "cwd": os.getcwd(),
                "layer_interval": self.layer_interval,
                "resumed": self.resumed,
                "start_step": self.start_step,
                "tied": dict(self.plan.tied),
                "gpu_uuids": _gpu_uuids(self.device),
                **job_extra(),
            },
        )
        self._recent = deque(maxlen=RECENT_STEPS)
        try:
            self._log = RunLogWriter(self.run_dir, self.meta)
            self._log.on_error.append(self._on_log_error)
        except OSError as exc:
            self._disable(f"cannot write the run log in {self.run_dir}: {exc}")
            return
        if self._want_channel:  # before the detectors, so that a step-0 finding reaches monitors
            self._channel = _make_channel(self)
            if self._channel is not None:
                self._log.keep_within(self._channel.ring.slots)
                # a failed log shows in the ring header, so monitors say why history stopped
                self._log.on_error.append(self._channel.ring.set_log_error)
        if self._want_detectors:
            self._diagnosis = _make_diagnosis(self)
        if self._tensorboard is not None:
            from nnwatch.export.tensorboard import attach_live

            self._exporter = attach_live(self, self._tensorboard)

    # ------------------------------------------------------------------------------------------
    # commands from monitors, applied by the training thread at a step boundary
    def apply_command(self, name: str, args: dict[str, Any]) -> tuple[bool, str, int]:
        """Apply one validated command; returns (ok, error, step at which it takes effect)."""
        at = self.step_index
        if name == "set_clip":
            value = args.get("max_norm")
            self.grads.override = None if value is None else float(value)
        elif name == "set_layer_interval":
            self.budget.set_layer_interval(int(args["n"]))
        elif name == "anomaly":
            steps = max(1, int(args.get("steps", 1)))
            if self._anomaly_prev is None:
                self._anomaly_prev = torch.is_anomaly_enabled()
            torch.autograd.set_detect_anomaly(True)
            self._anomaly_left = steps
        elif name == "snapshot":
            from nnwatch.diagnosis.snapshot import preflight

            why = preflight(self)  # a full disk: say so now, not promise a snapshot
            if why:
                return False, why, at
            self.request_snapshot(str(args.get("reason", "requested")))
        elif name == "stop":
            self.should_stop = True
        elif name == "pause":
            self._paused = True
        elif name == "resume":
            self._paused = False
        else:
            return False, f"unknown command {name!r}", at
        self.log_event({"type": "command", "command": name, "args": args, "step": at})
        return True, "", at

    @property
    def clip_override(self) -> float | None:
        return self.grads.override

    @property
    def paused(self) -> bool:
        return self._paused

    # ------------------------------------------------------------------------------------------
    # snapshots and the non-finite guard
    def request_snapshot(self, reason: str = "requested") -> None:
        """Snapshot the next step: its batch, RNG, and the weights from before its update."""
        if self._snapshot_reason is None:
            self._snapshot_reason = reason

    def _capture_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": _to_cpu(self.model.state_dict())}
        if self.optimizer is not None:
            state["optimizer"] = _to_cpu(self.optimizer.state_dict())
            state["lr"] = [g.get("lr") for g in self.optimizer.param_groups]
        if self.scaler is not None and hasattr(self.scaler, "state_dict"):
            state["scaler"] = self.scaler.state_dict()
        return state

    def _on_guard_hit(self) -> None:
        self._measure_until = self.step_index + 1 + AFTER_TROUBLE  # watch what follows closely
        if not self._measure and self._has_layers:
            self._rerun_forward()
        if not self._guard_tripped:
            self._guard_tripped = True
            if not self._snapshot_armed:
                self._snapshot_reason = None  # a request that arrived mid-step gives way
            self.request_snapshot("nonfinite")
            self._snapshot_armed = True
            if self._pre_state is None:
                self._pre_state = self._capture_state()
        if self._diagnosis is not None:
            self._diagnosis.on_nonfinite_grads(self.step_index)
        if self.skip_nonfinite:
            for p in self.plan.params:
                p.grad = None  # optimizers skip parameters without a gradient
            self.log_event({"type": "skipped_step", "step": self.step_index, "reason": "nonfinite"})

    def _rerun_forward(self) -> None:
        """Run a bad unmeasured step's forward again with the layer hooks on, to find its origin.

        It runs before ``optimizer.step()``, so the weights are the ones that produced the NaN;
        the RNG is set to its state at the start of the step (when the model draws from it) and
        restored after, and buffers (BatchNorm's running stats) are put back, so the training run
        goes on exactly as it would have. A forward that has side effects of its own, or that ran
        under autocast, may not reproduce the NaN: its origin then stays unknown.
        """
        if self._inputs is None:
            return
        args, kwargs = self._inputs
        model = self.model
        rng = torch.get_rng_state()
        saved = [(b, b.detach().clone()) for b in model.buffers()]
        self._arm_layer_hooks(True)
        self._rerun = True
        try:
            if self._rng_at_start is not None:
                torch.set_rng_state(self._rng_at_start["torch"])
            with torch.no_grad():
                model(*args, **kwargs)
            self._measure = True  # this step's layer sums now exist: record them
        except Exception as exc:  # noqa: BLE001 - the origin is a nicety; the finding still comes
            self._warn_once("rerun", f"could not re-run the bad step's forward pass: {exc!r}")
            for i in range(len(self._sums)):
                self._sums[i] = None
        finally:
            self._rerun = False
            self._arm_layer_hooks(self._measure or self._sampled)
            torch.set_rng_state(rng)
            with torch.no_grad():
                for buf, value in saved:
                    buf.copy_(value)
        if self._measure:
            self._store_sums()  # the diagnosis reads them from the buffers right away

    def _write_snapshot(self, batch: Any) -> None:
        reason = self._snapshot_reason or "requested"
        self._snapshot_reason = None
        state = self._pre_state or self._capture_state()
        self._pre_state = None
        rng = self._rng_at_start or _capture_rng()
        try:
            from nnwatch.diagnosis.snapshot import write_snapshot
        except ImportError:
            self._warn_once("no-snapshot", "snapshots are not available in this build")
            return
        try:
            path = write_snapshot(self, reason=reason, state=state, rng=rng, batch=batch)
        except Exception as exc:  # noqa: BLE001 - a failed snapshot is a finding, never a crash
            self.log_event({"type": "snapshot_failed", "step": self.step_index, "error": str(exc)})
            self._warn_once("snapshot-failed", f"could not write the snapshot: {exc}")
            return
        self.log_event({"type": "snapshot", "step": self.step_index, "reason": reason, "path": str(path)})

    def recent_records(self) -> np.ndarray:
        """Up to the last 500 step records, oldest first (for snapshots and detectors)."""
        if not self._recent:
            return np.zeros(0)
        raw = b"".join(self._recent.copy())  # deque.copy() is atomic under the GIL
        rows = np.frombuffer(raw, dtype=self.schema.record_dtype()).copy()
        rows = rows[np.isfinite(rows["step"])]
        return rows[np.argsort(rows["step"], kind="stable")]

    # ------------------------------------------------------------------------------------------
    # events, findings, failures
    def log_event(self, event: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.event(event)
        if self._channel is not None:
            self._channel.event(event)

    def add_finding(self, finding: Any) -> None:
        """Called by the detectors: keep it, log it once, write it to events.jsonl."""
        self.findings.append(finding)
        d = finding.to_dict() if hasattr(finding, "to_dict") else dict(finding)
        self.log_event({"type": "finding", **d})
        log.warning("nnwatch: %s", getattr(finding, "message", None) or d.get("message") or d)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("nnwatch: %s", message)

    def _layer_failed(self, i: int, exc: BaseException) -> None:
        name = self.plan.stat_names[i]
        self._warn_once(f"layer-{i}", f"stopped watching layer {name!r} after an error: {exc!r}")
        self._layers_off.add(i)
        self._sums[self._slots[i]] = None

    def _on_log_error(self, message: str) -> None:
        self.findings.append({"kind": "nnwatch_error", "severity": "error", "message": message})

    def _disable(self, reason: str) -> None:
        if self.disabled is None:
            self.disabled = reason
            log.error("nnwatch: %s; training continues without it", reason)
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        self._arm_layer_hooks(False)
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles.clear()

        for param, was_none in getattr(self, "_hooked_params", ()):
            if was_none and not param._post_accumulate_grad_hooks:
                param._post_accumulate_grad_hooks = None  # leave the tensor exactly as it was
        self._hooked_params = []
        if getattr(self, "grads", None) is not None:
            clip_intercept.unlisten(self.grads)
        hidden = getattr(self, "_hidden_classes", None)
        if hidden:
            self._hidden_classes = []
            release_hooks(hidden)

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
        self._remove_hooks()
        if self._consistency is not None:
            self._consistency.close()  # reads a check still in flight while the log is open
        if self._anomaly_prev is not None:
            torch.autograd.set_detect_anomaly(self._anomaly_prev)
            self._anomaly_prev = None
        self._sysmon.stop()
        try:
            self._buf.flush(self._publish)
        except Exception:  # noqa: BLE001
            pass
        if self._diagnosis is not None:
            self._diagnosis.close()
        if self._log is not None:
            self._log.close(status, self.step_index, ending.to_dict())
        if self._exporter is not None:
            self._exporter.close()  # after the log's last drain reached it
        if self._channel is not None:
            # Once the log holds every record the ring is only a 16 MiB copy in RAM (/dev/shm):
            # remove it. Keep it when the log failed, since it may hold steps the log lacks.
            self._channel.close(
                "stopped" if status == "interrupted" else status,
                remove_ring=self._log is not None and self._log.error is None,
            )

    def __enter__(self) -> Watch:
        return self

    # ------------------------------------------------------------------------------------------
    # notebooks and REPLs
    def summary(self) -> RunSummary:
        """Name, status, steps, the last loss and grad norm, the findings: what a notebook shows."""
        rows = self.recent_records()
        names = rows.dtype.names or () if len(rows) else ()
        status = "running" if not self.closed else (self._ending_status or "finished")
        if self.disabled and not self.closed:
            status = f"off ({self.disabled})"
        return RunSummary(
            name=self.name, status=status, steps=self.step_index - self.start_step,
            loss=last_finite(rows["loss"]) if "loss" in names else None,
            grad_norm=last_finite(rows["grad_norm"]) if "grad_norm" in names else None,
            run_dir=str(self.run_dir),
            findings=[f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in self.findings],
        )

    def __repr__(self) -> str:
        return self.summary().text()

    def _repr_html_(self) -> str:
        return self.summary().html()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ending = from_exception(exc_type, exc)
        if ending.status == "crashed" and exc_type is not None and not issubclass(exc_type, SystemExit):
            self.log_event({"type": "error", "step": self.step_index, "error": repr(exc)})
        self.close(ending)

    def _close_at_exit(self) -> None:
        """The interpreter is exiting with the run still open: end it as the program ended."""
        self.close(OBSERVER.final())


#: The open watch of each model: watching a model again (a re-run notebook cell) ends the earlier
#: watch first, so hooks never stack and each model reports into one run.
_LIVE: weakref.WeakKeyDictionary[nn.Module, Watch] = weakref.WeakKeyDictionary()


def _take_over(model: nn.Module) -> None:
    """Close the earlier, still open watch of ``model``, saying so.

    It ended as "interrupted" when Ctrl-C stopped it in the middle of a step (what a notebook's
    interrupted cell leaves behind: IPython keeps that exception in ``sys.last_type``), else as
    finished.
    """
    earlier = _LIVE.get(model)
    if earlier is None or earlier.closed:
        return
    last = getattr(sys, "last_type", None)
    mid_step = earlier._step_open or earlier._backward_seen
    if mid_step and isinstance(last, type) and issubclass(last, KeyboardInterrupt):
        ending = Ending("interrupted", "KeyboardInterrupt (Ctrl-C) in the middle of a step")
    else:
        ending = Ending("finished", "a new watch of the same model took over")
    print(
        f"nnwatch: {model.__class__.__name__} was already watched ({earlier.name} -> "
        f"{earlier.run_dir}); that run ends as {ending.status}, the new watch takes over",
        file=sys.stderr,
    )
    earlier.close(ending)


def _close_at_exit(ref: weakref.WeakMethod[Any]) -> None:
    method = ref()
    if method is not None:
        try:
            method()
        except Exception:  # noqa: BLE001
            pass


def _make_diagnosis(w: Watch) -> Any:
    try:
        from nnwatch.diagnosis import Diagnosis
    except ImportError:
        return None
    try:
        diag = Diagnosis(w)
    except Exception as exc:  # noqa: BLE001
        w._warn_once("diagnosis", f"detectors are off: {exc!r}")
        return None
    if w._log is not None:
        w._log.observers.append(diag.observe)
    return diag


def _optimizer_has_state(optimizer: Any) -> bool:
    """Whether an optimizer has stepped before (Adam's moments, SGD's momentum buffers).

    Plain SGD keeps no state, so a resumed plain-SGD run is not recognised: a hint, not a proof.
    """
    try:
        return any(bool(v) for v in optimizer.state.values()) if optimizer is not None else False
    except Exception:  # noqa: BLE001 - an optimizer-like object without the usual state dict
        return False


def _optimizer_step(optimizer: Any) -> int:
    """How many steps an optimizer has taken (Adam's and most others' per-parameter ``step``).

    Read once, when the watch starts; 0 for a fresh optimizer or one that keeps no count.
    """
    try:
        counts = [
            int(state["step"]) for state in optimizer.state.values()
            if isinstance(state, dict) and "step" in state
        ] if optimizer is not None else []
    except Exception:  # noqa: BLE001 - an optimizer-like object with its own bookkeeping
        return 0
    return max(counts, default=0)


def _make_channel(w: Watch) -> Any:
    try:
        from nnwatch.probe.channel_link import ChannelLink
    except ImportError:
        return None
    try:
        return ChannelLink(w)
    except Exception as exc:  # noqa: BLE001 - a monitor is optional; training goes on without
        w._warn_once("channel", f"live monitoring is off: {exc!r}")
        return None


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
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
    budget: float | None = 0.01,
    max_interval: int = 32,
    batch_size: int | None = None,
    start_step: int | None = None,
) -> Watch:
    """Attach nnwatch to a model (and optionally its optimizer and AMP GradScaler).

    Use it as a context manager, or call ``close()`` at the end. ``optimizer`` may be None (a
    hand-written update): ``w.step()`` is then the step boundary. Gradient norms before and after
    clipping are recorded whoever clips: torch's ``clip_grad_norm_`` is seen directly (every
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
    compares a parameter checksum across ranks with one small async all-reduce every N steps.
    ``start_step`` numbers the first recorded step (by default 0, or the step count of an
    optimizer that already holds state: a resumed run goes on where it left off).
    The environment variable ``NNWATCH_DISABLE=1`` makes this an inert watch (no hooks, no files).
    """
    return Watch(
        model, optimizer, scaler, num_classes=num_classes, name=name, run_dir=run_dir,
        layer_interval=layer_interval, stat_cap=stat_cap, guard=guard,
        skip_nonfinite=skip_nonfinite, channel=channel, detectors=detectors,
        tensorboard=tensorboard, consistency_every=consistency_every, budget=budget,
        max_interval=max_interval, batch_size=batch_size, start_step=start_step,
    )
