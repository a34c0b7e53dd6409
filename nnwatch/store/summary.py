"""A run's short summary as text and as HTML: what a notebook shows for a watch or a loaded run.

Pure formatting from plain values (no torch, no UI library), so that the probe's ``Watch`` and
the recorded ``Run`` render the same way in Jupyter (``_repr_html_``) and in a REPL (``repr``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.4g}"


@dataclass(frozen=True)
class RunSummary:
    name: str
    status: str
    steps: int
    loss: float | None
    grad_norm: float | None
    run_dir: str
    findings: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def attach(self) -> str:
        return f"nnwatch attach {self.name}" if self.status in ("running", "paused") else f"nnwatch open {self.run_dir}"

    def text(self) -> str:
        lines = [
            f"nnwatch run {self.name!r}: {self.status}, {self.steps} steps, "
            f"loss {_num(self.loss)}, grad norm {_num(self.grad_norm)}",
            f"  run directory: {self.run_dir}",
            f"  monitor: {self.attach}",
        ]
        for f in self.findings[:10]:
            lines.append(f"  [{f.get('severity')}] step {f.get('step')}: {f.get('kind')}: {f.get('summary', '')}")
            if f.get("remedy"):
                lines.append(f"      fix: {f.get('remedy')}")
        if len(self.findings) > 10:
            lines.append(f"  ... and {len(self.findings) - 10} more findings")
        return "\n".join(lines)

    def html(self) -> str:
        e = html.escape
        colour = {"running": "#2e7d32", "finished": "#1565c0", "crashed": "#c62828",
                  "interrupted": "#ef6c00"}.get(self.status, "#555")
        rows = "".join(
            f"<tr><td>{e(str(f.get('severity')))}</td><td>{e(str(f.get('step')))}</td>"
            f"<td>{e(str(f.get('kind')))}</td><td>{e(str(f.get('summary', '')))}"
            f"<br><i>fix:</i> {e(str(f.get('remedy', '')))}</td></tr>"
            for f in self.findings[:20]
        )
        table = (
            f"<table><tr><th>severity</th><th>step</th><th>kind</th><th>what and what to do</th></tr>{rows}</table>"
            if rows else "<p>No findings.</p>"
        )
        return (
            f"<div><b>nnwatch</b> run <code>{e(self.name)}</code> "
            f"<span style='color:{colour};font-weight:bold'>{e(self.status)}</span>: "
            f"{self.steps} steps, loss {e(_num(self.loss))}, grad norm {e(_num(self.grad_norm))}"
            f"<br>live monitor in a terminal: <code>{e(self.attach)}</code>"
            f"<br><small>{e(self.run_dir)}</small>{table}</div>"
        )


def last_finite(values: Iterable[float]) -> float | None:
    """The last finite value of a series (a skipped measurement is NaN, not the latest value)."""
    found = None
    for v in values:
        if v is not None and math.isfinite(float(v)):
            found = float(v)
    return found
