"""What the loss is, read from its autograd graph once, at the first step.

Two facts decide how the first loss and a flat loss are judged, and the graph holds both even
after ``backward()`` has freed its tensors (node types and saved sizes stay):

* the loss's *form*: plain cross-entropy (``cross_entropy`` or ``nll_loss`` over a log-softmax,
  maybe scaled by a constant or averaged) starts near ln K on a fresh classifier; a sum of terms
  (cross-entropy plus a distillation KL, an auxiliary loss) need not;
* a *broadcast* between prediction and target: ``mse_loss`` of a ``(B, 1)`` output against a
  ``(B,)`` target expands both to ``(B, B)``, and a hand-written ``((p - y) ** 2).mean()`` reduces a
  ``(B, B)`` tensor. The model can then learn only the targets' mean;
* *another trainable network* in the loss: trainable parameters that are neither the watched
  model's nor its optimizer's (a GAN generator's loss goes through the discriminator, which another
  optimizer trains). Such a loss moves when the other network learns: its level alone says little;
* a loss *detached* from the model: its graph never reaches the model's outputs (a loss taken from
  ``output.data`` or ``.detach()`` and kept alive by another term or by ``requires_grad = True``);
* a *squashed* input: ``BCEWithLogitsLoss`` over an output already through a sigmoid, or
  cross-entropy over a softmax: the loss squashes a second time and the predictions cannot leave a
  narrow band around chance.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Nodes that only scale, average or reshape the loss on the way to the root.
_PASS = frozenset({
    "MeanBackward0", "MeanBackward1", "SumBackward0", "SumBackward1", "DivBackward0",
    "DivBackward1", "MulBackward0", "MulBackward1", "ViewBackward0", "SqueezeBackward0",
    "SqueezeBackward1", "UnsqueezeBackward0", "ReshapeAliasBackward0", "CloneBackward0",
    "ToCopyBackward0", "NegBackward0", "MaskedFillBackward0", "GatherBackward0", "IndexBackward0",
    "SelectBackward0", "SliceBackward0",
})  # fmt: skip
#: Nodes that add terms: a loss made of several parts.
_TERMS = frozenset({"AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "StackBackward0",
                    "CatBackward0"})
_CROSS_ENTROPY = frozenset({"NllLossBackward0", "NllLoss2DBackward0", "NllLossNdBackward0"})
_ELEMENTWISE_LOSS = frozenset({
    "MseLossBackward0", "L1LossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0",
})  # fmt: skip
_REDUCE = frozenset({"MeanBackward0", "MeanBackward1", "SumBackward0", "SumBackward1"})
_DEPTH = 12


@dataclass(frozen=True)
class LossShape:
    """What the first step's loss graph shows."""

    form: str = ""
    """``cross_entropy`` (plain or label-smoothed, maybe scaled or averaged), ``terms`` (a sum
    with parts of other kinds: a distillation KL, an auxiliary loss), ``other``, or ``""`` (no
    graph: a float, a detached loss)."""
    broadcast: str = ""
    """Where a prediction was broadcast against a target of another shape, in words, or ``""``."""
    outside: int = 0
    """Elements of trainable parameters in the loss's graph that neither the watched model nor
    its optimizer holds (another network, trained elsewhere)."""

    detached: bool = False
    """The loss's graph was read whole and reaches none of the model's outputs of that step (or
    the loss is a leaf made to require a gradient): no gradient of it reaches the model."""
    squashed: str = ""
    """A loss that squashes an output already squashed (a sigmoid under ``BCEWithLogitsLoss``, a
    softmax under cross-entropy), in words, or ``""``."""

    def to_extra(self) -> dict[str, str | int | bool]:
        return {
            "loss_form": self.form, "loss_broadcast": self.broadcast, "loss_outside": self.outside,
            "loss_detached": self.detached, "loss_squashed": self.squashed,
        }  # fmt: skip


def describe_loss(
    loss: Any, own: set[int] | frozenset[int] = frozenset(), outputs: list[Any] | None = None
) -> LossShape:
    """The form of ``loss``, any broadcast in it and, given the ids of the parameters the watch
    knows (``own``), the trainable elements outside them; given the autograd nodes of the model's
    outputs in this step (``outputs``), whether the loss reaches any of them. Never raises."""
    try:
        node = getattr(loss, "grad_fn", None)
        if node is None:
            leaf = bool(getattr(loss, "requires_grad", False)) and bool(outputs)
            return LossShape(detached=leaf)  # ``loss.requires_grad = True`` on a detached loss
        reached = _reaches(node, {id(n) for n in outputs}) if outputs else None
        return LossShape(
            _form(node), _broadcast(node), _outside(node, own) if own else 0,
            detached=reached is False, squashed=_squashed(node),
        )  # fmt: skip
    except Exception:  # noqa: BLE001 - an odd graph: nothing is known
        return LossShape()


_MAX_NODES = 50_000  # a graph walked once, at the first step: bounded all the same


def _outside(root: Any, own: set[int] | frozenset[int]) -> int:
    """Elements of the graph's parameters (``nn.Parameter`` leaves) that are not in ``own``: an
    input or a detached tensor made to require a gradient (adversarial examples, a probe of
    the logits) is no other network."""
    from torch.nn import Parameter

    total = 0
    for node in walk(root):
        var = getattr(node, "variable", None)  # an AccumulateGrad: a leaf that gets a .grad
        if isinstance(var, Parameter) and id(var) not in own and var.requires_grad:
            total += int(var.numel())
    return total


def walk(root: Any) -> Iterator[Any]:
    """Each node of the autograd graph under ``root`` once, at most ``_MAX_NODES`` of them."""
    stack: list[Any] = [root]
    seen: set[int] = set()
    while stack and len(seen) < _MAX_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(_children(node))


def bce_inputs(root: Any) -> set[int]:
    """The ids of the nodes a binary cross-entropy under ``root`` reads (a sigmoid whose
    derivative the BCE undoes). Never raises."""
    try:
        return {id(n) for node in walk(root) if _name(node) == "BinaryCrossEntropyBackward0"
                for n in _children(node)}  # fmt: skip
    except (AttributeError, RuntimeError, TypeError):
        return set()


def _reaches(root: Any, targets: set[int]) -> bool | None:
    """Whether the graph under ``root`` holds one of the ``targets`` nodes; None when the graph is
    too large to read whole (then nothing is claimed)."""
    stack: list[Any] = [root]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in targets:
            return True
        if id(node) in seen:
            continue
        if len(seen) >= _MAX_NODES:
            return None
        seen.add(id(node))
        stack.extend(_children(node))
    return False


#: Nodes that only move an output around between a squashing function and the loss.
_RESHAPE = frozenset({
    "ViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "UnsqueezeBackward0", "PermuteBackward0", "TransposeBackward0", "TBackward0", "SliceBackward0",
    "SelectBackward0", "CloneBackward0", "ToCopyBackward0", "UnsafeViewBackward0",
})  # fmt: skip
_SQUASH = {"SigmoidBackward0": "a sigmoid", "SoftmaxBackward0": "a softmax"}
_SQUASHING_LOSS = {
    "BinaryCrossEntropyWithLogitsBackward0": "BCEWithLogitsLoss applies its own sigmoid",
    "LogSoftmaxBackward0": "cross-entropy applies its own log-softmax",
}


def _squashed(root: Any) -> str:
    """A loss that squashes an output already squashed, in words, or ``""``: looked for along
    the loss's own chain (its scaling, averaging and terms), not deep in the model."""
    stack, seen = [root], 0
    while stack and seen < 4 * _DEPTH:
        node = stack.pop()
        seen += 1
        name = _name(node)
        if name in _SQUASHING_LOSS:
            kids = _children(node)
            inner = _through_reshapes(kids[0]) if kids else None
            if inner is not None and _name(inner) in _SQUASH:
                band = (
                    "a sigmoid of a sigmoid lies between 0.5 and 0.73" if "Logits" in name
                    else "a softmax of probabilities gives any class at most e / (e + K - 1)"
                )
                return (
                    f"{_SQUASHING_LOSS[name]} to an output that already went through "
                    f"{_SQUASH[_name(inner)]} ({band})"
                )
            continue
        if name in _PASS or name in _TERMS or name in _CROSS_ENTROPY:
            stack.extend(_children(node))
    return ""


def _through_reshapes(node: Any) -> Any:
    for _ in range(_DEPTH):
        if _name(node) not in _RESHAPE:
            return node
        kids = _children(node)
        if len(kids) != 1:
            return node
        node = kids[0]
    return node


def _name(node: Any) -> str:
    return type(node).__name__


def _children(node: Any) -> list[Any]:
    return [n for n, _ in getattr(node, "next_functions", ()) if n is not None]


def _form(root: Any, depth: int = 0) -> str:
    """``cross_entropy`` when every term of the loss is a cross-entropy (label smoothing's
    mean of log-probabilities included), ``terms`` when other parts are added, else ``other``."""
    node = root
    for _ in range(_DEPTH - depth):
        name = _name(node)
        if name in _CROSS_ENTROPY or name == "LogSoftmaxBackward0":
            return "cross_entropy"
        kids = [k for k in _children(node) if _name(k) != "AccumulateGrad"]
        if name in _TERMS and len(kids) >= 2:
            parts = {_form(k, depth + 1) for k in kids}
            return "cross_entropy" if parts == {"cross_entropy"} else "terms"
        if name not in _PASS or len(kids) != 1:
            return "other"
        node = kids[0]
    return "other"


def _sizes(node: Any) -> tuple[int, ...] | None:
    try:
        value = node._saved_self_sym_sizes
    except (AttributeError, RuntimeError):
        return None
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return None


def _broadcast(root: Any) -> str:
    """A regression loss that broadcasts: an expand right under the loss node, or a reduction of
    a ``(B, B)`` tensor computed from a ``(B, 1)`` one."""
    stack, seen, steps = [root], set(), 0
    reduced: tuple[int, ...] | None = None
    while stack and steps < 4 * _DEPTH:
        node = stack.pop()
        steps += 1
        if id(node) in seen:
            continue
        seen.add(id(node))
        name = _name(node)
        if name in _ELEMENTWISE_LOSS or (name in _REDUCE and reduced is None):
            if name in _REDUCE:
                reduced = _sizes(node)
            for kid in _children(node):
                if _name(kid) == "ExpandBackward0":
                    before = _sizes(kid)
                    if before is not None:
                        return f"the prediction of shape {before} was broadcast against the target"
        if name in _PASS or name in _TERMS or name in _ELEMENTWISE_LOSS or name in (
            "PowBackward0", "AbsBackward0", "SubBackward0",
        ):
            stack.extend(_children(node))
            continue
        out = _sizes(node)
        if reduced is not None and _square_of_column(reduced, out, node):
            return (
                f"the loss averages a {reduced} tensor made from a prediction of shape "
                f"{_output_shape(node) or '(B, 1)'}: a (B, 1) prediction minus a (B,) target "
                "broadcasts to (B, B)"
            )
    return ""


def _output_shape(node: Any) -> tuple[int, ...] | None:
    """The output shape of a matmul node (the model's last layer), from its saved sizes."""
    try:
        a, b = tuple(node._saved_mat1_sym_sizes), tuple(node._saved_mat2_sym_sizes)
        return (int(a[0]), int(b[-1]))
    except (AttributeError, RuntimeError, TypeError, ValueError, IndexError):
        return None


def _square_of_column(reduced: tuple[int, ...], _out: Any, node: Any) -> bool:
    shape = _output_shape(node)
    if shape is None or len(reduced) != 2:
        return False
    b, width = shape
    return width == 1 and b > 1 and reduced == (b, b)
