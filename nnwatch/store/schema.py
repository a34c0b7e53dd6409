"""The step record: one fixed-size binary layout shared by the probe, the ring, the log and readers.

A record is three contiguous blocks, so that the probe can fill the last two with one device copy:

    host   float64 fields the training thread sets from Python (step, time, LR, memory, ...)
    dev    float64 scalars computed on the device (loss, grad norms, AMP scale, ...): a float64
           model's loss of 5e40 is stored as 5e40 (float32 in runs of schema 3 and older)
    layers float32 per-layer arrays (activation stats, per-layer gradient, weight and update
           norms); a finite value beyond float32's range is saturated at its largest value

NaN means "not measured" everywhere, never zero: a run without a scaler has a NaN ``amp_scale``.
The layout is described in ``meta.json`` so that any reader can rebuild it without importing torch.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Final, cast

import numpy as np

from nnwatch.store import clean_text

SCHEMA_VERSION = 4
# 2 added "layer_sums"; 3 added "grads_kept" and "act_dead"; 4 made the device scalars float64 and
# added what each update did (the update fields below) and the batch's label entropy

class FieldName:
    """Every field of the step record, named once: code elsewhere writes ``FieldName.GRAD_NORM``,
    never the bare string, so that a field is found, renamed or removed in one place
    (``tests/unit/test_field_names.py`` holds the package to it). What each field holds is said
    where the layout lists it, below."""

    STEP: Final = "step"
    TIME: Final = "time"
    STEP_TIME: Final = "step_time"
    SAMPLES_PER_SEC: Final = "samples_per_sec"
    CLIP_THRESHOLD: Final = "clip_threshold"
    LAYER_STATS: Final = "layer_stats"
    CUDA_ALLOCATED: Final = "cuda_allocated"
    CUDA_RESERVED: Final = "cuda_reserved"
    CUDA_PEAK: Final = "cuda_peak"
    CPU_PERCENT: Final = "cpu_percent"
    RSS: Final = "rss"
    LAYER_SUMS: Final = "layer_sums"
    GRADS_KEPT: Final = "grads_kept"
    PARAMS_NO_GRAD: Final = "params_no_grad"
    PARAMS_UNOPTIMIZED: Final = "params_unoptimized"
    LOSS: Final = "loss"
    GRAD_NORM: Final = "grad_norm"
    GRAD_NORM_CLIPPED: Final = "grad_norm_clipped"
    CLIPPED: Final = "clipped"
    AMP_SCALE: Final = "amp_scale"
    AMP_SKIPPED: Final = "amp_skipped"
    NONFINITE_GRADS: Final = "nonfinite_grads"
    UPDATE_FROZEN: Final = "update_frozen"
    LABEL_ENTROPY: Final = "label_entropy"
    LABEL_MEAN: Final = "label_mean"
    LABEL_VAR: Final = "label_var"
    WEIGHT_DRIFT: Final = "weight_drift"
    ACT_MEAN: Final = "act_mean"
    ACT_STD: Final = "act_std"
    ACT_ZERO: Final = "act_zero"
    ACT_NONFINITE: Final = "act_nonfinite"
    ACT_MAXABS: Final = "act_maxabs"
    ACT_DEAD: Final = "act_dead"
    ACT_ROWS: Final = "act_rows"
    ACT_SUM: Final = "act_sum"
    GRAD_LAYER: Final = "grad_layer"
    WEIGHT_LAYER: Final = "weight_layer"
    UPDATE_LAYER: Final = "update_layer"
    FROZEN_LAYER: Final = "frozen_layer"
    LR: Final = "lr"


_F = FieldName  # the short name, in this module only

HOST_FIELDS: tuple[str, ...] = (
    _F.STEP,  # 0-based index of the optimizer step this record describes
    _F.TIME,  # wall-clock time (time.time()) when w.step() was called
    _F.STEP_TIME,  # seconds since the previous w.step()
    _F.SAMPLES_PER_SEC,  # batch size / step_time, when the batch size is known
    _F.CLIP_THRESHOLD,  # max_norm of the last clip, NaN when the step was not clipped
    _F.LAYER_STATS,  # 1.0 when per-layer activation stats were sampled on this step
    _F.CUDA_ALLOCATED,  # torch.cuda.memory_allocated() in bytes (read at most every 0.2 s)
    _F.CUDA_RESERVED,  # torch.cuda.memory_reserved() in bytes (likewise)
    _F.CUDA_PEAK,  # torch.cuda.max_memory_allocated() in bytes (likewise)
    _F.CPU_PERCENT,  # process CPU use in percent of one core, sampled at ~1 Hz
    _F.RSS,  # process resident memory in bytes, sampled at ~1 Hz
    _F.LAYER_SUMS,  # 1.0 when layer output sums and gradient norms were measured, 0.0 when the
    # step was left out to keep nnwatch within its cost budget (NaN in older runs: measured)
    _F.GRADS_KEPT,  # 1.0 when this step's first backward found the previous update's gradients
    # still there, untouched (no zero_grad() between two updates), 0.0 when they were cleared,
    # NaN when not observed (the first step, a closure optimizer)
    _F.PARAMS_NO_GRAD,  # measured updates: the share of the optimizer's trainable elements that
    # have had no gradient at any measured update so far (the optimizer holds them, backward
    # never reaches them)
    _F.PARAMS_UNOPTIMIZED,  # measured updates: the share of the model's elements that got a
    # gradient but are in no parameter group of the optimizer (nothing ever updates them)
)
DEV_FIELDS: tuple[str, ...] = (
    _F.LOSS,  # the loss passed to w.step()
    _F.GRAD_NORM,  # global L2 norm of the gradients before clipping
    _F.GRAD_NORM_CLIPPED,  # global norm after clipping (NaN if no clip was called)
    _F.CLIPPED,  # 1.0 when clipping scaled the gradients down, 0.0 when not, NaN if no clip
    _F.AMP_SCALE,  # GradScaler scale after this step's update
    _F.AMP_SKIPPED,  # 1.0 when the scaler skipped optimizer.step() (its scale went down)
    _F.NONFINITE_GRADS,  # 1.0 when any gradient held NaN or Inf
    _F.UPDATE_FROZEN,  # measured updates: the share of the optimizer's sampled elements with a
    # non-zero gradient that the update left bit for bit unchanged (updates that round away)
    _F.LABEL_ENTROPY,  # measured steps of a classifier: the entropy (nats) of the batch's labels
    _F.LABEL_MEAN,  # ... the mean and the variance of the batch's class indices: over many batches,
    _F.LABEL_VAR,  # the share of the labels' variance between batches shows a data order
    _F.WEIGHT_DRIFT,  # measured updates: how far the weights are from where the first measured
    # update found them, ||w - w_start|| (from the same samples as the update norms)
)
LAYER_FIELDS_ACT: tuple[str, ...] = (
    _F.ACT_MEAN,
    _F.ACT_STD,
    _F.ACT_ZERO,  # fraction of outputs exactly zero (dead-ReLU sparsity)
    _F.ACT_NONFINITE,  # count of NaN/Inf outputs
    _F.ACT_MAXABS,
    _F.ACT_DEAD,  # rectifier layers: fraction of units that are zero for every input of the batch
)
#: On measured steps (schema 4): how many rows (the leading dimension) each layer's outputs had
#: over the step's forward; 0 for a layer that did not run (an expert no token was routed to, a
#: branch not taken), NaN on steps not measured.
ACT_ROWS_FIELD = _F.ACT_ROWS
#: The per-step series the charts draw, kept whole-run as min/max buckets by every monitor (the
#: TUI's history) and every live stream (the server's live aggregate): one list, one owner.
CHART_FIELDS: tuple[str, ...] = (
    _F.STEP,
    _F.LOSS,
    _F.GRAD_NORM,
    _F.GRAD_NORM_CLIPPED,
    _F.CLIP_THRESHOLD,
    _F.AMP_SCALE,
    _F.AMP_SKIPPED,
)
#: Per parameter-owning layer, on measured updates (schema 4): what the optimizer did to the
#: weights, beside ``grad_layer``. ``weight_layer`` is the L2 norm of the layer's parameters
#: after the update; ``update_layer`` the norm of (after - before), from a fixed sample of each
#: large parameter scaled to its size; ``frozen_layer`` the share of those sampled elements with a
#: non-zero gradient that the update left bit for bit unchanged. NaN where the layer was not updated (no optimizer step, a
#: skipped AMP step, a step not measured).
LAYER_FIELDS_UPDATE: tuple[str, ...] = (_F.WEIGHT_LAYER, _F.UPDATE_LAYER, _F.FROZEN_LAYER)
#: Fields that a schema version added, so that older runs keep their own layout.
_ADDED_IN = {
    _F.LAYER_SUMS: 2, _F.GRADS_KEPT: 3, _F.ACT_DEAD: 3, _F.PARAMS_NO_GRAD: 4,
    _F.PARAMS_UNOPTIMIZED: 4, _F.UPDATE_FROZEN: 4, _F.LABEL_ENTROPY: 4, _F.LABEL_MEAN: 4, _F.LABEL_VAR: 4, _F.WEIGHT_DRIFT: 4, _F.WEIGHT_LAYER: 4,
    _F.UPDATE_LAYER: 4, _F.FROZEN_LAYER: 4, ACT_ROWS_FIELD: 4,
}  # fmt: skip
#: The first schema whose device scalars are float64.
WIDE_SCALARS = 4


def fields_of(fields: tuple[str, ...], version: int) -> tuple[str, ...]:
    """``fields`` as a run of schema ``version`` has them."""
    return tuple(f for f in fields if _ADDED_IN.get(f, 1) <= version)

#: On measured steps (``layer_sums`` is not 0): the float32 sum of each layer's output. A
#: non-finite sum means the output held a NaN or Inf, which is how the first bad layer is found on
#: steps whose full stats were not sampled. NaN on steps that were not measured.
ACT_SUM_FIELD = _F.ACT_SUM
#: On measured steps: the gradient norm of each parameter-owning layer. NaN means the layer had no
#: gradient (or the step was not measured); +Inf means its gradient held NaN or Inf (so the two
#: never look alike).
GRAD_LAYER_FIELD = _F.GRAD_LAYER
#: The per-layer fields indexed by parameter-owning layer (``param_layer_names``), not by watched
#: layer (``layer_names``).
PARAM_LAYER_FIELDS: tuple[str, ...] = (GRAD_LAYER_FIELD, *LAYER_FIELDS_UPDATE)


@dataclass(frozen=True)
class RunSchema:
    """Sizes that fix the record layout for one run: layers, parameter-owning layers, LR groups."""

    layer_names: tuple[str, ...]
    layer_kinds: tuple[str, ...]
    param_layer_names: tuple[str, ...]
    num_lr: int
    version: int = SCHEMA_VERSION

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def num_param_layers(self) -> int:
        return len(self.param_layer_names)

    def host_dtype(self) -> np.dtype:
        names = fields_of(HOST_FIELDS, self.version)
        fields: list[tuple[Any, ...]] = [(n, "<f8") for n in names]
        fields.append((_F.LR, "<f8", (self.num_lr,)))
        return np.dtype(fields)

    def dev_scalar_dtype(self) -> np.dtype:
        kind = "<f8" if self.version >= WIDE_SCALARS else "<f4"
        return np.dtype([(n, kind) for n in fields_of(DEV_FIELDS, self.version)])

    def layer_dtype(self) -> np.dtype:
        L, P = self.num_layers, self.num_param_layers
        fields: list[tuple[Any, ...]] = [(ACT_SUM_FIELD, "<f4", (L,))]
        fields += [(n, "<f4", (L,)) for n in fields_of(LAYER_FIELDS_ACT, self.version)]
        fields += [(n, "<f4", (L,)) for n in fields_of((ACT_ROWS_FIELD,), self.version)]
        fields.append((GRAD_LAYER_FIELD, "<f4", (P,)))
        fields += [(n, "<f4", (P,)) for n in fields_of(LAYER_FIELDS_UPDATE, self.version)]
        return np.dtype(fields)

    def scalar_dtype(self) -> np.dtype:
        """Host and device scalars, flattened into one row: what ``scalars.bin`` stores per step."""
        h, d = self.host_dtype(), self.dev_scalar_dtype()
        return _concat(h, d)

    def record_dtype(self) -> np.dtype:
        """The whole step record: scalars followed by the per-layer block."""
        return _concat(self.scalar_dtype(), self.layer_dtype())

    def layer_row_dtype(self) -> np.dtype:
        """One row of ``layers.bin``: the step index, then the per-layer block."""
        return _concat(np.dtype([(_F.STEP, "<i8")]), self.layer_dtype())

    @functools.cached_property
    def host_size(self) -> int:
        return self.host_dtype().itemsize

    @functools.cached_property
    def dev_size(self) -> int:
        """Bytes of the device-computed tail (dev scalars, then the float32 layer block)."""
        return self.dev_scalar_dtype().itemsize + self.layer_dtype().itemsize

    @functools.cached_property
    def record_size(self) -> int:
        return self.host_size + self.dev_size

    @functools.cached_property
    def scalar_size(self) -> int:
        return self.host_size + self.dev_scalar_dtype().itemsize

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_names"] = list(self.layer_names)
        d["layer_kinds"] = list(self.layer_kinds)
        d["param_layer_names"] = list(self.param_layer_names)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSchema:
        """Rebuild a schema read from disk or a socket; every field is checked, and anything
        malformed raises ValueError naming the field (never a TypeError deep inside numpy)."""
        if not isinstance(d, dict):
            raise ValueError("the schema is not a JSON object")
        version = d.get("version", SCHEMA_VERSION)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"schema version must be a positive whole number, got {version!r}")
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"this run was written by a newer nnwatch (schema {version}, this one reads "
                f"up to {SCHEMA_VERSION}); upgrade nnwatch to read it"
            )
        layer_names = _names(d.get("layer_names"), "layer_names")
        kinds = d.get("layer_kinds") or ["?"] * len(layer_names)
        layer_kinds = _names(kinds, "layer_kinds")
        if len(layer_kinds) != len(layer_names):
            raise ValueError("layer_kinds and layer_names differ in length")
        num_lr = d.get("num_lr")
        if isinstance(num_lr, bool) or not isinstance(num_lr, int) or not 0 <= num_lr <= MAX_LAYERS:
            raise ValueError(f"num_lr must be a whole number from 0 to {MAX_LAYERS}, got {num_lr!r}")
        return cls(
            layer_names=layer_names,
            layer_kinds=layer_kinds,
            param_layer_names=_names(d.get("param_layer_names"), "param_layer_names"),
            num_lr=num_lr,
            version=version,
        )


#: The most layers (or LR groups) a schema read from disk may declare; more is a corrupt file.
MAX_LAYERS = 1 << 16


def _names(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_LAYERS:
        raise ValueError(f"{what} must be a list of at most {MAX_LAYERS} names")
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must hold only strings")
    return tuple(value)


def sums_measured(rows: np.ndarray) -> np.ndarray:
    """Per row: were the layer output sums measured? (Runs from before ``layer_sums``: always.)"""
    if _F.LAYER_SUMS not in (rows.dtype.names or ()):
        return np.ones(len(rows), dtype=bool)
    return cast("np.ndarray", np.asarray(rows[_F.LAYER_SUMS]) != 0.0)


def _concat(a: np.dtype, b: np.dtype) -> np.dtype:
    """Two packed structured dtypes laid end to end (numpy has no operator for it)."""
    names = list(a.names or ()) + list(b.names or ())
    assert a.fields is not None and b.fields is not None, "structured dtypes only"
    formats = [a.fields[n][0] for n in a.names or ()] + [b.fields[n][0] for n in b.names or ()]
    offsets = [a.fields[n][1] for n in a.names or ()] + [
        a.itemsize + b.fields[n][1] for n in b.names or ()
    ]
    return np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": a.itemsize + b.itemsize}
    )


@dataclass
class RunMeta:
    """Facts about a run that do not change per step; stored as ``meta.json`` in the run directory."""

    name: str
    schema: RunSchema
    pid: int
    host: str
    started: float
    device: str = "cpu"
    num_classes: int | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    nnwatch_version: str = ""
    torch_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["schema"] = self.schema.to_dict()
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RunMeta:
        """Parse ``meta.json`` (or the copy in a ring header). Every field is checked: anything
        malformed raises ValueError with the field's name."""
        try:
            d = clean_text.loads(text)  # names shown in terminals: no escape obeyed
        except RecursionError as exc:
            raise ValueError("meta.json is nested too deeply to be ours") from exc
        if not isinstance(d, dict):
            raise ValueError("meta.json is not a JSON object")
        if "schema" not in d:
            raise ValueError("meta.json has no schema")
        out: dict[str, Any] = {"schema": RunSchema.from_dict(d["schema"])}
        for name, kinds, required in _META_FIELDS:
            if name not in d or (d[name] is None and type(None) in kinds and not required):
                if required:
                    raise ValueError(f"meta.json has no {name}")
                continue
            value: Any = d[name]
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                raise ValueError(f"meta.json: {name} has the wrong type ({type(value).__name__})")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"meta.json: {name} is not finite")
            value = cast(Any, value)  # checked above: an int or a float from here on
            if name in ("pid", "rank", "local_rank") and not 0 <= value < 1 << 31:
                raise ValueError(f"meta.json: {name} is out of range ({value})")
            if name == "world_size" and not 1 <= value <= MAX_WORLD_SIZE:
                raise ValueError(f"meta.json: world_size is out of range ({value})")
            out[name] = float(value) if name == "started" else value
        return cls(**out)


#: The most ranks a job may say it has (the largest jobs run on ~10^5 GPUs): readers size job
#: views from this number, so one that is absurd (10^9) is refused before anything is allocated.
MAX_WORLD_SIZE = 1 << 20

#: (field, accepted JSON types, required) for RunMeta.from_json.
_META_FIELDS: tuple[tuple[str, tuple[type, ...], bool], ...] = (
    ("name", (str,), True),
    ("pid", (int,), True),
    ("host", (str,), True),
    ("started", (int, float), True),
    ("device", (str,), False),
    ("num_classes", (int, type(None)), False),
    ("rank", (int,), False),
    ("local_rank", (int,), False),
    ("world_size", (int,), False),
    ("nnwatch_version", (str,), False),
    ("torch_version", (str,), False),
    ("extra", (dict,), False),
)
