"""A 1 Hz background sampler of process CPU and memory, plus the heartbeat callbacks.

psutil costs tens of microseconds a call, so it never runs per step: the training thread only
reads the two floats this thread last wrote.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import psutil


class SystemSampler:
    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.cpu_percent = math.nan
        self.rss = math.nan
        self.beats: list[Callable[[], None]] = []  # called every tick (ring heartbeat, hang checks)
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, name="nnwatch-sysmon", daemon=True)

    def start(self) -> None:
        try:
            self._proc.cpu_percent(None)  # the first call primes the counter
        except psutil.Error:
            pass
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.cpu_percent = float(self._proc.cpu_percent(None))
                self.rss = float(self._proc.memory_info().rss)
            except psutil.Error:
                pass
            for beat in list(self.beats):
                try:
                    beat()
                except Exception:  # noqa: BLE001 - a failing listener must not stop the sampler
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
