"""A sharded run's step records, published a step late: each is held until the all-reduces its
step launched are done (long done by then, at the next step), then completed with the whole
norms and published.

Apart from :class:`~nnwatch.probe.sharded_reduce.ShardedReduce`, which launches the reduces (the
same collectives, in the same order, on every rank): here nothing talks to the other ranks, it
only waits on the works already launched and writes their sums into the held bytes.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.probe.clip_parts import CLIP_EPS
from nnwatch.store.schema import FieldName
from nnwatch.tensors.grad_norms import F32_MAX, LayerReducer

FLAGS = 3  # ranks that measured: the gradients, their per-layer norms, the update
_STEP = struct.Struct("<d")


class LaunchedStep:
    """One step's launched reduces: the vectors (summed in place) and their works."""

    __slots__ = ("clip", "event", "host", "layers", "present", "vecs", "works")

    def __init__(self) -> None:
        self.vecs: list[torch.Tensor] = []
        self.works: list[Any] = []
        self.host: list[torch.Tensor] = []  # pinned copies of device vectors (CUDA)
        self.event: Any = None
        self.present: list[int] = []
        self.layers = False
        self.clip = math.nan

    def wait(self, timeout: float | None) -> bool:
        """Wait for the reduces and the copies to the host (``timeout``: each, at most); False
        when one did not finish or failed."""
        import datetime

        try:
            for w in self.works:
                if timeout is None:
                    w.wait()
                elif w.wait(datetime.timedelta(seconds=timeout)) is False:
                    return False
            if self.event is not None:
                self.event.synchronize()  # the copies to pinned memory: done a step ago
        except Exception:  # noqa: BLE001 - a peer that left (close): not measured
            return False
        return True


class LateRecords:
    """The records held until their step's reduces are done, and how they are completed."""

    def __init__(
        self,
        buffers: StepBuffers,
        reducer: LayerReducer,
        slots: list[np.ndarray],
        layer_of: np.ndarray,
        num_layers: int,
        say: Callable[[str], None],
        ranks: Callable[[], float],
    ) -> None:
        self.buf = buffers
        self.reducer = reducer
        self.n = len(layer_of)  # the watched parameters
        self._slots = slots  # per mesh: where its parameters' values lie in the vector
        self._layer_of = layer_of
        self._num_layers = num_layers
        self.say = say  # a reason the norms are not whole, said once
        self.ranks = ranks  # the ranks that add to every count
        self._held: deque[tuple[np.ndarray, LaunchedStep]] = deque()

    def hold(
        self, record: bytes, launched_steps: dict[int, LaunchedStep], active: bool | None
    ) -> list[bytes]:
        """A finished record: the older held ones are completed and returned, oldest first; this
        one is held until its reduce is done (the next step), or returned too if none was
        launched (taken out of ``launched_steps``; ``active``: whether every rank watches, None
        before it is known)."""
        done = self.finish_all()
        step = int(_STEP.unpack_from(record, 0)[0])
        launched = launched_steps.pop(step, None)
        if launched is None:
            if active is False:
                held = np.frombuffer(bytearray(record), dtype=np.uint8)
                self.not_measured(held)
                record = held.tobytes()
            done.append(record)
            return done
        self._held.append((np.frombuffer(bytearray(record), dtype=np.uint8), launched))
        return done

    def finish_all(self, timeout: float | None = None) -> list[bytes]:
        """Complete every held record; they are returned oldest first."""
        done = []
        while self._held:
            held, s = self._held.popleft()
            try:
                if s.wait(timeout):
                    self._patch(held, s)
                else:
                    self.not_measured(held)
            except Exception as exc:  # noqa: BLE001 - the record goes out with local numbers
                self.say(f"could not complete the step's norms: {exc!r}")
            done.append(held.tobytes())
        return done

    def _field(self, held: np.ndarray, view: torch.Tensor, dtype: Any) -> np.ndarray:
        """The numpy view of ``held`` at the place ``view`` (a part of the device block, on the
        CPU or a GPU) has in a published record: after the host block, at its storage offset."""
        off = self.buf.schema.host_size + view.storage_offset() * view.element_size()
        out: np.ndarray = held[off : off + view.numel() * np.dtype(dtype).itemsize].view(dtype)
        return out

    def _whole(self, s: LaunchedStep) -> np.ndarray:
        n = self.n
        vals = s.host or s.vecs
        out: np.ndarray = vals[-1].numpy().copy()
        for b, t in enumerate(vals[:-1]):
            summed = t.numpy()
            idx = self._slots[b]
            out[idx] = summed[idx]
            out[3 * n :] = summed[3 * n :]
        return out

    def _patch(self, held: np.ndarray, s: LaunchedStep) -> None:
        n = self.n
        whole = self._whole(s)
        ranks = self.ranks()
        dev = self._field(held, self.buf.scalars, np.float64)
        if s.present and whole[3 * n] >= ranks:
            sq = whole[np.array(s.present, dtype=np.int64)]
            with np.errstate(over="ignore", invalid="ignore"):
                total = math.sqrt(float(sq.sum())) if not np.isnan(sq).any() else math.nan
            dev[DEV_INDEX[FieldName.GRAD_NORM]] = total
            dev[DEV_INDEX[FieldName.NONFINITE_GRADS]] = 0.0 if math.isfinite(total) else 1.0
            if s.clip == s.clip:
                coef = min(s.clip / (total + CLIP_EPS), 1.0) if math.isfinite(total) else math.nan
                dev[DEV_INDEX[FieldName.GRAD_NORM_CLIPPED]] = total * coef
                dev[DEV_INDEX[FieldName.CLIPPED]] = 1.0 if total > s.clip else 0.0
            if s.layers and whole[3 * n + 1] >= ranks:
                out = self._field(held, self.buf.grad_layer, np.float32)
                self.reducer.write_host(sq, s.present, out)
        elif s.present:
            self.not_measured(held)
        if whole[3 * n + 2] >= ranks:
            self._write_updates(held, whole)

    def _write_updates(self, held: np.ndarray, whole: np.ndarray) -> None:
        n, L = self.n, self._num_layers
        w_out = self._field(held, self.buf.weight_layer, np.float32)
        u_out = self._field(held, self.buf.update_layer, np.float32)
        for block, out in ((1, w_out), (2, u_out)):
            vals = whole[block * n : (block + 1) * n]
            acc = np.bincount(self._layer_of, weights=vals, minlength=L)[:L]
            rows = np.sqrt(acc)
            keep = ~np.isnan(out)  # layers the local update measured (others stay absent)
            out[keep] = np.clip(rows[keep], -F32_MAX, F32_MAX)

    def not_measured(self, held: np.ndarray) -> None:
        """Norms that could not be made whole: recorded as not measured, never as local ones."""
        dev = self._field(held, self.buf.scalars, np.float64)
        for name in (FieldName.GRAD_NORM, FieldName.GRAD_NORM_CLIPPED, FieldName.CLIPPED):
            dev[DEV_INDEX[name]] = math.nan
        dev[DEV_INDEX[FieldName.NONFINITE_GRADS]] = 0.0
        for view in (self.buf.grad_layer, self.buf.weight_layer, self.buf.update_layer):
            self._field(held, view, np.float32)[:] = math.nan
