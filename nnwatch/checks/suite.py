"""Run every pre-flight check in the order an engineer would, and collect one report.

Order matters for reading the report: the initial loss and the batch need no training, the
single-batch overfit tests the loop, and only then are the gradient scale and the LR range worth
reading. A check that crashes becomes a failed line with its error instead of hiding the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from nnwatch.checks.batch_inspect import Decoder, inspect_batch
from nnwatch.checks.common import CheckError, CheckResult, LossFn, count_params
from nnwatch.checks.gradient_health import gradient_check
from nnwatch.checks.loss_at_init import initial_loss
from nnwatch.checks.lr_range import lr_find
from nnwatch.checks.overfit import single_batch_overfit
from nnwatch.checks.report import CheckCrashed, CheckReport

CHECK_NAMES = ("initial_loss", "single_batch", "gradient", "lr_range", "batch")


def _guarded(name: str, fn: Callable[[], CheckResult]) -> CheckResult:
    try:
        return fn()
    except CheckError as exc:
        message = str(exc)
    except Exception as exc:  # a check must not take the others down with it
        message = f"{type(exc).__name__}: {exc}"
    return CheckCrashed(
        name=name,
        passed=False,
        verdict="ERROR",
        message=message,
        causes=[f"the check could not run: {message}"],
    )


def run_all(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    *,
    num_classes: int | None = None,
    loader: Iterable[Any] | None = None,
    decode: Decoder | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    max_norm: float = 1.0,
    overfit_steps: int = 200,
    lr_steps: int = 100,
    skip: Iterable[str] = (),
    seed: int = 0,
) -> CheckReport:
    """Every check on copies of ``model``; ``optimizer`` (optional) is the user's, to reproduce it.

    Without a ``loader`` the LR sweep reuses ``batch``. ``skip`` takes names from
    :data:`CHECK_NAMES`.
    """
    skipped = set(skip)
    unknown = skipped - set(CHECK_NAMES)
    if unknown:
        raise ValueError(
            f"unknown check(s) {sorted(unknown)}; choose from {', '.join(CHECK_NAMES)}"
        )
    sweep_data = loader if loader is not None else [batch]
    plan: list[tuple[str, str, Callable[[], CheckResult]]] = [
        (
            "initial_loss",
            "Initial loss",
            lambda: initial_loss(model, batch, loss_fn, num_classes, seed=seed),
        ),
        (
            "single_batch",
            "Single-batch",
            lambda: single_batch_overfit(
                model, batch, loss_fn, optimizer=optimizer, steps=overfit_steps, seed=seed
            ),
        ),
        (
            "gradient",
            "Gradient norm",
            lambda: gradient_check(model, batch, loss_fn, max_norm, seed=seed),
        ),
        (
            "lr_range",
            "LR range",
            lambda: lr_find(
                model, sweep_data, loss_fn, steps=lr_steps, optimizer=optimizer, seed=seed
            ),
        ),
        ("batch", "Batch", lambda: inspect_batch(batch, decode, num_classes=num_classes)),
    ]
    results = [_guarded(title, fn) for key, title, fn in plan if key not in skipped]
    return CheckReport(
        model_name=type(model).__name__, num_params=count_params(model), results=results
    )
