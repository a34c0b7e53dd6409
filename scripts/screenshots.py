"""Make the README's screenshots from real demo runs: ``python scripts/screenshots.py``.

Each picture comes from a real training script in ``demos/`` with the probe attached, followed
through the real channel (live shots) or opened from its run log (recorded shots), rendered by the
real app at a fixed terminal size, and written to ``screenshots/`` as SVG (Textual's export) and
PNG (``rsvg-convert``, from ``scripts/system-deps.sh``). The GPU pane shows this machine as it is:
without an NVIDIA driver it says so.

Shots:
  dashboard-160x48   exploding demo, live, after ``c`` set the clip threshold to 1.0
  dashboard-80x24    the same run in an 80x24 terminal (the narrow layout)
  open-dead_relu-160x48  a finished dead_relu run opened with ``nnwatch open``, cursor on a finding
  help-160x48        the ``?`` screen
  inspector-nan_log-160x48  ``i`` on the nan_log demo's automatic snapshot: the x1000 reading
  inspector-nan_log-80x24   the same in an 80x24 terminal
  inspector-digits-160x48   an image batch (8x8 digits, a real CNN run): the all-zero sample
  event-detail-160x48  ``e``, then ``d`` on the nan_or_inf finding: message, evidence, remedy
  compare-160x48     the dead_relu run with the healthy run overlaid (``o``), layers filtered (``/``)
  compare-80x24      the same overlay in an 80x24 terminal
  updates-vanishing-160x48  a finished vanishing run, ``u``: the update/weight ratio of each layer
  updates-vanishing-80x24   the same in an 80x24 terminal
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OUT = REPO / "screenshots"
_TEXT = re.compile(
    r'<text class="([^"]+)" x="([0-9.]+)" y="([0-9.]+)" textLength="([0-9.]+)" clip-path="([^"]+)">([^<]*)</text>'
)


def svg_to_png(svg: Path, png: Path) -> bool:
    """PNG through rsvg-convert. Every glyph is placed at its own cell first: rsvg ignores
    textLength, and fallback fonts (braille, box drawing) would otherwise drift off the grid."""
    if shutil.which("rsvg-convert") is None:
        print("screenshots: rsvg-convert not found (scripts/system-deps.sh installs it); SVG only")
        return False
    text = svg.read_text()
    if "xml:space" not in text:
        text = text.replace("<svg ", '<svg xml:space="preserve" ', 1)

    def per_glyph(m: re.Match[str]) -> str:
        cls, x, y, length, clip, body = m.groups()
        chars = html.unescape(body)
        if not chars:
            return m.group(0)
        w = float(length) / len(chars)
        return "".join(
            f'<text class="{cls}" x="{float(x) + i * w:.1f}" y="{y}" clip-path="{clip}">{html.escape(ch)}</text>'
            for i, ch in enumerate(chars)
            if ch not in (" ", "\u00a0")
        )

    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False) as tmp:
        tmp.write(_TEXT.sub(per_glyph, text))
    try:
        subprocess.run(["rsvg-convert", tmp.name, "-o", str(png)], check=True)
    finally:
        os.unlink(tmp.name)
    return True


def save(app: Any, name: str) -> None:
    svg = OUT / f"{name}.svg"
    svg.write_text(app.export_screenshot(simplify=True), newline="\n")
    png = svg.with_suffix(".png")
    print(f"screenshots: {svg.relative_to(REPO)}" + (" + png" if svg_to_png(svg, png) else ""))


def start_demo(name: str, steps: int, delay: float, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(REPO / "demos" / f"{name}.py"), "--steps", str(steps), "--delay", str(delay)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def wait_registered(proc: subprocess.Popen[str], timeout: float = 120.0) -> Any:
    from nnwatch.store.registry import list_runs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in list_runs() if r.pid == proc.pid and r.socket]
        if runs:
            return runs[0]
        if proc.poll() is not None:
            raise SystemExit(f"screenshots: the demo exited early (status {proc.returncode})")
        time.sleep(0.2)
    raise SystemExit("screenshots: the demo never registered")


async def drive(app: Any, size: tuple[int, int], body: Callable[[Any], Awaitable[None]]) -> None:
    async with app.run_test(size=size) as pilot:
        await body(pilot)


def live_shots(steps_before_clip: int) -> None:
    from nnwatch.sources.live import LiveSource
    from nnwatch.testing.tui import settle, wait_until
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.launch import gpu_uuids_for

    proc = start_demo("exploding", 100_000, 0.02, dict(os.environ))
    try:
        info = wait_registered(proc)
        for size, name in (((160, 48), "dashboard-160x48"), ((80, 24), "dashboard-80x24")):
            source = LiveSource.from_info(info)
            app = NNWatchApp(
                source, gpu_uuids=gpu_uuids_for(source.meta.device, list(info.cuda_devices)) or None
            )

            async def body(pilot: Any, app: Any = app, name: str = name) -> None:
                await settle(pilot, app, rows=10, timeout=120)
                if name == "dashboard-160x48":
                    await wait_until(
                        pilot, lambda: app.state.history.last_step >= steps_before_clip, 300
                    )
                    await pilot.press("c")
                    await pilot.press(*"1.0", "enter")
                    await pilot.press("y")
                    await wait_until(pilot, lambda: any("clip" in o for o in app.outcomes), 60)
                    await pilot.pause(8.0)  # let the clipped steps show on the charts
                else:
                    await pilot.pause(2.0)
                await wait_until(pilot, lambda: app.state.hardware is not None, 30)
                await settle(pilot, app)
                await pilot.pause(0.5)
                save(app, name)

            asyncio.run(drive(app, size, body))
    finally:
        proc.kill()
        proc.wait()


_kept: dict[str, Path] = {}


def kept_demo(name: str) -> Path:
    """A demo run recorded headless and kept on disk (once per script run)."""
    if name in _kept:
        return _kept[name]
    out = subprocess.run(
        [sys.executable, "-m", "nnwatch", "demo", name, "--headless", "--keep"],
        env=dict(os.environ), cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    kept = re.search(r"the run is kept in (\S+)", out.stderr)
    if not kept:
        raise SystemExit(f"screenshots: the {name} demo kept no run:\n{out.stderr[-2000:]}")
    _kept[name] = Path(kept.group(1))
    return _kept[name]


def recorded_shots() -> None:
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.testing.tui import settle
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.model import is_finding

    run_dir = kept_demo("dead_relu")

    app = NNWatchApp(RecordedSource(run_dir))

    async def body(pilot: Any) -> None:
        await settle(pilot, app, timeout=120)
        findings = [e for e in app.state.events if is_finding(e)]
        if findings:  # put the cursor on the first finding, as `e` + Enter would
            app.navigation.set_cursor(float(findings[0]["step"]))
        await settle(pilot, app)
        save(app, "open-dead_relu-160x48")
        await pilot.press("question_mark")
        await pilot.pause(0.5)
        save(app, "help-160x48")

    asyncio.run(drive(app, (160, 48), body))


def inspector_shots() -> None:
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.testing.tui import fixed_hardware, settle, wait_until
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.screens.snapshot import SnapshotScreen

    nan_run = kept_demo("nan_log")
    from tests.fixtures.snapshot_runs import image_run

    digits_run = image_run(Path(os.environ["NNWATCH_RUN_DIR"]) / "digits").parent.parent

    def inspect(run_dir: Path, name: str, size: tuple[int, int], detail: bool = False) -> None:
        app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware)

        async def body(pilot: Any) -> None:
            await settle(pilot, app, timeout=120)
            if detail:
                await pilot.press("e")
                events = app.screen.events  # type: ignore[attr-defined]
                row = next(k for k, e in enumerate(events) if e.get("kind") == "nan_or_inf")
                await pilot.press(*["down"] * row, "d")
                await pilot.pause(0.5)
                save(app, name)
                return
            await pilot.press("i")
            await wait_until(pilot, lambda: isinstance(app.screen, SnapshotScreen), 30)
            await wait_until(pilot, lambda: app.screen.report is not None, 60)  # type: ignore[attr-defined]
            await pilot.pause(0.5)
            save(app, name)

        asyncio.run(drive(app, size, body))

    inspect(nan_run, "inspector-nan_log-160x48", (160, 48))
    inspect(nan_run, "inspector-nan_log-80x24", (80, 24))
    inspect(digits_run, "inspector-digits-160x48", (160, 48))
    inspect(nan_run, "event-detail-160x48", (160, 48), detail=True)


def compare_shots() -> None:
    """The dead_relu run with the healthy one overlaid (``o``), the layers filtered to its ReLUs
    (``/``); and the same overlay in an 80x24 terminal."""
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.testing.tui import fixed_hardware, settle, wait_until
    from nnwatch.tui.app import NNWatchApp

    dead, healthy = kept_demo("dead_relu"), kept_demo("healthy")
    for size, name in (((160, 48), "compare-160x48"), ((80, 24), "compare-80x24")):
        app = NNWatchApp(
            RecordedSource(dead), compare=RecordedSource(healthy), hardware=fixed_hardware
        )

        async def body(pilot: Any, app: Any = app, name: str = name) -> None:
            await settle(pilot, app, timeout=120)
            await wait_until(pilot, lambda: app.overlay.state.history.rows > 0, 120)
            if name == "compare-160x48":
                await pilot.press("slash", *"relu", "enter", "escape")
            await settle(pilot, app)
            await pilot.pause(0.5)
            save(app, name)

        asyncio.run(drive(app, size, body))


def updates_shots() -> None:
    """The vanishing demo's run with the updates pane (``u``) in the layers pane's place, its
    rows given back to the dashboard (Escape), at both sizes."""
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.testing.tui import fixed_hardware, settle
    from nnwatch.tui.app import NNWatchApp

    run_dir = kept_demo("vanishing")
    shots = (((160, 48), "updates-vanishing-160x48"), ((80, 24), "updates-vanishing-80x24"))
    for size, name in shots:
        app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware)

        async def body(pilot: Any, app: Any = app, name: str = name) -> None:
            await settle(pilot, app, timeout=120)
            await pilot.press("u", "escape")
            await settle(pilot, app)
            await pilot.pause(0.5)
            save(app, name)

        asyncio.run(drive(app, size, body))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--clip-at", type=int, default=260, help="step at which to press c in the live shot"
    )
    ap.add_argument(
        "--only", choices=("live", "recorded", "inspector", "compare", "updates"), default=None
    )
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="nnwatch-shots-"))
    os.environ["NNWATCH_RUN_DIR"] = str(root)  # demo runs never touch the user's own runs
    os.environ.pop("NO_COLOR", None)
    try:
        if args.only in (None, "live"):
            live_shots(args.clip_at)
        if args.only in (None, "recorded"):
            recorded_shots()
        if args.only in (None, "inspector"):
            inspector_shots()
        if args.only in (None, "compare"):
            compare_shots()
        if args.only in (None, "updates"):
            updates_shots()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(sorted(p.name for p in OUT.iterdir())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
