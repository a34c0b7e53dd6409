"""Jumps of the loss that recur at a fixed period: data read in blocks, in the same order.

Data concatenated from files, shards or domains and read without shuffling pulls the model
toward the block it is reading; at each boundary the loss jumps several-fold and falls again as
the model adapts to the next block. The jumps come at a fixed period (a block's length, or an
epoch's), which nothing else in a healthy run produces at that size: a curriculum changes its data
a few times and never returns, a warm restart raises the LR (such jumps are not counted), and an
epoch's short last batch changes the batch size (not counted either). A jump counts only when
the loss after it is still up: a bad batch spikes for one step, a block of other data for several.
"""

from __future__ import annotations

import math
from collections import deque

from nnwatch.diagnosis.detectors.loss_diverging import noise_sigma
from nnwatch.diagnosis.history import median
from nnwatch.diagnosis.row import Row

LEVEL = 8  # losses whose median is the level a jump is measured from
NOISE = 16  # losses whose step-to-step noise a jump must stand well above
JUMP = 3.0  # a jump: a loss this many times its level ...
NOISE_UNITS = 8.0  # ... and this many noise sigmas above it
MIN_PERIOD = 8  # steps between recurring jumps, at least
POINTS = 4  # jumps at a, a + P, a + 2P, a + 3P
SPARSE_HITS, SPARSE_SHARE = 5, 0.6  # or five jumps on 60% of a lattice's points
MAX_SKIP = 6  # the period may be a sixth of the distance between two jumps
CROWD = 1.5  # all jumps in the span at most this many times the periodic ones: not noise
ONSETS = 64  # recent jump onsets kept
SUSTAIN = 1.5  # ... and the loss after it still this many times the level: a block, not a batch
LR_RISE = 1.2  # a jump within RISE_STEPS of an LR this much higher is the schedule's:
RISE_STEPS = 24  # momentum (beta 0.9 to 0.99) carries a restart's larger steps for tens of steps


class JumpLattice:
    """Feeds on every loss; ``push`` returns the period once jumps recur on a lattice."""

    def __init__(self) -> None:
        self.losses: deque[float] = deque(maxlen=NOISE)
        self.lrs: deque[float] = deque(maxlen=4)
        self.rise = -(10**9)  # the step of the LR's last rise (a warm restart, a warm-up)
        self.onsets: deque[tuple[int, float]] = deque(maxlen=ONSETS)  # (step, loss / level)
        self.up = False
        self.pending: tuple[int, float, float] | None = None  # step, times the level, the level
        self.batch = math.nan
        self.found: tuple[int, list[tuple[int, float]]] | None = None  # period, its jumps

    def push(self, row: Row) -> tuple[int, list[tuple[int, float]]] | None:
        """The period and its jumps (step, times the level) the first time they show, else None."""
        loss = row.loss
        if not math.isfinite(loss) or self.found is not None:
            return None
        pending, self.pending = self.pending, None
        ratio = self._jump(loss)
        counted = self._counted(row)
        self.losses.append(loss)
        up = ratio is not None
        onset = up and not self.up
        self.up = up
        if onset and counted and ratio is not None:
            self.pending = (row.step, ratio, loss / ratio)  # confirmed if the next loss stays up
        if pending is None or loss < SUSTAIN * pending[2]:
            return None  # a one-step spike (a bad batch) is no block of other data
        self.onsets.append(pending[:2])
        self.found = self._lattice()
        return self.found

    def _jump(self, loss: float) -> float | None:
        if len(self.losses) < NOISE:
            return None
        recent = list(self.losses)
        level = median(recent[-LEVEL:])
        if not level > 0 or loss < JUMP * level:
            return None
        if loss - level < NOISE_UNITS * noise_sigma(recent):
            return None
        return loss / level

    def _counted(self, row: Row) -> bool:
        """Not a jump the LR schedule made (a restart) nor a batch of another size (an epoch's
        short last batch)."""
        lr = row.lr0
        bs = float(round(row.batch_size)) if math.isfinite(row.batch_size) else math.nan  # sps x dt
        if math.isfinite(lr) and any(lr > LR_RISE * x for x in self.lrs if x > 0):
            self.rise = row.step
        restart = row.step - self.rise <= RISE_STEPS
        if math.isfinite(lr):
            self.lrs.append(lr)
        other_size = math.isfinite(bs) and math.isfinite(self.batch) and bs != self.batch
        if math.isfinite(bs):
            self.batch = bs
        return not (restart or other_size)

    def _lattice(self) -> tuple[int, list[tuple[int, float]]] | None:
        """The newest jump on a lattice of earlier ones: three in a row at equal spacing, or four
        on at least 60% of its points (a block the model has learned by then jumps no more),
        with few other jumps in the span."""
        steps = [s for s, _ in self.onsets]
        last = steps[-1]
        for b in reversed(steps[:-1]):
            for m in range(1, MAX_SKIP + 1):
                period = (last - b) / m
                if period < MIN_PERIOD:
                    break
                hits = self._hits(steps, last, period)
                if hits is not None:
                    chosen = set(hits)
                    return round(period), [(s, r) for s, r in self.onsets if s in chosen]
        return None

    @staticmethod
    def _hits(steps: list[int], last: int, period: float) -> list[int] | None:
        tol = max(1.0, 0.01 * period)  # blocks are counted in batches: the period is exact
        hits: list[int] = []
        points, run, in_row = 0, True, 0
        k = 0
        while last - k * period >= steps[0] - tol:
            near = [s for s in steps if abs(s - (last - k * period)) <= tol]
            points += 1
            if near:
                hits.append(near[0])
                in_row += run
            else:
                run = False
            k += 1
        if not (in_row >= POINTS or (len(hits) >= SPARSE_HITS and len(hits) >= SPARSE_SHARE * points)):
            return None
        span = [s for s in steps if min(hits) <= s <= last]
        return sorted(hits) if len(span) <= CROWD * len(hits) else None
