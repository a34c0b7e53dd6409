"""Gradient norms for monitoring: global and per layer, on the device, with no host sync.

When the user clips through ``Watch.clip_grad_norm_`` the per-parameter norms come from
:mod:`nnwatch.tensors.torch_clip` (bitwise torch's numbers). Otherwise the probe measures them itself right
before ``optimizer.step()``; on the CPU it uses one BLAS ``dot`` per parameter, which measured
2.8x faster here than ``torch._foreach_norm`` (195 us against 540 us on a 2.9M-parameter MLP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import numpy as np
import torch
from torch.nn.parameter import UninitializedParameter

F32_MAX = float(torch.finfo(torch.float32).max)


def stored_values(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """``grads`` with each sparse gradient (``nn.Embedding(sparse=True)``) replaced by its stored
    values, summed per index first: the same L2 norm, in a dense tensor every norm path takes.
    Called only once a dense path has refused one, so a dense model never pays for the check. On
    CUDA, summing per index (``coalesce``) must learn how many indices there are: one sync per
    step for a model with a sparse gradient on a GPU (such runs were not recorded at all before)."""
    out = []
    for g in grads:
        if g.layout == torch.sparse_coo:
            g = g.coalesce().values()
        elif g.layout != torch.strided:
            g = g.values()  # compressed layouts (CSR, CSC, BSR...) hold each index once
        out.append(g)
    return out


def _norms(grads: list[torch.Tensor]) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
    """One L2 norm per gradient: torch's fused ``_foreach_norm``, else one norm each (sparse
    gradients through their stored values)."""
    try:
        return torch._foreach_norm(grads, 2.0)
    except (RuntimeError, TypeError, NotImplementedError):
        dense = stored_values(grads)
    try:
        return torch._foreach_norm(dense, 2.0)
    except (RuntimeError, TypeError, NotImplementedError):
        return [torch.linalg.vector_norm(g, 2.0) for g in dense]


def squared_norms(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Squared L2 norm of each gradient, stacked on ``device`` as float64: a float32 gradient of
    finite elements can have a norm whose square (and a sum of squares) overflows float32, and
    that is an overflow, never a non-finite element."""
    if device.type == "cpu" and all(g.dtype == torch.float32 and g.device.type == "cpu" for g in grads):
        try:
            flats = [g.reshape(-1) for g in grads]
        except RuntimeError:  # a sparse gradient has no flat view
            flats = [g.reshape(-1) for g in stored_values(grads)]
        sq = torch.stack([torch.dot(f, f) for f in flats]).double()
        for i in torch.isinf(sq).nonzero().flatten().tolist():  # a float32 sum that overflowed
            f = flats[i].double()
            sq[i] = torch.dot(f, f)
        return sq
    norms = _norms(grads)
    return torch.stack([n.to(device=device, dtype=torch.float64) for n in norms]).square_()


def global_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor | float:
    """The global L2 norm alone, for steps whose per-layer norms are not wanted.

    One ``_foreach_norm`` call; on the CPU the norms are summed as Python floats (reading a CPU
    scalar is no sync), on a GPU the result stays on the device. The probe's unmeasured CPU steps
    take :func:`host_sum_of_squares` first, which is cheaper still.
    """
    norms = _norms(grads)
    if device.type == "cpu" and all(n.device.type == "cpu" for n in norms):
        return math.sqrt(math.fsum(float(n) ** 2 for n in norms))
    wide = any(g.dtype == torch.float64 for g in grads)
    dtype = torch.float64 if wide else torch.float32
    return cast("torch.Tensor", torch.linalg.vector_norm(torch.stack([n.to(device=device, dtype=dtype) for n in norms])))


_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_TENSOR = torch.Tensor


def host_sum_of_squares(grads: Iterable[torch.Tensor | None]) -> float | None:
    """The sum of squares of CPU float32/float64 gradients through numpy, one BLAS dot each:
    right after a backward (caches cold) 15 us against 19 for ``_foreach_norm`` on a 3-tensor
    MLP, 24 against 34 on a 100k-parameter one. None where one is of
    another kind (half precision, sparse, on a device, part of a graph, a tensor subclass) or
    none is there. A None in ``grads`` (a parameter without a gradient) counts as nothing."""
    total = 0.0
    seen = False
    vdot = np.vdot
    try:
        for g in grads:
            if g is None:
                continue
            if type(g) is not _TENSOR:
                return None  # a subclass (a DTensor shard) is not a plain buffer of numbers
            # in memory order: a channels_last gradient is one dense block, not C-contiguous,
            # and vdot of it in C order would copy it and skip BLAS (1.2 ms against 29 us)
            a = g.numpy().ravel(order="K")
            if a.dtype not in _BLAS_DTYPES:
                return None
            sq = float(vdot(a, a))
            total += sq if sq != _INF else _wide_square(a)
            seen = True
    except (RuntimeError, TypeError, ValueError):
        return None
    return total if seen else None


def _blas_square(g: torch.Tensor) -> float | None:
    """One gradient's sum of squares through numpy, read in memory order (see
    :func:`host_sum_of_squares`, which inlines this for the light step); None where numpy or BLAS
    does not take it."""
    if type(g) is not _TENSOR:
        return None
    try:
        a = g.numpy().ravel(order="K")
    except (RuntimeError, TypeError, ValueError):
        return None
    if a.dtype not in _BLAS_DTYPES:
        return None
    sq = float(np.vdot(a, a))
    return sq if sq != _INF else _wide_square(a)


_INF = math.inf


def _wide_square(a: np.ndarray) -> float:
    """A float32 sum of squares that overflowed, again in float64: inf only if an element is."""
    if a.dtype == np.float64:
        return math.inf
    with np.errstate(over="ignore", invalid="ignore"):
        wide = a.astype(np.float64)
        return float(np.dot(wide, wide))


def host_squared_norms(grads: list[torch.Tensor]) -> tuple[np.ndarray, float] | None:
    """Each gradient's sum of squares (float64) and their total, through numpy: the measured
    step's per-layer norms on the CPU. After a backward, with the caches cold, this took 20 us
    where ``torch.dot`` per gradient, ``stack`` and a numpy sum took 100 (4 gradients). The
    total is summed in the order and precision of :func:`host_sum_of_squares`, so a measured
    step's global norm is the light steps' to the bit. None where one gradient is of another
    kind (see there)."""
    out = np.empty(len(grads), dtype=np.float64)
    total = 0.0
    for i, g in enumerate(grads):
        sq = _blas_square(g)
        if sq is None:
            return None
        out[i] = sq
        total += sq
    return (out, total) if grads else None


def float32_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` as float32, a finite value beyond float32's range saturated at its largest value
    rather than turned into Inf (a finite float64 loss of 1e40 is not a non-finite one)."""
    if t.dtype != torch.float64:
        return t.to(torch.float32)
    return torch.where(torch.isfinite(t), t.clamp(-F32_MAX, F32_MAX), t).to(torch.float32)


def total_norm(sq: torch.Tensor) -> torch.Tensor | float:
    """The global L2 norm from per-parameter squared norms, as the probe records it.

    On the CPU it is summed in numpy (float64), a few microseconds against two torch calls on a
    cold cache; on a GPU it stays a device tensor (no sync). Replay recomputes it the same way
    (:func:`recorded_squares`), so that a reproduced step matches the record bit for bit.
    """
    if sq.device.type == "cpu":
        with np.errstate(over="ignore"):
            return math.sqrt(float(sq.numpy().sum(dtype=np.float64)))
    return sq.sum().sqrt()


def recorded_squares(
    grads: list[torch.Tensor], device: torch.device
) -> tuple[np.ndarray | torch.Tensor, torch.Tensor | float]:
    """Each gradient's squared norm and the global norm, as the probe's measured step records
    them where no clip hands it torch's: through numpy for CPU float gradients (the light step's
    norm to the bit), else torch's on ``device``. Replay takes its norm from here too: another
    kernel (``torch.dot`` against BLAS ``sdot``) can differ in the last bit on some CPUs, and a
    reproduced step must not read as different for that."""
    if device.type == "cpu":
        host = host_squared_norms(grads)
        if host is not None:
            return host[0], math.sqrt(host[1])
    sq = squared_norms(grads, device)
    return sq, total_norm(sq)


#: Parameters up to which :meth:`LayerReducer.write_host` folds in Python rather than numpy.
PYTHON_FOLD = 64


class LayerReducer:
    """Folds per-parameter norms into per-layer norms with one ``index_add_``.

    The index tensors are cached for the set of parameters that had gradients, which is almost
    always the same from step to step.
    """

    def __init__(self, param_layer_index: tuple[int, ...], num_layers: int) -> None:
        self._owner = param_layer_index
        self._num_layers = num_layers
        self._key: tuple[int, ...] | None = None
        self._index: torch.Tensor | None = None
        self._absent: torch.Tensor | None = None
        self._host_key: tuple[int, ...] | None = None
        self._host_index = np.zeros(0, dtype=np.int64)
        self._host_absent = np.zeros(0, dtype=bool)
        self._host_owners: list[int] = []
        self._host_empty: list[float] = []  # per layer: 0.0 with gradients to fold in, else NaN

    def _prepare(self, present: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (*present, -1 if device.type == "cpu" else (device.index or 0))
        if key != self._key or self._index is None or self._absent is None:
            owners = [self._owner[i] for i in present]
            self._index = torch.tensor(owners, dtype=torch.long, device=device)
            absent = torch.ones(self._num_layers, dtype=torch.bool)
            absent[owners] = False
            self._absent = absent.to(device)
            self._key = key
        return self._index, self._absent

    def write_host(self, per_param: np.ndarray, present: list[int], out: np.ndarray) -> None:
        """:meth:`write` for CPU buffers, in numpy: a handful of microseconds instead of six
        torch calls on a cold cache."""
        if self._num_layers == 0 or not present:
            return
        key = tuple(present)
        if key != self._host_key:
            owners = [self._owner[i] for i in present]
            absent = np.ones(self._num_layers, dtype=bool)
            absent[owners] = False
            self._host_index, self._host_absent, self._host_key = np.array(owners), absent, key
            self._host_owners = owners
            self._host_empty = [math.nan if a else 0.0 for a in absent.tolist()]
        if len(present) <= PYTHON_FOLD:
            out[:] = self._fold_in_python(per_param.tolist(), per_param.dtype == np.float64)
            return
        with np.errstate(invalid="ignore"):
            layer = np.sqrt(
                np.bincount(self._host_index, weights=per_param, minlength=self._num_layers)
            )
        layer[np.isnan(layer)] = math.inf
        if per_param.dtype == np.float64:  # a float64 model: saturate, never overflow to Inf
            big = np.isfinite(layer) & (layer > F32_MAX)
            layer[big] = F32_MAX
        layer[self._host_absent] = math.nan
        out[:] = layer

    def _fold_in_python(self, squares: list[float], wide: bool) -> list[float]:
        """:meth:`write_host`'s folding for a model of a few parameters, as Python floats: the
        same sums in the same order as ``bincount``, without its half-dozen numpy calls (each
        several microseconds on the cache a step has just used)."""
        sums = self._host_empty.copy()  # 0.0 where a layer has a gradient, NaN where it has none
        for layer, sq in zip(self._host_owners, squares, strict=True):
            sums[layer] += sq
        out = []
        for s, start in zip(sums, self._host_empty, strict=True):
            if start != start:  # no gradient in this layer: absent
                out.append(math.nan)
            elif s != s:  # a gradient held NaN
                out.append(math.inf)
            else:
                norm = math.sqrt(s)
                out.append(F32_MAX if wide and math.isfinite(norm) and norm > F32_MAX else norm)
        return out

    def write(
        self,
        per_param: torch.Tensor,
        present: list[int],
        out: torch.Tensor,
        norm_type: float = 2.0,
        squared: bool = False,
    ) -> None:
        """Write per-layer norms into ``out``.

        A layer without any gradient stays NaN (absent); a layer whose gradient held NaN or Inf is
        written as +Inf, so that readers can tell "not measured" from "non-finite".
        """
        if self._num_layers == 0 or not present:
            return
        index, absent = self._prepare(present, out.device)
        dtype = torch.float64 if per_param.dtype == torch.float64 else torch.float32
        per_param = per_param.to(device=out.device, dtype=dtype)
        acc = torch.zeros(self._num_layers, dtype=dtype, device=out.device)
        if math.isinf(norm_type):
            acc.index_reduce_(0, index, per_param, "amax", include_self=False)
            layer = acc
        elif squared or norm_type == 2.0:
            acc.index_add_(0, index, per_param if squared else per_param.square())
            layer = acc.sqrt_()
        else:
            acc.index_add_(0, index, per_param.pow(norm_type))
            layer = acc.pow_(1.0 / norm_type)
        layer = float32_of(layer.nan_to_num_(nan=math.inf))
        out.copy_(layer.masked_fill_(absent, math.nan))


def largest_finite(params: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> float:
    """The largest finite |element| of the parameters' gradients (NaN when none is finite): a
    sum of squares that overflows float32 has finite elements, and this shows how large. One
    pass and one host read per gradient: for the guard's bad steps only."""
    best = math.nan
    with torch.no_grad():
        for p in params:
            g = p.grad
            if g is None or g.layout != torch.strided or not g.is_floating_point():
                continue
            a = _local(g).abs()  # a DTensor's own piece: reading it needs no other rank
            m = float(torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax()) if a.numel() else 0.0
            best = m if not best >= m else best
    return best


def _local(g: torch.Tensor) -> torch.Tensor:
    """A gradient's own elements on this rank (a DTensor's local piece), detached."""
    to_local = getattr(g, "to_local", None)
    return (to_local() if callable(to_local) else g).detach()


def sentinel_params(
    params: tuple[torch.Tensor, ...] | list[torch.Tensor], owner: tuple[int, ...], limit: int = 65536
) -> list[torch.Tensor]:
    """A small parameter near the input, for the guard on steps the cost budget leaves unmeasured.

    A NaN or Inf loss reaches every gradient, and one born inside the backward pass reaches
    everything on the input side of where it was born, so the gradient of the first layer sees
    nearly every failure. Its smallest parameter (a bias, a norm's weight) is checked: a few
    kilobytes. Layers whose parameters are all larger than ``limit`` elements (an embedding
    table) are passed over for the next one.
    """
    by_layer: dict[int, list[torch.Tensor]] = {}
    for p, o in zip(params, owner, strict=False):
        if not isinstance(p, UninitializedParameter):  # a lazy module's: no size before its forward
            by_layer.setdefault(o, []).append(p)
    for layer in sorted(by_layer):
        smallest = min(by_layer[layer], key=lambda p: p.numel())
        if smallest.numel() <= limit:
            return [smallest]
    return []


def sentinels_finite(params: list[torch.Tensor]) -> bool:
    """True unless a sentinel gradient holds NaN or Inf (one host sync: the guard's).

    A sum is non-finite as soon as one element is; a finite sum that overflows only sends the
    guard to the full check, which then finds the gradients finite.
    """
    for p in params:
        g = p.grad
        if g is not None and not math.isfinite(_local(g).sum().item()):  # on CUDA this is the guard's sync
            return False
    return True
