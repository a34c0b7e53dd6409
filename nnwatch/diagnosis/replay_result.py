"""What a replay found, and the plain report ``nnwatch replay`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from nnwatch.diagnosis.anomaly_trace import AnomalyReport
from nnwatch.diagnosis.float_bits import num_text, same_bits


@dataclass
class ReplayResult:
    step: int
    loss: float
    grad_norm: float
    original_loss: float | None
    original_grad_norm: float | None
    loss_bits: str
    grad_norm_bits: str
    original_loss_bits: str | None
    original_grad_norm_bits: str | None
    grad_norm_method: str
    forward_nonfinite_module: str | None
    backward_nonfinite_module: str | None
    anomaly: AnomalyReport | None = None
    original_source: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def loss_matches(self) -> bool | None:
        return same_bits(self.loss_bits, self.original_loss_bits)

    @property
    def grad_norm_matches(self) -> bool | None:
        return same_bits(self.grad_norm_bits, self.original_grad_norm_bits)

    @property
    def reproduced(self) -> bool:
        """True when both the loss and the gradient norm reproduce bit for bit."""
        return bool(self.loss_matches) and bool(self.grad_norm_matches)

    def report(self) -> str:
        lines = [f"replayed step {self.step}"]
        lines.append(_compared(
            "loss", self.loss, self.loss_bits, self.original_loss, self.original_loss_bits,
            self.loss_matches,
        ))  # fmt: skip
        lines.append(_compared(
            "grad norm", self.grad_norm, self.grad_norm_bits, self.original_grad_norm,
            self.original_grad_norm_bits, self.grad_norm_matches,
        ))  # fmt: skip
        if self.forward_nonfinite_module:
            lines.append(
                f"  forward: first non-finite module output: {self.forward_nonfinite_module}"
            )
        if self.backward_nonfinite_module:
            lines.append(
                f"  backward: first parameter-owning module with non-finite gradients: {self.backward_nonfinite_module}"
            )
        if self.anomaly is not None:
            lines += _anomaly_lines(self.anomaly)
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _compared(
    label: str, now: float, bits: str, orig: float | None, obits: str | None, ok: bool | None
) -> str:
    """One replayed value beside the recorded one, and whether their bits are the same."""
    if orig is None:
        return f"  {label:<10} {num_text(now)} ({bits}); the original value is unknown"
    verdict = "identical, bit for bit" if ok else "DIFFERENT"
    return f"  {label:<10} original {num_text(orig)} ({obits})  replay {num_text(now)} ({bits})  -> {verdict}"


def _anomaly_lines(a: AnomalyReport) -> list[str]:
    """What anomaly mode found: the forward op that made the NaN/Inf, the backward op, or none."""
    lines: list[str] = []
    if a.forward_op:
        where = f" at {a.forward_source}" if a.forward_source else ""
        lines.append(
            f"  forward op that first turned finite inputs into NaN/Inf: {a.forward_op}{where}"
        )
        if a.forward_source and a.forward_source.code:
            lines.append(f"      {a.forward_source.code}")
    if a.backward_op:
        where = f" at {a.backward_source}" if a.backward_source else ""
        lines.append(f"  anomaly: {a.backward_op}{where}")
        if a.backward_source and a.backward_source.code:
            lines.append(f"      {a.backward_source.code}")
        if a.backward_error:
            lines.append(f"      ({a.backward_error})")
    elif not a.forward_op:
        lines.append("  anomaly mode found no NaN in the backward pass")
    return lines
