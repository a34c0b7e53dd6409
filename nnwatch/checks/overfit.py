"""Check B: can the model memorise one small batch?

Any working model, loss and update loop can drive the loss on 16 samples to nearly zero. When it
cannot, the bug is in the plumbing (graph, optimizer, labels, activations), not in the
hyper-parameters, and no amount of training will fix it. The check trains a deep copy, so the
user's model and optimizer are untouched, and it can reproduce the user's own loop: pass their
optimizer (its class, hyper-parameters and *parameter membership* are copied onto the clone) or an
``optimizer_factory``, and their ``train_step``.

Pass rule: classification passes at a loss below ``loss_threshold`` (0.01) with 100% accuracy;
regression (or unlabeled) passes at a loss below ``regression_threshold``, by default 1% of the
loss at step 0. Step k means "measured in the forward pass after k updates".

Besides the loss curve, the check gathers evidence while it trains: parameters that get no
gradient, parameters the optimizer does not hold, a zero learning rate, gradients that accumulate
between steps (missing ``zero_grad``), dead ReLUs, outputs that ignore the input, shapes that
broadcast in the loss and identical inputs with different labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from nnwatch.checks.common import (
    CheckError,
    CheckResult,
    LossFn,
    accuracy,
    batch_size,
    call_model,
    compute_loss,
    copy_user_optimizer,
    group_lr,
    is_classification,
    layer_of,
    model_device,
    prepared_copy,
    seeded,
    split_batch,
    take,
    to_device,
    trainable_named_params,
    with_generic_causes,
)
from nnwatch.checks.overfit_evidence import (
    OverfitRun,
    OverfitSetup,
    describe_optimizer,
    post_mortem,
    setup_evidence,
    training_evidence,
)

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
TrainStep = Callable[[nn.Module, torch.optim.Optimizer, Any, LossFn], Any]

DEFAULT_SAMPLES = 16
DEFAULT_STEPS = 200
DEFAULT_LR = 1e-2
LOSS_THRESHOLD = 0.01
REGRESSION_FRACTION = 0.01  # regression passes below 1% of its step-0 loss unless told otherwise

# (keyword, cause): a generic cause is listed unless specific evidence already names its keyword.
GENERIC_CAUSES = (
    (
        "disconnected graph",
        "a disconnected graph (.detach(), .item(), torch.no_grad() or a tensor "
        "rebuilt from values inside forward)",
    ),
    ("missing from the optimizer", "parameters missing from the optimizer"),
    ("zero learning rate", "a zero learning rate"),
    (
        "dead units",
        "dead units (ReLUs that never fire, e.g. after a large negative bias or a too-high LR)",
    ),
    (
        "label mismatch",
        "a label mismatch (labels not aligned with inputs, wrong shape, dtype or class indices)",
    ),
)


@dataclass(frozen=True)
class OverfitResult(CheckResult):
    """Outcome of :func:`single_batch_overfit`."""

    check_name: ClassVar[str] = "Single-batch"
    passed: bool
    verdict: str
    task: str
    num_samples: int
    steps_run: int
    passed_at_step: int | None
    final_loss: float
    best_loss: float
    final_accuracy: float | None
    threshold: float
    optimizer: str
    losses: list[float] = field(default_factory=list)
    not_in_optimizer: list[str] = field(default_factory=list)
    without_grad: list[str] = field(default_factory=list)
    zero_grad_layers: list[str] = field(default_factory=list)
    dead_units: dict[str, float] = field(default_factory=dict)
    grads_accumulate: bool = False
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False

    def summary(self) -> str:
        acc = "" if self.final_accuracy is None else f", acc {100 * self.final_accuracy:.1f}%"
        if self.passed_at_step is not None:
            return f"step {self.passed_at_step}: loss {self.final_loss:.4f}{acc}"
        return f"{self.steps_run} steps: best loss {self.best_loss:.4f}{acc}"


# ----------------------------------------------------------------------------------------------
# one training step


def _default_step(
    model: nn.Module, opt: torch.optim.Optimizer, batch: Any, loss_fn: LossFn
) -> Tensor:
    opt.zero_grad(set_to_none=True)
    inputs, targets = split_batch(batch)
    loss = compute_loss(loss_fn, call_model(model, inputs), targets)
    loss.backward()
    opt.step()
    return loss


def _loss_from_step(ret: Any) -> float:
    if isinstance(ret, (tuple, list)) and ret:
        ret = ret[0]
    if isinstance(ret, Tensor):
        return float(ret.detach().reshape(-1)[0])
    if isinstance(ret, (int, float)):
        return float(ret)
    raise CheckError(
        f"train_step returned {type(ret).__name__}; it must return the loss (a tensor or a float)"
    )


def _grads_accumulate(
    params: Sequence[nn.Parameter], prev: list[Tensor | None], fresh: Sequence[Tensor | None]
) -> bool:
    """True when the gradient after the user's step equals previous + fresh, not fresh alone."""
    saw_sum = False
    for p, g0, g1 in zip(params, prev, fresh, strict=True):
        now = p.grad
        if now is None or g1 is None or g0 is None or float(g0.abs().max()) == 0.0:
            continue
        scale = float(g1.abs().max()) + float(g0.abs().max())
        tol = 1e-4 * scale + 1e-7
        if torch.allclose(now, g1, rtol=1e-4, atol=tol):
            return False
        if torch.allclose(now, g0 + g1, rtol=1e-4, atol=tol):
            saw_sum = True
    return saw_sum


# ----------------------------------------------------------------------------------------------
# the check


def single_batch_overfit(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    *,
    num_samples: int = DEFAULT_SAMPLES,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
    optimizer: torch.optim.Optimizer | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    train_step: TrainStep | None = None,
    loss_threshold: float = LOSS_THRESHOLD,
    regression_threshold: float | None = None,
    allow_grad_accumulation: bool = False,
    seed: int = 0,
) -> OverfitResult:
    """Train a copy of ``model`` on the first ``num_samples`` of ``batch`` until it memorises them.

    By default this uses AdamW at ``lr``. ``optimizer`` (the user's, left untouched) or
    ``optimizer_factory(params)`` replace it; ``train_step(model, optimizer, batch, loss_fn)``
    replaces the default zero_grad/forward/backward/step and returns the loss (or
    ``(loss, ...)``). Set ``allow_grad_accumulation`` if your step accumulates on purpose.
    """
    if optimizer is not None and optimizer_factory is not None:
        raise ValueError("pass either optimizer or optimizer_factory, not both")
    with seeded(seed):
        net = prepared_copy(model)
        sub = to_device(take(batch, num_samples), model_device(net))
        inputs, targets = split_batch(sub)
        n = batch_size(inputs)
        warnings: list[str] = []
        if n < num_samples:
            warnings.append(f"the batch has only {n} samples (asked for {num_samples})")
        named = trainable_named_params(net)
        if not named:
            raise CheckError("the model has no trainable parameters (requires_grad=True)")
        opt = _make_optimizer(model, net, named, optimizer, optimizer_factory, lr, warnings)
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        setup = OverfitSetup(
            not_in_opt=[name for name, p in named if id(p) not in held],
            zero_lr=any(group_lr(g) == 0.0 for g in opt.param_groups),
            opt=opt,
        )
        run = OverfitRun(threshold=loss_threshold)
        _train(net, opt, sub, named, loss_fn, run, steps=steps, train_step=train_step,
               regression_threshold=regression_threshold,
               check_accumulation=train_step is not None and not allow_grad_accumulation)  # fmt: skip
        if run.passed_at is None:
            post_mortem(net, inputs, targets, run)
    evidence = setup_evidence(setup, run, warnings) + training_evidence(setup, run, targets)
    return _result(setup, run, n, evidence, warnings)


def _make_optimizer(
    model: nn.Module,
    net: nn.Module,
    named: list[tuple[str, nn.Parameter]],
    optimizer: torch.optim.Optimizer | None,
    optimizer_factory: OptimizerFactory | None,
    lr: float,
    warnings: list[str],
) -> torch.optim.Optimizer:
    """The user's optimizer copied onto ``net``, the factory's, or AdamW at ``lr``."""
    params = [p for _, p in named]
    if optimizer is not None:
        opt, more = copy_user_optimizer(optimizer, model, net)
        warnings += more
        return opt
    if optimizer_factory is not None:
        opt = optimizer_factory(list(params))
        if not isinstance(opt, torch.optim.Optimizer):
            raise CheckError("optimizer_factory must return a torch.optim.Optimizer")
        return opt
    return torch.optim.AdamW(params, lr=lr)


def _train(
    net: nn.Module,
    opt: torch.optim.Optimizer,
    sub: Any,
    named: list[tuple[str, nn.Parameter]],
    loss_fn: LossFn,
    run: OverfitRun,
    *,
    steps: int,
    train_step: TrainStep | None,
    regression_threshold: float | None,
    check_accumulation: bool,
) -> None:
    """Train until the loss is under the threshold (and every sample right), a failure, or
    ``steps``; the model's output is caught by a hook at each forward."""
    inputs, targets = split_batch(sub)  # the same views as the caller's: no copy, no randomness
    params = [p for _, p in named]
    last_output: list[Tensor] = []

    def keep_output(_m: nn.Module, _i: Any, out: Any) -> None:
        last_output[:] = [out] if isinstance(out, Tensor) else []

    hook = net.register_forward_hook(keep_output)
    step_fn: TrainStep = train_step or _default_step
    try:
        for step in range(steps):
            probe = check_accumulation and step == 1
            if probe:
                prev = [None if p.grad is None else p.grad.detach().clone() for p in params]
                fresh_loss = compute_loss(loss_fn, call_model(net, inputs), targets)
                fresh = torch.autograd.grad(fresh_loss, params, allow_unused=True)
            try:
                loss = _loss_from_step(step_fn(net, opt, sub, loss_fn))
            except RuntimeError as exc:
                run.failure = _step_failure(exc)
                break
            if probe:
                run.accumulate = _grads_accumulate(params, prev, fresh)
            run.output = last_output[0] if last_output else None
            if step == 0:
                _first_step(run, named, targets, loss, regression_threshold)
            if _record_step(run, step, loss, targets):
                break
    finally:
        hook.remove()
    run.output = last_output[0] if last_output else None


def _step_failure(exc: RuntimeError) -> str:
    if "does not require grad" in str(exc):
        return (
            "disconnected graph: the loss does not depend on any parameter "
            "(a .detach(), .item(), torch.no_grad() or a tensor rebuilt from "
            "values inside forward)"
        )
    return f"the training step raised {type(exc).__name__}: {exc}"


def _first_step(
    run: OverfitRun,
    named: list[tuple[str, nn.Parameter]],
    targets: Any,
    loss: float,
    regression_threshold: float | None,
) -> None:
    """After the first step: the parameters without a gradient, the layers whose gradient is all
    zero, and whether this is classification (else the threshold is relative to this loss)."""
    run.without_grad = [name for name, p in named if p.grad is None]
    run.zero_grad_layers = sorted(
        {
            layer_of(name)
            for name, p in named
            if p.grad is not None and float(p.grad.detach().abs().max()) == 0.0
        }
    )
    output = run.output
    run.classification = output is not None and is_classification(output, targets)
    if not run.classification:
        run.threshold = (
            regression_threshold
            if regression_threshold is not None
            else REGRESSION_FRACTION * abs(loss)
        )


def _record_step(run: OverfitRun, step: int, loss: float, targets: Any) -> bool:
    """Keep the step's loss and accuracy; True when training ends here (passed, or not finite)."""
    run.losses.append(loss)
    output = run.output
    acc = (
        accuracy(output, targets)
        if run.classification and output is not None and targets is not None
        else None
    )
    if acc is not None:
        run.accs.append(acc)
    if not math.isfinite(loss):
        return True
    if loss < run.threshold and (acc is None or acc == 1.0):
        run.passed_at = step
        return True
    return False


def _result(
    setup: OverfitSetup, run: OverfitRun, n: int, evidence: list[str], warnings: list[str]
) -> OverfitResult:
    """The verdict: passed, a loop bug (the loss fell, but the loop is wrong), or failed."""
    losses, opt = run.losses, setup.opt
    finite = [v for v in losses if math.isfinite(v)]
    if (
        run.passed_at is None
        and not evidence
        and len(finite) == len(losses) >= 20
        and finite[-1] < 0.95 * finite[0]
        and sum(finite[-5:]) < 0.995 * sum(finite[-10:-5])
    ):
        evidence.append(
            f"the loss was still falling after {len(losses)} steps ({finite[0]:.3g} -> "
            f"{finite[-1]:.3g}): the learning rate of {describe_optimizer(opt)} may be too low for this "
            "test; raise steps or lr"
        )
    reached = run.passed_at is not None
    passed = reached and not setup.not_in_opt and not run.accumulate and run.failure is None
    causes: list[str] = []
    if not passed:
        causes = with_generic_causes(evidence, GENERIC_CAUSES) if not reached else list(evidence)
    else:
        warnings += [e for e in evidence if e not in causes]
    verdict = "PASSED" if passed else "FAILED: loop bug" if reached else "FAILED"
    return OverfitResult(
        passed=passed,
        verdict=verdict,
        task="classification" if run.classification else "regression",
        num_samples=n,
        steps_run=len(losses),
        passed_at_step=run.passed_at,
        final_loss=losses[-1] if losses else float("nan"),
        best_loss=min(finite) if finite else float("nan"),
        final_accuracy=run.accs[-1] if run.accs else None,
        threshold=float(run.threshold),
        optimizer=describe_optimizer(opt),
        losses=losses,
        not_in_optimizer=setup.not_in_opt,
        without_grad=run.without_grad,
        zero_grad_layers=run.zero_grad_layers,
        dead_units=run.dead,
        grads_accumulate=run.accumulate,
        causes=causes,
        warnings=warnings,
    )
