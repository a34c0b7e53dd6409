"""``nnwatch show SNAPSHOT_DIR``: the failing batch of a snapshot, sample by sample, as text or JSON.

After a divergence the first questions are "what did the grad norm do just before?" and "which
inputs and labels were in that batch?". This prints both: the grad norms of the 50 steps before
the snapshot, then every flagged sample (non-finite or all-zero inputs, out-of-range targets,
empty sequences, duplicate inputs with different labels, extreme table values) with its label
index, its inputs and, given ``--model``, its own loss. ``--all`` prints every sample;
``--json`` is for scripts. The TUI shows the same report on its inspector screen (``i``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

COMMAND = "show"
HELP = (
    "print a snapshot's batch sample by sample (flags, labels, losses) and the grad norms before it"
)

SPARK = "▁▂▃▄▅▆▇█"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli._options import FACTORY, FUNCTION, SNAPSHOT_DIR, SNAPSHOT_HELP

    parser.add_argument("snapshot", metavar=SNAPSHOT_DIR, help=SNAPSHOT_HELP)
    parser.add_argument("--json", action="store_true", help="the whole report as JSON")
    parser.add_argument(
        "--all", action="store_true", help="print every sample, not only flagged ones"
    )
    parser.add_argument(
        "--decode",
        metavar=FUNCTION,
        default=None,
        help="a function that turns a list of token ids into text (module:function or file.py:function)",
    )
    parser.add_argument(
        "--model",
        metavar=FACTORY,
        default=None,
        help="the model factory (as for `nnwatch replay`), to recompute each sample's loss",
    )


def run(args: argparse.Namespace) -> int:
    from nnwatch.diagnosis.batch_report import (
        ReportError,
        build_report,
        load_decoder,
        load_model_factory,
    )

    try:
        decode = load_decoder(args.decode) if args.decode else None
        factory = load_model_factory(args.model) if args.model else None
        report = build_report(args.snapshot, decode=decode, factory=factory)
    except (ReportError, OSError) as exc:
        print(f"nnwatch show: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, allow_nan=False))
    else:
        print(report_text(report, all_samples=args.all))
    return 0


def report_text(report: Any, *, all_samples: bool = False, width: int = 100) -> str:
    from nnwatch.diagnosis.batch_report import fmt_value, label_text

    out: list[str] = []
    out.append(
        f"snapshot of step {report.step}"
        + (f" ({report.reason})" if report.reason else "")
        + (f", run {report.run}" if report.run else "")
    )
    out.append(f"  {report.path}")
    out.append(
        f"recorded loss {_num(report.recorded_loss)}  grad norm {_num(report.recorded_grad_norm)}"
    )
    classes = f", num_classes {report.num_classes}" if report.num_classes else ""
    out.append(
        f"batch: {len(report.samples)} samples ({report.kind}); inputs {report.input_desc}; "
        f"targets {report.target_desc}{classes}"
    )
    out.append("batch flags: " + ("; ".join(report.batch_flags) if report.batch_flags else "none"))
    if len(report.grad_steps):
        out.append(
            f"grad norm, steps {report.grad_steps[0]}..{report.grad_steps[-1]} "
            f"(log scale, ' ' not measured, ✕ non-finite):"
        )
        bad_last = report.grad_steps[-1] == report.step and _nonfinite(report.recorded_grad_norm)
        out.append("  " + sparkline(report.grad_norms, bad_last=bad_last))
        measured = (
            report.grad_norms[:-1] if report.grad_steps[-1] == report.step else report.grad_norms
        )
        fin = measured[np.isfinite(measured)] if len(measured) else measured
        if len(fin):
            out.append(
                f"  before the snapshot: min {_num(float(fin.min()))}  max {_num(float(fin.max()))}  "
                f"last {_num(float(fin[-1]))}"
            )
    if report.loss_source:
        out.append(f"per-sample loss: {report.loss_source}")
    out.extend(f"note: {n}" for n in report.notes)
    shown = report.samples if all_samples else report.flagged
    out.append("")
    if not shown:
        out.append(f"no sample is flagged ({len(report.samples)} samples; --all prints them)")
    for s in shown:
        head = f"#{s.index:<4} label {label_text(s.label)}"
        if s.loss is not None:
            head += f"  loss {_num(s.loss)}"
        if s.flags:
            head += "  ! " + "; ".join(s.flags)
        out.append(head)
        out.append("      " + sample_inputs_text(report.kind, s, width - 6, fmt_value))
    if shown and not all_samples:
        rest = len(report.samples) - len(shown)
        if rest:
            out.append(f"({rest} unflagged sample(s) not shown; --all prints them)")
    return "\n".join(out)


def sample_inputs_text(kind: str, s: Any, width: int, fmt_value: Any) -> str:
    x = s.inputs
    if kind == "tokens":
        ids = " ".join(str(int(v)) for v in x.reshape(-1))
        text = f"ids ({s.length} of {x.size} in the mask): {ids}"
        if s.decoded is not None:
            text = f"text: {s.decoded!r}  " + text
        return text if len(text) <= width else text[: width - 1] + "…"
    if kind == "table":
        parts = []
        for j, v in enumerate(x.reshape(-1)):
            z = s.zscores[j] if s.zscores is not None else math.nan
            parts.append(
                f"{fmt_value(v)}" + (f"(z{z:+.1f})" if math.isfinite(z) and abs(z) >= 2 else "")
            )
        text = "values: " + " ".join(parts)
        return text if len(text) <= width else text[: width - 1] + "…"
    from nnwatch.diagnosis.batch_report import value_stats

    st = value_stats(x)
    return (
        f"{kind} {list(x.shape)}: min {_num(st['min'])} max {_num(st['max'])} "
        f"mean {_num(st['mean'])} non-finite {st['nonfinite']}"
    )


def _nonfinite(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def sparkline(values: Any, *, bad_last: bool = False) -> str:
    """One character per step on a log scale; ' ' for unmeasured (NaN), ✕ for ±inf (and for the
    last step when ``bad_last``: the snapshot's own step, recorded as non-finite)."""
    v = np.asarray(values, dtype=np.float64).copy()
    if bad_last and len(v):
        v[-1] = math.inf
    ok = np.isfinite(v) & (v > 0)
    if not ok.any():
        return "".join("✕" if np.isinf(x) else " " for x in v)
    lv = np.log10(np.where(ok, v, 1.0))
    lo, hi = float(lv[ok].min()), float(lv[ok].max())
    span = hi - lo or 1.0
    chars = []
    for x, good, lx in zip(v, ok, lv, strict=True):
        if good:
            chars.append(SPARK[min(int((lx - lo) / span * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)])
        elif np.isinf(x):
            chars.append("✕")
        else:
            chars.append(" ")
    return "".join(chars)


def _num(x: Any) -> str:
    from nnwatch.tui import format as fmt

    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isnan(x):
        return "nan"  # a value that was computed and is NaN; "–" is for "not known"
    return fmt.num(x)
