"""The events pane: the newest detector findings (severity, step, layer, what to do about it),
snapshots written and commands applied, newest first, one line each."""

from __future__ import annotations

import re
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.app import RenderResult

from nnwatch.tui import format as fmt
from nnwatch.tui.model import is_finding
from nnwatch.tui.widgets.base import Palette, Pane

SEVERITY_LABEL = {
    "critical": "CRIT",
    "error": "ERROR",
    "warning": "WARN",
    "warn": "WARN",
    "info": "INFO",
}


def describe(ev: dict[str, Any]) -> tuple[str, str, str, str]:
    """(kind label, layer, message, remedy) of any event, in the words the panes show."""
    if is_finding(ev):
        sev = str(ev.get("severity", "info")).lower()
        msg = str(ev.get("message") or ev.get("kind", "finding"))
        msg = re.sub(r"^step \d+:\s*", "", msg)  # the step has its own column
        return (
            SEVERITY_LABEL.get(sev, sev.upper()[:5]),
            str(ev.get("layer") or ""),
            msg,
            str(ev.get("remedy") or ""),
        )
    kind = str(ev.get("type", "event"))
    if kind == "snapshot":
        reason = ev.get("reason")
        msg = f"snapshot written: {ev.get('path', '?')}" + (f" ({reason})" if reason else "")
        return "SNAP", "", msg, ""
    if kind == "command":
        args = ev.get("args") or {}
        arg_text = (
            " ".join(f"{k}={v}" for k, v in args.items()) if isinstance(args, dict) else str(args)
        )
        name = ev.get("command") or ev.get("name") or "?"
        msg = str(ev.get("message") or " ".join(p for p in (str(name), arg_text, "applied") if p))
        ok = ev.get("ok", True)
        return "CMD", "", msg + ("" if ok else f" (failed: {ev.get('error', '')})"), ""
    if kind == "snapshot_failed":
        return "SNAP", "", f"snapshot failed: {ev.get('error', '?')}", ""
    if kind == "skipped_step":
        return "SKIP", "", f"step skipped ({ev.get('reason', '')})", ""
    if kind == "error":
        return "ERROR", "", f"nnwatch error in the trainer: {ev.get('error', '?')}", ""
    if kind == "log_failed":
        return "ERROR", "", f"the run log stopped: {ev.get('error', '?')}", ""
    if kind == "run_ended":
        why = ev.get("reason") or ev.get("signal") or ""
        return "END", "", f"the run ended {ev.get('status', '?')}" + (f": {why}" if why else ""), ""
    # an event of a kind this version does not know: whatever text it carries
    text = next((str(ev[k]) for k in ("message", "error", "reason", "summary") if ev.get(k)), "")
    return kind.upper()[:5], "", text, ""


def label_style(label: str, pal: Palette) -> Style:
    return {
        "CRIT": pal.error + Style(bold=True),
        "ERROR": pal.error + Style(bold=True),
        "WARN": pal.warning + Style(bold=True),
        "INFO": pal.primary,
        "SNAP": pal.success,
        "CMD": pal.accent,
    }.get(label, pal.muted)


def event_line(ev: dict[str, Any], pal: Palette, width: int, layer_width: int = 14) -> Text:
    label, layer, msg, remedy = describe(ev)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{fmt.count(ev.get('step')):>9} ", style=pal.muted)
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
                findings = [e for e in st.events if is_finding(e)]
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
