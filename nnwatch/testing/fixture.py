"""A deterministic synthetic run, so that the monitor can be built, tested and benchmarked alone.

Every value is a function of the step index and the seed (noise comes from one seeded generator
per block of steps), so any slice of the run can be produced in any order and in any chunking, and
two sources with the same arguments agree byte for byte. Time comes from a fixed clock unless
``rate`` asks for real time. The run has what a dashboard must show: a one-step loss spike, a ReLU
layer that dies over the run, AMP overflows that halve the loss scale, gradient clipping, and the
detector findings, snapshots and commands that go with them. Nothing here imports a UI library.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import cast

import numpy as np

from nnwatch.sources.base import RunSource, SourceError, SourceStatus, SourceUpdate
from nnwatch.store.events import Event
from nnwatch.store.paths import ensure_private_dir
from nnwatch.store.runlog import END_FILE, LAYERS_FILE, SCALARS_FILE, RunLogWriter
from nnwatch.store.schema import SCHEMA_VERSION, FieldName, RunMeta, RunSchema, sums_measured
from nnwatch.testing.fixture_events import DYING_LAYER, fixture_events

#: The fixed clock: every fixture run starts at this Unix time unless it runs in real time.
FIXED_START = 1_700_000_000.0
_BLOCK = 1024

LAYERS: tuple[tuple[str, str], ...] = (
    ("embed", "Embedding"),
    ("blocks.0.fc1", "Linear"),
    ("blocks.0.act", "ReLU"),
    ("blocks.0.fc2", "Linear"),
    ("blocks.1.fc1", "Linear"),
    ("blocks.1.act", "ReLU"),
    ("blocks.1.fc2", "Linear"),
    ("blocks.2.fc1", "Linear"),
    ("blocks.2.act", "ReLU"),
    ("blocks.2.fc2", "Linear"),
    ("norm", "LayerNorm"),
    ("head", "Linear"),
)
UPDATE_KINDS = ("healthy", "rounded")
LR_PEAK = 3e-4
FIXTURE_GPU_UUID = "GPU-5e1f0c2a-7b3d-4e8f-9a61-0d2c4b6e8f10"


class FixtureSource(RunSource):
    """A synthetic run of ``steps`` steps (``None``: endless), delivered as a live run would be.

    ``steps_per_poll=None`` delivers the whole run on the first poll (like a recorded run);
    an int delivers that many steps per poll; ``rate`` (steps per second) follows the wall clock.
    After the last step the state becomes ``end_state`` ("finished", "crashed", "hung", "lost").
    ``fail_on_poll=n`` makes the n-th poll raise ``SourceError``, as an unreachable run would.
    ``num_lr=0`` is a run watched with ``optimizer=None`` (a hand-written update: no LR groups);
    ``layers`` replaces the model's (name, kind) layers, ``()`` for a model with none watched;
    ``grad_every=k`` measures gradient norms (and layer output sums) on every k-th step only, as
    the probe's cost budget does: NaN (not measured) on the others, with ``layer_sums`` 0.0.
    ``updates``: what the measured updates did, ``"healthy"`` or ``"rounded"`` (``update_layers``);
    ``schema_version=3``: a run as nnwatch wrote it before updates were recorded.
    """

    def __init__(
        self,
        steps: int | None = 3000,
        *,
        seed: int = 0,
        steps_per_poll: int | None = None,
        rate: float | None = None,
        layer_every: int = 10,
        end_state: str = "finished",
        name: str = "fixture-mlp",
        num_classes: int | None = 10,
        amp: bool = True,
        cuda: bool = True,
        spike_at: float = 0.45,
        fail_on_poll: int | None = None,
        num_lr: int = 1,
        layers: tuple[tuple[str, str], ...] = LAYERS,
        grad_every: int = 1,
        updates: str = "healthy",
        schema_version: int = SCHEMA_VERSION,
    ) -> None:
        if updates not in UPDATE_KINDS:
            raise ValueError(f"updates must be one of {UPDATE_KINDS}, not {updates!r}")
        self.updates = updates
        self.steps = steps
        self.seed = seed
        self.steps_per_poll = steps_per_poll
        self.rate = rate
        self.layer_every = max(1, layer_every)
        self.end_state = end_state
        self.amp = amp
        self.cuda = cuda
        self.fail_on_poll = fail_on_poll
        self.grad_every = max(1, int(grad_every))
        self.horizon = steps if steps else 10_000
        self.spike_step = int(self.horizon * spike_at)
        self.halving_steps = tuple(
            sorted({int(self.horizon * f) for f in (0.12, 0.3)} | {self.spike_step})
        )
        self.dead_step = int(self.horizon * 0.7)  # the dying layer crosses 80% dead about here
        self.clip = 1.0
        self._polls = 0
        self._next = 0
        self._events_sent = 0
        self._closed = False
        self._t0 = time.time() if rate else FIXED_START
        self._wall0 = time.monotonic()
        self._meta = _fixture_meta(
            name, layers, num_lr=num_lr, schema_version=schema_version, started=self._t0 - 2.0,
            cuda=cuda, num_classes=num_classes,
        )  # fmt: skip
        # lines as an older nnwatch wrote them (findings without a "type", a command's "name"):
        # every monitor that reads the fixture reads that format too
        events = fixture_events(
            self.halving_steps, self.spike_step, self.dead_step, self.steps,
            lambda h: float(self._amp_scale(np.array([h - 1.0]))[0]),
        )  # fmt: skip
        self._events = [Event.from_json(e) for e in events]

    def events(self) -> list[Event]:
        """Every event of the run, in step order."""
        return list(self._events)

    # -- RunSource ---------------------------------------------------------------------------
    @property
    def meta(self) -> RunMeta:
        return self._meta

    def poll(self) -> SourceUpdate:
        if self._closed:
            raise SourceError("the fixture source is closed")
        self._polls += 1
        if self.fail_on_poll is not None and self._polls == self.fail_on_poll:
            raise SourceError("fixture: the run cannot be reached (simulated)")
        stop = self._target()
        start = self._next
        self._next = stop
        scalars = self.scalar_rows(start, stop)
        layers = self.layer_rows(start, stop)
        events = [e for e in self._events if e.step is not None and start <= e.step < stop]
        done = self.steps is not None and stop >= self.steps
        state = self.end_state if done else "live"
        status = SourceStatus(
            state=state,
            heartbeat_age=0.0 if state == "live" else None,
            message={"lost": "trainer pid 4242 is gone", "hung": "no heartbeat for 30 s"}.get(
                state, ""
            ),
        )
        return SourceUpdate(scalars=scalars, layers=layers, events=events, status=status)

    def close(self) -> None:
        self._closed = True

    # -- synthetic data ----------------------------------------------------------------------
    def _target(self) -> int:
        if self.rate:
            stop = int((time.monotonic() - self._wall0) * self.rate)
        elif self.steps_per_poll:
            stop = self._next + self.steps_per_poll
        else:
            stop = self.steps if self.steps is not None else self._next + 1000
        return stop if self.steps is None else min(stop, self.steps)

    def _noise(self, start: int, stop: int, kind: int) -> np.ndarray:
        """Standard normal noise for steps [start, stop), the same however the range is cut."""
        if stop <= start:
            return np.zeros(0)
        b0, b1 = start // _BLOCK, (stop - 1) // _BLOCK + 1
        blocks = [
            np.random.default_rng([self.seed, kind, b]).standard_normal(_BLOCK)
            for b in range(b0, b1)
        ]
        return np.concatenate(blocks)[start - b0 * _BLOCK : stop - b0 * _BLOCK]

    def _amp_scale(self, s: np.ndarray) -> np.ndarray:
        """GradScaler's scale: 2^16, doubling every 2000 clean steps (up to 2^24), halved at
        each overflow. Worked out in log2, so a 10M-step run cannot overflow."""
        exp = np.full(s.shape, 16.0)
        last = np.zeros(s.shape)
        for h in self.halving_steps:
            after = s >= h
            grown = np.floor((np.minimum(s, h) - last) / 2000.0)
            exp = np.where(after, np.minimum(exp + grown, 24.0) - 1.0, exp)
            last = np.where(after, h, last)
        grown = np.floor((s - last) / 2000.0)
        return cast("np.ndarray", 2.0 ** np.minimum(exp + grown, 24.0))

    def scalar_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows of ``scalar_dtype()`` for steps [start, stop)."""
        dt = self.meta.schema.scalar_dtype()
        n = max(0, stop - start)
        out = np.zeros(n, dtype=dt)
        if n == 0:
            return out
        s = np.arange(start, stop, dtype=np.float64)
        frac = s / self.horizon
        k = self.meta.num_classes or 10
        z = self._noise(start, stop, 1)
        loss = (
            0.32 + (math.log(k) - 0.32) * np.exp(-frac * 6.0) + 0.05 * z * (0.4 + np.exp(-frac * 3))
        )
        loss = np.where(s == self.spike_step, loss * 6.5, loss)
        loss = np.where(s == self.spike_step + 1, loss * 2.0, loss)
        gz = self._noise(start, stop, 2)
        gnorm = 0.55 * np.exp(0.25 * gz) * (1.0 + 0.8 * np.exp(-frac * 8.0))
        gnorm = np.where(s == self.spike_step, 38.0, gnorm)
        period = 1.0 / (self.rate or 20.0)
        tz = self._noise(start, stop, 3)
        out[FieldName.STEP] = s
        out[FieldName.TIME] = self._t0 + s * period + 0.1 * period * tz
        out[FieldName.STEP_TIME] = period * (1.0 + 0.05 * np.abs(tz))
        out[FieldName.SAMPLES_PER_SEC] = 64.0 / out[FieldName.STEP_TIME]
        out[FieldName.CLIP_THRESHOLD] = self.clip
        out[FieldName.LAYER_STATS] = (s.astype(np.int64) % self.layer_every == 0).astype(np.float64)
        measured = self._grad_measured(s)
        out[FieldName.LAYER_SUMS] = measured.astype(np.float64)  # 0.0: sums not measured at this step
        if self.cuda:
            out[FieldName.CUDA_ALLOCATED] = 3.1e9 + 0.2e9 * (np.sin(s / 7.0) > 0)
            out[FieldName.CUDA_RESERVED] = 4.0e9
            out[FieldName.CUDA_PEAK] = 3.6e9
        else:
            out[FieldName.CUDA_ALLOCATED] = out[FieldName.CUDA_RESERVED] = out[FieldName.CUDA_PEAK] = np.nan
        out[FieldName.CPU_PERCENT] = 97.0 + 2.0 * np.sin(s / 50.0)
        out[FieldName.RSS] = 2.1e9 + 1e6 * frac
        lr = lr_schedule(s, self.horizon)
        for group in range(self.meta.schema.num_lr):  # none for a run without an optimizer
            out[FieldName.LR][:, group] = lr * (0.1**group)
        out[FieldName.LOSS] = loss
        out[FieldName.GRAD_NORM] = gnorm
        out[FieldName.GRAD_NORM_CLIPPED] = np.minimum(gnorm, self.clip)
        out[FieldName.CLIPPED] = (gnorm > self.clip).astype(np.float32)
        if self.amp:
            skipped = np.isin(s, self.halving_steps)
            out[FieldName.AMP_SCALE] = self._amp_scale(s)
            out[FieldName.AMP_SKIPPED] = skipped.astype(np.float32)
            out[FieldName.NONFINITE_GRADS] = skipped.astype(np.float32)
            out[FieldName.GRAD_NORM] = np.where(skipped & (s != self.spike_step), np.inf, out[FieldName.GRAD_NORM])
        else:
            out[FieldName.AMP_SCALE] = np.nan
            out[FieldName.AMP_SKIPPED] = np.nan
            out[FieldName.NONFINITE_GRADS] = 0.0
        if self.grad_every > 1:  # the cost budget skipped these steps: not measured, not zero
            for name in (FieldName.GRAD_NORM, FieldName.GRAD_NORM_CLIPPED, FieldName.CLIPPED):
                out[name] = np.where(measured, out[name], np.nan)
        if FieldName.UPDATE_FROZEN in (dt.names or ()):
            update_scalars(out, self._updated(s), frac, self.updates == "rounded")
        return out

    def _updated(self, s: np.ndarray) -> np.ndarray:
        """Steps whose update was measured: the measured ones the AMP scaler did not skip."""
        skipped = np.isin(s, self.halving_steps) if self.amp else np.zeros(s.shape, dtype=bool)
        return cast("np.ndarray", self._grad_measured(s) & ~skipped)

    def _grad_measured(self, s: np.ndarray) -> np.ndarray:
        """Steps whose gradient norms were measured: every ``grad_every``-th, and the spike."""
        return cast("np.ndarray", (s.astype(np.int64) % self.grad_every == 0) | (s == self.spike_step))

    def layer_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows of ``layer_row_dtype()`` for [start, stop), chosen as the run log chooses them:
        steps whose stats were sampled, or whose gradients or outputs held a non-finite value."""
        block = self.layer_block(start, stop)
        scal = self.scalar_rows(start, stop)
        keep = (
            (scal[FieldName.LAYER_STATS] == 1.0)
            | (scal[FieldName.NONFINITE_GRADS] == 1.0)
            | (~np.isfinite(block[FieldName.ACT_SUM]).all(axis=1) & sums_measured(scal))
        )
        out = np.zeros(int(keep.sum()), dtype=self.meta.schema.layer_row_dtype())
        for name in block.dtype.names or ():
            out[name] = block[name][keep]
        out[FieldName.STEP] = scal[FieldName.STEP][keep].astype(np.int64)
        return out

    def records(self, start: int, stop: int) -> np.ndarray:
        """Whole step records (``record_dtype()``), as the probe hands them to the run log."""
        out = np.zeros(max(0, stop - start), dtype=self.meta.schema.record_dtype())
        for part in (self.scalar_rows(start, stop), self.layer_block(start, stop)):
            for name in part.dtype.names or ():
                out[name] = part[name]
        return out

    def layer_block(self, start: int, stop: int) -> np.ndarray:
        """The per-layer block of every step in [start, stop): ``act_sum`` always, the other
        activation stats only on sampled steps (NaN elsewhere: not measured)."""
        schema = self.meta.schema
        s = np.arange(start, stop, dtype=np.int64)
        out = np.zeros(len(s), dtype=schema.layer_dtype())
        if len(s) == 0:
            return out
        sampled = ((s % self.layer_every == 0) | (s == self.spike_step))[:, None]
        L, P = schema.num_layers, schema.num_param_layers
        frac = (s / self.horizon)[:, None]
        z = self._noise(start, stop, 4)[:, None]
        depth = np.linspace(0.0, 1.0, L)[None, :]
        kinds = np.array(schema.layer_kinds, dtype=str)
        relu = (kinds == "ReLU")[None, :]
        dying = (np.array(schema.layer_names, dtype=str) == DYING_LAYER)[None, :]
        zero = np.where(relu, 0.42 + 0.08 * depth + 0.01 * z, 0.0)
        die = 1.0 / (1.0 + np.exp(-(frac - self.dead_step / self.horizon + 0.08) * 25.0))
        zero = np.where(dying, 0.45 + 0.52 * die, zero)
        std = (0.9 - 0.3 * depth) * (1.0 + 0.02 * z) * np.where(dying, 1.0 - 0.85 * die, 1.0)
        spike = (s == self.spike_step)[:, None]
        maxabs = std * (4.0 + 0.2 * z) * np.where(spike, 40.0, 1.0)
        mean = 0.05 * z * np.ones((1, L))
        nan = np.float32(np.nan)
        out[FieldName.ACT_ZERO] = np.where(sampled, zero, nan)
        out[FieldName.ACT_STD] = np.where(sampled, std, nan)
        out[FieldName.ACT_MEAN] = np.where(sampled, mean, nan)
        out[FieldName.ACT_MAXABS] = np.where(sampled, maxabs, nan)
        out[FieldName.ACT_NONFINITE] = np.where(sampled, np.where(spike & (depth > 0.85), 17.0, 0.0), nan)
        out[FieldName.ACT_SUM] = np.where(spike & (depth > 0.85), np.inf, mean * 4096.0)
        gdepth = np.linspace(0.0, 1.0, P)[None, :]
        g = 0.05 * (1.0 + gdepth) * (1.0 + 0.1 * z) * np.where(spike, 60.0, 1.0)
        measured = self._grad_measured(s)[:, None]
        out[FieldName.GRAD_LAYER] = np.where(measured, g, nan)
        out[FieldName.ACT_SUM] = np.where(measured, out[FieldName.ACT_SUM], nan)
        if FieldName.UPDATE_LAYER in (out.dtype.names or ()):
            f = s.astype(np.float64)
            lr = lr_schedule(f, self.horizon)[:, None] / LR_PEAK
            update_layers(out, self._updated(f)[:, None], frac, z, gdepth, lr, self.updates == "rounded")
        return out


def _fixture_meta(
    name: str,
    layers: tuple[tuple[str, str], ...],
    *,
    num_lr: int,
    schema_version: int,
    started: float,
    cuda: bool,
    num_classes: int | None,
) -> RunMeta:
    """The fixture run's description, as a probe would record it for this model on one host
    (its schema names the layers; a parameterless ReLU has no gradient)."""
    schema = RunSchema(
        layer_names=tuple(n for n, _ in layers),
        layer_kinds=tuple(k for _, k in layers),
        param_layer_names=tuple(n for n, k in layers if k != "ReLU"),
        num_lr=max(0, int(num_lr)),
        version=schema_version,
    )
    return RunMeta(
        name=name,
        schema=schema,
        pid=4242,
        host="gpu-node-07",
        started=started,
        device="cuda:0" if cuda else "cpu",
        num_classes=num_classes,
        nnwatch_version="fixture",
        torch_version="fixture",
        extra={"gpu_uuids": [FIXTURE_GPU_UUID]} if cuda else {},
    )


def lr_schedule(s: np.ndarray, horizon: int) -> np.ndarray:
    """Group 0's LR: a linear warm-up over the first 5%, then a cosine to 0."""
    frac = s / horizon
    warm = np.minimum(1.0, (s + 1) / (0.05 * horizon))
    return cast("np.ndarray", LR_PEAK * warm * 0.5 * (1 + np.cos(np.pi * np.minimum(frac, 1.0))))


def update_scalars(out: np.ndarray, updated: np.ndarray, frac: np.ndarray, rounded: bool) -> None:
    """The run-level update fields of scalar rows: NaN where no update was measured."""
    run_level: dict[str, float | np.ndarray] = {
        FieldName.UPDATE_FROZEN: 0.62 if rounded else 0.0,
        FieldName.PARAMS_NO_GRAD: 0.0,
        FieldName.PARAMS_UNOPTIMIZED: 0.0,
        FieldName.WEIGHT_DRIFT: (0.02 if rounded else 1.5) * np.sqrt(frac),
    }
    for name, value in run_level.items():
        out[name] = np.where(updated, value, np.nan)


def update_layers(
    out: np.ndarray,
    updated: np.ndarray,
    frac: np.ndarray,
    z: np.ndarray,
    depth: np.ndarray,
    lr: np.ndarray,
    rounded: bool,
) -> None:
    """What each measured update did to the weights (``lr`` as a share of its peak): weight norms
    that grow a little over the run, update/weight ratios about 1e-3 that follow the LR (deeper
    layers a little lower); NaN on steps not measured and on the steps the scaler skipped.
    ``rounded``: bf16 weights and a tiny LR, where most of each update rounds away."""
    weight = 6.0 * (1.0 + depth) * (1.0 + 0.1 * frac)
    ratio = 2e-3 * (0.3 + 0.7 * lr) * (1.2 - 0.6 * depth) * np.exp(0.1 * z)
    frozen = np.zeros_like(ratio)
    if rounded:
        ratio = ratio * 10.0 ** (-2.0 - 2.5 * depth)
        frozen = (0.45 + 0.5 * depth) * np.ones_like(ratio)
        ratio = np.where(depth >= 1.0, 0.0, ratio)  # the last layer: every update rounds away
        frozen = np.where(depth >= 1.0, 1.0, frozen)
    nan = np.float32(np.nan)
    out[FieldName.WEIGHT_LAYER] = np.where(updated, weight, nan)
    out[FieldName.UPDATE_LAYER] = np.where(updated, ratio * weight, nan)
    out[FieldName.FROZEN_LAYER] = np.where(updated, frozen, nan)


def write_run(
    source: FixtureSource,
    run_dir: str | Path,
    *,
    bulk: bool = False,
    chunk: int = 262_144,
) -> Path:
    """Write the fixture's whole run as a run log in ``run_dir`` (which must not exist yet).

    The default path goes through ``RunLogWriter`` record by record, exactly as a trainer's log
    is written. ``bulk=True`` appends rows in large blocks (the documented file layout: a header,
    then fixed-size rows) for benchmark runs of millions of steps. A fixture whose ``end_state``
    is "crashed" gets no ``end.json``, as a killed trainer leaves none.
    """
    if source.steps is None:
        raise ValueError("an endless fixture cannot be written; give it a number of steps")
    run_dir = ensure_private_dir(Path(run_dir))
    steps = source.steps
    writer = RunLogWriter(run_dir, source.meta)
    for ev in source.events():
        writer.events.event(ev)
    if not bulk:
        for start in range(0, steps, chunk):
            for rec in source.records(start, min(steps, start + chunk)):
                writer.put(rec.tobytes())
    writer.close("finished", steps)
    if source.end_state == "crashed":
        (run_dir / END_FILE).unlink()  # a killed trainer never writes it
    if bulk:
        with open(run_dir / SCALARS_FILE, "ab") as fs, open(run_dir / LAYERS_FILE, "ab") as fl:
            for start in range(0, steps, chunk):
                stop = min(steps, start + chunk)
                fs.write(source.scalar_rows(start, stop).tobytes())
                fl.write(source.layer_rows(start, stop).tobytes())
    return run_dir
