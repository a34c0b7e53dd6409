"""The per-layer forward hooks: one per watched layer, attached only for the steps that use them.

Each hook adds its layer's output sum (measured steps) and activation statistics (sampled steps)
into preallocated per-layer slots, on the device, with no host sync. The slots follow the order
in which the layers ran in the first step (forward order, not definition order); ``finalize``
fixes that order once the first step is done.

This is the hot path: the hook reads the schedule's ``measure``/``sampled`` and adds to its
``own`` directly, and keeps everything it touches in attributes of this object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from nnwatch.probe.activation_stats import StatBlock, layer_sum
from nnwatch.probe.buffers import StepBuffers
from nnwatch.probe.hook_hiding import ProbeHook
from nnwatch.probe.schedule import Schedule
from nnwatch.tensors.layers import LayerPlan, first_tensor
from nnwatch.tensors.sharded import local_of


class HookOwner(Protocol):
    """What the hooks need of the watch: whether it is off, and one warning per problem."""

    @property
    def disabled(self) -> str | None: ...

    def warn_once(self, key: str, message: str) -> None: ...


class LayerHooks:
    """Owns the per-layer forward hooks, their handles and the per-layer slots they write."""

    def __init__(
        self,
        model: nn.Module,
        plan: LayerPlan,
        schedule: Schedule,
        owner: HookOwner,
        device: torch.device,
        cap: int,
    ) -> None:
        self.plan = plan
        self.schedule = schedule
        self.owner = owner
        self.cap = int(cap)
        self.present = bool(plan.stat_modules)  # the model has layers to watch
        if not self.present:
            owner.warn_once(
                "no-layers",
                f"found no layers to watch in {type(model).__name__} (no Linear, Conv, Norm, "
                "attention or activation modules); per-layer statistics are off, loss and "
                "gradient norms are still recorded",
            )
        self.hooks: list[Callable[..., None]] = []
        self.handles: list[Any] = []  # attached only for measured or sampled steps
        self.rerun = False  # the guard is re-running a bad step's forward: always measure
        self.off: set[int] = set()  # layers whose hook failed once
        self.finalized = False  # the slot order is fixed (after the first step)
        self.order: list[int] = []  # layers in the order they ran, during the first step
        self.slots = list(range(len(plan.stat_modules)))  # layer -> slot in the record
        self.sums: list[torch.Tensor | None] = [None] * len(self.slots)  # this step's, by slot
        self.rows = [0.0] * len(self.slots)  # this step's output rows, by slot (measured steps)
        self.sums_stored = False  # this step's sums are in the record
        #: take the output sums on every step (a sharded model under the guard: its forward is
        #: collective, so a bad step's cannot be re-run on one rank to find where a NaN began)
        self.sums_always = False
        self.stats = StatBlock(len(self.slots), device, self.cap)
        #: per layer: None, or for a rectifier whether its input comes channels-first (a conv)
        self.rectifier = _rectifier_layouts(plan.stat_modules)

    def refresh(self, device: torch.device) -> None:
        """Rebuild the statistics block (slots reordered, or the buffers moved device)."""
        self.stats = StatBlock(len(self.slots), device, self.cap)

    def attach(self) -> None:
        self.hooks = [ProbeHook(self.make(i)) for i in range(len(self.plan.stat_modules))]
        self.arm(True)

    def make(self, i: int) -> Callable[..., None]:
        """The forward hook of layer ``i`` (the benchmark wraps this to time the hooks)."""
        sched = self.schedule
        owner = self.owner

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            # the guard's re-run of a bad step's forward runs under no_grad and always measures
            if self.rerun:
                measure = True
            elif owner.disabled or i in self.off or not torch.is_grad_enabled():
                return
            else:
                measure = sched.measure or self.sums_always
                if not (measure or sched.sampled):
                    return
            t0 = time.perf_counter()
            try:
                x = first_tensor(output)
                if x is not None:
                    if not self.finalized and i not in self.order:
                        self.order.append(i)
                    x = local_of(x)  # a DTensor output: this rank's piece (no collective)
                    slot = self.slots[i]
                    total = None
                    if measure:
                        total = layer_sum(x)
                        earlier = self.sums[slot]
                        self.sums[slot] = total if earlier is None else earlier + total
                        self.rows[slot] += x.shape[0] if x.dim() else 1
                    if sched.sampled:
                        self.stats.add(x, slot, total)
                        conv = self.rectifier[i]
                        if conv is not None:
                            nd = x.dim()
                            self.stats.add_dead(x, slot, 1 if nd >= 4 or (nd == 3 and conv) else nd - 1)
            except Exception as exc:  # noqa: BLE001 - never raise into the forward pass
                self.failed(i, exc)
            sched.own += time.perf_counter() - t0

        return hook

    def arm(self, on: bool) -> None:
        """Attach the per-layer forward hooks for a measured step, detach them for a light one.

        A module with no hooks takes PyTorch's fast call path, so a light step costs the model
        nothing per layer (an idle hook costs a few microseconds per call on a cold CPU cache).
        """
        if on == bool(self.handles):
            return
        if on:
            self.handles = [
                m.register_forward_hook(fn) for m, fn in zip(self.plan.stat_modules, self.hooks, strict=True)
            ]
        else:
            for h in self.handles:
                h.remove()
            self.handles = []

    def store(self, buffers: StepBuffers) -> None:
        """This step's layer sums and rows into the record: one stack instead of an add per layer."""
        sums = self.sums
        if not sums:
            return
        present = [t for t in sums if t is not None]
        if not present:
            return  # stored already (the guard's re-run), or no layer ran
        self.sums_stored = True
        act_sum = buffers.act_sum
        buffers.write_rows(self.rows)
        self.rows = [0.0] * len(sums)
        if len(present) == len(sums):
            torch.stack(present, out=act_sum)
        else:  # a layer that was not called (or was switched off) sums to 0 on a measured step
            act_sum.zero_()
            for slot, t in enumerate(sums):
                if t is not None:
                    act_sum[slot].copy_(t)
        for slot in range(len(sums)):
            sums[slot] = None

    def clear_sums(self) -> None:
        sums = self.sums
        for slot in range(len(sums)):
            sums[slot] = None
        self.rows = [0.0] * len(sums)

    def finalize(self, buffers: StepBuffers) -> list[int]:
        """Fix the slot order to the first step's forward order; returns it (layer per slot)."""
        n = len(self.plan.stat_modules)
        order = list(self.order) + [i for i in range(n) if i not in self.order]
        self.finalized = True
        if order != list(range(len(order))):
            buffers.permute_layers(order)
            new_slot = [0] * len(order)
            for pos, reg in enumerate(order):
                new_slot[reg] = pos
            self.slots = new_slot
            self.refresh(buffers.dev.device)
        return order

    def failed(self, i: int, exc: BaseException) -> None:
        name = self.plan.stat_names[i]
        self.owner.warn_once(f"layer-{i}", f"stopped watching layer {name!r} after an error: {exc!r}")
        self.off.add(i)
        self.sums[self.slots[i]] = None


#: Rectifiers whose output is zero exactly where a unit is off (and never negative).
_RECTIFIERS = ("ReLU", "ReLU6")
_CHANNELS_FIRST = ("Conv", "BatchNorm", "InstanceNorm", "GroupNorm", "MaxPool", "AvgPool", "Dropout2d")


def _rectifier_layouts(modules: tuple[nn.Module, ...]) -> list[bool | None]:
    """For each watched layer: None unless it is a rectifier; then whether a ``(B, C, L)`` output
    has its units on dim 1 (after a convolution) rather than last (after a Linear in a sequence)."""
    out: list[bool | None] = []
    prev = ""
    for m in modules:
        kind = type(m).__name__
        out.append(prev.startswith(_CHANNELS_FIRST) if kind in _RECTIFIERS else None)
        if kind not in _RECTIFIERS:
            prev = kind
    return out
