"""The preallocated step record: where hooks write, and how it reaches the host once per step.

On the CPU the device block *is* the host record (a torch view of numpy memory), so hooks write
straight into what gets published and nothing is copied. On CUDA the device block is copied once
per step into a pinned buffer with ``non_blocking=True``; the record is published when its CUDA
event has completed, usually one step later. If the GPU falls ``PIPELINE`` steps behind, the oldest
copy is waited for; by then the CPU would have stalled on the GPU anyway.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch

from nnwatch.store.schema import DEV_FIELDS, RunSchema

PIPELINE = 4
DEV_INDEX = {name: i for i, name in enumerate(DEV_FIELDS)}


class StepBuffers:
    """Record memory for one run. Views are named after the schema's fields.

    The device block is one float64 buffer: the scalars (float64, so that a float64 model's loss
    and norms keep their range), then the per-layer block as float32 in the same memory. One
    buffer is one copy per step to the host.
    """

    def __init__(self, schema: RunSchema, device: torch.device) -> None:
        self.schema = schema
        self._nd = len(schema.dev_scalar_dtype().names or ())
        layer_bytes = schema.layer_dtype().itemsize
        self._nl = layer_bytes // 4
        self._raw_len = self._nd + (self._nl + 1) // 2  # float64 words: scalars, then layers
        hs = schema.host_size
        # the raw block may end 4 bytes past the record (an odd count of float32 layer values)
        self.record = np.zeros(hs + 8 * self._raw_len, dtype=np.uint8)
        self.record_view = self.record.data[: schema.record_size]  # what gets published
        self.host = self.record[:hs].view(np.float64)
        self._raw_view = self.record[hs:].view(np.float64)
        self._pending: deque[tuple[torch.cuda.Event, int, np.ndarray]] = deque()
        self._pinned: list[torch.Tensor] = []
        self._rows_pinned: list[torch.Tensor] = []  # per pipeline slot: act_rows on their way
        self._next = 0
        self.device = torch.device("cpu")
        self._allocate(device)

    # -- layout ----------------------------------------------------------------------------------
    def _allocate(self, device: torch.device) -> None:
        nd, nl = self._nd, self._nl
        self.device = device
        self.on_cuda = device.type == "cuda"
        #: On the CPU, the scalars as numpy (the same memory): a scalar written from Python
        #: here costs a microsecond, against tens for a torch ``copy_`` on a cold cache.
        self.dev_np: np.ndarray | None = None
        self.grad_layer_np: np.ndarray | None = None
        if device.type == "cpu":
            self.dev = torch.from_numpy(self._raw_view)
            self.dev_np = self._raw_view[:nd]
            self._pinned = []
        else:
            self.dev = torch.empty(self._raw_len, dtype=torch.float64, device=device)
            self._pinned = [
                torch.empty(self._raw_len, dtype=torch.float64, pin_memory=True)
                for _ in range(PIPELINE)
            ]
            L = self.schema.num_layers
            self._rows_pinned = [
                torch.empty(L, dtype=torch.float32, pin_memory=True) for _ in range(PIPELINE)
            ]
        self.scalars = self.dev[:nd]
        layer = self.dev[nd:].view(torch.float32)[:nl]
        self._layer_views(layer)
        if self.dev_np is not None:
            self.grad_layer_np = self.grad_layer.numpy()
        # every value starts absent (NaN), layer sums included: a step the cost budget leaves
        # unmeasured publishes them as NaN without touching them
        self.template = torch.full((self._raw_len,), math.nan, dtype=torch.float64, device=device)
        self.template[nd:].view(torch.float32).fill_(math.nan)
        self._template_np = self.template.numpy() if self.dev_np is not None else None
        self.dev.copy_(self.template)

    def _layer_views(self, layer: torch.Tensor) -> None:
        """Name the per-layer block's parts (the schema's ``layer_dtype`` order)."""
        s = self.schema
        L, P = s.num_layers, s.num_param_layers
        self.act_sum = layer[:L]
        self.act_stats = layer[L : 6 * L].view(5, L)
        #: per-unit dead fraction of rectifier layers (schema 3), right after the five stats
        self.act_dead = layer[6 * L : 7 * L]
        #: rows each layer's outputs had on a measured step (schema 4): 0 where it did not run
        self.act_rows = layer[7 * L : 8 * L]
        g0 = 8 * L
        self.grad_layer = layer[g0 : g0 + P]
        #: what each update did (schema 4): weight norm, update norm, frozen share, per layer
        self.weight_layer = layer[g0 + P : g0 + 2 * P]
        self.update_layer = layer[g0 + 2 * P : g0 + 3 * P]
        self.frozen_layer = layer[g0 + 3 * P : g0 + 4 * P]
        self.loss = self.scalars[DEV_INDEX["loss"]]

    def slot(self, name: str) -> torch.Tensor:
        """The 0-d device view of one scalar field, e.g. ``slot("loss")``."""
        return self.scalars[DEV_INDEX[name]]

    def move_to(self, device: torch.device) -> list[bytes]:
        """Follow a model that was moved: reallocate on the new device; the records that were
        in flight are returned, oldest first."""
        landed = self.flush()
        self._allocate(device)
        return landed

    def write_rows(self, rows: list[float]) -> None:
        """This measured step's rows per layer: numbers into the record on the CPU; on CUDA a
        non-blocking copy from pinned memory (a copy from a Python list would sync), whose
        buffer is the one this step's record will use, so it is free again when the record is."""
        if not self._rows_pinned:
            self.act_rows.numpy()[:] = rows
            return
        staged = self._rows_pinned[self._next]
        staged.numpy()[:] = rows
        self.act_rows.copy_(staged, non_blocking=True)

    def permute_layers(self, order: list[int]) -> None:
        """Reorder the per-layer block once, after the first forward revealed the real order."""
        idx = torch.tensor(order, dtype=torch.long, device=self.dev.device)
        self.act_sum.copy_(self.act_sum[idx])
        self.act_stats.copy_(self.act_stats[:, idx])
        self.act_dead.copy_(self.act_dead[idx])
        self.act_rows.copy_(self.act_rows[idx])

    # -- per step --------------------------------------------------------------------------------
    def commit(self, reset: bool = True) -> list[bytes]:
        """The records that are done, oldest first, as bytes (the record memory is reused at
        once): on the CPU this step's; on CUDA those whose copy has landed, usually the step
        before's. Then the device block is reset for the next step.

        On the CPU ``reset=False`` skips refilling the device block with NaN, for a step that wrote
        nothing the next one does not overwrite.
        """
        if not self._pinned:
            done = [bytes(self.record_view)]
            if reset:  # numpy on the same memory: a microsecond where torch's copy_ takes tens
                self._raw_view[:] = self._template_np
            return done
        done = []
        if len(self._pending) >= PIPELINE:
            ev, k, host = self._pending.popleft()
            ev.synchronize()
            done.append(self._landed(k, host))
        k = self._next
        self._next = (self._next + 1) % PIPELINE
        self._pinned[k].copy_(self.dev, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._pending.append((ev, k, self.host.copy()))
        self.dev.copy_(self.template)
        while self._pending and self._pending[0][0].query():
            _, k2, host2 = self._pending.popleft()
            done.append(self._landed(k2, host2))
        return done

    def flush(self) -> list[bytes]:
        """Wait for every record still in flight (at close or on a device move), oldest first."""
        done = []
        while self._pending:
            ev, k, host = self._pending.popleft()
            ev.synchronize()
            done.append(self._landed(k, host))
        return done

    def _landed(self, k: int, host: np.ndarray) -> bytes:
        """The record whose device block landed in pinned slot ``k``, with its host part."""
        saved = self.host.copy()
        self.host[:] = host
        self._raw_view[:] = self._pinned[k].numpy()
        record = bytes(self.record_view)
        self.host[:] = saved
        return record
