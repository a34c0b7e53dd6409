"""The events pane: the newest detector findings (severity, step, layer, what to do about it),
snapshots written and commands applied, newest first, one line each."""

from __future__ import annotations

import re

from rich.style import Style
from rich.text import Text
from textual.app import RenderResult

from nnwatch.store.events import (
    CommandApplied,
    Event,
    FindingEvent,
    LogFailed,
    RunEnded,
    SnapshotFailed,
    SnapshotTaken,
    StepSkipped,
    TrainingError,
)
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane

SEVERITY_LABEL = {
    "critical": "CRIT",
    "error": "ERROR",
    "warning": "WARN",
    "warn": "WARN",
    "info": "INFO",
}


def kind_of(ev: Event) -> str:
    """The word that names an event: a finding's kind, else the event's type."""
    if isinstance(ev, FindingEvent):
        return ev.finding.kind
    return str(ev.get("kind") or ev.type or "event")


def describe(ev: Event) -> tuple[str, str, str, str]:
    """(kind label, layer, message, remedy) of any event, in the words the panes show."""
    if isinstance(ev, FindingEvent):
        f = ev.finding
        # the line's own message first: an older writer's words are shown as it wrote them
        msg = str(ev.get("message") or f.kind)
        msg = re.sub(r"^step \d+:\s*", "", msg)  # the step has its own column
        sev = f.severity.lower()
        return SEVERITY_LABEL.get(sev, sev.upper()[:5]), str(f.layer or ""), msg, f.remedy
    if isinstance(ev, SnapshotTaken):
        msg = f"snapshot written: {ev.path or '?'}" + (f" ({ev.reason})" if ev.reason else "")
        return "SNAP", "", msg, ""
    if isinstance(ev, CommandApplied):
        arg_text = " ".join(f"{k}={v}" for k, v in ev.args.items())
        msg = str(ev.get("message") or " ".join(p for p in (ev.command, arg_text, "applied") if p))
        ok = ev.get("ok", True)
        return "CMD", "", msg + ("" if ok else f" (failed: {ev.get('error', '')})"), ""
    if isinstance(ev, SnapshotFailed):
        return "SNAP", "", f"snapshot failed: {ev.error}", ""
    if isinstance(ev, StepSkipped):
        return "SKIP", "", f"step skipped ({ev.reason})", ""
    if isinstance(ev, TrainingError):
        return "ERROR", "", f"nnwatch error in the trainer: {ev.error}", ""
    if isinstance(ev, LogFailed):
        return "ERROR", "", f"the run log stopped: {ev.error}", ""
    if isinstance(ev, RunEnded):
        why = ev.reason or ev.signal or ""
        return "END", "", f"the run ended {ev.status}" + (f": {why}" if why else ""), ""
    # an event of a kind this version does not know: whatever text it carries
    text = next((str(ev[k]) for k in ("message", "error", "reason", "summary") if ev.get(k)), "")
    return (ev.type or "event").upper()[:5], "", text, ""


def label_style(label: str, pal: Palette) -> Style:
    return {
        "CRIT": pal.error + Style(bold=True),
        "ERROR": pal.error + Style(bold=True),
        "WARN": pal.warning + Style(bold=True),
        "INFO": pal.primary,
        "SNAP": pal.success,
        "CMD": pal.accent,
    }.get(label, pal.muted)


def event_line(ev: Event, pal: Palette, width: int, layer_width: int = 14) -> Text:
    label, layer, msg, remedy = describe(ev)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{fmt.count(ev.step):>9} ", style=pal.muted)
    t.append(f"{label:<5} ", style=label_style(label, pal))
    if layer_width:
        t.append(f"{layer[:layer_width]:<{layer_width}} ", style=pal.text if layer else pal.muted)
    if remedy:
        # keep room for the remedy: it is what the user acts on
        room = width - t.cell_len - min(len(remedy) + 3, max(width * 2 // 5, 24))
        if len(msg) > room > 12:
            msg = msg[: room - 1] + "…"
    t.append(msg)
    if remedy:
        t.append(" → ", style=pal.muted)
        t.append(remedy, style=pal.success)
    t.truncate(width, overflow="ellipsis")
    return t


class EventsPane(Pane):
    key = "events"

    def build(self) -> RenderResult:
        st, pal = self.ctx.state, self.ctx.palette
        w, h = self.size
        with st.lock:
            if h <= 2:  # one line (the narrow layout): the newest finding says the most
                findings: list[Event] = [e for e in st.events if isinstance(e, FindingEvent)]
                recent = (findings or list(st.events))[-max(h, 1) :]
            else:
                recent = list(st.events)[-max(h, 1) :]
            total = st.events_total
            sev = dict(st.findings_by_severity)
        counts = [f"{n} {s}" for s, n in sorted(sev.items(), key=lambda kv: _rank(kv[0]))]
        self.border_title = f"[b]Events[/b] {total}" + (
            " · " + " · ".join(counts) if counts else ""
        )
        self.border_subtitle = "e: all events"
        if not recent:
            return Text("no findings yet: training looks healthy", style=pal.muted)
        layer_w = 14 if w >= 100 else 0
        return Text("\n").join(event_line(ev, pal, w, layer_w) for ev in reversed(recent))


def _rank(sev: str) -> int:
    return {"critical": 0, "error": 1, "warning": 2, "warn": 2, "info": 3}.get(sev, 4)
