"""Hysteresis: one finding per episode of a problem, not one per step.

A condition that flickers around its threshold would otherwise report on every crossing. An episode
opens after ``confirm`` consecutive hits and closes only after ``release`` consecutive misses, so a
problem that persists is reported once and a problem that comes back after a real recovery is
reported again.
"""

from __future__ import annotations

from typing import cast

import numpy as np


class Episode:
    """Hysteresis for one condition: one finding per episode, not one per step.

    The episode opens after ``confirm`` consecutive hits and closes after ``release`` consecutive
    misses. ``update`` returns True exactly once per episode, at the step where it opens.
    """

    __slots__ = ("confirm", "release", "active", "hits", "misses", "first_hit", "opened_at")

    def __init__(self, confirm: int = 1, release: int = 20) -> None:
        self.confirm = max(1, int(confirm))
        self.release = max(1, int(release))
        self.active = False
        self.hits = 0
        self.misses = 0
        self.first_hit = -1
        self.opened_at = -1

    def update(self, hit: bool, step: int) -> bool:
        if hit:
            if self.hits == 0:
                self.first_hit = step
            self.hits += 1
            self.misses = 0
            if not self.active and self.hits >= self.confirm:
                self.active = True
                self.opened_at = step
                return True
            return False
        self.hits = 0
        if self.active:
            self.misses += 1
            if self.misses >= self.release:
                self.active = False
                self.misses = 0
        return False

    def open_now(self, step: int) -> bool:
        """Open the episode immediately (e.g. the guard saw it first); False if it was open already."""
        self.hits = max(self.hits, self.confirm)
        self.misses = 0
        if self.active:
            return False
        self.active = True
        self.first_hit = step if self.first_hit < 0 else self.first_hit
        self.opened_at = step
        return True


class EpisodeArray:
    """:class:`Episode` for many layers at once, with numpy counters (one update per row)."""

    def __init__(self, n: int, confirm: int = 1, release: int = 20) -> None:
        self.confirm = max(1, int(confirm))
        self.release = max(1, int(release))
        self.active = np.zeros(n, dtype=bool)
        self.hits = np.zeros(n, dtype=np.int64)
        self.misses = np.zeros(n, dtype=np.int64)
        self.first_hit = np.full(n, -1, dtype=np.int64)
        self._busy = False

    def update(self, hit: np.ndarray, step: int, observed: np.ndarray | None = None) -> np.ndarray:
        """Count hits/misses where ``observed`` (default: everywhere); returns the newly opened mask."""
        if not self._busy and not hit.any():
            return hit  # nothing counting, nothing open, no hit: no state changes (the usual step)
        obs = np.ones_like(hit, dtype=bool) if observed is None else observed
        h = hit & obs
        m = ~hit & obs
        started = h & (self.hits == 0)
        self.first_hit[started] = step
        self.hits[h] += 1
        self.misses[h] = 0
        self.hits[m] = 0
        self.misses[m & self.active] += 1
        closed = self.active & (self.misses >= self.release)
        self.active[closed] = False
        self.misses[closed] = 0
        opened = h & ~self.active & (self.hits >= self.confirm)
        self.active[opened] = True
        self._busy = bool(self.active.any() or self.hits.any())
        return cast("np.ndarray", opened)
