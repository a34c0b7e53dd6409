"""What every dashboard pane shares: the context it draws from (the run state, the view settings,
the overlay, the theme palette), and the rule that a pane redraws only when what it draws from
changed (or its size did).

The context is a Textual reactive model: the view settings are ``reactive`` attributes that a pane
``watch``es, and so is ``changed``, the data topics the app's redraw tick found new in the run
state. A pane names what it draws from (``key``: its data topic; ``redraw_on``: the settings) and
redraws itself when one of them changes; nobody else decides which panes to redraw. ``render()``
only returns what ``redraw()`` built, so nothing is computed, let alone polled, while Textual
paints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import App, RenderResult
from textual.color import Color
from textual.dom import DOMNode
from textual.reactive import reactive
from textual.widget import Widget

from nnwatch.tui.model import EVERY_TOPIC, RunState

#: The overlaid run's colour: a magenta that none of the themes' roles (primary, accent, success,
#: error) uses, readable on dark and light backgrounds.
OVERLAY_COLOR = "#c678dd"


@dataclass(frozen=True)
class Outcome:
    """The answer to the last command the user gave, shown in the header."""

    text: str = ""
    error: bool = False


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


class PaneContext(DOMNode):
    """Everything a pane draws from; one per app, shared by its panes and screens. Panes never
    reach into the App: they watch these reactives (``Pane.redraw_on``) and read the rest."""

    zoomed: reactive[bool] = reactive(False, init=False)
    """The charts show the last ``ZOOM_STEPS`` steps instead of the whole run."""
    log_scale: reactive[bool] = reactive(False, init=False)
    """Loss and grad norm (and the snapshot inspector's chart) on a log axis."""
    cursor: reactive[float | None] = reactive(None, init=False)
    """The step being inspected; None follows the newest step."""
    layer_filter: reactive[str] = reactive("", init=False)
    """A substring or glob that narrows the layer and update rows."""
    outcome: reactive[Outcome] = reactive(Outcome, init=False)
    """The answer to the last command the user gave."""
    overlay: reactive[Overlay | None] = reactive(None, init=False, always_update=True)
    """A second run on the loss and grad charts; set again (the same one) when it has news."""
    palette: reactive[Palette] = reactive(lambda: Palette.from_variables({}), init=False)
    """Rich styles from the current theme."""
    changed: reactive[frozenset[str]] = reactive(frozenset, init=False, always_update=True)
    """The run state's data topics found new by the app's last redraw tick (``EVERY_TOPIC``:
    all of them, for a new main run)."""

    def __init__(
        self, state: RunState, source: Any = None, *, gpu_uuids: list[str] | None = None
    ) -> None:
        super().__init__()
        self.state = state
        self.source = source  # the RunSource, for exact reads while scrubbing a recorded run
        self.gpu_uuids = gpu_uuids  # the run's GPUs, when known from outside its meta.json

    def redraw_everything(self) -> None:
        """Every pane draws again (a new main run, a new theme)."""
        self.changed = EVERY_TOPIC


class Pane(Widget):
    """A bordered dashboard pane that rebuilds its picture only when what it draws from changed."""

    key: ClassVar[str] = ""
    """Its data topic in the run state (``RunState.take_changes``); redrawn when it is new."""
    redraw_on: ClassVar[frozenset[str]] = frozenset()
    """The :class:`PaneContext` reactives it draws from besides its data (``zoomed``,
    ``cursor``, ``overlay``...): it watches them, and redraws when one changes."""
    always_redraw_on: ClassVar[frozenset[str]] = frozenset({"palette", "changed"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = cls.redraw_on - set(PaneContext._reactives)
        if unknown:  # a typo would leave the pane stale without a word
            raise TypeError(f"{cls.__name__}.redraw_on names no PaneContext reactive: {unknown}")

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
        self.redraws = 0  # how often the picture was rebuilt; tests check that idle panes stay idle
        self._picture: RenderResult = Text("")
        self.draw_error = ""  # why the last redraw failed ("IndexError: ..."), shown in the pane

    def on_mount(self) -> None:
        for name in sorted(self.redraw_on | self.always_redraw_on):
            self.watch(self.ctx, name, self._context_changed, init=False)

    def _context_changed(self, old: object, new: object) -> None:
        if isinstance(new, frozenset) and new is not EVERY_TOPIC and self.key not in new:
            return  # ``changed``: data of other panes
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def redraw_later(self) -> None:
        """Draw again at the app's next redraw tick (a part of the pane is not mounted yet): its
        data topic is marked changed again, so a history still loading is not drawn half-way."""
        self.ctx.state.mark_changed(self.key)

    def redraw(self) -> None:
        """Rebuild the picture from the run state (UI thread)."""
        if not self.is_mounted:
            return
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
