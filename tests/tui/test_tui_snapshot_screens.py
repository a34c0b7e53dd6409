"""SVG snapshots (pytest-textual-snapshot) of every pane and screen in its main states: the
dashboard under each view key, a run without a scaler, a crashed run, a failing reader, GPUs, an
overlay swapped in, the help, the events list and a finding's detail, the overlay chooser and the
run picker, the steering dialogs, and the job view (its ranks pane).

Deterministic by construction: the runs are the seeded fixture (``nnwatch.testing.fixture``)
written to a real run log with a fixed clock, pid and host; the hardware reading is fixed; the
terminal size is fixed; listed runs are stand-ins with a fixed age and directory. Each test waits
on the app's state (every record read, no collector half-way through a poll, the screen it
expects on top), never on a sleep. What would change with the clock is kept out of the picture:
toasts (a message may arrive a moment before or after it; the app keeps their text in
``toasts``, and the header shows a command's outcome anyway) and the blink of a text cursor.

The baselines are in ``__snapshots__/test_tui_snapshot_screens/``; after a deliberate change to
the screens, look at the report of a failing run, then ``pytest tests/tui/test_tui_snapshot_screens.py
--snapshot-update``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Input

from nnwatch.sources.hardware import GpuReading, HardwareReading
from nnwatch.sources.job_monitor import RankState, build_view
from nnwatch.sources.job_stacks import RankStacks
from nnwatch.sources.job_view import JobView
from nnwatch.sources.recorded import RecordedSource
from nnwatch.store.jobs import Job
from nnwatch.store.registry import RunInfo
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import GiB, fixed_hardware, settle, wait_until
from nnwatch.tui import app as app_module
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.job_app import JobApp
from nnwatch.tui.picker import RunPickerApp
from nnwatch.tui.screens.compare import CompareScreen
from nnwatch.tui.screens.dialogs import ClipScreen, ConfirmScreen
from nnwatch.tui.screens.events import EventDetailScreen, EventsScreen
from nnwatch.tui.screens.help import HelpScreen
from nnwatch.tui.screens.snapshot import SnapshotScreen
from tests.fixtures import snapshot_runs

SnapCompare = Callable[..., bool]
WIDE, NARROW = (160, 48), (80, 24)
STEPS, OTHER_STEPS = 3000, 1500


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixture run, a run without a scaler or CUDA, a crashed one, and one to overlay."""
    root = tmp_path_factory.mktemp("snapshot-runs")
    return {
        "main": write_run(FixtureSource(STEPS), root / "fixture-run"),
        "no_amp": write_run(FixtureSource(STEPS, amp=False, cuda=False), root / "no-amp-run"),
        "crashed": write_run(FixtureSource(STEPS, end_state="crashed"), root / "crashed-run"),
        "other": write_run(
            FixtureSource(OTHER_STEPS, seed=3, name="lr-high", spike_at=0.8), root / "other-run"
        ),
    }


def gpu_hardware() -> HardwareReading:
    """Two GPUs as NVML would read them, the second one busy and hot."""
    host = fixed_hardware().host
    gpus = (
        GpuReading(0, "GPU-0000", "NVIDIA H100 80GB HBM3", 41.0, 30.5 * GiB, 80.0 * GiB, 52.0, 310.0, 700.0),
        GpuReading(1, "GPU-0001", "NVIDIA H100 80GB HBM3", 97.0, 76.0 * GiB, 80.0 * GiB, 83.0, 690.0, 700.0),
    )  # fmt: skip
    return HardwareReading(time=fixed_hardware().time, host=host, gpus=gpus)


def broken_hardware() -> HardwareReading:
    raise PermissionError("/proc/stat: permission denied")


class SteerableRun(RecordedSource):
    """A recorded run that says it can be steered: the steering dialogs open over it (nothing is
    sent; the tests only look at the dialogs)."""

    @property
    def can_command(self) -> bool:
        return True


class QuietApp(NNWatchApp):
    """The dashboard with its toasts kept in a list instead of on screen."""

    CSS_PATH = str(Path(app_module.__file__).with_name(NNWatchApp.CSS_PATH))  # as the app's

    def __init__(self, source: RecordedSource, **options: Any) -> None:
        super().__init__(source, **options)
        self.toasts: list[str] = []

    def notify(self, message: str, **_: Any) -> None:
        self.toasts.append(message)


def dashboard(run_dir: Path, steerable: bool = False, **options: Any) -> NNWatchApp:
    source = (SteerableRun if steerable else RecordedSource)(run_dir)
    options.setdefault("hardware", fixed_hardware)
    return QuietApp(source, fps=10, **options)


def after(
    *keys: str,
    screen: type[Screen[Any]] | None = None,
    ready: Callable[[Any], bool] | None = None,
    rows: int = STEPS,
) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """What a snapshot waits for: every record read (and the overlay's), then ``keys`` pressed,
    the data settled again, ``screen`` on top and ``ready(app)`` true; no toast left."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, NNWatchApp)
        await settle(pilot, app, rows)
        if app.overlay is not None:
            overlay = app.overlay.state.history
            await wait_until(pilot, lambda: overlay.rows >= OTHER_STEPS)
        if keys:
            await pilot.press(*keys)
            await settle(pilot, app)
        if screen is not None:
            await wait_until(pilot, lambda: isinstance(app.screen, screen))
        if ready is not None:
            await wait_until(pilot, lambda: ready(app))
        for field in app.screen.query(Input):
            field.cursor_blink = False  # the cursor shown, steadily
        await pilot.pause()

    return run_before


DASHBOARD_STATES = {
    # name: (run, size, keys, app options)
    "log_scale_160x48": ("main", WIDE, ("g",), {}),
    "zoomed_80x24": ("main", NARROW, ("z",), {}),
    "cursor_80x24": ("main", NARROW, ("home", *["shift+right"] * 3), {}),
    "cursor_zoomed_log_160x48": ("main", WIDE, ("home", *["shift+right"] * 6, "z", "g"), {}),
    "filter_typed_80x24": ("main", NARROW, ("slash", *"fc"), {}),
    "filter_matches_nothing_160x48": ("main", WIDE, ("slash", *"zzz"), {}),
    "layer_rows_focused_160x48": ("main", WIDE, ("l", "enter", "down", "down"), {}),
    "updates_at_cursor_160x48": ("main", WIDE, ("home", *["shift+right"] * 5, "u"), {}),
    "not_live_outcome_160x48": ("main", WIDE, ("s",), {}),
    "no_amp_160x48": ("no_amp", WIDE, (), {}),
    "no_amp_80x24": ("no_amp", NARROW, (), {}),
    "crashed_160x48": ("crashed", WIDE, (), {}),
    "crashed_80x24": ("crashed", NARROW, (), {}),
    "gpus_160x48": ("main", WIDE, (), {"hardware": gpu_hardware}),
    "very_wide_220x60": ("main", (220, 60), (), {}),
    "between_layouts_120x32": ("main", (120, 32), (), {}),
}


@pytest.mark.parametrize("name", sorted(DASHBOARD_STATES))
def test_dashboard_state(snap_compare: SnapCompare, runs: dict[str, Path], name: str) -> None:
    run, size, keys, options = DASHBOARD_STATES[name]
    app = dashboard(runs[run], False, **options)
    assert snap_compare(app, terminal_size=size, run_before=after(*keys))


def test_dashboard_reader_failed(snap_compare: SnapCompare, runs: dict[str, Path]) -> None:
    """A hardware reader that raises: the header says so in the error's own words."""
    app = dashboard(runs["main"], hardware=broken_hardware, hardware_interval=0.05)
    ready = after(ready=lambda app: bool(app.state.reader_errors) and "failed" in header(app))
    assert snap_compare(app, terminal_size=WIDE, run_before=ready)


def header(app: NNWatchApp) -> str:
    from nnwatch.tui.widgets.header import RunHeader

    return str(getattr(app.query_one(RunHeader)._picture, "plain", ""))


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["160x48", "80x24"])
def test_dashboard_overlay_swapped(
    snap_compare: SnapCompare, runs: dict[str, Path], size: tuple[int, int]
) -> None:
    """``O``: the overlaid run is the main one now, the main one overlaid."""
    app = dashboard(runs["main"], compare=RecordedSource(runs["other"]))
    swapped = after("O", ready=lambda app: app.source.meta.name == "lr-high")
    assert snap_compare(app, terminal_size=size, run_before=swapped)


SCREENS: dict[str, tuple[tuple[str, ...], type[Screen[Any]], tuple[int, int]]] = {
    # name: (keys, the screen on top, size)
    "help_160x48": (("question_mark",), HelpScreen, WIDE),
    "help_80x24": (("question_mark",), HelpScreen, NARROW),
    "events_160x48": (("e",), EventsScreen, WIDE),
    "events_80x24": (("e",), EventsScreen, NARROW),
    "event_detail_160x48": (("e", "d"), EventDetailScreen, WIDE),
    "event_detail_80x24": (("e", "d"), EventDetailScreen, NARROW),
}


@pytest.mark.parametrize("name", sorted(SCREENS))
def test_screen(snap_compare: SnapCompare, runs: dict[str, Path], name: str) -> None:
    keys, screen, size = SCREENS[name]
    app = dashboard(runs["main"])
    assert snap_compare(app, terminal_size=size, run_before=after(*keys, screen=screen))


@pytest.mark.parametrize(
    ("key", "screen", "size"),
    [("p", ConfirmScreen, WIDE), ("c", ClipScreen, NARROW)],
    ids=["confirm_pause_160x48", "clip_80x24"],
)
def test_steering_dialog(
    snap_compare: SnapCompare,
    runs: dict[str, Path],
    key: str,
    screen: type[Screen[Any]],
    size: tuple[int, int],
) -> None:
    app = dashboard(runs["main"], steerable=True)
    assert snap_compare(app, terminal_size=size, run_before=after(key, screen=screen))


@dataclass
class ListedRun:
    """A run as a list shows it, with a fixed age and directory (a RunInfo's age is the clock's)."""

    name: str
    state: str
    step: int
    steps_per_s: float
    pid: int
    rank: int = 0
    world_size: int = 1
    host: str = "gpu-host"
    age: float = 754.0
    live: bool = False
    started: float = 0.0

    @property
    def run_dir(self) -> str:
        return f"/runs/{self.name}-{self.pid}"


LISTED = [
    ListedRun("lr-high", "live", 1234, 41.5, 4242, live=True),
    ListedRun("baseline", "finished", 3000, 55.0, 4100, age=5400.0),
    ListedRun("nan-run", "crashed", 812, math.nan, 3999, age=86400.0 * 2),
]


def test_compare_chooser(snap_compare: SnapCompare, runs: dict[str, Path]) -> None:
    """``o``: the runs to overlay, live first."""
    app = dashboard(runs["main"], lister=lambda: list(LISTED))

    def listed(app: NNWatchApp) -> bool:
        return isinstance(app.screen, CompareScreen) and app.screen.listed

    assert snap_compare(app, terminal_size=WIDE, run_before=after("o", ready=listed))


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["160x48", "80x24"])
def test_run_picker(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    """``nnwatch pick`` (and ``nnwatch`` with several runs): the list to choose from."""
    app = RunPickerApp(lister=lambda: list(LISTED))

    async def listed(pilot: Pilot[Any]) -> None:
        await wait_until(pilot, lambda: len(app.runs) == len(LISTED))
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=listed)


def _info(rank: int, world: int) -> RunInfo:
    return RunInfo(
        name="ddp", pid=100 + rank, host="node-a", rank=rank, world_size=world, state="running",
        message="", step=None, steps_per_s=None, age=1.0, heartbeat_age=None, last_step_age=None,
        dropped_records=0, run_dir=f"/nonexistent/ddp-r{rank}", ring="", socket=None,
        entry_path="", local_rank=rank, started=0.0,
    )  # fmt: skip


def job_view(stuck: bool = False) -> JobView:
    """Four ranks of an eight-rank job here: one went non-finite first, one lags behind;
    ``stuck``: every rank's stacks as well, three waiting in all_reduce for the fourth."""
    job = Job("k", "ddp (4/8 ranks here)", "torchelastic", 8, 0, tuple(_info(r, 8) for r in range(4)))  # fmt: skip
    states = {r: RankState() for r in range(4)}
    for r, st in states.items():
        st.step, st.loss, st.grad_norm, st.step_times = (90 if r == 3 else 100), 0.5 + r / 10, 1.2, [0.5]  # fmt: skip
    states[1].loss, states[1].first = math.nan, {"loss": 97}
    stacks = tuple(RankStacks(r, "node-a", 100 + r, (_thread(r == 3),)) for r in range(4) if stuck)
    return build_view(job, states, dict.fromkeys(range(4), "live"), stacks=stacks)


def _thread(loading: bool) -> dict[str, Any]:
    """A main thread in all_reduce after backward, or (``loading``) still reading its batch."""
    frames: list[list[Any]] = [["train.py", 88, "<module>", "main()"], ["train.py", 61, "main", "loss.backward()"]]  # fmt: skip
    if loading:
        frames[-1] = ["train.py", 52, "main", "x, y = next(batches)"]
        frames.append(["data.py", 17, "__next__", "return self.load(self.i)"])
    else:
        frames.append(["torch/distributed/distributed_c10d.py", 2501, "all_reduce", "work.wait()"])
    return {"name": "MainThread", "main": True, "own": False, "frames": frames}


class FixedJob:
    """A job source whose every poll returns the same view."""

    spec = "ddp"

    def __init__(self, stuck: bool) -> None:
        self.stuck = stuck

    def poll(self) -> JobView:
        return job_view(self.stuck)


@pytest.mark.parametrize(
    ("size", "stuck"),
    [(WIDE, False), (NARROW, False), (WIDE, True)],
    ids=["160x48", "80x24", "stuck_160x48"],
)
def test_job_view(snap_compare: SnapCompare, size: tuple[int, int], stuck: bool) -> None:
    """``nnwatch attach --job``: the ranks pane, full screen; under it, while the job is stuck,
    the stacks pane (every rank's stack, identical ones folded)."""
    app = JobApp(FixedJob(stuck), interval=60.0)

    async def shown(pilot: Pilot[Any]) -> None:
        await wait_until(pilot, lambda: app.views >= 1)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=shown)


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real CNN run on 8x8 digits whose step-8 snapshot holds an all-zero image; its
    weights are seeded and its sums taken on one thread, so every run trains the same."""
    import torch

    root = tmp_path_factory.mktemp("image-run")
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the model is built before the run seeds its training
    try:
        return snapshot_runs.image_run(root / "image").parent.parent
    finally:
        torch.set_num_threads(threads)
        mp.undo()


def test_snapshot_inspector(snap_compare: SnapCompare, image_run: Path) -> None:
    """``i``: the snapshot's batch sample by sample, the first flagged one selected."""
    app = dashboard(image_run)

    def loaded(app: NNWatchApp) -> bool:
        screen = app.screen
        return isinstance(screen, SnapshotScreen) and screen.report is not None

    inspect = after("i", screen=SnapshotScreen, ready=loaded, rows=snapshot_runs.STEPS)
    assert snap_compare(app, terminal_size=WIDE, run_before=inspect)
