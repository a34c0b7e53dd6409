"""Where the probe hooks into the user's objects, and how it leaves them exactly as they were.

The model gets a forward pre-hook (a step starts), a forward hook until the first loss is read
(what the model output) and the per-layer hooks; the parameters at both
ends get a post-accumulate-grad hook (one of them gets a gradient in any backward that reaches
the model); torch's clip functions are intercepted; the optimizer gets a step pre-hook. Every
hook is marked so that a saved or copied model leaves it out, and all of them come off at close.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from nnwatch.probe import clip_intercept
from nnwatch.probe.exit_status import OBSERVER
from nnwatch.probe.first_outputs import FirstOutputs
from nnwatch.probe.grad_recorder import GradientRecorder
from nnwatch.probe.hook_hiding import ProbeHook, hide_hooks, release_hooks
from nnwatch.probe.layer_hooks import LayerHooks
from nnwatch.tensors.layers import LayerPlan


class Attachment:
    """Owns the handles of every hook the probe put on the model, its parameters and optimizer."""

    def __init__(self, layers: LayerHooks, grads: GradientRecorder) -> None:
        self.layers = layers
        self.grads = grads
        self.handles: list[Any] = []
        self.hooked_params: list[tuple[Any, bool]] = []  # (param, had no hook dict)
        self.hidden: list[type] = []  # classes whose pickling leaves our hooks out
        self.step_pre_hook: Any = None  # the optimizer's step pre-hook handle
        #: called once a lazy model's parameters exist (the guard picks its sentinels then)
        self.on_materialized: Callable[[], None] | None = None

    def attach(
        self,
        model: nn.Module,
        plan: LayerPlan,
        optimizer: Any,
        on_forward_start: Callable[..., None],
        on_backward: Callable[[torch.Tensor], None],
        before_step: Callable[..., None],
        outputs: FirstOutputs | None = None,
    ) -> None:
        self.hidden = hide_hooks(model)
        self.handles.append(model.register_forward_pre_hook(ProbeHook(on_forward_start), with_kwargs=True))
        if outputs is not None:
            squash = dict(zip(plan.stat_names, plan.stat_modules, strict=True))
            self.handles.extend(outputs.attach(model, squash))
        self.layers.attach()
        params = plan.params
        self.hooked_params = []
        ends = list(dict.fromkeys((params[0], params[-1]) if params else ()))
        if any(isinstance(p, UninitializedParameter) for p in ends):
            self._await_materialized(model, ends, on_backward)
        else:
            self._hook_ends(ends, on_backward)
        clip_intercept.listen(self.grads)
        OBSERVER.install()
        if optimizer is not None:
            self.step_pre_hook = optimizer.register_step_pre_hook(before_step)
            self.handles.append(self.step_pre_hook)

    def _hook_ends(self, ends: Sequence[torch.Tensor], on_backward: Callable[[torch.Tensor], None]) -> None:
        for p in ends:
            self.hooked_params.append((p, p._post_accumulate_grad_hooks is None))
            self.handles.append(p.register_post_accumulate_grad_hook(on_backward))

    def _await_materialized(
        self, model: nn.Module, ends: Sequence[torch.Tensor], on_backward: Callable[[torch.Tensor], None]
    ) -> None:
        """Lazy modules (``nn.LazyLinear``) get their parameters in their first forward, and an
        uninitialized parameter takes no hook: the ends are hooked once the model's forward has
        returned, before the backward that needs them."""

        def after_forward(module: nn.Module, args: Any, output: Any) -> None:
            if any(isinstance(p, UninitializedParameter) for p in ends):
                return  # a forward that skipped a lazy module: wait for the next one
            handle.remove()
            if handle in self.handles:
                self.handles.remove(handle)
            self._hook_ends(ends, on_backward)
            if self.on_materialized is not None:
                self.on_materialized()

        handle = model.register_forward_hook(ProbeHook(after_forward))
        self.handles.append(handle)

    def detach_step_pre_hook(self) -> bool:
        """Remove the optimizer's step pre-hook (a framework calls the probe's pre-step work at
        the right moment itself); False when there is none."""
        handle, self.step_pre_hook = self.step_pre_hook, None
        if handle is None or handle not in self.handles:
            return False
        handle.remove()
        self.handles.remove(handle)
        return True

    def remove(self) -> None:
        """Take every hook off again, leaving the tensors and classes exactly as they were."""
        self.layers.arm(False)
        for h in self.handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self.handles.clear()
        self.step_pre_hook = None
        for param, was_none in self.hooked_params:
            if was_none and not param._post_accumulate_grad_hooks:
                param._post_accumulate_grad_hooks = None  # leave the tensor exactly as it was
        self.hooked_params = []
        clip_intercept.unlisten(self.grads)
        hidden = self.hidden
        if hidden:
            self.hidden = []
            release_hooks(hidden)
