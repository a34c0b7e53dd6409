"""The pre-flight report: every check's result, as aligned text or as JSON.

Kept apart from the checks so the Python API, the ``nnwatch check`` command and any future UI
share one wording and one exit-code rule (non-zero as soon as one check fails).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from nnwatch.checks.common import CheckResult, format_count

NAME_WIDTH = 18
SUMMARY_WIDTH = 40


@dataclass(frozen=True)
class CheckCrashed(CheckResult):
    """A check that could not run (bad batch, loss_fn error...): it counts as a failure."""

    check_name: ClassVar[str] = "check"
    name: str
    passed: bool
    verdict: str
    message: str
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False

    def summary(self) -> str:
        return self.message if len(self.message) <= SUMMARY_WIDTH else self.message[:37] + "..."

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["check"] = self.name
        return out


def result_name(result: CheckResult) -> str:
    return result.name if isinstance(result, CheckCrashed) else result.check_name


@dataclass(frozen=True)
class CheckReport:
    """All results of one ``run_all``, in the order they ran."""

    model_name: str
    num_params: int
    results: list[CheckResult]

    @property
    def passed_count(self) -> int:
        return sum(1 for r in self.results if r.passed and not r.skipped)

    @property
    def failed_count(self) -> int:
        return sum(1 for r in self.results if not r.passed)

    @property
    def skipped_count(self) -> int:
        return sum(1 for r in self.results if r.skipped)

    @property
    def ok(self) -> bool:
        return self.failed_count == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def get(self, name: str) -> CheckResult | None:
        """The result of the check named ``name`` ("Initial loss", "Single-batch", ...)."""
        return next((r for r in self.results if result_name(r) == name), None)

    def counts_line(self) -> str:
        line = f"checks: {self.passed_count} passed, {self.failed_count} failed"
        return line + (f", {self.skipped_count} skipped" if self.skipped_count else "")

    def table(self) -> str:
        lines = [
            f"[nnwatch check] model={self.model_name} ({format_count(self.num_params)} params)"
        ]
        for r in self.results:
            name = result_name(r)
            lines.append(f"  {name:<{NAME_WIDTH}}{r.summary():<{SUMMARY_WIDTH}}  {r.verdict}")
        return "\n".join(lines)

    def details(self, plot: bool = True) -> str:
        """Causes, warnings, the LR curve and the decoded samples, below the table."""
        blocks: list[str] = []
        for r in self.results:
            name = result_name(r)
            lines = []
            if r.causes:
                lines.append(f"{name}: likely causes, most specific first")
                lines += [f"  - {c}" for c in r.causes]
            if r.warnings:
                lines.append(f"{name}: worth a look")
                lines += [f"  ! {w}" for w in r.warnings]
            if plot and hasattr(r, "plot") and getattr(r, "smoothed", None):
                lines.append(f"{name}: smoothed loss against learning rate")
                lines += ["  " + line for line in r.plot().splitlines()]  # type: ignore[attr-defined]
            if hasattr(r, "samples_text") and getattr(r, "samples", None):
                lines.append(f"{name}: first samples beside their labels")
                lines += ["  " + line for line in r.samples_text().splitlines()]  # type: ignore[attr-defined]
            if lines:
                blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def format_text(self, plot: bool = True, details: bool = True) -> str:
        text = self.table() + "\n" + self.counts_line()
        extra = self.details(plot) if details else ""
        return text + ("\n\n" + extra if extra else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "params": self.num_params,
            "passed": self.passed_count,
            "failed": self.failed_count,
            "skipped": self.skipped_count,
            "ok": self.ok,
            "checks": [r.to_dict() for r in self.results],
        }
