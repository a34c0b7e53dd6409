"""SVG snapshots of the dashboard at 80x24 and 160x48, compared with baselines in tests/snapshots.

The run is the fixture written to a real run log and opened as ``nnwatch open`` would open it:
seeded data, a fixed clock, and a fixed hardware reading, so the picture is the same on every
machine. After a deliberate change to the screens, regenerate the baselines with
``NNWATCH_UPDATE_SNAPSHOTS=1 pytest tests/tui/test_tui_snapshots.py`` and look at them before
committing (``scripts/screenshots.py`` renders PNGs).
"""

from __future__ import annotations

import asyncio
import difflib
import os
from pathlib import Path

import pytest
import textual

from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp

SNAPSHOTS = Path(__file__).resolve().parents[1] / "snapshots"
UPDATE = bool(os.environ.get("NNWATCH_UPDATE_SNAPSHOTS"))


def render(
    run_dir: Path, size: tuple[int, int], keys: tuple[str, ...] = (), compare: Path | None = None
) -> str:
    other = RecordedSource(compare) if compare is not None else None
    app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware, fps=10, compare=other)

    async def main() -> str:
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app, 3000)
            if app.overlay is not None:
                ov = app.overlay.state.history
                await wait_until(pilot, lambda: ov.rows == OTHER_STEPS)
            if keys:
                await pilot.press(*keys)
            await settle(pilot, app)
            return app.export_screenshot(simplify=True)

    return asyncio.run(main())


def _visible(svg: str) -> list[str]:
    """The text on each screen line, for a readable diff (the SVG itself is compared whole)."""
    import html
    import re

    lines: dict[str, list[tuple[float, str]]] = {}
    for x, line, body in re.findall(
        r'<text [^>]*x="([0-9.]+)"[^>]*line-(\d+)\)">([^<]*)</text>', svg
    ):
        lines.setdefault(line, []).append((float(x), html.unescape(body)))
    return [
        "".join(t for _, t in sorted(v))
        for _, v in sorted(lines.items(), key=lambda kv: int(kv[0]))
    ]


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(FixtureSource(3000), tmp_path_factory.mktemp("snap") / "fixture-run")


OTHER_STEPS = 1500


@pytest.fixture(scope="module")
def other_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, shorter run to overlay (``o``, ``--compare``)."""
    source = FixtureSource(OTHER_STEPS, seed=3, name="lr-high", spike_at=0.8)
    return write_run(source, tmp_path_factory.mktemp("snap") / "other-run")


@pytest.mark.parametrize(
    ("name", "size", "keys", "compare"),
    [
        ("dashboard_80x24", (80, 24), (), False),
        ("dashboard_160x48", (160, 48), (), False),
        ("scrubbed_zoomed_160x48", (160, 48), ("home", *["shift+right"] * 4, "z"), False),
        ("compare_80x24", (80, 24), (), True),
        ("compare_filtered_160x48", (160, 48), ("slash", *"fc", "enter", "escape"), True),
    ],
)
def test_dashboard_matches_its_baseline(
    recorded_run: Path,
    other_run: Path,
    tmp_path: Path,
    name: str,
    size: tuple[int, int],
    keys: tuple[str, ...],
    compare: bool,
) -> None:
    other = other_run if compare else None
    svg = render(recorded_run, size, keys, other)
    again = render(recorded_run, size, keys, other)
    check_baseline(name, svg, again, tmp_path)


@pytest.fixture(scope="module")
def rounded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture run as bf16 weights with a tiny LR train it: most updates round away."""
    source = FixtureSource(3000, updates="rounded")
    return write_run(source, tmp_path_factory.mktemp("snap") / "rounded-run")


@pytest.mark.parametrize(
    ("name", "size", "rounded"),
    [
        ("updates_80x24", (80, 24), False),
        ("updates_160x48", (160, 48), False),
        ("updates_rounded_80x24", (80, 24), True),
        ("updates_rounded_160x48", (160, 48), True),
    ],
)
def test_updates_pane_matches_its_baseline(
    recorded_run: Path,
    rounded_run: Path,
    tmp_path: Path,
    name: str,
    size: tuple[int, int],
    rounded: bool,
) -> None:
    """``u``: the updates pane in the layers' place, its rows focused."""
    run_dir = rounded_run if rounded else recorded_run
    svg = render(run_dir, size, ("u",))
    check_baseline(name, svg, render(run_dir, size, ("u",)), tmp_path)


def check_baseline(name: str, svg: str, again: str, tmp_path: Path) -> None:
    """``svg`` is what two renders agree on and what the baseline ``name`` holds."""
    if again != svg:
        text = "\n".join(difflib.unified_diff(_visible(svg), _visible(again), lineterm="", n=0))
        pytest.fail(f"two renders of the same run differ:\n{text or '(in colour or style only)'}")
    baseline = SNAPSHOTS / f"{name}.svg"
    if UPDATE or not baseline.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        baseline.write_text(svg, newline="\n")
        if not UPDATE:
            pytest.fail(f"no baseline yet; wrote {baseline}: look at it, then commit it")
        return
    expected = baseline.read_text()
    if svg != expected:
        got = tmp_path / f"{name}.svg"
        got.write_text(svg)
        diff = "\n".join(
            list(difflib.unified_diff(_visible(expected), _visible(svg), lineterm="", n=0))[:30]
        )
        pytest.fail(
            f"{name} changed (textual {textual.__version__}); new picture in {got}.\n"
            f"If the change is intended: NNWATCH_UPDATE_SNAPSHOTS=1 pytest {__file__}\n{diff}"
        )
