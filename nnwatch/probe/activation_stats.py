"""Per-layer activation statistics computed on the device, with no host sync.

Every measured forward takes each layer output's float32 sum (one cheap reduction: a NaN or Inf
anywhere makes it non-finite, which is how the first bad layer is found on any measured step).
On sampled steps five more numbers are derived from a handful of fused reductions over at most
``cap`` leading elements, because cost grows with bytes read and calls made, not with the number
of statistics:

    mean = x.1 / n,  std from x.x,  zero fraction from s.s with s = sign(x),
    max |x| from aminmax,  non-finite count from (x * 0) with NaN mapped to 1, summed.

sign(NaN) is 0, so a layer whose sum of squares is not finite has its non-zeros counted directly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

F32_MAX = float(torch.finfo(torch.float32).max)
#: Statistic rows of the ``(5, L)`` block, in schema order (act_mean ... act_maxabs).
N_STATS = 5
#: Inputs per unit below which "zero for every input" is no evidence of a dead unit: a healthy
#: unit that fires on half its inputs is zero on all of 8 one time in 256 (a rarely chosen expert
#: of a mixture sees a handful of tokens).
MIN_DEAD_INPUTS = 16


def layer_sum(x: torch.Tensor) -> torch.Tensor:
    """The output's float32 sum: one cheap reduction, non-finite as soon as one value is.

    The sums are kept as loose 0-d tensors and stacked into the record once per step: one add per
    layer into the record cost about as much as the sum itself. A float64 output is summed in
    float64 and a finite sum beyond float32's range saturated: a float64 model's finite
    activations of 1e40 are not non-finite ones.
    """
    if x.dtype == torch.float64:
        return _saturated(x.sum())
    return x.sum(dtype=torch.float32)


def _saturated(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32, finite values beyond float32's range held at its largest (Inf and NaN
    stay what they are)."""
    return torch.where(torch.isfinite(x), x.clamp(-F32_MAX, F32_MAX), x).to(torch.float32)


class StatBlock:
    """Raw moments per layer, taken by the forward hooks, turned into the five stats once a step.

    A hook only reduces its output to a sum, a sum of squares, a min, a max and a count of
    non-zeros (plus, when some value is not finite, how many are not). The divisions, the square
    root and the rest run once per sampled step over all layers together: on a CPU whose caches
    the step has just flushed, every PyTorch call costs tens of microseconds whatever its size, so
    the number of calls per layer is what the cost is made of.

    On the CPU a hook makes five calls and allocates nothing: ``sign`` into a scratch buffer, then
    ``dot(x, x)``, ``dot(x, 1)``, ``dot(s, s)`` (the non-zero count) and ``aminmax``, each with
    ``out=`` the layer's row of one raw block, whose numpy view ``finish`` works on. Measured here
    on a 64K-element capped output: 61 against 100 us for the same reductions returning fresh
    tensors when the output has left the cache, about even when it is still there; ``finish``
    then has nothing to stack (94 against 118 us per step for a 7-layer MLP). On a GPU the same
    numbers come from branch-free reductions, stacked once per step.
    """

    def __init__(self, num_layers: int, device: torch.device, cap: int) -> None:
        self.cap = max(1, int(cap))
        self.device = device
        self._on_cpu = device.type == "cpu"
        # per layer slot, this step: how many elements were reduced (NaN: none) and non-finite
        self.count = np.full(num_layers, math.nan)
        self.nonfinite: list[Any] = [0.0] * num_layers
        # GPU: (sum, sum of squares, min, max, non-zeros) per slot, stacked in finish()
        self.moments: list[tuple[torch.Tensor, ...] | None] = [None] * num_layers
        #: rectifier layers: (units that fired at least once, units), see ``add_dead``
        self.dead: list[tuple[torch.Tensor, int] | None] = [None] * num_layers
        self._const: dict[tuple[float, ...], torch.Tensor] = {}
        if self._on_cpu:
            # per slot: sum of squares, sum, non-zeros, min, max (the raw columns, in that order)
            self._raw = torch.full((num_layers, 5), math.nan)
            self._raw_np = self._raw.numpy()
            self._outs = [(r[0], r[1], r[2], (r[3], r[4])) for r in self._raw]
            self._work: torch.Tensor | None = None  # row 0: signs, row 1: ones
            self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def reset(self) -> None:
        self.count.fill(math.nan)
        for i in range(len(self.moments)):
            self.moments[i] = None
            self.nonfinite[i] = 0.0
            self.dead[i] = None

    def add_dead(self, x: torch.Tensor, slot: int, unit_dim: int) -> None:
        """Count the units of a rectifier's output that are zero for every input of the batch.

        A unit is one feature (the last dimension of ``(B, F)`` or ``(B, T, F)``, the channel of
        a convolution's ``(B, C, ...)``). Its largest output over the batch is zero only when it
        never fired: one ``amax`` and one count, over a prefix of the batch within the cap.
        A share of exact zeros in the output says nothing of this (a healthy sparse layer is
        80% zeros with a few units dead). A unit seen on fewer than ``MIN_DEAD_INPUTS`` inputs
        is not judged.
        """
        if x.dim() < 2 or x.numel() == 0:
            return
        rows = max(1, self.cap // max(1, x[0].numel()))
        if unit_dim != 0 and x.shape[0] > rows:
            x = x[:rows]
        units = x.shape[unit_dim]
        if units == 0 or x.numel() // units < MIN_DEAD_INPUTS:
            return
        dims = tuple(d for d in range(x.dim()) if d != unit_dim)
        peak = x.amax(dim=dims)
        self.dead[slot] = (torch.count_nonzero(peak), peak.numel())

    def finish_dead(self, out: torch.Tensor) -> None:
        """The dead-unit fraction of each rectifier layer into ``out`` (L,); others stay NaN."""
        present = [i for i, d in enumerate(self.dead) if d is not None]
        if not present:
            return
        if self._on_cpu:
            values = out.numpy()
            for i in present:
                alive, units = self.dead[i]  # type: ignore[misc]
                values[i] = 1.0 - float(alive) / units
            return
        alive = torch.stack([self.dead[i][0] for i in present]).to(torch.float32)  # type: ignore[index]
        units = self._constant(tuple(float(self.dead[i][1]) for i in present))  # type: ignore[index]
        idx = self._constant(tuple(float(i) for i in present)).long()
        out[idx] = (1.0 - alive / units).to(out.device)

    def add(self, x: torch.Tensor, slot: int, total: torch.Tensor | None = None) -> None:
        """Reduce one layer output (its first ``cap`` elements); a second call replaces the first.

        ``total`` is the whole output's float32 sum when the caller has it already: for an output
        within the cap on a GPU it is the sum the statistics need, one reduction fewer.
        """
        n = x.numel()
        if n > self.cap:
            n = self.cap
            total = None
            # one call for the prefix view of a contiguous output instead of reshape + slice
            flat = x.as_strided((n,), (1,)) if x.is_contiguous() else x.reshape(-1)[:n]
        else:
            flat = x.reshape(-1)
        if n == 0:
            return
        if flat.dtype == torch.float64:
            flat = _saturated(flat)  # finite stays finite
        if self._on_cpu:
            self._add_cpu(flat, n, slot)
            return
        if flat.dtype != torch.float32:
            flat = flat.float()
        sq = torch.dot(flat, flat)
        lo, hi = torch.aminmax(flat)
        if total is None:
            total = flat.sum()
        # branch-free; count_nonzero rather than the CPU's sign trick, since sign(NaN) is 0
        self.moments[slot] = (total, sq, lo, hi, torch.count_nonzero(flat).to(torch.float32))
        self.nonfinite[slot] = _nonfinite_count(flat)
        self.count[slot] = n

    def _add_cpu(self, flat: torch.Tensor, n: int, slot: int) -> None:
        if flat.dtype != torch.float32:
            flat = flat.float()
        signs, ones = self._rows(n)
        sq, total, nonzero, extremes = self._outs[slot]
        torch.sign(flat, out=signs)
        torch.dot(flat, flat, out=sq)
        torch.dot(flat, ones, out=total)
        torch.dot(signs, signs, out=nonzero)
        torch.aminmax(flat, out=extremes)
        self.count[slot] = n
        raw = self._raw_np[slot]
        # reading a CPU scalar is not a device sync: count the non-finite values only when the sum
        # of squares says some exist (one that merely overflows just costs the exact count)
        if math.isfinite(raw[0]):
            self.nonfinite[slot] = 0.0
        else:
            raw[2] = float(torch.count_nonzero(flat))  # sign(NaN) is 0, yet NaN is not zero
            self.nonfinite[slot] = float(_nonfinite_count(flat))

    def _rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sign scratch and the ones for ``n`` elements, as views of one work matrix.

        Cached per size: a handful, one per distinct capped output size."""
        v = self._views.get(n)
        if v is None:
            if self._work is None:
                self._work = torch.empty(2, self.cap)
                self._work[1].fill_(1.0)
            if len(self._views) > 64:  # sizes that change every step (variable lengths)
                self._views.clear()
            v = self._views[n] = (self._work[0, :n], self._work[1, :n])
        return v

    def finish(self, out: torch.Tensor, dead: torch.Tensor | None = None) -> bool:
        """Write mean, std, zero fraction, non-finite count and max |x| into ``out`` (5, L), and
        the rectifiers' dead-unit fractions into ``dead`` (L,).

        Returns whether any layer had statistics this step.
        """
        if dead is not None:
            self.finish_dead(dead)
        count = self.count
        every = not np.isnan(count).any()
        present = np.arange(len(count)) if every else np.flatnonzero(~np.isnan(count))
        if not len(present):
            return False
        if self._on_cpu:
            raw = self._raw_np if every else self._raw_np[present]
            self._finish_numpy(raw, count if every else count[present], present, out.numpy(), every)
        else:
            idx = present.tolist()
            moments = torch.stack([t for i in idx for t in self.moments[i]])  # type: ignore[union-attr]
            self._finish_torch(moments.view(-1, 5), idx, out)
        self.reset()
        return True

    def _finish_numpy(
        self, raw: np.ndarray, n: np.ndarray, present: np.ndarray, out: np.ndarray, every: bool
    ) -> None:
        sq, total, nonzero, lo, hi = raw.astype(np.float64).T
        nonfinite = np.array(self.nonfinite, dtype=np.float64)
        mean = total / n
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            var = np.maximum(sq / n - mean * mean, 0.0) * (n / (n - 1))  # unbiased, like torch.std
            stats = np.stack((
                mean, np.sqrt(var), 1.0 - nonzero / n,
                nonfinite if every else nonfinite[present], np.maximum(hi, -lo),
            ))  # fmt: skip
        if every:
            out[:] = stats
        else:
            out[:, present] = stats

    def _finish_torch(self, raw: torch.Tensor, present: list[int], out: torch.Tensor) -> None:
        total, sq, lo, hi, nonzero = raw.to(torch.float32).unbind(1)
        nonfinite = torch.stack([self.nonfinite[i] for i in present]).to(torch.float32)
        n = self._constant(tuple(float(self.count[i]) for i in present))
        mean = total / n
        var = (sq / n - mean * mean).clamp_(min=0.0) * (n / (n - 1))  # unbiased, like torch.std
        stats = torch.stack((mean, var.sqrt_(), 1.0 - nonzero / n, nonfinite, torch.maximum(hi, lo.neg())))
        if len(present) == out.shape[1]:
            out.copy_(stats)
        else:
            out[:, self._constant(tuple(float(i) for i in present)).long()] = stats.to(out.device)

    def _constant(self, values: tuple[float, ...]) -> torch.Tensor:
        """A small constant tensor on the device, made once: building one from a Python list on
        a GPU is a blocking copy, i.e. the host sync the hot path must not have."""
        t = self._const.get(values)
        if t is None:
            if len(self._const) > 16:
                self._const.clear()
            t = self._const[values] = torch.tensor(values, dtype=torch.float32, device=self.device)
        return t


def _nonfinite_count(flat: torch.Tensor) -> torch.Tensor:
    """How many values are NaN or Inf: (x * 0) is 0 for a finite x and NaN otherwise."""
    return (flat * 0).nan_to_num_(nan=1.0).sum()


def write_stats(x: torch.Tensor, column: torch.Tensor, cap: int) -> None:
    """The five stats of one tensor into a (5,) column (what the hooks do, for a single layer)."""
    block = StatBlock(1, column.device, cap)
    block.add(x, 0)
    if math.isnan(block.count[0]):
        return  # an empty tensor: nothing to write
    block.finish(column.view(5, 1))


def stats_reference(x: torch.Tensor) -> tuple[float, float, float, float, float]:
    """The same five numbers the slow, obvious way; used by tests to check ``write_stats``."""
    xf = x.detach().reshape(-1).double()
    finite = torch.isfinite(xf)
    return (
        float(xf.mean()),
        float(xf.std()) if xf.numel() > 1 else math.nan,
        float((xf == 0).double().mean()),
        float((~finite).sum()),
        float(xf.abs().max()),
    )
