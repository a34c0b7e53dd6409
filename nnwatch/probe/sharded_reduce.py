"""Whole-parameter norms of a sharded model, reduced across ranks without ever waiting on them.

With FSDP2 or tensor parallelism each rank holds a piece of every parameter (a DTensor), so the
norms one rank can measure are of its pieces. The whole model's norm (what torch's clip returns,
``full_tensor()``) is the root of the pieces' squares summed over the mesh, each replica counted
once (:mod:`nnwatch.tensors.sharded`). How it is taken:

- during the step, the gradient recorder hands in each parameter's local sum of squares (before
  any clip), the update recorder the weights' and updates' (:meth:`take_grads`,
  :meth:`take_updates`);
- at ``w.step()``, every rank launches the same all-reduces in the same order: one
  ``all_reduce(SUM, async_op=True)`` of a small float64 vector per device mesh (the mesh's own
  process group), every step, whatever this rank measured (what it did not measure it sends as
  zeros, with a count that says so). A rank whose probe switched itself off still takes part, so
  no collective is left unmatched;
- the step's record is held and published one step later, when the work is waited (long done by
  then): the whole norms are written into it then.

The ranks agree once, through the job's key-value store (no collective), that every one of them
watches: with ``watch()`` on some ranks only, nothing is reduced and the norms are recorded as
not measured, with one message saying why.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from nnwatch.probe.buffers import StepBuffers
from nnwatch.probe.sharded_publish import FLAGS as _FLAGS
from nnwatch.probe.sharded_publish import LateRecords, LaunchedStep
from nnwatch.tensors.grad_norms import LayerReducer
from nnwatch.tensors.layers import LayerPlan
from nnwatch.tensors.sharded import (
    UnsupportedLayout,
    counted_here,
    finish_partial,
    has_partial,
    is_dtensor,
    local_of,
    local_squares,
    mesh_key,
    resolve_partial,
)

log = logging.getLogger("nnwatch")

#: How long the close waits for the last step's reduce (a rank that stopped early never sends it).
CLOSE_WAIT_S = 10.0
_created = 0


class ShardedReduce:
    """Owns the step's local sums, the reduces in flight and the records they complete."""

    def __init__(self, plan: LayerPlan, buffers: StepBuffers, reducer: LayerReducer) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.plan = plan
        self.buf = buffers
        self.reducer = reducer
        params = list(plan.params)
        self.n = len(params)
        self._index = {id(p): i for i, p in enumerate(params)}
        keys: list[Any] = []
        self._bucket = []  # per parameter: index of its mesh in ``keys``, -1 for a plain tensor
        self._mesh: list[Any] = []
        for p in params:
            k = mesh_key(p)
            if k is None:
                self._bucket.append(-1)
                continue
            if k not in keys:
                keys.append(k)
                self._mesh.append(p.device_mesh)  # type: ignore[attr-defined]
            self._bucket.append(keys.index(k))
        self._groups: list[Any] | None = None
        n = self.n
        #: per mesh: where its parameters' values lie in the vector (gradient, weight, update)
        self._slots = []
        for b in range(len(keys)):
            where = np.array([k for k in range(n) if self._bucket[k] == b], dtype=np.int64)
            self._slots.append(np.concatenate([where, n + where, 2 * n + where]))
        self._weight_counts = torch.tensor([float(counted_here(p)) for p in params], dtype=torch.float64)
        self._masks: list[torch.Tensor] = []  # per mesh, on the reduce's device
        self._count_cache: dict[tuple[int, tuple[Any, ...]], float] = {}
        self._consts: dict[tuple[Any, ...], torch.Tensor] = {}
        self._layer_of = np.array(plan.param_layer_index, dtype=np.int64)
        self._num_layers = len(plan.param_layer_names)
        self.active: bool | None = None  # every rank watches (decided at the first step)
        self.note: str | None = None  # why the norms are not whole, said once
        self._said: set[str] = set()
        self._grads: tuple[list[int], torch.Tensor] | None = None
        #: the last gradients' local squares, each piece whole (the guard's per-layer view)
        self.local = torch.zeros(0, dtype=torch.float64)
        self._partial: list[tuple[int, torch.Tensor, list[Any]]] = []
        self._partial_started = False  # this step's Partial gradients are being summed
        self._layers = False
        self._clip = math.nan
        self._updates: tuple[list[int], torch.Tensor, torch.Tensor] | None = None
        self._launched: dict[int, LaunchedStep] = {}
        self._idle: deque[LaunchedStep] = deque()  # launched while the probe is off, never published
        self._store, self._key = _register()
        self._comm = torch.device("cpu")
        self.late = LateRecords(
            buffers, reducer, self._slots, self._layer_of, self._num_layers, self._say,
            lambda: _group_size(self._groups, self.dist),
        )  # fmt: skip

    # -- during the step -------------------------------------------------------------------------
    def take_grads(
        self, present: list[int], grads: list[torch.Tensor], layers: bool
    ) -> torch.Tensor | float:
        """This step's gradients, before any clip: their local squares are kept for the reduce.
        Returns the local sum of squares (NaN or Inf when a local element is), for the guard: a
        number on the CPU, a device tensor on a GPU.

        A ``Partial`` gradient's pieces are summed by an async all-reduce launched at the first
        look of the step only (every rank looks first at the same point; a later look, such as
        the guard's second one, may happen on some ranks only) and waited at ``w.step()``."""
        if self.active is None:  # every rank is past its first backward: all have counted in
            self.active = self._everyone_watches()
        sq = local_squares(grads)
        self.local = sq
        partial = [has_partial(g) for g in grads]
        if any(partial) and not self._partial_started and self.active:
            self._partial_started = True
            for k, g, part in zip(present, grads, partial, strict=True):
                if not part:
                    continue
                try:
                    local, works = resolve_partial(g)
                except UnsupportedLayout as exc:
                    self._say(f"{exc} is left out of the norms")
                    continue
                self._partial.append((k, local, works))
        counts = tuple(0.0 if part else self._counted(k, g) for k, g, part in zip(present, grads, partial, strict=True))
        contrib = sq * self._const(counts, torch.float64, sq.device)
        self._grads = (list(present), contrib)
        self._layers = self._layers or layers
        total = sq.sum()
        return float(total) if total.is_cpu else total  # a GPU's stays there (no sync)

    def _counted(self, k: int, g: torch.Tensor) -> float:
        """1.0 where this rank's piece of gradient ``k`` counts (see ``counted_here``), cached
        per layout: reading the mesh coordinate costs microseconds a parameter."""
        key = (k, tuple(g.placements)) if is_dtensor(g) else (k, ())  # type: ignore[attr-defined]
        c = self._count_cache.get(key)
        if c is None:
            c = self._count_cache[key] = 1.0 if counted_here(g) else 0.0
        return c

    def _const(self, values: tuple[Any, ...], dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
        """``values`` as a tensor on ``dev``, made once per distinct value: a copy from a Python
        list to a GPU waits for the stream (a sync), and these repeat from step to step."""
        key = (values, dtype, dev)
        t = self._consts.get(key)
        if t is None:
            if len(self._consts) > 64:  # parameter sets that keep changing: start afresh
                self._consts.clear()
            t = self._consts[key] = torch.tensor(values, dtype=dtype).to(dev)
        return t

    def clip_at(self, max_norm: float) -> None:
        """torch's clip scaled this step's gradients at ``max_norm`` (the whole norm's)."""
        self._clip = float(max_norm)

    def take_updates(self, params: Sequence[torch.Tensor], weight_sq: Any, update_sq: Any) -> None:
        """The update recorder's per-parameter weight and update squares (local pieces)."""
        idx = [self._index.get(id(p), -1) for p in params]
        self._updates = (idx, torch.as_tensor(weight_sq), torch.as_tensor(update_sq))

    # -- at w.step() -----------------------------------------------------------------------------
    def launch(self, step: int) -> None:
        """Launch this step's reduces (every rank, every step, the same ones, in mesh order)."""
        if self.active is None:
            self.active = self._everyone_watches()
        if not self.active:
            self._reset()
            return
        try:
            groups = self._resolve_groups()
        except Exception as exc:  # noqa: BLE001 - decided the same way on every rank
            self.active = False
            self._say(f"cannot reduce across this mesh: {exc!r}")
            self._reset()
            return
        s = LaunchedStep()
        try:
            vec = self._fill(s)
        except Exception as exc:  # noqa: BLE001 - still take part, with zeros
            vec = torch.zeros(3 * self.n + _FLAGS, dtype=torch.float64, device=self._comm)
            self._say(f"could not take the local norms: {exc!r}")
        self._reset()
        for b, mask in enumerate(self._masks):
            t = vec * mask  # this mesh's parameters, and the counts
            s.vecs.append(t)
            s.works.append(self.dist.all_reduce(t, group=groups[b], async_op=True))
        s.vecs.append(vec)  # the plain tensors' own values, not reduced
        if self._comm.type == "cuda":  # NCCL: the stream waits, the host reads a step later
            for w in s.works:
                w.wait()
            for t in s.vecs:
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                h.copy_(t, non_blocking=True)
                s.host.append(h)
            s.works = []
            s.event = torch.cuda.Event()
            s.event.record()
        if step < 0:  # a rank whose probe is off: it only keeps pace with the others
            self._idle.append(s)
            while len(self._idle) > 2:
                self._idle.popleft().wait(None)
            return
        self._launched[step] = s

    def _fill(self, s: LaunchedStep) -> torch.Tensor:
        """This rank's vector, on the device the reduce runs on (no host read of a GPU value)."""
        n, dev = self.n, self._comm
        vec = torch.zeros(3 * n + _FLAGS, dtype=torch.float64, device=dev)
        if self._grads is not None:
            present, sq = self._grads
            for k, local, works in self._partial:
                whole = finish_partial(local, works)
                g = self.plan.params[k].grad
                if k in present and g is not None:  # summed: now a replica, counted once
                    c = 1.0 if counted_here(g, partial_as_replica=True) else 0.0
                    sq[present.index(k)] = local_squares([whole])[0].to(sq.device) * c
            vec[self._const(tuple(present), torch.long, dev)] = sq.to(dev)
            vec[3 * n] = 1.0
            vec[3 * n + 1] = 1.0 if self._layers else 0.0
            s.present, s.layers = present, self._layers
        s.clip = self._clip
        if self._updates is not None:
            idx, w2, u2 = self._updates
            keep = tuple(i for i in idx if i >= 0)
            if keep:
                sel = self._const(tuple(j for j, i in enumerate(idx) if i >= 0), torch.long, dev)
                at = self._const(keep, torch.long, dev)
                counts = self._const(tuple(self._weight_counts[list(keep)].tolist()), torch.float64, dev)
                vec[n + at] = w2.to(dev, torch.float64)[sel] * counts
                vec[2 * n + at] = u2.to(dev, torch.float64)[sel] * counts
                vec[3 * n + 2] = 1.0
        return vec

    def _reset(self) -> None:
        self._grads, self._partial, self._updates = None, [], None
        self._partial_started = False
        self._layers, self._clip = False, math.nan

    def _resolve_groups(self) -> list[Any]:
        if self._groups is None:
            self._groups = [_mesh_group(m, self.dist) for m in self._mesh]
            backend = str(self.dist.get_backend(self._groups[0] if self._groups else None))
            first = self.plan.params[0] if self.plan.params else None
            if first is not None and first.device.type == "cuda" and "nccl" in backend.lower():
                self._comm = first.device
            for slots in self._slots:
                mask = torch.zeros(3 * self.n + _FLAGS, dtype=torch.float64)
                mask[torch.from_numpy(slots)] = 1.0
                mask[3 * self.n :] = 1.0
                self._masks.append(mask.to(self._comm))
        return self._groups

    def _everyone_watches(self) -> bool:
        """Every rank of the job made this reduce: decided from the job's store, no collective."""
        world = self.dist.get_world_size()
        try:
            count = int(self._store.add(self._key, 0)) if self._store is not None else 0
        except Exception:  # noqa: BLE001
            count = 0
        if count < world:
            self._say(
                f"nnwatch watches {count} of {world} ranks, so gradient norms of this sharded "
                "model are not recorded (each rank holds a piece of them); call watch() on every "
                "rank"
            )
            return False
        return True

    def _say(self, message: str) -> None:
        """Each reason the norms are not whole, said once (the first kept as ``note``)."""
        if message not in self._said:
            self._said.add(message)
            self.note = self.note or message
            log.warning("nnwatch: sharded parameters: %s", message)

    # -- publishing, a step late -----------------------------------------------------------------
    def hold(self, record: bytes) -> list[bytes]:
        """A finished record; the records now whole are returned: see :meth:`LateRecords.hold`."""
        return self.late.hold(record, self._launched, self.active)

    def close(self) -> list[bytes]:
        """At the end of the run: the last records, waited for a bounded time."""
        done = self.late.finish_all(CLOSE_WAIT_S)
        self._launched.clear()
        return done


def _mesh_group(mesh: Any, dist: Any) -> Any:
    """The process group of a whole device mesh: its one dimension's, the default group when it
    spans every rank, else its flattened group."""
    if mesh.ndim == 1:
        return mesh.get_group(0)
    if mesh.size() == dist.get_world_size():
        return None
    return mesh._flatten().get_group(0)


def _group_size(groups: list[Any] | None, dist: Any) -> float:
    """Ranks that add to every count: the smallest group's size (one mesh in practice)."""
    if not groups:
        return 1.0
    return float(min(dist.get_world_size(g) for g in groups))


def _register() -> tuple[Any, str]:
    """Count this rank in, in the default group's store (no collective)."""
    global _created
    _created += 1
    import torch.distributed as dist

    key = f"nnwatch/sharded/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_created}/{dist.get_world_size()}"
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
        store.add(key, 1)
    except Exception as exc:  # noqa: BLE001 - then the norms are not reduced, and it is said
        log.info("nnwatch: cannot register for the sharded norms: %r", exc)
        return None, key
    return store, key


def sharded_model(params: Sequence[torch.Tensor]) -> bool:
    """A model whose parameters are DTensors, in a job of more than one process."""
    if not any(is_dtensor(p) for p in params):
        return False
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except Exception:  # noqa: BLE001
        return False


__all__ = ["ShardedReduce", "local_of", "sharded_model"]
