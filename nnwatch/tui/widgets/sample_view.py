"""One sample of a snapshot's batch, in full: its label index, its own loss when it could be
recomputed, every flag, and its inputs as what they are: the image itself, the token ids (and
their text when a decoder is known), or the table row with each feature's z-score against the
batch, the extreme ones in colour."""

from __future__ import annotations

import math

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from nnwatch.diagnosis.batch_report import BatchReport, SampleView, fmt_value, label_text
from nnwatch.tui.widgets.base import Palette
from nnwatch.tui.widgets.sample_image import (
    graphics_image_class,
    halfblock,
    pil_image,
    scale_to_fit,
    to_rgb,
)

Z_WARN = 3.0


def batch_range(report: BatchReport) -> tuple[float, float]:
    """The finite value range of the whole batch: every image is drawn on the same scale."""
    lo, hi = math.inf, -math.inf
    for s in report.samples:
        a = np.asarray(s.inputs, dtype=np.float64)
        a = a[np.isfinite(a)]
        if a.size:
            lo, hi = min(lo, float(a.min())), max(hi, float(a.max()))
    return (lo, hi) if lo < hi else (0.0, 1.0)


def header_text(report: BatchReport, s: SampleView, pal: Palette) -> Text:
    t = Text()
    t.append(f"sample #{s.index}", style=pal.text + Style(bold=True))
    t.append("  label ", style=pal.muted)
    t.append(label_text(s.label), style=pal.accent)
    if report.num_classes and isinstance(s.label, int):
        t.append(f" of 0..{report.num_classes - 1}", style=pal.muted)
    if s.loss is not None:
        t.append("  loss ", style=pal.muted)
        t.append("nan" if math.isnan(s.loss) else fmt_value(s.loss), style=pal.text)
    for f in s.flags:
        t.append("\n! ", style=pal.error + Style(bold=True))
        t.append(f, style=pal.error)
    if not s.flags:
        t.append("\nno flag", style=pal.muted)
    return t


def tokens_text(s: SampleView, pal: Palette) -> Text:
    t = Text()
    ids = [int(v) for v in np.asarray(s.inputs).reshape(-1)]
    n = s.length if s.length is not None else len(ids)
    if s.decoded is not None:
        t.append("text  ", style=pal.muted)
        t.append(repr(s.decoded), style=pal.text)
        t.append("\n")
    t.append(f"ids   ({n} of {len(ids)} in the mask)\n", style=pal.muted)
    for k, v in enumerate(ids):
        t.append(f"{v} ", style=pal.text if k < n else pal.muted)
    if isinstance(s.label, list):
        t.append("\ntargets\n", style=pal.muted)
        t.append(" ".join(str(v) for v in s.label), style=pal.accent)
    return t


def table_text(s: SampleView, pal: Palette) -> Text:
    t = Text()
    t.append(f"{'feature':>7}  {'value':>10}  {'z':>6}\n", style=pal.muted + Style(bold=True))
    x = np.asarray(s.inputs).reshape(-1)
    z = s.zscores if s.zscores is not None else np.full(len(x), np.nan)
    for j, (v, zj) in enumerate(zip(x, z, strict=True)):
        bad = not math.isfinite(float(v))
        style = (
            pal.error + Style(bold=True)
            if bad or (math.isfinite(zj) and abs(zj) >= Z_WARN)
            else pal.text
        )
        zs = f"{zj:+6.1f}" if math.isfinite(zj) else "     –"
        t.append(f"{j:>7}  {fmt_value(v):>10}  {zs}\n", style=style)
    return t


def other_text(s: SampleView, pal: Palette) -> Text:
    a = np.asarray(s.inputs)
    return Text(
        f"inputs {list(a.shape)} {a.dtype}\n{np.array2string(a, threshold=64)}", style=pal.text
    )


class SampleDetail(VerticalScroll):
    """The selected sample; ``show`` replaces what is on screen."""

    DEFAULT_CSS = """
    SampleDetail {
        border: round $panel-lighten-2;
        border-title-color: $text;
        padding: 0 1;
        height: 2fr;
    }
    SampleDetail #sample-head { height: auto; }
    SampleDetail #sample-body { height: auto; margin-top: 1; }
    SampleDetail .graphics { width: auto; height: auto; max-height: 16; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "[b]Sample[/b]"
        self.shown: SampleView | None = None
        self.body_text = Text("")  # what the body shows, for tests

    def compose(self) -> ComposeResult:
        yield Static("", id="sample-head")
        yield Static("", id="sample-body")

    def show(
        self, report: BatchReport, s: SampleView, pal: Palette, value_range: tuple[float, float]
    ) -> None:
        self.shown = s
        self.border_title = f"[b]Sample #{s.index}[/b] of {len(report.samples)} · {report.kind}"
        self.query_one("#sample-head", Static).update(header_text(report, s, pal))
        for old in self.query(".graphics"):
            old.remove()
        body = self.query_one("#sample-body", Static)
        if report.kind == "image":
            px, bad = to_rgb(s.inputs, *value_range)
            note = Text(
                f"\n{px.shape[1]}x{px.shape[0]} px, batch range {fmt_value(value_range[0])}..{fmt_value(value_range[1])}"
                + (f", {int(bad.sum())} non-finite (red)" if bad.any() else ""),
                style=pal.muted,
            )
            widget_cls = graphics_image_class()
            if widget_cls is not None:
                img = widget_cls(pil_image(px), classes="graphics")
                self.mount(img, before=body)
                self.body_text = note
            else:
                width = max(self.size.width - 4, 16)
                self.body_text = halfblock(scale_to_fit(px, min(width, 48), 12)) + note
        elif report.kind == "tokens":
            self.body_text = tokens_text(s, pal)
        elif report.kind == "table":
            self.body_text = table_text(s, pal)
        else:
            self.body_text = other_text(s, pal)
        body.update(self.body_text)

    @property
    def head_text(self) -> str:
        return str(self.query_one("#sample-head", Static).render())


def describe_flags(flags: list[str], width: int) -> str:
    if not flags:
        return ""
    text = flags[0] + (f" (+{len(flags) - 1})" if len(flags) > 1 else "")
    return text if len(text) <= width else text[: width - 1] + "…"
