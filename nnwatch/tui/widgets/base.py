"""What every dashboard pane shares: the run state it reads, the view settings, the theme palette,
and the rule that a pane redraws only when its data (or its size, or the view) changed.

The app's refresh timer compares each pane's ``seen_version`` with ``RunState.versions`` and calls
``redraw()`` on the panes that are behind; ``render()`` only returns what ``redraw()`` built, so
nothing is ever computed, let alone polled, while Textual paints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import App, RenderResult
from textual.color import Color
from textual.widget import Widget

from nnwatch.tui.model import RunState

#: The overlaid run's colour: a magenta that none of the themes' roles (primary, accent, success,
#: error) uses, readable on dark and light backgrounds.
OVERLAY_COLOR = "#c678dd"


@dataclass
class ViewSettings:
    """How the user wants to see the run; changed by key bindings, read by the panes."""

    zoomed: bool = False  # charts show the last ZOOM_STEPS steps instead of the whole run
    log_scale: bool = False  # loss and grad norm on a log axis
    cursor: float | None = None  # the step being inspected; None follows the newest step
    layer_filter: str = ""
    outcome: str = ""  # the answer to the last command the user gave, shown in the header
    outcome_error: bool = False


@dataclass
class Overlay:
    """Another run drawn over the main one on the charts, aligned by step (``o`` picks it).

    It is followed as the main run is: its own ``RunState`` fed by its own collector thread, so a
    live overlay keeps growing. ``label`` names it in the legends.
    """

    state: RunState
    source: Any  # its RunSource
    label: str
    collector: Any = None  # the SourceCollector feeding ``state`` (the app starts and stops it)
    owned: bool = True  # the app closes the source when the overlay goes
    main_label: str = ""  # the main run's name in the legends (tells two runs of one script apart)


@dataclass
class PaneContext:
    """Everything a pane reads. One per app; panes never reach into the App subclass."""

    state: RunState
    view: ViewSettings
    source: Any = None  # the RunSource, for exact reads while scrubbing a recorded run
    gpu_uuids: list[str] | None = None  # the run's GPUs, when known from outside its meta.json
    palette: Palette = field(default_factory=lambda: Palette.from_variables({}))
    overlay: Overlay | None = None  # a second run on the loss and grad charts


@dataclass(frozen=True)
class Palette:
    """Rich styles derived from the current Textual theme, so charts follow ``ctrl+p`` theme changes."""

    primary: Style
    secondary: Style
    accent: Style
    success: Style
    warning: Style
    error: Style
    muted: Style
    text: Style
    bar_empty: Style
    overlay: Style  # the overlaid run's series: a hue no other series of the charts uses

    @classmethod
    def from_variables(cls, v: dict[str, str]) -> Palette:
        background = _solid(v.get("background", "#121212"), None)

        def st(name: str, fallback: str, **kw: Any) -> Style:
            # theme colours may carry alpha (#e0e0e099); Rich needs them blended onto the background
            return Style(color=_solid(v.get(name, fallback), background).hex, **kw)

        return cls(
            primary=st("primary", "#0178D4"),
            secondary=st("secondary", "#004578"),
            accent=st("accent", "#ffa62b"),
            success=st("success", "#4EBF71"),
            warning=st("warning", "#ffa62b"),
            error=st("error", "#ba3c5b"),
            muted=st("foreground-muted", "#808080"),
            text=st("foreground", "#e0e0e0"),
            bar_empty=st("panel-lighten-2", "#3a3a3a"),
            overlay=st("nnwatch-overlay", OVERLAY_COLOR),  # a theme may define its own
        )

    @classmethod
    def from_app(cls, app: App[Any]) -> Palette:
        return cls.from_variables(dict(app.theme_variables))

    def severity(self, severity: str) -> Style:
        s = severity.lower()
        if s in ("error", "critical", "fatal"):
            return self.error
        if s in ("warning", "warn"):
            return self.warning
        return self.primary


def _solid(value: str, background: Color | None) -> Color:
    try:
        color = Color.parse(value)
    except Exception:  # noqa: BLE001 - an odd theme value must not stop the monitor
        color = Color(128, 128, 128)
    if color.a < 1.0 and background is not None:
        return background + color
    return color.with_alpha(1.0)


def panes_reading(*settings: str) -> tuple[str, ...]:
    """The keys of the dashboard panes that draw from any of ``settings`` (their ``reads``), to
    mark changed in ``RunState.versions`` when one of those settings changes. Every pane class is
    defined by then: the dashboard screen imports them all."""
    found: list[str] = []
    todo = list(Pane.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.key and cls.key not in found and cls.reads & set(settings):
            found.append(cls.key)
    return tuple(sorted(found))


class Pane(Widget):
    """A bordered dashboard pane that rebuilds its picture only when told its data changed."""

    key: ClassVar[str] = ""  # its entry in RunState.versions
    #: What this pane draws from besides the run's records: fields of :class:`ViewSettings`
    #: (``zoomed``, ``cursor``...), ``overlay`` (the overlaid run's records) and ``overlay_state``.
    #: Declared here, by the pane that reads them: whoever changes a setting asks
    #: :func:`panes_reading` which panes to redraw, and never names them.
    reads: ClassVar[frozenset[str]] = frozenset()

    DEFAULT_CSS = """
    Pane {
        border: round $panel-lighten-2;
        border-title-color: $text;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        padding: 0 1;
        height: 1fr;
    }
    Pane:focus-within {
        border: round $accent;
    }
    """

    def __init__(
        self, ctx: PaneContext, *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.ctx = ctx
        self.seen_version = -1
        self.redraws = 0  # how often the picture was rebuilt; tests check that idle panes stay idle
        self._picture: RenderResult = Text("")
        self.draw_error = ""  # why the last redraw failed ("IndexError: ..."), shown in the pane

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        """Rebuild the picture from the run state (UI thread)."""
        if not self.is_mounted:
            return
        self.seen_version = self.ctx.state.versions.get(self.key, 0)
        self.redraws += 1
        try:
            self._picture = self.build()
        except Exception as exc:  # noqa: BLE001 - one pane's bug must not take the monitor down
            self.draw_error = f"{type(exc).__name__}: {exc}"
            self.log.error(f"{type(self).__name__} could not draw: {self.draw_error}")
            self._picture = Text(
                f"this pane could not draw: {self.draw_error}", style=self.ctx.palette.error
            )
        else:
            self.draw_error = ""
        self.refresh()

    def build(self) -> RenderResult:  # pragma: no cover - every pane overrides it
        return Text("")

    def render(self) -> RenderResult:
        return self._picture
