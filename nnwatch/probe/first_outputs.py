"""The autograd nodes of the model's outputs in the first step, kept until its loss is read.

Whether the loss depends on what the model computed at all is a fact of the graph: a loss taken
from ``output.data``, ``output.detach()`` or a numpy copy has a graph (an L2 term, a
``requires_grad = True`` set on it to silence backward's error) that never reaches the model's
output. The loss's graph is read once, at the first ``w.step()``; this holds the nodes of every
output the model's forward returned before it (micro-batches, a siamese pair), then lets go.

It also tells which sigmoid layers (``nn.Sigmoid``) the loss reads with ``BCELoss``: such a
sigmoid sits near 0 and 1 because the model is sure, and the loss undoes its derivative (the
gradient that reaches the logits is ``s - t``), so its saturation is not a fault. A squashing
output under any other loss (a tanh under MSE to targets past +-1) is judged like any layer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree

from nnwatch.probe.hook_hiding import ProbeHook
from nnwatch.tensors.loss_graph import bce_inputs

MAX_NODES = 64  # outputs kept: a step that calls the model more often is a loop of its own


class FirstOutputs:
    """Collects the ``grad_fn`` of the model's tensor outputs until ``take()``."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self._handle: Any = None
        self._squash_nodes: dict[str, list[Any]] = {}
        self._squash_handles: list[Any] = []
        #: the sigmoid layers the loss reads with BCE (known after ``take(loss)``)
        self.output_layers: list[str] = []

    def attach(self, model: nn.Module, layers: dict[str, nn.Module] | None = None) -> list[Any]:
        """Hook ``model``'s forward, and the sigmoid modules among ``layers`` (name -> module);
        returns the handles (the attachment removes them at close, ``take()`` before)."""
        self._handle = model.register_forward_hook(ProbeHook(self._seen))
        for name, module in (layers or {}).items():
            if isinstance(module, nn.Sigmoid):
                hook = ProbeHook(functools.partial(self._squashed, name))
                self._squash_handles.append(module.register_forward_hook(hook))
        return [self._handle, *self._squash_handles]

    def _squashed(self, name: str, _module: nn.Module, _args: Any, output: Any) -> None:
        node = getattr(output, "grad_fn", None) if isinstance(output, torch.Tensor) else None
        kept = self._squash_nodes.setdefault(name, [])
        if node is not None and len(kept) < MAX_NODES and torch.is_grad_enabled():
            kept.append(node)

    def _seen(self, module: nn.Module, args: Any, output: Any) -> None:
        if len(self.nodes) >= MAX_NODES or not torch.is_grad_enabled():
            return  # a validation forward says nothing of the training loss
        try:
            leaves = _pytree.tree_leaves(output)
        except Exception:  # noqa: BLE001 - an output pytree cannot flatten: nothing to keep
            return
        for t in leaves:
            node = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            if node is not None:
                self.nodes.append(node)

    def take(self, loss: Any = None) -> list[Any]:
        """The nodes seen so far; the hooks come off (they are needed for the first step only).
        Given the first ``loss``, which sigmoid layers it reads with BCE (``output_layers``)."""
        nodes, self.nodes = self.nodes, []
        ids = bce_inputs(getattr(loss, "grad_fn", None)) if self._squash_nodes else set()
        self.output_layers = [
            name for name, seen in self._squash_nodes.items() if any(id(n) in ids for n in seen)
        ]
        self._squash_nodes = {}
        for h in self._squash_handles:
            h.remove()
        self._squash_handles = []
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return nodes

