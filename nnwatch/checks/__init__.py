"""Pre-flight checks: the debugging checklist to run before a long training job.

Is the initial loss near ln(K)? Can the model overfit one batch? Are the gradients sane, and does
clipping keep their direction? What learning rate is sensible? Do inputs and labels line up?
Each question is one function returning a frozen result (``passed``, ``verdict``, numbers,
``causes``, ``to_dict()``); ``run_all`` asks them all and returns a printable report. Every check
works on a deep copy, so the caller's model and optimizer are never touched, and a seed makes the
numbers repeatable. This package imports no UI library.
"""

from __future__ import annotations

from nnwatch.checks.batch_inspect import BatchResult, inspect_batch
from nnwatch.checks.common import CheckError, CheckResult
from nnwatch.checks.gradient_health import GradientResult, gradient_check
from nnwatch.checks.loss_at_init import InitialLossResult, initial_loss
from nnwatch.checks.lr_range import LRFindResult, lr_find, steepest_slope_lr, suggest_lr
from nnwatch.checks.overfit import OverfitResult, single_batch_overfit
from nnwatch.checks.report import CheckCrashed, CheckReport
from nnwatch.checks.suite import CHECK_NAMES, run_all

__all__ = [
    "CHECK_NAMES",
    "BatchResult",
    "CheckCrashed",
    "CheckError",
    "CheckReport",
    "CheckResult",
    "GradientResult",
    "InitialLossResult",
    "LRFindResult",
    "OverfitResult",
    "gradient_check",
    "initial_loss",
    "inspect_batch",
    "lr_find",
    "run_all",
    "single_batch_overfit",
    "steepest_slope_lr",
    "suggest_lr",
]
