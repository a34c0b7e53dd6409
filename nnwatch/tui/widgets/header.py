"""The header line: which run this is (name, host, pid, rank/world), how far it got (step, steps/s,
elapsed), a status badge that changes the moment the trainer pauses, hangs or dies, the dropped-
record count when there is one, and the outcome of the last command the user gave."""

from __future__ import annotations

import math

from rich.style import Style
from rich.text import Text
from textual.app import RenderResult

from nnwatch.sources.base import SourceStatus
from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.widgets.base import Palette, Pane

BADGES = {
    "live": "● LIVE",
    "paused": "‖ PAUSED",
    "hung": "◌ HUNG",
    "finished": "✔ FINISHED",
    "interrupted": "■ INTERRUPTED",  # Ctrl-C or SIGTERM: ended from outside, not by a failure
    "crashed": "✖ CRASHED",
    "lost": "✖ LOST",
    "recorded": "▣ RECORDED",
    "running": "● RUNNING",
    "connecting": "… CONNECTING",
    "catching": "⟳ CATCHING UP",  # live, but the monitor is still receiving the past
    "failed": "✖ READER FAILED",  # the monitor's own reader broke (the run itself may be fine)
}


def badge_style(state: str, pal: Palette) -> Style:
    color = {
        "live": pal.success,
        "running": pal.success,
        "paused": pal.warning,
        "hung": pal.warning,
        "catching": pal.warning,
        "finished": pal.primary,
        "interrupted": pal.warning,
        "recorded": pal.primary,
        "crashed": pal.error,
        "lost": pal.error,
        "failed": pal.error,
    }.get(state, pal.muted).color
    return Style(
        bgcolor=color,
        color="#000000" if state in ("paused", "hung", "catching", "interrupted") else "#ffffff",
        bold=True,
    )


class RunHeader(Pane):
    key = "header"
    redraw_on = frozenset({"cursor", "layer_filter", "outcome", "overlay"})

    DEFAULT_CSS = """
    RunHeader {
        border: none;
        padding: 0 1;
        height: 1;
        background: $panel;
    }
    """

    def build(self) -> RenderResult:
        st, pal = self.ctx.state, self.ctx.palette
        w, h = self.size
        with st.lock:
            status = st.status
            hist = st.history
            last_step = hist.last_step
            last_time = hist.latest("time")
            clip = hist.latest_finite(FieldName.CLIP_THRESHOLD)
        compact = w < 100
        left = self._left(last_step, last_time, compact)
        right = self._notes(status, clip, compact)
        failure = st.reader_failure
        state = "failed" if "reader" in st.reader_errors else status.state
        outcome = self.ctx.outcome
        note = outcome.text or status.message
        if status.catching_up is not None and state == "live":
            have, of = status.catching_up
            state = "catching"  # not LIVE while the screen shows the past
            note = f"catching up: {fmt.count(have)} of {fmt.count(of)}" + (
                f"  {outcome.text}" if outcome.text else ""
            )
        badge = f" {BADGES.get(state, state.upper())} "
        if failure:  # a monitor-side thread failed: that outranks every other note
            # cut to fit beside the badge (and a little of the run's name) on one line
            room = max(w - right.cell_len - len(badge) - 2 - (0 if h >= 2 else 24), 12)
            cut = failure if len(failure) <= room else failure[: room - 1] + "…"
            right.append(cut + "  ", style=pal.error + Style(bold=True))
        elif note:
            right.append(note + "  ", style=pal.error if outcome.error else pal.text)
        right.append(badge, style=badge_style(state, pal))
        return _lay_out(left, right, w, h)

    def _left(self, last_step: float, last_time: float, compact: bool) -> Text:
        """Which run this is and how far it got."""
        st, pal = self.ctx.state, self.ctx.palette
        meta = st.meta
        rate = st.steps_per_second()
        elapsed = last_time - meta.started if math.isfinite(last_time) else math.nan
        left = Text(no_wrap=True, overflow="ellipsis")
        left.append("nnwatch ", style=pal.accent + Style(bold=True))
        left.append(meta.name, style=pal.text + Style(bold=True))
        # a run on another machine: the host as the user named it to ssh, not its own hostname
        host = getattr(self.ctx.source, "files_host", None) or meta.host
        left.append(f" {host}:{meta.pid}" if compact else f"  {host}:{meta.pid}", style=pal.muted)
        rank = (
            f"r{meta.rank}/{meta.world_size}" if compact else f"rank {meta.rank}/{meta.world_size}"
        )
        left.append(f" {rank}" if compact else f"  {rank}", style=pal.muted)
        left.append(" step " if compact else "  step ", style=pal.muted)
        left.append(fmt.count(last_step), style=Style(bold=True))
        left.append(" " if compact else "  ")
        left.append(f"{fmt.si(rate)}", style=Style(bold=True))
        left.append("/s" if compact else " steps/s", style=pal.muted)
        left.append(" elapsed " if compact else "  elapsed ", style=pal.muted)
        left.append(fmt.duration(elapsed))
        return left

    def _notes(self, status: SourceStatus, clip: float, compact: bool) -> Text:
        """The right side before the outcome and the badge: overlay, filter, cursor, drops, clip."""
        view, pal = self.ctx, self.ctx.palette
        right = Text(no_wrap=True, overflow="ellipsis")
        ov = view.overlay
        if ov is not None:  # the second run on the charts, and how it is doing
            with ov.state.lock:
                ov_state = ov.state.status.state
            right.append("vs ", style=pal.muted)
            right.append(fmt.shorten_middle(ov.label, 16 if compact else 32), style=pal.overlay)
            right.append(f" {ov_state}  ", style=pal.muted)
        if view.layer_filter:  # rows are hidden: say so wherever the user looks
            right.append(f"filter {view.layer_filter!r}  ", style=pal.accent + Style(bold=True))
        if view.cursor is not None:
            right.append(f"cursor {fmt.count(view.cursor)}  ", style=pal.accent + Style(bold=True))
        if status.dropped:
            right.append(
                f"dropped {fmt.count(status.dropped)}  ", style=pal.warning + Style(bold=True)
            )
        if math.isfinite(clip):
            right.append(f"clip {fmt.num(clip)}  ", style=pal.muted)
        return right


def _lay_out(left: Text, right: Text, w: int, h: int) -> Text:
    """Left and right on one line (the left cut first), or on two when the header has them."""
    if h >= 2:
        left.truncate(w, overflow="ellipsis")
        pad = max(w - right.cell_len, 0)
        second = Text(" " * pad) + right if right.cell_len <= w else right
        second.truncate(w, overflow="ellipsis")
        return Text("\n").join([left, second])
    room = w - right.cell_len - 1
    left.truncate(max(room, 0), overflow="ellipsis")
    gap = max(w - left.cell_len - right.cell_len, 1)
    out = left + Text(" " * gap) + right
    out.truncate(w, overflow="ellipsis")
    return out
