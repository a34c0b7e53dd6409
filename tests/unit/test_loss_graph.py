"""The loss's graph, read once at the first step: whether it reaches the model's output at all,
and whether it squashes an output that is already squashed."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from nnwatch.tensors.loss_graph import describe_loss


def _out(last: nn.Module | None = None) -> torch.Tensor:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(4, 3)] + ([last] if last is not None else [])
    return nn.Sequential(*layers)(torch.randn(8, 4))


def test_a_loss_from_the_output_reaches_it():
    out = _out()
    shape = describe_loss(F.cross_entropy(out, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])), outputs=[out.grad_fn])
    assert not shape.detached and shape.form == "cross_entropy" and shape.squashed == ""


def test_a_loss_from_a_detached_output_kept_alive_by_a_penalty_is_detached():
    lin = nn.Linear(4, 3)
    out = lin(torch.randn(8, 4))
    loss = F.cross_entropy(out.data, torch.zeros(8, dtype=torch.long)) + 1e-4 * lin.weight.pow(2).sum()
    assert describe_loss(loss, outputs=[out.grad_fn]).detached


def test_a_detached_loss_made_to_require_grad_is_detached():
    out = _out()
    loss = F.cross_entropy(out.detach(), torch.zeros(8, dtype=torch.long)).requires_grad_(True)
    assert describe_loss(loss, outputs=[out.grad_fn]).detached


def test_without_the_outputs_nothing_is_claimed():
    out = _out()
    loss = F.cross_entropy(out.detach(), torch.zeros(8, dtype=torch.long)).requires_grad_(True)
    assert not describe_loss(loss).detached
    assert not describe_loss(loss.detach(), outputs=[out.grad_fn]).detached  # a logged copy


def test_bce_with_logits_over_a_sigmoid_squashes_twice():
    out = _out(nn.Sigmoid())
    shape = describe_loss(nn.BCEWithLogitsLoss()(out, torch.rand(8, 3)), outputs=[out.grad_fn])
    assert "BCEWithLogitsLoss applies its own sigmoid" in shape.squashed and "0.73" in shape.squashed


def test_cross_entropy_over_a_softmax_squashes_twice_even_label_smoothed():
    out = _out(nn.Softmax(dim=-1))
    y = torch.zeros(8, dtype=torch.long)
    for loss in (F.cross_entropy(out, y), F.cross_entropy(out, y, label_smoothing=0.1)):
        assert "already went through a softmax" in describe_loss(loss).squashed


def test_one_squashing_is_not_two():
    out = _out(nn.Sigmoid())
    assert describe_loss(F.binary_cross_entropy(out, torch.rand(8, 3))).squashed == ""
    logits = _out()
    assert describe_loss(F.cross_entropy(logits, torch.zeros(8, dtype=torch.long))).squashed == ""
    assert describe_loss(F.nll_loss(F.log_softmax(logits, -1), torch.zeros(8, dtype=torch.long))).squashed == ""


def test_a_sigmoid_read_by_bce_is_told_apart_from_other_squashing_layers():
    from nnwatch.probe.first_outputs import FirstOutputs

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 3), nn.Sigmoid())
    seen = FirstOutputs()
    handles = seen.attach(model, dict(model.named_children()))
    with torch.no_grad():
        model(torch.randn(2, 4))  # an evaluation forward says nothing of the training loss
    out = model(torch.randn(8, 4))
    loss = 0.5 * F.binary_cross_entropy(out, torch.ones(8, 3), reduction="sum")
    assert len(handles) == 3 and seen.take(loss) and seen.output_layers == ["3"]  # not "1"
    assert not model[3]._forward_hooks and not model._forward_hooks  # every hook came off
    seen = FirstOutputs()
    seen.attach(model, dict(model.named_children()))
    seen.take(F.mse_loss(model(torch.randn(8, 4)), torch.full((8, 3), 255.0)))
    assert seen.output_layers == []  # under MSE an output sigmoid's saturation stops learning
