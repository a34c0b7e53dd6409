"""Helpers for driving the dashboard headless: fixed hardware readings and waiting for data.

Tests, the screenshot script and the benchmark share them, so that what the tests check is what
the screenshots show. A fixed reading plays the role of a fixed clock: psutil's live CPU numbers
would make every snapshot differ.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from nnwatch.sources.hardware import HardwareReading, HostReading
from nnwatch.testing.fixture import FIXED_START

GiB = float(1 << 30)


def fixed_hardware() -> HardwareReading:
    """What this repository's CI machines look like: no NVIDIA driver, a small host."""
    return HardwareReading(
        time=FIXED_START,
        host=HostReading(cpu_percent=23.0, cpu_count=16, ram_used=9.4 * GiB, ram_total=62.7 * GiB),
        gpus=(),
        nvml_error="NVML unavailable: no NVIDIA driver",
    )


async def wait_until(pilot: Any, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Let the app run until ``condition()`` holds; raise TimeoutError with a clear message."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the app did not reach the expected state within {timeout:.0f} s")
        await pilot.pause(0.05)


async def settle(pilot: Any, app: Any, rows: int | None = None, timeout: float = 20.0) -> None:
    """Wait for the first poll (and ``rows`` records), then draw every pane once more.

    Drawn only once no collector is half-way through a poll (a run's rows are counted before its
    layers, events and end are taken in) and the app has heard that the history is loaded (while
    it loads, only the header is redrawn): otherwise two renders of one run can differ.
    """

    def ready() -> bool:
        if app.collector.polls < 1 or not app.collector.caught_up or app.loading:
            return False
        overlay = app.overlay
        if overlay is not None and not overlay.collector.caught_up:
            return False
        return rows is None or app.state.history.rows >= rows

    await wait_until(pilot, ready, timeout)
    app.redraw_everything()
    await pilot.pause()
    await asyncio.sleep(0)
