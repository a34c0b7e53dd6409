"""Set-up faults the records show outright: gradients never cleared, a negative LR.

These are not symptoms to be inferred from a loss curve: the step records hold them (whether the
last update's gradients were still there when the next backward began; the LR of every group).
Each is reported once, early, with the fix, before its symptoms (a loss that climbs, a gradient
norm that grows step after step) are mistaken for an LR that is merely too high.
"""

from __future__ import annotations

from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.detectors.base import Detector
from nnwatch.diagnosis.history import RunHistory
from nnwatch.diagnosis.observed import KEPT_STEPS
from nnwatch.diagnosis.row import Row
from nnwatch.store.finding import Finding, fmt
from nnwatch.store.schema import FieldName


class SetupFaultDetector(Detector):
    """Reports ``grads_not_cleared`` and ``lr_negative``, each once per run."""

    kind = "setup_fault"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.reported: set[str] = set()

    def update(self, row: Row, hist: RunHistory) -> Finding | None:
        # the shared observations take this row after the detectors: count it here
        kept = hist.obs.kept + 1 if row.grads_kept == 1.0 else (0 if row.grads_kept == 0.0 else hist.obs.kept)
        if kept >= KEPT_STEPS and "grads_not_cleared" not in self.reported:
            self.reported.add("grads_not_cleared")
            return Finding(
                kind="grads_not_cleared",
                severity="error",
                step=row.step,
                summary=(
                    f"the gradients are not cleared between updates: on {kept} updates in a "
                    "row, backward() added to the previous update's gradients, which nobody had "
                    "zeroed. Each step's gradient then holds the sum of every earlier one: the "
                    "gradient norm grows step after step and the updates overshoot."
                ),
                remedy="call optimizer.zero_grad() (or model.zero_grad()) once per update, before backward()",
                evidence={"updates_not_cleared": float(kept), FieldName.GRAD_NORM: row.grad_norm},
                onset_step=row.step - kept + 1,
            )
        lr = row.lr
        if lr.size and bool((lr < 0).any()) and "lr_negative" not in self.reported:
            self.reported.add("lr_negative")
            neg = float(lr[lr < 0][0])
            return Finding(
                kind="lr_negative",
                severity="error",
                step=row.step,
                summary=(
                    f"the LR is negative ({fmt(neg)}): every update climbs the gradient instead of "
                    "descending it, so the loss can only rise."
                ),
                remedy="make the LR positive (look for a sign error in the LR, its schedule or a hand-written update)",
                evidence={"lr": neg, "loss": row.loss},
            )
        return None
