"""The dashboard's key bindings, and which of them apply to which run.

Every binding has an id (``?`` lists them) so users can remap it (``keymap.py``). The keys that
steer training come from the command specification (``keyed_commands()``: key, footer word, help
line, id), so a command given a key there gets its binding here without an edit; they are greyed
out, and explained when pressed, for a run that cannot be steered. The rank keys only show for a
rank of a distributed job, the overlay keys only while one is shown.
"""

from __future__ import annotations

from textual.binding import Binding

from nnwatch.channel.commands import keyed_commands

#: The action of every steering key: ``steer('<command>')`` (see ``steering.py``).
STEER = "steer"


def steer_action(command: str) -> str:
    """The binding action that sends ``command`` (Textual passes the name to ``action_steer``)."""
    return f"{STEER}({command!r})"


def steering_bindings() -> list[Binding]:
    """One binding per keyed command of the spec, in the spec's order."""
    return [
        Binding(
            spec.key,
            steer_action(name),
            spec.key_label or name,
            id=spec.key_id or name,
            tooltip=spec.key_help or spec.summary,
        )
        for name, spec in keyed_commands().items()
        if spec.key is not None
    ]


STEERING_BINDINGS = steering_bindings()
#: Actions that change training: greyed out (and explained) when the source cannot be steered.
#: Both forms: the action name ``check_action`` is asked about, and each binding's action string.
STEERING = frozenset({STEER, *(b.action for b in STEERING_BINDINGS)})
#: Actions that only mean something for a rank of a distributed job: hidden for a single process.
RANK_ACTIONS = frozenset({"prev_rank", "next_rank"})
#: Actions that only mean something while another run is overlaid on the charts.
OVERLAY_ACTIONS = frozenset({"clear_overlay", "swap_overlay"})
NOT_LIVE = "this run is not live, so it cannot be steered; attach to a running trainer with `nnwatch attach`"

BINDINGS: list[Binding] = [
    *STEERING_BINDINGS,
    Binding("l", "focus_layers", "layer", id="layers", tooltip="focus the layers pane: type to filter, Enter for the rows"),
    Binding("u", "toggle_updates", "update", id="updates", tooltip="each layer's update/weight ratio on a log scale, in place of the layers (u again: the layers)"),
    Binding("slash", "filter", "filter", id="filter", key_display="/", tooltip="filter the layers: a substring or a glob (blocks.*.act)"),
    Binding("z", "toggle_zoom", "zoom", id="zoom", tooltip="charts: last 500 steps <-> whole run"),
    Binding("g", "toggle_log_scale", "log", id="log_scale", tooltip="log scale on every chart (loss, grad norm, snapshot inspector)"),
    Binding("o", "choose_overlay", "compare", id="overlay", tooltip="overlay another run on the loss and grad charts"),
    Binding("O", "swap_overlay", "swap", id="swap_overlay", tooltip="overlay: swap it with the main run"),
    Binding("x", "clear_overlay", "drop", id="clear_overlay", tooltip="overlay: remove it from the charts"),
    Binding("e", "show_events", "event", id="events", tooltip="all events; Enter jumps to a step, d details, i inspects a snapshot"),
    Binding("i", "inspect_snapshot", "inspect", id="inspect", tooltip="the snapshot at or before the step cursor: its batch sample by sample"),
    Binding("P", "pull_snapshot", "pull", id="pull", tooltip="remote run: copy the snapshot at the step cursor to this machine, checked"),
    Binding("r", "reconnect", "recon", id="reconnect", tooltip="reconnect to the run"),
    Binding("left_square_bracket", "prev_rank", "rank-", id="prev_rank", key_display="[", tooltip="distributed job: watch the previous rank"),
    Binding("right_square_bracket", "next_rank", "rank+", id="next_rank", key_display="]", tooltip="distributed job: watch the next rank"),
    Binding("question_mark", "show_help", "help", id="help", key_display="?", tooltip="this help"),
    Binding("q", "quit", "quit", id="quit", tooltip="quit the monitor (training goes on)"),
    Binding("escape", "clear_filter", "unfilter", id="clear_filter", tooltip="clear the layer filter"),
    Binding("left", "move_cursor(-1)", "step back", id="cursor_back", show=False, tooltip="step cursor back"),
    Binding("right", "move_cursor(1)", "step fwd", id="cursor_forward", show=False, tooltip="step cursor forward"),
    Binding("shift+left", "move_cursor(-10)", "back x10", id="cursor_back_fast", show=False, tooltip="step cursor back, 10x"),
    Binding("shift+right", "move_cursor(10)", "fwd x10", id="cursor_forward_fast", show=False, tooltip="step cursor forward, 10x"),
    Binding("home", "cursor_start", "first step", id="cursor_start", show=False, tooltip="cursor to the first step"),
    Binding("end", "cursor_follow", "follow", id="cursor_follow", show=False, tooltip="cursor off: follow the newest step"),
]  # fmt: skip


def footer_state(
    action: str,
    *,
    can_command: bool,
    has_ranks: bool,
    has_overlay: bool,
    files_remote: bool,
    filtering: bool,
) -> bool | None:
    """How the footer shows ``action`` for this run (Textual's ``check_action``): True shown,
    None greyed out, False hidden."""
    if action in STEERING and not can_command:
        return None  # shown greyed out in the footer; pressing it explains why (on_key)
    if action in RANK_ACTIONS and not has_ranks:
        return False  # a single process: no rank selector in the footer
    if action in OVERLAY_ACTIONS and not has_overlay:
        return False  # nothing overlaid: nothing to drop or swap
    if action == "pull_snapshot" and not files_remote:
        return False  # the snapshots are on this machine already
    if action == "clear_filter" and not filtering:
        return False  # Escape has nothing to clear; it stays free for the panes
    return True


def help_note(binding: Binding, *, can_command: bool, has_overlay: bool) -> str:
    """Why a key does nothing now, for the help screen ("" when it does something)."""
    if binding.action in STEERING and not can_command:
        return "not live"
    if binding.action in OVERLAY_ACTIONS and not has_overlay:
        return "after o"
    return ""
