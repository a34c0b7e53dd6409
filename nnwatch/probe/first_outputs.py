"""The autograd nodes of the model's outputs in the first step, kept until its loss is read.

Whether the loss depends on what the model computed at all is a fact of the graph: a loss taken
from ``output.data``, ``output.detach()`` or a numpy copy has a graph (an L2 term, a
``requires_grad = True`` set on it to silence backward's error) that never reaches the model's
output. The loss's graph is read once, at the first ``w.step()``; this holds the nodes of every
output the model's forward returned before it (micro-batches, a siamese pair), then lets go.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree

from nnwatch.probe.hook_hiding import ProbeHook

MAX_NODES = 64  # outputs kept: a step that calls the model more often is a loop of its own


class FirstOutputs:
    """Collects the ``grad_fn`` of the model's tensor outputs until ``take()``."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self._handle: Any = None

    def attach(self, model: nn.Module) -> Any:
        """Hook ``model``'s forward; returns the handle (the attachment removes it at close)."""
        self._handle = model.register_forward_hook(ProbeHook(self._seen))
        return self._handle

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

    def take(self) -> list[Any]:
        """The nodes seen so far; the hook comes off (it is needed for the first step only)."""
        nodes, self.nodes = self.nodes, []
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return nodes
