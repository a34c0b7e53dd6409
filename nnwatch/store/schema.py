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
from typing import Any, cast

import numpy as np

from nnwatch.store import clean_text

SCHEMA_VERSION = 4
# 2 added "layer_sums"; 3 added "grads_kept" and "act_dead"; 4 made the device scalars float64 and
# added what each update did (the update fields below) and the batch's label entropy

HOST_FIELDS: tuple[str, ...] = (
    "step",  # 0-based index of the optimizer step this record describes
    "time",  # wall-clock time (time.time()) when w.step() was called
    "step_time",  # seconds since the previous w.step()
    "samples_per_sec",  # batch size / step_time, when the batch size is known
    "clip_threshold",  # max_norm of the last clip, NaN when the step was not clipped
    "layer_stats",  # 1.0 when per-layer activation stats were sampled on this step
    "cuda_allocated",  # torch.cuda.memory_allocated() in bytes (read at most every 0.2 s)
    "cuda_reserved",  # torch.cuda.memory_reserved() in bytes (likewise)
    "cuda_peak",  # torch.cuda.max_memory_allocated() in bytes (likewise)
    "cpu_percent",  # process CPU use in percent of one core, sampled at ~1 Hz
    "rss",  # process resident memory in bytes, sampled at ~1 Hz
    "layer_sums",  # 1.0 when layer output sums and gradient norms were measured, 0.0 when the
    # step was left out to keep nnwatch within its cost budget (NaN in older runs: measured)
    "grads_kept",  # 1.0 when this step's first backward found the previous update's gradients
    # still there, untouched (no zero_grad() between two updates), 0.0 when they were cleared,
    # NaN when not observed (the first step, a closure optimizer)
    "params_no_grad",  # measured updates: the share of the optimizer's trainable elements that
    # have had no gradient at any measured update so far (the optimizer holds them, backward
    # never reaches them)
    "params_unoptimized",  # measured updates: the share of the model's elements that got a
    # gradient but are in no parameter group of the optimizer (nothing ever updates them)
)
DEV_FIELDS: tuple[str, ...] = (
    "loss",  # the loss passed to w.step()
    "grad_norm",  # global L2 norm of the gradients before clipping
    "grad_norm_clipped",  # global norm after clipping (NaN if no clip was called)
    "clipped",  # 1.0 when clipping scaled the gradients down, 0.0 when not, NaN if no clip
    "amp_scale",  # GradScaler scale after this step's update
    "amp_skipped",  # 1.0 when the scaler skipped optimizer.step() (its scale went down)
    "nonfinite_grads",  # 1.0 when any gradient held NaN or Inf
    "update_frozen",  # measured updates: the share of the optimizer's sampled elements with a
    # non-zero gradient that the update left bit for bit unchanged (updates that round away)
    "label_entropy",  # measured steps of a classifier: the entropy (nats) of the batch's labels
    "label_mean",  # ... the mean and the variance of the batch's class indices: over many batches,
    "label_var",  # the share of the labels' variance between batches shows a data order
    "weight_drift",  # measured updates: how far the weights are from where the first measured
    # update found them, ||w - w_start|| (from the same samples as the update norms)
)
LAYER_FIELDS_ACT: tuple[str, ...] = (
    "act_mean",
    "act_std",
    "act_zero",  # fraction of outputs exactly zero (dead-ReLU sparsity)
    "act_nonfinite",  # count of NaN/Inf outputs
    "act_maxabs",
    "act_dead",  # rectifier layers: fraction of units that are zero for every input of the batch
)
#: On measured steps (schema 4): how many rows (the leading dimension) each layer's outputs had
#: over the step's forward; 0 for a layer that did not run (an expert no token was routed to, a
#: branch not taken), NaN on steps not measured.
ACT_ROWS_FIELD = "act_rows"
#: The per-step series the charts draw, kept whole-run as min/max buckets by every monitor (the
#: TUI's history) and every live stream (the server's live aggregate): one list, one owner.
CHART_FIELDS: tuple[str, ...] = (
    "step",
    "loss",
    "grad_norm",
    "grad_norm_clipped",
    "clip_threshold",
    "amp_scale",
    "amp_skipped",
)
#: Per parameter-owning layer, on measured updates (schema 4): what the optimizer did to the
#: weights, beside ``grad_layer``. ``weight_layer`` is the L2 norm of the layer's parameters
#: after the update; ``update_layer`` the norm of (after - before), from a fixed sample of each
#: large parameter scaled to its size; ``frozen_layer`` the share of those sampled elements with a
#: non-zero gradient that the update left bit for bit unchanged. NaN where the layer was not updated (no optimizer step, a
#: skipped AMP step, a step not measured).
LAYER_FIELDS_UPDATE: tuple[str, ...] = ("weight_layer", "update_layer", "frozen_layer")
#: Fields that a schema version added, so that older runs keep their own layout.
_ADDED_IN = {
    "layer_sums": 2, "grads_kept": 3, "act_dead": 3, "params_no_grad": 4,
    "params_unoptimized": 4, "update_frozen": 4, "label_entropy": 4, "label_mean": 4, "label_var": 4, "weight_drift": 4, "weight_layer": 4,
    "update_layer": 4, "frozen_layer": 4, ACT_ROWS_FIELD: 4,
}  # fmt: skip
#: The first schema whose device scalars are float64.
WIDE_SCALARS = 4


def fields_of(fields: tuple[str, ...], version: int) -> tuple[str, ...]:
    """``fields`` as a run of schema ``version`` has them."""
    return tuple(f for f in fields if _ADDED_IN.get(f, 1) <= version)

#: On measured steps (``layer_sums`` is not 0): the float32 sum of each layer's output. A
#: non-finite sum means the output held a NaN or Inf, which is how the first bad layer is found on
#: steps whose full stats were not sampled. NaN on steps that were not measured.
ACT_SUM_FIELD = "act_sum"
#: On measured steps: the gradient norm of each parameter-owning layer. NaN means the layer had no
#: gradient (or the step was not measured); +Inf means its gradient held NaN or Inf (so the two
#: never look alike).
GRAD_LAYER_FIELD = "grad_layer"
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
        fields.append(("lr", "<f8", (self.num_lr,)))
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
        return _concat(np.dtype([("step", "<i8")]), self.layer_dtype())

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
    if "layer_sums" not in (rows.dtype.names or ()):
        return np.ones(len(rows), dtype=bool)
    return cast("np.ndarray", np.asarray(rows["layer_sums"]) != 0.0)


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
